"""C++ batches against Python's: `dllm-generate --prompts-file F --batch-size 4` decodes the four
prompts as one batch (left-padded, block by block in lockstep, finished rows leaving) and each row
gets the tokens, forwards and finish reason of Python's `Runtime.generate(prompts, ...)`."""
from __future__ import annotations

import pytest

from .conftest import generate_many
from .test_errors import ASAN_ENV


def _prompts() -> list[str]:
    """Eval prompts of 30 to 97 characters whose rows (greedy, 4 blocks) end at EOS in blocks 3
    and 4 or run to the budget: rows leave the batch at different blocks."""
    from dllm_deploy.evals import tasks
    by_family: dict[str, list[str]] = {}
    for ex in tasks.eval_split():
        by_family.setdefault(ex.family, []).append(ex.prompt)
    return [by_family["upper"][0], by_family["count"][0], by_family["csv"][1], by_family["kv"][0]]


PROMPTS = _prompts()
GEN = {"gen_length": 64, "block_length": 16}
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "seed": 1}   # the tiny model's tokens stay the greedy ones here,
HOT = {"temperature": 5.0, "top_p": 0.9, "seed": 1}       # and differ from them in every row here
SAMPLINGS = {"greedy": {}, "seeded": SAMPLED, "hot": HOT}
STRATEGIES = {
    "vanilla": {"strategy": "vanilla"},
    "threshold": {"strategy": "threshold"},
    "threshold-delayed": {"strategy": "threshold", "cache": "delayed"},
    "spd-lossless": {"strategy": "spd", "beam_width": 4},
    "spd-select-threshold": {"strategy": "spd", "select": "threshold", "beam_width": 4},
}
KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished", "finish_reason",
        "beam_width_used", "beam_width_requested")


@pytest.fixture(scope="module")
def py_rt(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


def _python(rt, options: dict) -> list[dict]:
    return [{k: r.to_dict()[k] for k in KEYS} for r in rt.generate(PROMPTS, **GEN, **options)]


def _cpp(build, artifact, options: dict, tmp_path, env=None) -> list[dict]:
    rows = generate_many(build, artifact, PROMPTS, {**GEN, **options}, tmp_path, extra=("--batch-size", "4"), env=env)
    return [{k: r[k] for k in KEYS} for r in rows]


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("case", list(STRATEGIES))
def test_batch_matches_python_batch(case, sampling, cpp_build, tiny_artifact, py_rt, tmp_path):
    options = {**STRATEGIES[case], **SAMPLINGS[sampling]}
    want = _python(py_rt, options)
    assert len({len(p) for p in PROMPTS}) > 1                          # the rows are padded
    assert len({w["forwards"] for w in want}) > 1, want                # rows end at different points
    if sampling == "hot":                                               # the noise reaches every row
        greedy = _python(py_rt, STRATEGIES[case])
        assert all(w["token_ids"] != g["token_ids"] for w, g in zip(want, greedy))
    assert _cpp(cpp_build, tiny_artifact[0], options, tmp_path) == want


def test_batch_with_a_stop_string_and_budget(cpp_build, tiny_artifact, py_rt, tmp_path):
    """Rows stopped by a stop string or max_tokens leave mid-call; the others decode on."""
    options = {"strategy": "spd", "beam_width": 4, "max_tokens": 20, "stop": " "}
    want = _python(py_rt, {**options, "stop": [" "]})
    assert {w["finish_reason"] for w in want} - {"eos"}, want
    assert _cpp(cpp_build, tiny_artifact[0], options, tmp_path) == want


@pytest.mark.parametrize("case", ["spd-lossless", "threshold-delayed"])
def test_batch_under_sanitizers(case, cpp_asan_build, tiny_artifact, py_rt, tmp_path):
    """A seeded batch whose rows leave at different blocks, under ASan + UBSan (the KV cache and
    the per-row state compacted as rows leave; delayed: the held keys cut from the cache)."""
    options = {**STRATEGIES[case], **HOT}
    got = _cpp(cpp_asan_build, tiny_artifact[0], options, tmp_path, env=ASAN_ENV)
    assert got == _python(py_rt, options)
