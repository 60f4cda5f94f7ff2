import numpy as np
import pytest

from dllm_deploy.runtime.rules import Threshold, ThresholdSchedule, Vanilla
from dllm_deploy.runtime.tree import ALT_POSITION, CHAIN, CONSERVATIVE, RUNNER_UP, Drafter, make_tree, node_depths

M = 99  # mask id


def test_vanilla_commits_most_confident_and_breaks_ties_low():
    s = np.array([M, M, 7, M])
    ids = np.array([1, 2, 3, 4])
    p = np.array([0.5, 0.9, 1.0, 0.9])
    assert Vanilla(1)(s, ids, p, 0, M).tolist() == [M, 2, 7, M]
    assert Vanilla(2)(s, ids, p, 0, M).tolist() == [M, 2, 7, 4]


def test_vanilla_llada_step_schedule():
    v = Vanilla(steps=3)
    assert [v.count(8, i) for i in range(3)] == [3, 3, 2]     # 8 tokens over 3 steps


def test_threshold_commits_all_above_tau_or_the_best_one():
    s = np.array([M, M, M, M])
    ids = np.array([1, 2, 3, 4])
    assert Threshold(0.8)(s, ids, np.array([0.9, 0.2, 0.85, 0.1]), 0, M).tolist() == [1, M, 3, M]
    assert Threshold(0.95)(s, ids, np.array([0.9, 0.2, 0.85, 0.1]), 0, M).tolist() == [1, M, M, M]


def test_threshold_schedule_decays_to_floor_and_rises_at_the_end():
    sch = ThresholdSchedule(init=0.95, decay=0.9, floor=0.85, end_tokens=2)
    assert sch.tau(0, 10) == pytest.approx(0.95)
    assert sch.tau(1, 10) == pytest.approx(0.855)
    assert sch.tau(5, 10) == pytest.approx(0.85)
    assert sch.tau(5, 2) == pytest.approx(0.95)


def test_threshold_with_a_schedule_uses_the_step_and_the_masked_count():
    sch = ThresholdSchedule(init=0.95, decay=0.9, floor=0.8, end_tokens=2)
    s = np.array([M, M, M, M])
    ids = np.array([1, 2, 3, 4])
    p = np.array([0.9, 0.2, 0.86, 0.1])
    assert Threshold(0.95, sch)(s, ids, p, 0, M).tolist() == [1, M, M, M]        # tau 0.95
    assert Threshold(0.95, sch)(s, ids, p, 1, M).tolist() == [1, M, 3, M]        # tau 0.855
    s2 = np.array([M, 5, M, 6])                                                   # 2 masked left: tau 0.95 again
    assert Threshold(0.95, sch)(s2, ids, p, 5, M).tolist() == [1, 5, M, 6]


def test_far_threshold_takes_left_to_right_then_only_near_certain_positions():
    s = np.array([M, 7, M, M, M, M])
    ids = np.array([1, 2, 3, 4, 5, 6])
    p = np.array([0.95, 0.1, 0.92, 0.5, 0.97, 0.9999])
    assert Threshold(0.9)(s, ids, p, 0, M).tolist() == [1, 7, 3, M, 5, 6]              # Fast-dLLM: every one >= tau
    assert Threshold(0.9, far=0.999)(s, ids, p, 0, M).tolist() == [1, 7, 3, M, M, 6]   # gap at 3: 4 waits, 5 clears far
    assert Threshold(0.9, far=1.0)(s, ids, p, 0, M).tolist() == [1, 7, 3, M, M, M]     # left to right only
    low = np.array([0.5, 0.1, 0.6, 0.4, 0.3, 0.2])
    assert Threshold(0.9, far=0.999)(s, ids, low, 0, M).tolist() == [M, 7, 3, M, M, M]  # none clears: the most confident
    order = Threshold(0.9, far=0.999).positions(s, p, 0, M)
    assert order.tolist() == [5, 0, 2]                                                  # most confident first (SPD's drafts)
    assert Threshold(0.9, far=0.999).positions(s, p, 0, M, tau=0.96).tolist() == [5]   # a draft tau raises far's floor too


