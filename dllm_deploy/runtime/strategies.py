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
from .tree import Drafter, TreeSpec, make_tree, node_depths

STRATEGIES = ("vanilla", "threshold", "spd")
SELECTS = ("lossless", "threshold")


@dataclass
class DecodeConfig:
    strategy: str = "vanilla"         # vanilla | threshold | spd
    gen_length: int = 256             # token budget per prompt (rounded up to whole blocks)
    block_length: int = 32            # L: positions denoised together
    tokens_per_step: int = 1          # vanilla: k tokens committed per step
    steps: int | None = None          # vanilla: LLaDA steps over gen_length (overrides k)
    threshold: float = 0.9            # threshold rule tau (and the spd threshold base)
    beam_width: int = 4               # spd: W drafted block states verified per forward
    tree: str = "chain"               # spd: tree preset (chain | binary | wide)
    select: str = "lossless"          # spd: lossless | threshold (lossy, dynamic tau)
    base: str = "vanilla"             # spd lossless: the rule it reproduces (vanilla | threshold)
    draft_tau: float = 0.5            # spd: threshold chain drafts use (threshold base, lossy mode)
    schedule: ThresholdSchedule = field(default_factory=ThresholdSchedule)  # lossy mode's tau
    cache: str = "auto"               # none | prefix | dual | exact | auto (exact if block-causal)
    topk: int = 2                     # ids/probabilities the verifier returns per position


class Policy:
    """plan/select over one block row. ``width`` = nodes per verification."""

    def __init__(self, cfg: DecodeConfig, mask_id: int):
        self.cfg, self.mask_id = cfg, mask_id
        blocks = max(1, -(-cfg.gen_length // cfg.block_length))
        if cfg.strategy == "vanilla" or (cfg.strategy == "spd" and cfg.base == "vanilla" and cfg.select == "lossless"):
            steps = None if cfg.steps is None else max(1, cfg.steps // blocks)
            self.rule = Vanilla(cfg.tokens_per_step, steps)
        else:
            self.rule = Threshold(cfg.threshold)
        self.lossy = cfg.strategy == "spd" and cfg.select == "threshold"
        width = cfg.beam_width if cfg.strategy == "spd" else 1
        self.spec: TreeSpec = make_tree(cfg.tree if cfg.strategy == "spd" else "chain", width)
        self.depths = node_depths(self.spec)
        self.drafter = Drafter(self.rule, mask_id, cfg.draft_tau if cfg.strategy == "spd" else None)

    @property
    def width(self) -> int:
        return self.spec.width

    def _tau(self, step: int, state: np.ndarray) -> float:
        return self.cfg.schedule.tau(step, int((state == self.mask_id).sum()))

    def plan(self, state, top_ids, top_probs, step):
        tau = self._tau(step, state) if self.lossy else None
        return self.drafter.draft(self.spec, state, top_ids, top_probs, step, tau_now=tau)

    def select(self, nodes, f_ids, f_probs, step):
        """(node index, steps accepted). f_ids/f_probs: (W, L, K) = f(node)."""
        m = self.mask_id
        cur, steps = 0, 1
        while (nodes[cur] == m).any():
            kids = self.spec.children(cur)
            if not kids:
                break
            nxt = None
            if self.lossy:
                tau = self._tau(step + self.depths[cur] + 1, nodes[cur])
                masked = nodes[cur] == m
                for c in sorted(kids, key=lambda c: -int((nodes[c] != m).sum())):
                    drafted = masked & (nodes[c] != m)
                    if not drafted.any():
                        continue
                    if (f_ids[cur, drafted, 0] == nodes[c][drafted]).all() and (f_probs[cur, drafted, 0] >= tau).all():
                        nxt = c
                        break
            else:
                truth = self.rule(nodes[cur], f_ids[cur, :, 0], f_probs[cur, :, 0], step + self.depths[cur] + 1, m)
                nxt = next((c for c in kids if np.array_equal(nodes[c], truth)), None)
            if nxt is None:
                break
            cur, steps = nxt, steps + 1
        return cur, steps
