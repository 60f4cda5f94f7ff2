"""Decision traces (runtime/trace.py): the margins by hand, the margin as a guarantee (no change of
the probabilities smaller than half of it changes the decision), and the records of a decode on the
bundled artifact (they retell its tokens and forwards)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_deploy.runtime.rules import Threshold, Vanilla
from dllm_deploy.runtime.trace import decision_margin

M = 99  # mask id
f32 = lambda x: float(np.float32(x))   # noqa: E731


def _probs(p1, p2):
    return np.stack([np.asarray(p1, np.float32), np.asarray(p2, np.float32)], axis=1)   # (L,2)


def test_vanilla_margin_is_the_closer_of_order_and_token():
    s = np.array([M, M, M, 7])
    probs = _probs([0.5, 0.3, 0.2, 1.0], [0.1, 0.25, 0.1, 0.0])
    # k = 1 takes position 0: order 0.5 - 0.3, token 0.5 - 0.1
    assert decision_margin(Vanilla(1), s, probs, 0, M) == pytest.approx(f32(0.5) - f32(0.3))
    # k = 2 takes 0 and 1: order 0.3 - 0.2, token at 1: 0.3 - 0.25
    assert decision_margin(Vanilla(2), s, probs, 0, M) == pytest.approx(f32(0.3) - f32(0.25))
    # every masked position taken: only the tokens count
    assert decision_margin(Vanilla(3), s, probs, 0, M) == pytest.approx(f32(0.3) - f32(0.25))
    assert decision_margin(Vanilla(1), np.array([1, 2, 3, 7]), probs, 0, M) == float("inf")


def test_threshold_margin_is_the_distance_to_the_bar():
    s = np.array([M, M, M])
    probs = _probs([0.95, 0.88, 0.2], [0.01, 0.1, 0.1])
    assert decision_margin(Threshold(0.9), s, probs, 0, M) == pytest.approx(f32(0.9) - f32(0.88))
    # none clears its bar: the most confident is taken, so its lead over the next counts too
    probs = _probs([0.6, 0.58, 0.1], [0.2, 0.2, 0.05])
    assert decision_margin(Threshold(0.9), s, probs, 0, M) == pytest.approx(f32(0.6) - f32(0.58))


def test_threshold_margin_with_lead_and_far_bars():
    s = np.array([M, M, M, M])
    probs = _probs([0.72, 0.93, 0.5, 0.985], [0.0, 0.0, 0.0, 0.0])
    # lead 0.7 at position 0 (0.02 above it), tau 0.9 at 1, the gap at 2 (0.4 below tau), far 0.98 past it
    rule = Threshold(0.9, lead=0.7, far=0.98)
    assert rule.positions(s, probs[:, 0], 0, M).tolist() == [3, 1, 0]
    assert decision_margin(rule, s, probs, 0, M) == pytest.approx(f32(0.985) - f32(0.98))
    # the gap at the first position and nothing at the far bar: the most confident is taken
    probs = _probs([0.5, 0.6, 0.62, 0.1], [0.0, 0.0, 0.0, 0.0])
    assert Threshold(0.9, far=0.97).positions(s, probs[:, 0], 0, M).tolist() == [2]
    assert decision_margin(Threshold(0.9, far=0.97), s, probs, 0, M) == pytest.approx(f32(0.62) - f32(0.6))


def _decide(rule, state, ids, probs, step):
    """The decision a rule makes when a position's top two may swap: (positions, their tokens)."""
    p1, p2 = probs[:, 0], probs[:, 1]
    best = np.maximum(p1, p2)
    pos = rule.positions(state, best, step, M)
    tok = np.where(p1 >= p2, ids[:, 0], ids[:, 1])
    return sorted(pos.tolist()), tok[np.sort(pos)].tolist()


RULES = [Vanilla(1), Vanilla(3), Vanilla(steps=4), Threshold(0.9), Threshold(0.6), Threshold(0.9, lead=0.7),
         Threshold(0.9, far=0.97), Threshold(0.8, lead=0.5, far=0.95)]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), rule=st.sampled_from(RULES))
