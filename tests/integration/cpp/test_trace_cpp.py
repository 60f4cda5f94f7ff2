"""Decision traces in C++ (cpp/src/trace.cpp, dllm-generate --trace, dllm_runtime_set_trace) equal
Python's (runtime/trace.py, Runtime.generate(trace=...)) record for record, margins included, for
every strategy and cache mode of the bundled model, on a batch of prompts."""
from __future__ import annotations

import json

import pytest

from .conftest import STRATEGIES, first_prompts, flags, run_generate

CASES = {**{f"{name}/{cache}": {**opts, "cache": cache} for name, opts in STRATEGIES.items() for cache in ("exact", "none")},
         "vanilla/delayed": {"strategy": "vanilla", "tokens_per_step": 2, "cache": "delayed"},
         "threshold/lead-far": {"strategy": "threshold", "threshold_lead": 0.7, "threshold_far": 0.95},
         "spd-wide-k2": {"strategy": "spd", "beam_width": 5, "tree": "wide", "tokens_per_step": 2}}


@pytest.fixture(scope="module")
def runtime(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpp_trace_equals_python(cpp_build, tiny_artifact, runtime, case, tmp_path):
    prompts = first_prompts(3)
    options = {"gen_length": 64, **CASES[case]}
    want: list[dict] = []
    runtime.generate(prompts, trace=want.append, **options)
    pfile, out = tmp_path / "prompts.jsonl", tmp_path / "trace.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    r = run_generate(cpp_build, "--artifact", str(tiny_artifact[0]), "--prompts-file", str(pfile), "--batch-size", "3",
                     "--json", "--trace", str(out), *flags(options))
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == len(want) > 3 and f"trace: {len(got)} decision records in {out}" in r.stderr
    assert got == want
    assert not list(tmp_path.glob(".*.tmp"))


def test_trace_is_refused_where_it_does_not_apply(cpp_build, selfspec_artifact, tmp_path):
    out = tmp_path / "trace.jsonl"
    r = run_generate(cpp_build, "--artifact", str(selfspec_artifact), "--prompt", "hi", "--trace", str(out))
    assert r.returncode == 2 and "--trace records the decisions of masked-diffusion models" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
