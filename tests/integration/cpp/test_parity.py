"""The C++ runtime against the Python ONNX Runtime runtime on the same artifact: token-identical
output and identical counters for every strategy (DESIGN §2, STYLE 8)."""
from __future__ import annotations

import json

import pytest

from dllm_deploy.runtime.api import decode_config

from .conftest import STRATEGIES, first_prompts, generate_many, run_generate

GEN = 64   # tokens per prompt: two blocks of 32, so the fused commit forward runs too


PROMPTS = first_prompts(3)

# the five strategies on 3 prompts; the variants on 1 (keeps the suite near a minute)
CASES = {
    **STRATEGIES,
    # tree kinds beyond the chain (runner-up, conservative) and LLaDA's steps schedule
    "spd-binary-threshold-w4": {"strategy": "spd", "tree": "binary", "base": "threshold", "beam_width": 4},
    "spd-wide-select-threshold-w4": {"strategy": "spd", "tree": "wide", "select": "threshold", "beam_width": 4},
    "vanilla-steps": {"strategy": "vanilla", "steps": 40},
    # chain drafts below the threshold (the default drafts at the threshold itself)
    "spd-chain-threshold-w4-draft-tau": {"strategy": "spd", "base": "threshold", "beam_width": 4, "draft_tau": 0.5},
    "spd-fork-w6": {"strategy": "spd", "tree": "fork", "beam_width": 6},
    # the far threshold: the rule, and the fork's alt-position and binary's runner-up drafts over it
    "threshold-far": {"strategy": "threshold", "threshold": 0.8, "threshold_far": 0.999},
    "spd-fork-threshold-far-w4": {"strategy": "spd", "base": "threshold", "threshold": 0.8, "threshold_far": 0.999,
                                  "beam_width": 4},
    "spd-binary-threshold-far-w4": {"strategy": "spd", "tree": "binary", "base": "threshold", "threshold": 0.8,
                                    "threshold_far": 0.999, "beam_width": 4},
    # the lead threshold: with the far one, alone, and under the fork's drafts
    "threshold-far-lead": {"strategy": "threshold", "threshold": 0.98, "threshold_far": 0.999, "threshold_lead": 0.7},
    "threshold-lead": {"strategy": "threshold", "threshold": 0.95, "threshold_lead": 0.5},
    "spd-fork-threshold-far-lead-w4": {"strategy": "spd", "base": "threshold", "threshold": 0.98, "threshold_far": 0.999,
                                       "threshold_lead": 0.7, "beam_width": 4},
    # the delayed in-block cache under the far and lead thresholds
    "threshold-far-lead-delayed": {"strategy": "threshold", "threshold": 0.98, "threshold_far": 0.999,
                                   "threshold_lead": 0.7, "cache": "delayed"},
}
N_PROMPTS = {"spd-binary-threshold-w4": 1, "spd-wide-select-threshold-w4": 1, "vanilla-steps": 1,
             "spd-chain-threshold-w4-draft-tau": 1, "spd-fork-w6": 1, "threshold-far": 2,
             "spd-fork-threshold-far-w4": 2, "spd-binary-threshold-far-w4": 1, "threshold-far-lead": 2,
             "threshold-lead": 1, "spd-fork-threshold-far-lead-w4": 1}

KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished", "beam_width_used",
        "beam_width_requested")


@pytest.fixture(scope="module")
def py_runtimes(tiny_artifact):
    from dllm_deploy import Runtime
    folder = tiny_artifact[0]
    return {p: Runtime.load(artifact=str(folder), precision=p) for p in ("fp32", "int8")}


def _python(rt, prompts, options) -> list[dict]:
    # one prompt per call: the C++ runtime decodes batch 1, and a padded batch differs by float noise
    return [rt.decoder.generate([p], decode_config(gen_length=GEN, **options))[0].to_dict() for p in prompts]


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_matches_python(case, cpp_build, tiny_artifact, py_runtimes, tmp_path):
    options, prompts = CASES[case], PROMPTS[:N_PROMPTS.get(case, len(PROMPTS))]
    want = _python(py_runtimes["fp32"], prompts, options)
    got = generate_many(cpp_build, tiny_artifact[0], prompts, {"gen_length": GEN, **options}, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) == set(w) | {"backend_s"}
        assert {k: g[k] for k in KEYS} == {k: w[k] for k in KEYS}
        assert g["tpf"] == pytest.approx(w["tpf"])
        assert 0 < g["backend_s"] <= g["wall_s"]


def test_cpp_matches_python_int8(cpp_build, tiny_artifact, py_runtimes, tmp_path):
    options = {"strategy": "spd", "base": "threshold", "beam_width": 4}
    want = _python(py_runtimes["int8"], PROMPTS[:2], options)
    got = generate_many(cpp_build, tiny_artifact[0], PROMPTS[:2], {"gen_length": GEN, **options}, tmp_path,
                        extra=("--precision", "int8"))
    assert [{k: g[k] for k in KEYS} for g in got] == [{k: w[k] for k in KEYS} for w in want]


def test_beam_width_cap_warns_and_matches_the_lower_width(cpp_build, tiny_artifact, py_runtimes, tmp_path):
    """--max-beam-width 2 lowers W 4 -> 2 with a warning; the output is Python's at W 2."""
    r = run_generate(cpp_build, "--artifact", str(tiny_artifact[0]), "--prompt", PROMPTS[0], "--json",
                     "--strategy", "spd", "--beam-width", "4", "--max-beam-width", "2", "--gen-length", str(GEN))
    assert r.returncode == 0, r.stderr
    assert "warning: beam width 4 lowered to 2" in r.stderr
    got = json.loads(r.stdout)
    want = _python(py_runtimes["fp32"], PROMPTS[:1], {"strategy": "spd", "beam_width": 2})[0]
    assert (got["beam_width_used"], got["beam_width_requested"]) == (2, 4)
    assert got["token_ids"] == want["token_ids"] and got["forwards"] == want["forwards"]


def test_prompts_file_raw_and_json_lines(cpp_build, tiny_artifact, tmp_path):
    """A raw line and the same prompt as a JSON string decode alike; blank lines are skipped."""
    pfile = tmp_path / "p.txt"
    pfile.write_text('count: from 7 by 2, 3 terms\n\n"count: from 7 by 2, 3 terms"\n')
    r = run_generate(cpp_build, "--artifact", str(tiny_artifact[0]), "--prompts-file", str(pfile), "--json",
                     "--gen-length", "32", "--strategy", "threshold")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 2 and rows[0]["token_ids"] == rows[1]["token_ids"]
