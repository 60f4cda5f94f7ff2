"""SPD tree specs and branch drafting (pure numpy, no model calls).

A tree spec lists W nodes; ``parents[i]`` is node i's parent (-1: the current block state S),
``kinds[i]`` how node i is drafted from its parent:

    0  chain        the draft rule applied on the stale predictions f(S)
    1  runner-up    as 0, but the first newly committed position takes its runner-up token
    2  conservative as 0 with the rule's most conservative step (one token: the most confident)
    3  alt-position as 0, but the least confident position it would take gives way to the next one
                    in the stale ranking (vanilla: the runner-up position instead of the first)

Node 0 is always ``R(S, f(S))`` — the base rule's true next state, known exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ..options import PRESETS
from .rules import _ranked_masked, commit

CHAIN, RUNNER_UP, CONSERVATIVE, ALT_POSITION = 0, 1, 2, 3
DEFAULT_TREE = "fork"   # the best measured on the core-vocabulary weights (lab/tiny-core; docs/algorithms.md)


@dataclass(frozen=True)
class TreeSpec:
    parents: tuple[int, ...]
    kinds: tuple[int, ...]

    @property
    def width(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]


def make_tree(preset: str, width: int) -> TreeSpec:
    """Named tree presets of ``width`` nodes.

    chain   0 <- 1 <- 2 <- ...                                  (depth W)
    binary  each chain node gets a chain child and a runner-up child (alternatives are leaves)
    wide    node 0 gets a chain, a runner-up and a conservative child; then a chain
    fork    as binary, with alt-position leaves: for a confident model the drafted tokens are
            right and the ORDER of near-certain positions is what a chain guesses wrong
    """
    if width < 1:
        raise ValueError("beam width must be >= 1")
    parents, kinds = [-1], [CHAIN]
    if preset == "chain":
        for i in range(1, width):
            parents.append(i - 1)
            kinds.append(CHAIN)
    elif preset in ("binary", "fork"):
        leaf = RUNNER_UP if preset == "binary" else ALT_POSITION
        tip = 0
        while len(parents) < width:
            parents.append(tip)
            kinds.append(CHAIN)
            new_tip = len(parents) - 1
            if len(parents) < width:
                parents.append(tip)
                kinds.append(leaf)
            tip = new_tip
    elif preset == "wide":
        for k in (CHAIN, RUNNER_UP, CONSERVATIVE):
            if len(parents) < width:
                parents.append(0)
                kinds.append(k)
        tip = 1
        while len(parents) < width:
            parents.append(tip)
            kinds.append(CHAIN)
            tip = len(parents) - 1
    else:
        raise ValueError(f"unknown tree preset {preset!r} (expected one of {', '.join(PRESETS)})")
    return TreeSpec(tuple(parents), tuple(kinds))


@lru_cache(maxsize=256)
def node_depths(spec: TreeSpec) -> list[int]:
    """Depth of each node (node 0: 0). Cached (do not mutate the list): the decode loop asks
    once per verification."""
    d: list[int] = []
    for p in spec.parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


class Drafter:
    """Drafts the W block states of a tree from S and its (stale) predictions f(S).

    ``rule`` is the base rule (node 0 uses it exactly); ``draft_tau`` is the threshold that
    chain children use for the threshold base and the lossy mode (more aggressive than tau:
    confidences rise as neighbours are filled)."""

    def __init__(self, rule, mask_id: int, draft_tau: float | None = None):
        self.rule, self.mask_id = rule, mask_id
        self.draft_tau = draft_tau

    def _step(self, parent, ids, probs, step, kind):
        m = self.mask_id
        ranked = _ranked_masked(parent, probs, m)
        if ranked.size == 0:
            return parent.copy(), ranked
        if kind == CONSERVATIVE:
            take = ranked[:1]
        else:
            take = self.rule.positions(parent, probs, step, m, tau=self.draft_tau)
        if kind == ALT_POSITION and take.size < ranked.size:
            # the least confident taken position gives way to the most confident one not taken
            # (with a far threshold the taken set need not be a prefix of the ranking)
            take = np.concatenate([take[:-1], ranked[~np.isin(ranked, take)][:1]])
        child = commit(parent, ids, take)
        return child, take

    def draft(self, spec: TreeSpec, state, top_ids, top_probs, step: int, tau_now=None):
        """W drafted states (W, L). top_ids/top_probs (L, K) are f(S)."""
        ids1, p1 = top_ids[:, 0], top_probs[:, 0]
        rule = self.rule if tau_now is None else replace(self.rule, tau=tau_now, schedule=None)   # lossy: a Threshold
        take = rule.positions(state, p1, step, self.mask_id)       # node 0: the rule's step, commit(S, take)
        nodes = np.empty((spec.width, state.shape[0]), dtype=state.dtype)
        nodes[:] = state
        nodes[0, take] = ids1[take]
        if spec.width == 1 or not take.size:     # one node, or a full block (nothing to take): every node is S
            return nodes
        depths = node_depths(spec)
        for i in range(1, spec.width):
            parent = nodes[spec.parents[i]]
            child, take = self._step(parent, ids1, p1, step + depths[i], spec.kinds[i])
            if spec.kinds[i] == RUNNER_UP and take.size and top_ids.shape[1] > 1:
                child[take[0]] = top_ids[take[0], 1]
            nodes[i] = child
        return nodes
