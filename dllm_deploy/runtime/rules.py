"""Base commit rules: what one denoising step commits in a block, given the model's predictions.

A rule maps (block state, per-position top-1 ids and probabilities, step index) to the next
block state. Rules are pure numpy on one row: ``state`` (L,) int64 with ``mask_id`` where a
position is still masked; ``ids`` / ``probs`` (L,) the top-1 prediction per position.
Ties in confidence go to the lower position (stable order), so every backend and the C++ port
commit the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _ranked_masked(state: np.ndarray, probs: np.ndarray, mask_id: int) -> np.ndarray:
    """Masked positions, most confident first (stable: lower position wins a tie)."""
    pos = np.flatnonzero(state == mask_id)
    return pos[np.argsort(-probs[pos], kind="stable")]


def commit(state: np.ndarray, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    out = state.copy()
    out[positions] = ids[positions]
    return out


@dataclass(frozen=True)
class Vanilla:
    """LLaDA low-confidence remasking: commit the k most confident masked positions per step.

    ``steps`` (per block) follows LLaDA's ``get_num_transfer_tokens``: with m masked positions at
    the block start and s steps, step i commits m // s tokens, plus one for the first m % s steps.
    ``steps=None`` means ``tokens_per_step`` (k) every step; k = 1 is the quality gold standard.
    """
    tokens_per_step: int = 1
    steps: int | None = None
    name: str = "vanilla"

    def count(self, block_len: int, step: int) -> int:
        if self.steps is None:
            return self.tokens_per_step
        base, rem = divmod(block_len, self.steps)
        return base + (1 if step < rem else 0)

    def __call__(self, state, ids, probs, step, mask_id):
        return commit(state, ids, self.positions(state, probs, step, mask_id))

    def positions(self, state, probs, step, mask_id, tau: float | None = None) -> np.ndarray:
        """The masked positions this step commits, most confident first (``tau``: unused, as in
        ``Threshold.positions``)."""
        return _ranked_masked(state, probs, mask_id)[:max(1, self.count(len(state), step))]


@dataclass(frozen=True)
class Threshold:
    """Fast-dLLM confidence-aware parallel decoding: commit every masked position whose top-1
    probability is >= tau, and always at least the most confident one. With a ``schedule`` tau
    is dynamic: ``schedule.tau(step, masked positions left)`` (a pure function of the state and
    the step, so lossless SPD over this rule stays exact).

    ``far`` (None: tau) is the bar for a masked position to the right of the first masked position
    below tau: positions are taken left to right while they clear tau, past that gap only at
    ``far`` (and the most confident one when none qualifies). A character placed beyond an
    unresolved one is where a small model's parallel step goes wrong (a variable-length field
    shifts the rest of the block, docs/distill.md); a near-certain tail (the end-of-text padding)
    still commits at once.

    ``lead`` (None: tau) is the bar for the leftmost masked position, every position before it
    committed: there the model predicts with its whole left context, as an autoregressive step
    would, and on the core-vocabulary weights (lab/tiny-core) a bar of 0.7 there kept
    vanilla's accuracy at 25% more tokens per forward (docs/algorithms.md). Above the step's tau
    it has no effect."""
    tau: float = 0.9
    schedule: "ThresholdSchedule | None" = None
    far: float | None = None
    lead: float | None = None
    name: str = "threshold"

    def __call__(self, state, ids, probs, step, mask_id):
        return commit(state, ids, self.positions(state, probs, step, mask_id))

    def positions(self, state, probs, step, mask_id, tau: float | None = None) -> np.ndarray:
        """The masked positions this step commits, most confident first. ``tau`` overrides the
        rule's tau at this step (SPD's drafts); ``far`` stays at least that tau. The decode loop
        calls this once per row and forward: a handful of numpy calls, the rest on a short list."""
        pos = (state == mask_id).nonzero()[0]                    # masked positions, left to right
        if pos.size == 0:
            return pos
        t = self.tau_at(step, int(pos.size)) if tau is None else tau
        p = probs[pos]
        order = (-p).argsort(kind="stable")                      # most confident first (ties: lower position)
        if self.lead is None and self.far is None:
            return pos[order[:max(1, int(np.count_nonzero(p >= t)))]]
        pl = p.tolist()
        bars, far = self.bars(t, len(pl), p.dtype)
        ok = [x >= b for x, b in zip(pl, bars)]                 # (M,) left to right: clears its bar
        if far is not None and False in ok:
            gap = ok.index(False)                                # the first masked position below its bar
            ok[gap:] = [x >= far for x in pl[gap:]]
        keep = [j for j in order.tolist() if ok[j]]
        return pos[keep] if keep else pos[order[:1]]

    def bars(self, t: float, n: int, dtype=np.float32) -> tuple[list[float], float | None]:
        """The bars of ``n`` masked positions (left to right) at tau ``t``, in the probabilities'
        precision (as in C++; float32 values and bars compare the same as Python floats): tau, the
        leftmost at ``min(lead, t)``; and the far bar past the first position below its bar (None:
        no far bar)."""
        bar = lambda x: float(np.dtype(dtype).type(x))            # noqa: E731
        bars = [bar(t)] * n
        if self.lead is not None and n:
            bars[0] = bar(min(self.lead, t))
        return bars, None if self.far is None else bar(max(self.far, t))

    def tau_at(self, step: int, masked_left: int) -> float:
        """tau at this step of a block with ``masked_left`` masked positions."""
        return self.tau if self.schedule is None else self.schedule.tau(step, masked_left)


@dataclass(frozen=True)
class ThresholdSchedule:
    """The dynamic threshold of SPD's lossy mode ("confidence game", DESIGN §2).

    tau starts high (``init``), is multiplied by ``decay`` every step of a block down to ``floor``,
    and is ``init`` again once ``end_tokens`` or fewer masked positions remain in the last block
    of the budget or the block (the tail is where a wrong token ends the answer).
    """
    init: float = 0.93
    decay: float = 0.97
    floor: float = 0.85
    end_tokens: int = 2

    def tau(self, step: int, masked_left: int) -> float:
        if masked_left <= self.end_tokens:
            return self.init
        return max(self.floor, self.init * self.decay ** step)