def test_lead_threshold_is_the_leftmost_masked_positions_bar():
    s = np.array([7, M, M, M, M, M])
    ids = np.array([1, 2, 3, 4, 5, 6])
    p = np.array([0.1, 0.8, 0.95, 0.5, 0.9999, 0.97])
    assert Threshold(0.9, far=0.999)(s, ids, p, 0, M).tolist() == [7, M, M, M, 5, M]          # 1 is the gap
    assert Threshold(0.9, far=0.999, lead=0.7)(s, ids, p, 0, M).tolist() == [7, 2, 3, M, 5, M]  # 1 clears 0.7: gap at 3
    assert Threshold(0.9, far=0.999, lead=0.85)(s, ids, p, 0, M).tolist() == [7, M, M, M, 5, M]
    assert Threshold(0.9, lead=0.7)(s, ids, p, 0, M).tolist() == [7, 2, 3, M, 5, 6]             # no far: lead, then >= tau
    assert Threshold(0.9, lead=0.0)(s, ids, np.full(6, 0.01), 0, M).tolist() == [7, 2, M, M, M, M]   # 0: always the leftmost
    # only the leftmost masked position: 2 at 0.8 is not leftmost once 1 is committed
    s2 = np.array([7, 9, M, M, M, M])
    p2 = np.array([0.1, 0.1, 0.8, 0.5, 0.2, 0.3])
    assert Threshold(0.9, lead=0.7)(s2, ids, p2, 0, M).tolist() == [7, 9, 3, M, M, M]
    p3 = np.array([0.1, 0.1, 0.6, 0.8, 0.2, 0.3])
    assert Threshold(0.9, lead=0.7)(s2, ids, p3, 0, M).tolist() == [7, 9, M, 4, M, M]           # none: the most confident
    # a draft tau (SPD): lead still lowers the leftmost bar, and never raises one
    assert Threshold(0.9, far=0.999).positions(s, p, 0, M, tau=0.85).tolist() == [4]
    assert Threshold(0.9, far=0.999, lead=0.7).positions(s, p, 0, M, tau=0.85).tolist() == [4, 2, 1]
    assert Threshold(0.9, far=0.999, lead=0.7).positions(s, p, 0, M, tau=0.6).tolist() == [4, 2, 1]


def test_threshold_floor_over_the_threshold_is_refused():
    from dllm_deploy.errors import UserError
    from dllm_deploy.runtime.api import decode_config
    assert decode_config(strategy="threshold", threshold=0.95, threshold_floor=0.7).threshold_floor == 0.7
    with pytest.raises(UserError, match="threshold floor"):
        decode_config(strategy="threshold", threshold=0.8, threshold_floor=0.9)


def test_tree_presets_hand_drawn():
    t = make_tree("chain", 4)
    assert t.parents == (-1, 0, 1, 2) and t.kinds == (CHAIN,) * 4
    b = make_tree("binary", 5)
    assert b.parents == (-1, 0, 0, 1, 1)
    assert b.kinds == (CHAIN, CHAIN, RUNNER_UP, CHAIN, RUNNER_UP)
    w = make_tree("wide", 6)
    assert w.parents == (-1, 0, 0, 0, 1, 4)
    assert w.kinds == (CHAIN, CHAIN, RUNNER_UP, CONSERVATIVE, CHAIN, CHAIN)
    assert node_depths(w) == [0, 1, 1, 1, 2, 3]
    f = make_tree("fork", 5)
    assert f.parents == b.parents and f.kinds == (CHAIN, CHAIN, ALT_POSITION, CHAIN, ALT_POSITION)
    assert make_tree("chain", 1).parents == (-1,)
    with pytest.raises(ValueError):
        make_tree("bushy", 3)


def test_drafter_chain_and_runner_up():
    spec = make_tree("binary", 3)          # node0, chain child, runner-up child
    s = np.array([M, M, M])
    top_ids = np.array([[1, 11], [2, 12], [3, 13]])
    top_p = np.array([[0.3, 0.2], [0.9, 0.05], [0.6, 0.3]])
    nodes = Drafter(Vanilla(1), M).draft(spec, s, top_ids, top_p, 0)
    assert nodes[0].tolist() == [M, 2, M]        # base rule: most confident position
    assert nodes[1].tolist() == [M, 2, 3]        # chain: next most confident on stale f
    assert nodes[2].tolist() == [M, 2, 13]       # runner-up token at the chain's position


