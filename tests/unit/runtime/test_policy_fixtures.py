"""Golden policy traces for the C++ port (tests/data/golden/policy/, format in the fixtures'
README.md): for every verification of a short real decode of the bundled model (torch, one
`count` prompt, its weakest family, so the rules take many steps; two blocks of 16), the policy's inputs and decisions: the block state S, f(S) and the
rule step (plan's inputs), the drafted nodes (plan's output, the tree when pruned), f(nodes) and
the selected node with the rule steps it accepted (select's output). One file per strategy.

test_decode_makes_the_committed_steps re-records them (DLLM_UPDATE_POLICY_FIXTURES=1 rewrites the
files); test_traces_replay runs each recorded step through runtime/strategies.py::Policy again;
cpp/tests/test_policy.cpp (ctest policy_traces) replays them through cpp/src/policy.cpp.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dllm_deploy.runtime import strategies
from dllm_deploy.runtime.strategies import DecodeConfig, Policy

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "golden" / "policy"
L, GEN = 16, 32
CASES = {  # file stem: decode options besides block length L and gen length GEN
    "vanilla": {"strategy": "vanilla"},
    "vanilla-k2": {"strategy": "vanilla", "tokens_per_step": 2},
    "threshold": {"strategy": "threshold", "threshold": 0.99},
    "threshold-far-lead": {"strategy": "threshold", "threshold": 0.99, "threshold_far": 0.999, "threshold_lead": 0.7},
    "threshold-dynamic": {"strategy": "threshold", "threshold": 0.95, "threshold_floor": 0.8},
    "spd-lossless-vanilla": {"strategy": "spd", "beam_width": 4},
    "spd-lossless-threshold": {"strategy": "spd", "base": "threshold", "threshold": 0.99, "beam_width": 4},
    "spd-binary": {"strategy": "spd", "base": "threshold", "threshold": 0.99, "beam_width": 6, "tree": "binary"},
    "spd-select-threshold": {"strategy": "spd", "select": "threshold", "beam_width": 4},
    "spd-select-pruned": {"strategy": "spd", "select": "threshold", "beam_width": 4, "candidates": 8, "tree": "wide"},
}
PROMPT = "count: from 761 by 39, 11 terms\n"


def _f32(a) -> list:
    return np.asarray(a, dtype=np.float32).tolist()


def record(tiny_runtime, options: dict) -> dict:
    """Decode PROMPT, recording every select call with the plan call that drafted its nodes."""
    plans: dict[bytes, dict] = {}
    steps: list[dict] = []
    plan, select = Policy.plan, Policy.select

    def spy_plan(self, state, top_ids, top_probs, step):
        nodes, spec = plan(self, state, top_ids, top_probs, step)
        plans[np.asarray(nodes).tobytes()] = {
            "state": np.asarray(state).tolist(), "top_ids": np.asarray(top_ids).tolist(), "top_probs": _f32(top_probs),
            "step": int(step), "nodes": np.asarray(nodes).tolist(),
            "tree": None if spec is self.spec else {"parents": list(spec.parents), "kinds": list(spec.kinds)}}
        return nodes, spec

    def spy_select(self, nodes, spec, f_ids, f_probs, step):
        cur, accepted = select(self, nodes, spec, f_ids, f_probs, step)
        steps.append({**plans[np.asarray(nodes).tobytes()], "f_ids": np.asarray(f_ids).tolist(),
                      "f_probs": _f32(f_probs), "selected": int(cur), "accepted": int(accepted)})
        return cur, accepted

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(strategies.Policy, "plan", spy_plan)
        mp.setattr(strategies.Policy, "select", spy_select)
        tiny_runtime.generate(PROMPT, block_length=L, gen_length=GEN, **options)
    return {"options": {"block_length": L, "gen_length": GEN, **options},
            "mask_id": tiny_runtime.config.mask_token_id, "steps": steps}


def dumps(fixture: dict) -> str:
    """One step per line."""
    head = json.dumps({k: v for k, v in fixture.items() if k != "steps"})[:-1]
    body = ",\n".join(json.dumps(s, separators=(",", ":")) for s in fixture["steps"])
    return f'{head}, "steps": [\n{body}\n]}}\n'


@pytest.mark.parametrize("stem", sorted(CASES))
def test_decode_makes_the_committed_steps(tiny_runtime, stem):
    fixture = record(tiny_runtime, CASES[stem])
    assert fixture["steps"]
    path = FIXTURES / f"{stem}.json"
    if os.environ.get("DLLM_UPDATE_POLICY_FIXTURES") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(fixture))
    assert _same(json.loads(path.read_text()), json.loads(dumps(fixture))), \
        f"{path} is stale: rerun with DLLM_UPDATE_POLICY_FIXTURES=1"


def _same(a, b, tol: float = 1e-5) -> bool:
    """Equal, probabilities within ``tol``: torch's CPU kernels round the last bits differently
    from one CPU to another (states, ids and decisions must match exactly)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b))
    return a == b


def test_the_traces_cover_what_they_are_for():
    """Deep acceptance, pruned trees and several tokens a step all occur (else the C++ replay
    would check little)."""
    load = {s: json.loads((FIXTURES / f"{s}.json").read_text()) for s in CASES}
    assert max(x["accepted"] for x in load["spd-lossless-threshold"]["steps"]) >= 3
    assert max(x["accepted"] for x in load["spd-select-threshold"]["steps"]) >= 2
    assert any(x["tree"] for x in load["spd-select-pruned"]["steps"])
    assert any(x["selected"] > 0 for x in load["spd-binary"]["steps"])


@pytest.mark.parametrize("stem", sorted(CASES))
def test_traces_replay(stem):
    fixture = json.loads((FIXTURES / f"{stem}.json").read_text())
    policy = Policy(DecodeConfig(**fixture["options"]), fixture["mask_id"])
    for i, s in enumerate(fixture["steps"]):
        arr = lambda k, t=np.int64: np.array(s[k], dtype=t)  # noqa: E731
        nodes, spec = policy.plan(arr("state"), arr("top_ids"), arr("top_probs", np.float32), s["step"])
        assert nodes.tolist() == s["nodes"], (stem, i)
        cur, accepted = policy.select(nodes, spec, arr("f_ids"), arr("f_probs", np.float32), s["step"])
        assert (cur, accepted) == (s["selected"], s["accepted"]), (stem, i)
