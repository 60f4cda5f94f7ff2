"""Decision traces: what each step of the decode loop decided and how close it came to deciding
otherwise (``generate --trace``; the C++ runtime writes the same records, cpp/src/trace.cpp).

Two machines (x86-64 and arm64, or two providers) compute the same model with different kernels,
so their probabilities differ in the last bits. Where a decision's margin is smaller than that
difference the two may decide differently; a differing decision with a wide margin is a bug. One
record per row and loop iteration (JSON, docs/cpp.md "What 'the same model' means"):

    {"row": 0, "block": 0, "step": 3, "forward": 4,      # the row's rule step in the block; its
                                                         # forwards so far (the last one's f is used)
     "commit": [[5, 812], [6, 97]],                      # node 0: [position, id], ascending position
     "margin": 0.031,                                    # node 0's decision margin (null: none to take)
     "drafts": [0.2, 0.004],                             # SPD: nodes 1..W-1, each draft's margin on f(S)
     "accepted": 2,                                      # rule steps the verify forward accepted
     "checks": [0.12, 0.0007]}                           # SPD: the margin of each check on the path

A decision's margin is the smallest of
- which token: top-1 minus top-2 probability at each position it commits;
- which positions, vanilla: the probability of the last position taken minus that of the first
  left (the k-th and (k+1)-th most confident masked positions);
- which positions, threshold: |p - bar| at each masked position (bar: tau, the lead bar at the
  leftmost masked position, the far bar past the first one below its bar), and when none clears its
  bar (the most confident is taken) the first minus the second most confident;
- a draft of kind "conservative" takes the most confident position: first minus second. The other
  kinds derive from the chain step, whose margin they get.
SPD's checks: lossless, the base rule's decision on f(node) at each node the selection stood on;
lossy, each child it tried: |p - tau| and top-1 minus top-2 at the positions that child drafted.
Margins are computed in double from the float32 probabilities the rule compares (bars as float32).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .rules import Threshold, Vanilla, _ranked_masked
from .tree import CONSERVATIVE, node_depths

INF = math.inf


def _token_margin(probs: np.ndarray, take) -> float:
    """min over ``take`` of top-1 minus top-2 probability; probs (L,K)."""
    if probs.shape[1] < 2 or not len(take):
        return INF
    return min(float(probs[j, 0]) - float(probs[j, 1]) for j in take)


def _order_margin(p: np.ndarray, ranked: np.ndarray, n: int) -> float:
    """The n-th most confident masked position's probability minus the (n+1)-th's (inf when all taken)."""
    return float(p[ranked[n - 1]]) - float(p[ranked[n]]) if 0 < n < ranked.size else INF


def _threshold_margin(rule: Threshold, state, p: np.ndarray, step: int, mask_id: int, tau) -> float:
    pos = np.flatnonzero(state == mask_id)
    t = rule.tau_at(step, int(pos.size)) if tau is None else tau
    pl = p[pos].tolist()
    bars, far = rule.bars(t, len(pl), p.dtype)                  # the rule's own bars
    if far is None:
        out = min(abs(x - b) for x, b in zip(pl, bars))
        none = not any(x >= b for x, b in zip(pl, bars))
    else:       # left to right up to the first position below its bar, past it at the far bar
        gap = next((j for j, (x, b) in enumerate(zip(pl, bars)) if x < b), len(pl))
        out = min(min((abs(x - b) for x, b in zip(pl[:gap + 1], bars)), default=INF),
                  min((abs(x - far) for x in pl[gap:]), default=INF))
        none = gap == 0 and not any(x >= far for x in pl)
    if none:                                                   # the most confident is taken
        out = min(out, _order_margin(p, _ranked_masked(state, p, mask_id), 1))
    return out


def decision_margin(rule, state: np.ndarray, probs: np.ndarray, step: int, mask_id: int, tau=None,
                    conservative: bool = False) -> float:
    """The margin of ``rule``'s decision on ``state`` (L,) given top-k probabilities ``probs`` (L,K)
    (``tau``: a threshold rule's tau at this step, as ``positions`` takes it); inf when no position
    is masked."""
    p = probs[:, 0]
    ranked = _ranked_masked(state, p, mask_id)
    if ranked.size == 0:
        return INF
    if conservative:
        return min(_order_margin(p, ranked, 1), _token_margin(probs, ranked[:1]))
    take = rule.positions(state, p, step, mask_id, tau)
    if isinstance(rule, Vanilla):
        where = _order_margin(p, ranked, len(take))
    else:
        where = _threshold_margin(rule, state, p, step, mask_id, tau)
    return min(where, _token_margin(probs, take))


def _json(x: float):
    return None if x == INF else x


class Tracer:
    """Builds the records of one decode call from the loop's plan and select and hands each, a
    dict, to ``sink`` once its iteration is over."""

    def __init__(self, policy, sink):
        self.policy, self.sink = policy, sink
        self.open: dict[int, dict] = {}           # batch index -> this iteration's record

    def plan(self, r: int, row: int, block: int, step: int, forward: int, state, f_probs, nodes, spec) -> None:
        """Row ``r`` (prompt ``row``) committed node 0 of ``nodes`` (W,L) drafted from ``state`` and
        f(state)'s probabilities ``f_probs`` (L,K)."""
        pol, m = self.policy, self.policy.mask_id
        new = np.flatnonzero(nodes[0] != state)
        # node 0's rule, as Drafter.draft takes it (lossy mode: a threshold at the scheduled tau)
        rule = replace(pol.rule, tau=pol._tau(step, state), schedule=None) if pol.lossy else pol.rule
        rec = {"row": row, "block": block, "step": step, "forward": forward,
               "commit": [[int(j), int(nodes[0, j])] for j in new],
               "margin": _json(decision_margin(rule, state, f_probs, step, m))}
        if spec.width > 1:
            depths, draft_tau = node_depths(spec), pol.drafter.draft_tau
            rec["drafts"] = [_json(decision_margin(pol.rule, nodes[spec.parents[i]], f_probs, step + depths[i], m,
                                                   draft_tau, conservative=spec.kinds[i] == CONSERVATIVE))
                             for i in range(1, spec.width)]
        self.open[r] = rec

    def select(self, r: int, nodes, spec, f_probs, step: int, cur: int, steps: int) -> None:
        """Row ``r``'s selection reached node ``cur`` (``steps`` rule steps) on f(nodes)'s
        probabilities ``f_probs`` (W,L,K)."""
        rec = self.open[r]
        rec["accepted"] = int(steps)
        if spec.width > 1:
            rec["checks"] = [_json(x) for x in self._checks(nodes, spec, f_probs, step, cur)]

    def _checks(self, nodes, spec, f_probs, step: int, cur: int) -> list[float]:
        """The margin of each check ``Policy.select`` made on its way to ``cur``."""
        pol, m = self.policy, self.policy.mask_id
        path = [cur]
        while spec.parents[path[-1]] >= 0:
            path.append(spec.parents[path[-1]])
        path.reverse()
        depths, out = node_depths(spec), []
        for i, node in enumerate(path):
            kids = spec.children(node)
            if not kids or not (nodes[node] == m).any():
                break
            at = step + depths[node] + 1
            if not pol.lossy:
                out.append(decision_margin(pol.rule, nodes[node], f_probs[node], at, m))
                continue
            tau = float(np.float32(pol._tau(at, nodes[node])))
            masked = nodes[node] == m
            nxt = path[i + 1] if i + 1 < len(path) else None
            for c in sorted(kids, key=lambda c: -int((nodes[c] != m).sum())):
                drafted = np.flatnonzero(masked & (nodes[c] != m))
                if drafted.size:
                    fp = f_probs[node]
                    out.append(min(min(abs(float(fp[j, 0]) - tau) for j in drafted), _token_margin(fp, drafted)))
                if c == nxt:
                    break
        return out

    def flush(self) -> None:
        """The iteration is over: its records, in batch order, to the sink."""
        for r in sorted(self.open):
            self.sink(self.open[r])
        self.open.clear()


DECISIONS = ("row", "block", "step", "forward", "commit", "accepted")   # what a record decided


def narrowest(record: dict) -> float:
    """The narrowest margin a record holds (node 0's, its drafts', its checks'); inf: none."""
    ms = [record["margin"], *record.get("drafts", []), *record.get("checks", [])]
    return min((m for m in ms if m is not None), default=INF)


def first_difference(a: list[dict], b: list[dict]) -> dict | None:
    """Where two traces of one decode (two machines, two providers) first decide differently: the
    record's index, both records and the narrowest margin on each side; None when every decision
    is the same. Margins are not compared: they differ in the last bits between kernels."""
    for i, (x, y) in enumerate(zip(a, b)):
        if any(x.get(k) != y.get(k) for k in DECISIONS):
            return {"record": i, "margin_a": narrowest(x), "margin_b": narrowest(y), "a": x, "b": y}
    if len(a) != len(b):
        raise ValueError("one trace ends before the other with every decision the same (not one decode's traces)")
    return None


def margin_drift(a: list[dict], b: list[dict]) -> float:
    """The largest difference between two traces' margins over the records where they decide alike."""
    out = 0.0
    for x, y in zip(a, b):
        if any(x.get(k) != y.get(k) for k in DECISIONS):
            break
        for k in ("margin", "drafts", "checks"):
            u, v = x.get(k), y.get(k)
            for m, n in zip(u if isinstance(u, list) else [u], v if isinstance(v, list) else [v]):
                if m is not None and n is not None:
                    out = max(out, abs(m - n))
    return out