def test_fork_leaves_take_the_next_position_in_the_stale_ranking():
    spec = make_tree("fork", 3)            # node0, chain child, alt-position child
    s = np.array([M, M, M, M])
    top_ids = np.array([[1, 11], [2, 12], [3, 13], [4, 14]])
    top_p = np.array([[0.3, 0.2], [0.9, 0.05], [0.6, 0.3], [0.5, 0.1]])
    nodes = Drafter(Vanilla(1), M).draft(spec, s, top_ids, top_p, 0)
    assert nodes[0].tolist() == [M, 2, M, M]     # base rule: most confident position
    assert nodes[1].tolist() == [M, 2, 3, M]     # chain: the next one (0.6)
    assert nodes[2].tolist() == [M, 2, M, 4]     # alt-position: the one after it (0.5) instead
    # threshold drafts: the least confident position of the drafted set gives way to the next
    thr = Drafter(Threshold(0.9), M, draft_tau=0.55).draft(spec, s, top_ids, top_p, 0)
    assert thr[1].tolist() == [M, 2, 3, M] and thr[2].tolist() == [M, 2, M, 4]


def test_threshold_drafts_default_to_the_threshold():
    from dllm_deploy.runtime.strategies import DecodeConfig, Policy
    s = np.full(4, M)
    top_ids = np.array([[1, 11], [2, 12], [3, 13], [4, 14]])
    top_p = np.array([[0.95, 0.0], [0.85, 0.1], [0.6, 0.3], [0.3, 0.2]])
    for draft_tau, child in ((None, [1, 2, M, M]), (0.5, [1, 2, 3, M])):
        pol = Policy(DecodeConfig(strategy="spd", base="threshold", threshold=0.9, beam_width=2, draft_tau=draft_tau), M)
        nodes, _ = pol.plan(s, top_ids, top_p, 0)
        assert nodes[0].tolist() == [1, M, M, M]       # node 0: the rule at tau 0.9
        # the chain child: nothing else >= 0.9 -> the single most confident; at 0.5 -> both above it
        assert nodes[1].tolist() == child


def test_draft_scores_and_pruning_hand_drawn():
    from dllm_deploy.runtime.strategies import draft_scores, prune
    s = np.array([M, M, M, M])
    top_ids = np.array([[1, 11], [2, 12], [3, 13], [4, 14]])
    top_p = np.array([[0.5, 0.4], [0.9, 0.05], [0.8, 0.1], [0.2, 0.1]])
    nodes = np.array([[M, 2, M, M],        # 0: base step
                      [M, 2, 3, M],        # 1: chain child of 0
                      [M, 2, 13, M],       # 2: runner-up child of 0
                      [1, 2, 3, M],        # 3: chain child of 1
                      [11, 2, 3, M]])      # 4: runner-up child of 1
    got = draft_scores(nodes, s, top_ids, top_p, M)
    want = np.log([0.9, 0.9 * 0.8, 0.9 * 0.1, 0.9 * 0.8 * 0.5, 0.9 * 0.8 * 0.4])
    assert np.allclose(got, want)
    # keep 3: node 0, then the two best others (1: 0.72, 3: 0.36) -- 2 (0.09) and 4 (0.29) go
    assert prune(nodes, s, top_ids, top_p, M, 3) == [0, 1, 3]
    assert prune(nodes, s, top_ids, top_p, M, 5) == [0, 1, 2, 3, 4]
    assert prune(nodes, s, top_ids, top_p, M, 1) == [0]


def test_policy_prunes_candidates_to_the_beam_width():
    from dllm_deploy.runtime.strategies import DecodeConfig, Policy
    cfg = DecodeConfig(strategy="spd", select="threshold", beam_width=3, tree="binary", candidates=7)
    pol = Policy(cfg, M)
    s = np.full(8, M)
    rng = np.random.default_rng(0)
    top_ids = rng.integers(0, 50, size=(8, 2))
    top_p = np.sort(rng.random((8, 2)), axis=1)[:, ::-1]
    nodes, tree = pol.plan(s, top_ids, top_p, 0)
    parents = tree.parents
    assert nodes.shape == (3, 8) and parents[0] == -1
    assert all(0 <= p < i for i, p in enumerate(parents) if i)          # a tree: parents come first
    for i, p in enumerate(parents[1:], 1):                              # each child extends its parent
        assert ((nodes[p] == M) | (nodes[i] == nodes[p]) | (nodes[p] != M) & (nodes[i] != M)).all()
        assert (nodes[i] != M).sum() > (nodes[p] != M).sum()
    unpruned = Policy(DecodeConfig(strategy="spd", select="threshold", beam_width=3, tree="binary"), M)
    assert unpruned.plan(s, top_ids, top_p, 0)[1] == unpruned.spec


