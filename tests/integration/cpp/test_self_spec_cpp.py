"""The C++ self-speculative decoder (cpp/src/self_spec.cpp) against Python's (runtime/self_spec.py):
the same tokens and the same tokens per round, row by row, for ar, linear-spec, tree-spec (greedy
and sampled) and fastdiffuser, batch 4 with different prompt lengths (a random Nemotron-Labs-Diffusion
checkpoint, its ONNX Runtime artifact)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import write_random_checkpoint
from tests.integration.models.test_nemotron_diffusion import RAW

from .conftest import generate_many, run_generate

PROMPTS = ["upper: ab", "count: 1 2 3\n", "reverse: a b c d e f", "kv"]
CASES = {"ar": {"strategy": "ar"}, "linear-spec": {"strategy": "linear-spec"},
         "tree-spec-2": {"strategy": "tree-spec", "beam_width": 2}, "tree-spec-4": {"strategy": "tree-spec", "beam_width": 4},
         "tree-spec-sampled": {"strategy": "tree-spec", "beam_width": 4, "temperature": 0.9, "seed": 5},
         "ar-sampled": {"strategy": "ar", "temperature": 0.9, "seed": 5},
         "fastdiffuser": {"strategy": "fastdiffuser", "threshold": 0.3},
         "fastdiffuser-1": {"strategy": "fastdiffuser", "threshold": 1.0}}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from dllm_deploy.export.exporter import export
    root = tmp_path_factory.mktemp("selfspec-cpp")
    ckpt = write_random_checkpoint(root / "ckpt", RAW)
    export(ckpt, root / "art", log=lambda m: None)
    return root / "art"


@pytest.fixture(scope="module")
def python_runs(artifact):
    from dllm_deploy.runtime.backends.ort import load_ort
    from dllm_deploy.runtime.self_spec import SelfSpecOptions, generate
    loaded = load_ort(artifact)
    be, tok = loaded.backend, loaded.tokenizer
    c = be.config
    out = {}
    for name, opts in CASES.items():
        res = generate(be, [tok.encode(p) for p in PROMPTS], SelfSpecOptions(max_new_tokens=20, **opts),
                       c.mask_token_id, c.eos_token_id, c.block_size)
        out[name] = res
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_equals_python(cpp_build, artifact, python_runs, case, tmp_path):
    rows = generate_many(cpp_build, artifact, PROMPTS, {**CASES[case], "gen_length": 20}, tmp_path,
                         extra=("--batch-size", "4"))
    want = python_runs[case]
    eos = json.loads((artifact / "manifest.json").read_text())["model"]["eos_token_id"]
    for r, row in enumerate(rows):
        assert row["token_ids"] == want.tokens[r] + [eos] * (want.stop[r] == "eos"), (case, r)   # up to and with EOS
        hist = {str(k): v for k, v in Counter(want.accepted[r]).items()}
        assert row["accepted_hist"] == hist, (case, r)
        assert row["finish_reason"] == {"eos": "eos", "length": "length"}[want.stop[r]]
    if case == "tree-spec-4":      # lossless: the greedy strategies agree
        assert want.tokens == python_runs["ar"].tokens


@pytest.mark.parametrize("strategy", ["tree-spec", "fastdiffuser"])
def test_cpp_streams_and_stops_as_python(cpp_build, artifact, strategy):
    """--stream --json: each round's chunks, as Python's Runtime.stream cuts them; --stop ends a row
    where Python's does."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(artifact))
    prompt = PROMPTS[2]
    full = rt.generate([prompt], strategy=strategy, gen_length=20)[0]
    stop = full.text[len(full.text) // 2:][:1]
    for extra, row_stop in (([], ()), (["--stop", stop], (stop,))):
        r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", prompt, "--strategy", strategy,
                         "--gen-length", "20", "--stream", "--json", *extra)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        chunks, result = lines[:-1], lines[-1]
        want = list(rt.stream([prompt], strategy=strategy, gen_length=20, stop=list(row_stop) or None))
        assert [(c["delta"], c["token_ids"], c["forwards"], c["finish_reason"]) for c in chunks] == \
            [(c["delta"], c["token_ids"], c["forwards"], c["finish_reason"]) for c in want]
        assert result["text"] == "".join(c["delta"] for c in want) and result["finish_reason"] == want[-1]["finish_reason"]
    assert result["finish_reason"] == "stop" and stop not in result["text"]


def test_cpp_refuses_masked_options(cpp_build, artifact):
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "x", "--cache", "dual")
    assert r.returncode == 2 and "--cache does not apply to a self-speculative model" in r.stderr
    assert r.stderr.count("\n") == 1
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "x", "--strategy", "spd")
    assert r.returncode == 2 and "unknown strategy 'spd' for a self-speculative model" in r.stderr
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "x", "--gen-length", "300")
    assert r.returncode == 2 and "exceeds the model's max_seq 256" in r.stderr
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "upper: ab", "--gen-length", "6", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["token_ids"]) <= 6
