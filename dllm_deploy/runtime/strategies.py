"""Decoding strategies as small policy objects over one loop (DESIGN §2).

Every strategy is the same two verbs per iteration:
    plan(S, f(S))            -> W drafted block states (node 0 = the base rule's next state)
    select(nodes, f(nodes))  -> which node becomes the new S, and how many steps that was
``vanilla`` and ``threshold`` are plans of one node (one step per forward); ``spd`` drafts a
tree of W nodes and accepts as deep as verification allows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .rules import Threshold, ThresholdSchedule, Vanilla
from .tree import DEFAULT_TREE, Drafter, TreeSpec, make_tree, node_depths


@dataclass
class DecodeConfig:
    """The implemented decode options of decode_options.json (names, order and defaults: tests/unit/test_options.py
    checks them), plus ``schedule``, the lossy mode's tau (a structure, not an option)."""
    strategy: str = "vanilla"         # vanilla | threshold | spd
    gen_length: int = 256             # the canvas per prompt (rounded up to whole blocks)
    block_length: int = 32            # L: positions denoised together
    tokens_per_step: int = 1          # vanilla: k tokens committed per step
    steps: int | None = None          # vanilla: LLaDA steps over gen_length (overrides k)
    threshold: float = 0.9            # threshold rule tau (and the spd threshold base)
    threshold_floor: float | None = None  # threshold rule: dynamic tau's floor (None: fixed tau)
    threshold_far: float | None = None    # threshold rule: tau past the first masked position below tau (None: tau)
    threshold_lead: float | None = None   # threshold rule: tau of the leftmost masked position (None: tau)
    beam_width: int = 4               # spd: W drafted block states verified per forward
    tree: str = DEFAULT_TREE          # spd: tree preset (chain | binary | wide | fork)
    select: str = "lossless"          # spd: lossless | threshold (lossy, dynamic tau)
    base: str = "vanilla"             # spd lossless: the rule it reproduces (vanilla | threshold)
    draft_tau: float | None = None    # spd: threshold chain drafts use (threshold base, lossy mode; None: threshold)
    schedule: ThresholdSchedule = field(default_factory=ThresholdSchedule)  # lossy mode's tau
    cache: str = "auto"               # none | prefix | dual | exact | auto (exact if block-causal)
    topk: int = 2                     # ids/probabilities the verifier returns per position
    candidates: int = 0               # spd lossy: draft this many tree nodes, verify the W most confident (0: W)


def dynamic_schedule(cfg: DecodeConfig) -> ThresholdSchedule | None:
    """The threshold rule's dynamic tau (article §4.3: high early and late, lower in the middle):
    --threshold on a block's first step, x0.97 per step down to --threshold-floor, --threshold again
    for the block's last 2 masked positions. None: a fixed tau."""
    if cfg.threshold_floor is None:
        return None
    return ThresholdSchedule(init=cfg.threshold, decay=0.97, floor=cfg.threshold_floor, end_tokens=2)