def test_candidates_only_for_the_lossy_mode():
    from dllm_deploy.errors import UserError
    from dllm_deploy.runtime.api import decode_config
    assert decode_config(strategy="spd", select="threshold", candidates=8).candidates == 8
    for bad in (dict(strategy="vanilla", candidates=8), dict(strategy="spd", select="lossless", candidates=8),
                dict(strategy="spd", select="threshold", candidates=-1)):
        with pytest.raises(UserError):
            decode_config(**bad)


def test_lead_threshold_above_the_threshold_is_refused():
    from dllm_deploy.errors import UserError
    from dllm_deploy.runtime.api import decode_config
    assert decode_config(strategy="threshold", threshold=0.9, threshold_lead=0.9).threshold_lead == 0.9
    assert decode_config(strategy="threshold", threshold=0.9, threshold_lead=0.0).threshold_lead == 0.0
    with pytest.raises(UserError, match="lead threshold"):
        decode_config(strategy="threshold", threshold=0.9, threshold_lead=0.95)


def test_far_threshold_below_the_threshold_is_refused():
    from dllm_deploy.errors import UserError
    from dllm_deploy.runtime.api import decode_config
    assert decode_config(strategy="threshold", threshold=0.9, threshold_far=0.9).threshold_far == 0.9
    with pytest.raises(UserError, match="far threshold"):
        decode_config(strategy="threshold", threshold=0.9, threshold_far=0.8)


def _positions_reference(rule: Threshold, state, probs, step, mask_id, tau=None):
    """Threshold.positions as first written (one bar array, the ranking filtered): the vectorised
    rule must take the same positions in the same order."""
    ranked = np.flatnonzero(state == mask_id)
    ranked = ranked[np.argsort(-probs[ranked], kind="stable")]
    if ranked.size == 0:
        return ranked
    t = rule.tau_at(step, int(ranked.size)) if tau is None else tau
    p = probs[ranked]
    if rule.lead is None and rule.far is None:
        return ranked[:max(1, int((p >= t).sum()))]
    bar = np.full(p.shape, t, dtype=p.dtype)
    if rule.lead is not None:
        bar[ranked == ranked.min()] = min(rule.lead, t)
    if rule.far is None:
        keep = p >= bar
    else:
        below = ranked[p < bar]
        gap = below.min() if below.size else state.shape[0]
        keep = ((ranked < gap) & (p >= bar)) | (p >= max(rule.far, t))
    return ranked[keep] if keep.any() else ranked[:1]


def test_threshold_positions_match_the_reference_on_random_states():
    """Ties, probabilities one float32 step either side of each bar, float32 and float64, draft
    taus, schedules: the same positions, most confident first."""
    rng = np.random.default_rng(0)
    rules = [Threshold(t, s, far, lead) for t in (0.3, 0.7, 0.9, 0.99) for far in (None, 0.7, 0.95, 0.999)
             for lead in (None, 0.5, 0.7, 0.95)
             for s in (None, ThresholdSchedule(init=t, decay=0.97, floor=0.6, end_tokens=2))]
    edges = [y for x in (0.3, 0.5, 0.6, 0.7, 0.9, 0.95, 0.99, 0.999) for f in [np.float32(x)]
             for y in (f, np.nextafter(f, np.float32(0)), np.nextafter(f, np.float32(1)))]
    for i in range(6000):
        n = int(rng.integers(1, 12))
        state = np.where(rng.random(n) < 0.6, M, rng.integers(0, 50, n)).astype(np.int64)
        dtype = np.float64 if i % 5 == 0 else np.float32
        probs = rng.choice(np.array(edges + list(rng.random(4)), dtype=dtype), n)
        rule, step = rules[i % len(rules)], int(rng.integers(0, 5))
        tau = None if i % 3 else float(rng.choice([0.5, 0.9, 0.99]))
        want = _positions_reference(rule, state, probs, step, M, tau)
        got = rule.positions(state, probs, step, M, tau)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), (rule, state.tolist(), probs.tolist(), tau)


def test_drafter_full_block_every_node_is_the_state():
    """A row whose block is full (waiting for the others) drafts its state at every node."""
    s = np.array([1, 2, 3, 4])
    top_ids, top_p = np.array([[5, 6]] * 4), np.array([[0.9, 0.1]] * 4)
    for rule in (Vanilla(1), Threshold(0.9, far=0.99, lead=0.5)):
        for preset in ("chain", "binary", "wide", "fork"):
            nodes = Drafter(rule, M).draft(make_tree(preset, 4), s, top_ids, top_p, 0)
            assert nodes.tolist() == [s.tolist()] * 4
