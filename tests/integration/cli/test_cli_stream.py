"""`dllm-deploy generate --stream / --max-tokens / --stop` as a user runs them (subprocesses):
chunk lines that add up to the final object, text printed as it comes, one-line errors."""
import json
import subprocess
import sys

import pytest

PROMPT = "reverse: river stone cloud garden window light\\n"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "generate", *args], capture_output=True,
                          text=True, timeout=300)


def test_stream_json_chunks_add_up_to_the_final_object(tiny_artifact):
    p = cli("--artifact", str(tiny_artifact[0]), "--prompt", PROMPT, "--escapes", "--stream", "--json",
            "--strategy", "spd", "--max-tokens", "64", "--stop", " garden")
    assert p.returncode == 0, p.stderr
    *chunks, final = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(chunks) > 1 and all(set(c) == {"index", "delta", "token_ids", "forwards", "tokens", "finish_reason"}
                                   for c in chunks)
    assert "".join(c["delta"] for c in chunks) == final["text"] == "light window"
    assert sum((c["token_ids"] for c in chunks), []) == final["token_ids"]
    assert final["finish_reason"] == chunks[-1]["finish_reason"] == "stop" and final["finished"]
    assert 0 < final["time_to_first_token_s"] <= final["wall_s"]
    assert {"forwards", "tokens", "tpf", "accepted_hist", "beam_width_used"} <= set(final)


def test_stream_prints_the_same_text_as_generate(tiny_artifact):
    args = ("--artifact", str(tiny_artifact[0]), "--prompt", PROMPT, "--escapes", "--max-tokens", "12")
    plain, streamed = cli(*args), cli(*args, "--stream")
    assert plain.returncode == streamed.returncode == 0, plain.stderr + streamed.stderr
    assert streamed.stdout == plain.stdout == "light window\n"
    assert "length]" in streamed.stderr.splitlines()[-1]


@pytest.mark.parametrize("args, msg", [
    (["--max-tokens", "0"], "max tokens must be >= 1, got 0 (--max-tokens)"),
    (["--max-tokens", "65", "--gen-length", "64"], "max tokens (65) exceeds gen length (64)"),
    (["--stop", ""], "stop strings must be non-empty strings"),
    (["--stream", "--prompt", "b"], "--stream prints one prompt's text"),
])
def test_stream_and_stop_errors_are_one_line(args, msg):
    p = cli("--prompt", "a", *args)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, p.stderr
    assert p.stderr.startswith("dllm-deploy: error: ") and p.stdout == ""