def test_no_change_under_half_the_margin_changes_the_decision(data, rule):
    L = 8
    masked = data.draw(st.lists(st.booleans(), min_size=L, max_size=L).filter(any))
    state = np.where(masked, M, 5)
    grid = st.integers(0, 100).map(lambda i: i / 100)       # probabilities on a coarse grid: ties happen
    p1 = np.array(data.draw(st.lists(grid, min_size=L, max_size=L)), np.float32)
    p2 = np.minimum(p1, np.array(data.draw(st.lists(grid, min_size=L, max_size=L)), np.float32))
    probs = _probs(p1, p2)
    ids = np.stack([np.arange(L) + 10, np.arange(L) + 20], axis=1)
    step = data.draw(st.integers(0, 3))
    m = decision_margin(rule, state, probs, step, M)
    assert m >= 0
    if m == float("inf") or m == 0:
        return
    noise = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=2 * L, max_size=2 * L)), np.float64).reshape(L, 2)
    moved = (probs + noise * (m / 2) * 0.999).astype(np.float32)
    assert _decide(rule, state, ids, moved, step) == _decide(rule, state, ids, probs, step)


def test_a_decode_is_retold_by_its_trace(tiny_artifact):
    """Vanilla and threshold (one node per step): node 0's commits, block by block, are the tokens;
    SPD: each verify forward's record says how many steps it accepted, and forwards = verify
    forwards + one forward per block started."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(tiny_artifact[0]))
    prompts = ["upper: dog\n", "count: a b c\n"]
    for options in ({"strategy": "vanilla", "tokens_per_step": 2}, {"strategy": "threshold"}):
        recs: list[dict] = []
        res = rt.generate(prompts, gen_length=64, trace=recs.append, **options)
        json.dumps(recs)                                  # plain JSON values
        for row, r in enumerate(res):
            blocks: dict[int, list] = {}
            for rec in (x for x in recs if x["row"] == row):
                blocks.setdefault(rec["block"], [99] * 32)
                for pos, tok in rec["commit"]:
                    assert blocks[rec["block"]][pos] == 99
                    blocks[rec["block"]][pos] = tok
            ids = [t for b in sorted(blocks) for t in blocks[b]]
            assert ids[:len(r.token_ids)] == r.token_ids
            assert sum(1 for x in recs if x["row"] == row) == r.forwards
    recs = []
    res = rt.generate(prompts, gen_length=64, strategy="spd", beam_width=4, trace=recs.append)
    for row, r in enumerate(res):
        mine = [x for x in recs if x["row"] == row]
        verifies = [x for x in mine if "accepted" in x]
        assert r.forwards == len(verifies) + len({x["block"] for x in mine})
        assert {int(k): v for k, v in r.to_dict()["accepted_hist"].items()} == \
            {n: sum(1 for x in verifies if x["accepted"] == n) for n in {x["accepted"] for x in verifies}}
        assert all(len(x["drafts"]) == 3 and len(x["checks"]) >= 1 for x in verifies)
        for a, b in zip(mine, mine[1:]):                 # within a block, steps advance by what was accepted
            if a["block"] == b["block"]:
                assert b["step"] == a["step"] + a["accepted"]


def test_trace_diff_tells_where_two_decodes_part(tiny_artifact, tmp_path, capsys):
    """generate --trace writes the records; trace-diff finds the first different decision (here an
    edited acceptance) with both sides' margins, and refuses what is not a trace in one line."""
    from dllm_deploy.cli import main
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["generate", "--artifact", str(tiny_artifact[0]), "--prompt", "upper: dog", "--gen-length", "32",
                 "--strategy", "spd", "--beam-width", "2", "--trace", str(a)]) == 0
    recs = [json.loads(line) for line in a.read_text().splitlines()]
    assert f"trace: {len(recs)} decision records in {a}" in capsys.readouterr().err
    assert main(["trace-diff", str(a), str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"same": True, "records": len(recs), "margin_drift": 0.0}
    recs[1]["accepted"] += 1
    b.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["trace-diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("first different decision: record 1 (row 0, block 0, step") and "narrowest margin" in out
    b.write_text("not json\n")
    assert main(["trace-diff", str(a), str(b)]) == 2
    assert capsys.readouterr().err.strip() == f"dllm-deploy: error: {b}:1: not a trace record (not JSON)"