class Policy:
    """plan/select over one block row. ``width`` = nodes per verification."""

    def __init__(self, cfg: DecodeConfig, mask_id: int):
        self.cfg, self.mask_id = cfg, mask_id
        blocks = max(1, -(-cfg.gen_length // cfg.block_length))
        if cfg.strategy == "vanilla" or (cfg.strategy == "spd" and cfg.base == "vanilla" and cfg.select == "lossless"):
            steps = None if cfg.steps is None else max(1, cfg.steps // blocks)
            self.rule = Vanilla(cfg.tokens_per_step, steps)
        else:
            self.rule = Threshold(cfg.threshold, dynamic_schedule(cfg), cfg.threshold_far, cfg.threshold_lead)
        self.lossy = cfg.strategy == "spd" and cfg.select == "threshold"
        width = cfg.beam_width if cfg.strategy == "spd" else 1
        self.spec: TreeSpec = make_tree(cfg.tree if cfg.strategy == "spd" else "chain", width)
        # lossy mode with pruning: draft a larger tree, verify the `width` most confident nodes
        self.draft_spec = (make_tree(cfg.tree, cfg.candidates) if self.lossy and cfg.candidates > width
                           else self.spec)
        self.drafter = Drafter(self.rule, mask_id, cfg.draft_tau if cfg.strategy == "spd" else None)

    @property
    def width(self) -> int:
        return self.spec.width

    def _tau(self, step: int, state: np.ndarray) -> float:
        return self.cfg.schedule.tau(step, int((state == self.mask_id).sum()))

    def plan(self, state, top_ids, top_probs, step):
        """W drafted states (W, L) and the tree they form (the fixed spec unless pruned)."""
        tau = self._tau(step, state) if self.lossy else None
        nodes = self.drafter.draft(self.draft_spec, state, top_ids, top_probs, step, tau_now=tau)
        self._check_progress(state, nodes[0])
        if self.draft_spec is self.spec:
            return nodes, self.spec
        keep = prune(nodes, state, top_ids, top_probs, self.mask_id, self.width)
        index = {old: new for new, old in enumerate(keep)}
        spec = TreeSpec(tuple(index.get(self.draft_spec.parents[i], -1) for i in keep),
                        tuple(self.draft_spec.kinds[i] for i in keep))
        return nodes[keep], spec

    def _check_progress(self, state, step0) -> None:
        """Node 0, the base rule's step (which every selection reaches at least), commits a real
        token while the block has a masked position: a block of L positions fills in at most L
        steps. The backends never choose [MASK] (DESIGN §8), so a stuck step is a bug, reported
        rather than looped on."""
        m = self.mask_id
        if (step0 == state).all() and (state == m).any():     # (step0 differs from S only where S is masked)
            raise RuntimeError(f"internal error: a decode step committed no token ({np.count_nonzero(state == m)} "
                               "masked positions left; the predictions there are the mask token)")

    def select(self, nodes, spec: TreeSpec, f_ids, f_probs, step):
        """(node index, steps accepted). f_ids/f_probs: (W, L, K) = f(node)."""
        if spec.width == 1:       # node 0 alone (vanilla, threshold): one step, nothing to walk
            return 0, 1
        m = self.mask_id
        depths = node_depths(spec)
        cur, steps = 0, 1
        while (nodes[cur] == m).any():
            kids = spec.children(cur)
            if not kids:
                break
            nxt = None
            if self.lossy:
                tau = self._tau(step + depths[cur] + 1, nodes[cur])
                masked = nodes[cur] == m
                for c in sorted(kids, key=lambda c: -int((nodes[c] != m).sum())):
                    drafted = masked & (nodes[c] != m)
                    if not drafted.any():
                        continue
                    if (f_ids[cur, drafted, 0] == nodes[c][drafted]).all() and (f_probs[cur, drafted, 0] >= tau).all():
                        nxt = c
                        break
            else:
                truth = self.rule(nodes[cur], f_ids[cur, :, 0], f_probs[cur, :, 0], step + depths[cur] + 1, m)
                nxt = next((c for c in kids if np.array_equal(nodes[c], truth)), None)
            if nxt is None:
                break
            cur, steps = nxt, steps + 1
        return cur, steps


def draft_scores(nodes, state, top_ids, top_probs, mask_id: int) -> np.ndarray:
    """Log draft confidence of each node: the sum of log f(S) probabilities of the tokens it
    drafted into positions masked in S (a runner-up token scores its runner-up probability).
    Children add tokens to their parent, so a score never rises down the tree."""
    masked = state == mask_id
    probs = np.where(nodes[:, :, None] == top_ids[None], top_probs[None], 0.0).max(-1)   # (N,L)
    drafted = masked[None] & (nodes != mask_id)
    return np.where(drafted, np.log(np.maximum(probs, 1e-30)), 0.0).sum(-1)


def prune(nodes, state, top_ids, top_probs, mask_id: int, k: int) -> list[int]:
    """Indices of the k most confident drafted nodes (node 0 always; ties to the lower index),
    in tree order. A parent scores at least its child and comes first, so the kept set is a tree."""
    scores = draft_scores(nodes, state, top_ids, top_probs, mask_id)
    order = sorted(range(1, len(nodes)), key=lambda i: (-scores[i], i))
    return sorted([0] + order[:k - 1])
