"""`dllm-deploy distill`: a few real steps on the bundled model and on LLaDA / Dream checkpoints
(the student is written in the source's own layout and loads again), the certainty term, and the
refusals that keep a user's folders safe."""
import json

import pytest

from dllm_deploy.cli import main
from tests.conftest import write_checkpoint


def _distill(model, out, *extra):
    return main(["distill", "--model", str(model), "--out", str(out), "--steps", "3", "--batch", "2",
                 "--teacher-prompts", "4", "--gen-length", "32", "--json", *extra])


def test_distill_tiny_writes_a_checkpoint_that_decodes(tmp_path, capsys):
    out = tmp_path / "student"
    assert _distill("tiny", out) == 0
    rec = json.loads(capsys.readouterr().out)
    d = rec["distill"]
    assert d["steps_done"] == 3 and d["teacher_decoded"] == 4
    assert d["teacher_kept"] + d["replaced_by_reference"] == 4
    assert d["cpu_s"] > 0 and d["states"] == "block_causal"
    assert rec["previous"]["steps"] > 0                         # the base model's record is kept
    assert json.loads((out / "training.json").read_text()) == rec
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["phase"] == "distill" and {"ce", "entropy"} <= set(log[-1])
    from dllm_deploy import Runtime
    r = Runtime.load(model=str(out)).generate(["upper: river stone\n"], strategy="threshold", gen_length=32)[0]
    assert r.forwards >= 1 and r.token_ids


@pytest.mark.parametrize("layout", ["llada", "dream"])
def test_distill_bidirectional_checkpoint_keeps_its_layout(tmp_path, layout, capsys):
    from safetensors.torch import load_file

    from dllm_deploy.models.loading import load_model
    src = write_checkpoint(tmp_path / layout, layout)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}: abc"}) + "\n" for i in range(5)))
    out = tmp_path / "student"
    assert _distill(src, out, "--prompts", str(prompts)) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["distill"]["states"] == "bidirectional" and rec["distill"]["teacher_kept"] == 4
    before, after = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(before) == set(after)                             # the source's own tensor names
    assert any(not (before[k] == after[k]).all() for k in before)
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    load_model(out)


def test_certainty_loss_is_the_entropy_of_correct_predictions_only():
    import torch

    from dllm_deploy.training.distill import certainty_loss
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    assert certainty_loss(logits, torch.tensor([1, 0]), 1.0).item() == 0.0          # both wrong
    p = torch.softmax(logits[0], -1)
    want = -(p * p.log()).sum()
    assert certainty_loss(logits, torch.tensor([0, 0]), 1.0).item() == pytest.approx(want.item())
    sharper = certainty_loss(logits, torch.tensor([0, 0]), 0.5).item()
    assert sharper < want.item()                                                     # T < 1 sharpens


def test_distill_never_replaces_a_users_folder(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert _distill("tiny", mine) == 2
    assert _distill("tiny", mine, "--force") == 2
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    err = capsys.readouterr().err
    assert "already exists" in err and "not a checkpoint written by dllm-deploy distill" in err
    out = tmp_path / "student"
    assert _distill("tiny", out) == 0
    assert _distill("tiny", out, "--force") == 0                 # its own output: replaced
    assert _distill(out, out, "--force") == 2                    # never onto its own source
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".student.tmp")]


