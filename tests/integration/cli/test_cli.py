"""The CLI as a user runs it: JSON keys, exit codes, one-line errors."""
import json
import subprocess
import sys

import pytest

from dllm_deploy.cli import main


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_generate_json_keys(capsys):
    rc, out, _ = run(["generate", "--model", "tiny", "--prompt", "upper: hello world\n", "--strategy", "spd",
                      "--beam-width", "4", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    for k in ("text", "token_ids", "forwards", "tokens", "tpf", "tokens_per_s", "wall_s", "beam_width_used", "accepted_hist"):
        assert k in d, k
    assert d["beam_width_used"] == 4


def test_generate_batch_json(capsys):
    rc, out, _ = run(["generate", "--prompt", "upper: ab cd\n", "--prompt", "count: from 100 by 5, 9 terms\n", "--json"], capsys)
    assert rc == 0
    assert len(json.loads(out)["results"]) == 2


def test_eval_json_keys(capsys):
    rc, out, _ = run(["eval", "--model", "tiny", "--strategy", "threshold", "--tasks", "upper,count", "--n", "2", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["strategy"] == "threshold" and d["backend"] == "torch"
    assert set(d["tasks"]) == {"upper", "count"}
    for s in [d["overall"], *d["tasks"].values()]:
        for k in ("accuracy", "n", "tpf", "forwards", "tokens", "tokens_per_s"):
            assert k in s
        assert 0.0 <= s["accuracy"] <= 1.0
    assert d["overall"]["n"] == 4


@pytest.mark.parametrize("args, msg", [
    (["generate", "--model", "/no/such/dir", "--prompt", "x"], "no such model folder"),
    (["generate", "--prompt", "x", "--strategy", "greedy"], "unknown strategy 'greedy'"),
    (["generate", "--prompt", "x", "--threshold", "1.5"], "threshold must be in (0, 1]"),
    (["generate", "--prompt", "x", "--strategy", "spd", "--draft-tau", "0"], "draft tau must be in (0, 1]"),
    (["generate", "--prompt", "x" * 600], "exceeds the model's max_seq 512"),
    (["generate", "--prompt", "x", "--cache", "triple"], "unknown cache mode 'triple'"),
    (["generate", "--artifact", "/no/such/artifact", "--prompt", "x"], "no such artifact folder"),
    (["eval", "--tasks", "poetry"], "unknown task 'poetry'"),
    (["train", "--out", "/tmp/never-written", "--mix", "poetry=1"], "--mix: unknown family 'poetry'"),
    (["train-selfspec", "--out", "/tmp/never-written", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["train-selfspec", "--out", "/tmp/never-written", "--init-from", "/no/such/dir"], "no config.json"),
])
def test_user_errors_exit_2_with_one_line(args, msg, capsys):
    rc, _, err = run(args, capsys)
    assert rc == 2
    assert msg in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_console_script_error_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "generate", "--model", "/nope", "--prompt", "x"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "no such model folder" in p.stderr


def test_train_writes_a_checkpoint_the_runtime_decodes(tmp_path, capsys):
    """`dllm-deploy train` (the recipe's flags; a 1-layer model, 3 steps): the checkpoint files and
    the training record, and the runtime loads and decodes it."""
    from dllm_deploy import Runtime
    out = tmp_path / "m"
    rc, _, _ = run(["train", "--out", str(out), "--steps", "3", "--batch", "2", "--pool", "1", "--hidden", "32",
                    "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn", "64"], capsys)
    assert rc == 0
    assert {"config.json", "model.safetensors", "training.json", "train_log.jsonl"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "training.json").read_text())["steps"] == 3
    r = Runtime.load(model=str(out)).generate("upper: ab\n", gen_length=32)[0]
    assert r.forwards >= 1 and len(r.token_ids) >= 1


def test_train_selfspec_fine_tunes_into_the_tri_mode_layout(tmp_path, capsys):
    """`dllm-deploy train-selfspec` (2 steps from the bundled model): a checkpoint of the
    Nemotron-Labs-Diffusion layout whose record repeats the command, which the runtime loads and
    decodes autoregressively; a checkpoint of another layout to start from is one line, exit 2."""
    from dllm_deploy import Runtime
    from tests.conftest import write_checkpoint
    out = tmp_path / "selfspec"
    rc, _, _ = run(["train-selfspec", "--out", str(out), "--steps", "2", "--batch", "2", "--threads", "1"], capsys)
    assert rc == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "nemotron_labs_diffusion"
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 2 and record["command"].startswith(f"dllm-deploy train-selfspec --out {out} ")
    r = Runtime.load(model=str(out)).generate("upper: ab\n", strategy="ar", gen_length=8)[0]
    assert r.forwards >= 1 and len(r.token_ids) >= 1
    llada = write_checkpoint(tmp_path / "llada", "llada")
    rc, _, err = run(["train-selfspec", "--out", str(tmp_path / "x"), "--init-from", str(llada)], capsys)
    assert rc == 2 and "expected a checkpoint of the bundled tiny model's layout" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