def test_distill_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    assert _distill("tiny", tmp_path / "a", "--prompts", str(bad)) == 2
    assert _distill("tiny", tmp_path / "b", "--prompts", str(tmp_path / "missing.jsonl")) == 2
    assert _distill("tiny", tmp_path / "c", "--mix", "nope=1") == 2
    assert main(["distill", "--model", "tiny", "--out", str(tmp_path / "d"), "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 4
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_core_source_draws_only_the_original_distribution():
    """``--dist core``: every upper / count prompt is of the original form (the 149 words, starts of
    100-9999); ``train`` also draws broad inputs."""
    from dllm_deploy.training.distill_data import TaskSource
    from dllm_deploy.evals import tasks

    def draws(dist):
        src = TaskSource({"upper": 1.0, "count": 1.0}, seed=3, dist=dist)
        return [src.draw() for _ in range(200)]

    def original(ex):
        text = ex.prompt.split(": ", 1)[1].strip()
        if ex.family == "upper":
            return all(w in tasks.WORDS for w in text.split())
        return 100 <= int(text.split()[1]) <= 9999
    assert all(original(e) for e in draws("core"))
    assert not all(original(e) for e in draws("train"))
    from dllm_deploy.errors import UserError
    with pytest.raises(UserError):
        TaskSource({"upper": 1.0}, seed=0, dist="general")


def test_policy_states_replay_the_runtimes_threshold_decode():
    """Teacher-forced on the runtime's own τ 0.9 answer, the recorded states are the runtime's
    trajectory: one state per forward, each block's first state fully masked, each next one a
    strict subset, and no commit disagrees with the answer."""
    import torch

    from dllm_deploy import Runtime
    from dllm_deploy.training.distill import policy_states
    from dllm_deploy.models.loading import load_model, resolve_model_dir
    from dllm_deploy.models.tokenizer import load_tokenizer
    src = resolve_model_dir("tiny")
    model, cfg = load_model(src)
    model.eval().set_attention("sdpa")
    tok = load_tokenizer(src, cfg.eos_token_id)
    rt = Runtime.load(model="tiny")
    prompts = ["upper: hello world from the diffusion model\n",
               "kv: hyb=2yyy6 hzk=4nz zeu=u8n8m vib=6uru mmb=e3ike tyj=foxc ? vib zeu hzk mmb hyb\n"]
    results = rt.generate(prompts, strategy="threshold", threshold=0.9, gen_length=128)
    rows = [(tok.encode(p), [t for t in r.token_ids if t != cfg.eos_token_id]) for p, r in zip(prompts, results)]
    with torch.no_grad():
        states, counts = policy_states(model, cfg, rows, 0.9)
    assert counts["wrong"] == 0
    assert counts["commits"] == sum((len(a) + 1 + 31) // 32 * 32 for _, a in rows)
    for r, blocks in zip(results, states):
        assert sum(len(b) for b in blocks) == r.forwards
        for b in blocks:
            assert all(b[0])
            assert all(set(_masked(nxt)) < set(_masked(prev)) for prev, nxt in zip(b, b[1:]))
    assert results[1].forwards > len(states[1])                 # kv takes several steps per block


def _masked(state):
    return [i for i, m in enumerate(state) if m]


def test_distill_with_policy_states_logs_their_calibration(tmp_path, capsys):
    out = tmp_path / "student"
    assert _distill("tiny", out, "--policy-share", "1", "--policy-every", "2") == 0
    d = json.loads(capsys.readouterr().out)["distill"]
    assert d["policy_first"]["step"] == 0 and d["policy_last"]["step"] == 3
    assert d["policy_first"]["commits"] > 0 and 0 <= d["policy_first"]["wrong_share"] <= 1
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if x["phase"] == "policy"] == [0, 2, 3]


def test_distill_policy_pool_records_fresh_reference_answers(tmp_path, capsys):
    out = tmp_path / "student"
    assert _distill("tiny", out, "--teacher-prompts", "0", "--policy-share", "1", "--policy-pool", "6",
                    "--policy-every", "2") == 0
    d = json.loads(capsys.readouterr().out)["distill"]
    assert d["teacher_decoded"] == 0 and d["policy_pool"] == 6
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    pol = [x for x in log if x["phase"] == "policy"]
    assert [x["step"] for x in pol] == [0, 2, 3]
    assert all(x["rows"] == 6 and x["fresh"] and x["commits"] > 0 for x in pol)


def test_policy_pool_needs_a_share_and_reference_answers(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "upper: abc\n"}) + "\n")
    assert _distill("tiny", tmp_path / "a", "--policy-pool", "8") == 2
    assert _distill("tiny", tmp_path / "b", "--prompts", str(prompts), "--policy-share", "1", "--policy-pool", "8") == 2
    err = capsys.readouterr().err
    assert "set --policy-share too" in err and "no reference answers" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_policy_states_need_a_block_causal_model(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "llada", "llada")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "q: abc"}) + "\n")
    assert _distill(src, tmp_path / "a", "--prompts", str(prompts), "--policy-share", "0.5") == 2
    assert _distill("tiny", tmp_path / "b", "--policy-share", "1.5") == 2
    err = capsys.readouterr().err
    assert "block-causal" in err and "--policy-share must be in [0, 1]" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
