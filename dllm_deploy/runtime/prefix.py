"""The rows still decoding: their prefix, their original row numbers, sampling options and the
engine cache.

``PrefixState.run`` is the one place an engine call is made and its results come back; what the
call feeds is a ``canvas.Plan``, built elsewhere, plus the rows' sampling inputs, built here from
the plan's positions and the base-rule step each read column serves (noise.py). Dimension legend
as in canvas.py (K top-k).
"""
from __future__ import annotations

import numpy as np

from .canvas import Plan, Prefix
from .noise import uniforms
from .rows import RowOptions


def demote_excluded(top_i: np.ndarray, top_p: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
    """(B,T,K) top-k of a schema-1 graph, which may choose an excluded id (the mask token, a pad
    distinct from EOS): excluded entries move last at probability 0, the others keep their order
    and probabilities (not renormalised: 1 - p([MASK]) cancels to nothing when the mask is near
    certain). A [MASK] top-1 gives way to the runner-up (K >= 2); a position whose K entries are
    all excluded keeps them, at probability 0, so the rules take it last."""
    bad = np.isin(top_i, ids)
    if not bad.any():
        return top_i, top_p
    order = np.argsort(bad, axis=-1, kind="stable")
    top_i, top_p, bad = (np.take_along_axis(x, order, axis=-1) for x in (top_i, top_p, bad))
    return top_i, np.where(bad, np.float32(0), top_p)


class RowSampling:
    """The rows' sampling options as per-row arrays (B,) that follow the live rows."""

    def __init__(self, options: list[RowOptions]):
        self.seed = np.array([o.seed for o in options], dtype=np.uint64)
        self.request = np.array([o.request for o in options], dtype=np.uint64)
        self.temperature = np.array([o.temperature for o in options], dtype=np.float32)
        self.top_k = np.array([o.top_k for o in options], dtype=np.int64)
        self.top_p = np.array([o.top_p for o in options], dtype=np.float32)

    def take(self, idx: np.ndarray) -> None:
        for name, arr in vars(self).items():
            setattr(self, name, arr[idx])

    def inputs(self, positions: np.ndarray, steps: np.ndarray) -> dict:
        """The graphs' sampling inputs for a call at ``positions`` (B,T) serving ``steps`` (B,T)."""
        u = uniforms(self.seed[:, None], self.request[:, None], positions, steps)
        return {"sample_u": u, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


class PrefixState:
    """The live rows' ``Prefix``, sampling options and engine cache; ``rows[r]`` is live row r's
    original row."""

    def __init__(self, backend, prefix: Prefix, capacity: int = 0, options: list[RowOptions] | None = None):
        """``capacity``: positions of a cache that lives through the whole decode (mode exact);
        0 when the calls bring their own (a refresh's new cache, mode none's scratch ones).
        ``options``: each row's; the calls are greedy (no sampling inputs) when no row samples."""
        self.backend, self.prefix = backend, prefix
        self.rows = np.arange(len(prefix.ids))
        self.cache = backend.new_cache(len(self.rows), capacity) if capacity else None
        self.sampling = RowSampling(options) if options and any(o.sampling for o in options) else None

    def keep(self, live: np.ndarray) -> None:
        """Only the ``live`` rows (B,) bool go on."""
        idx = np.flatnonzero(live)
        if idx.size == len(self.rows):
            return
        self.prefix, self.rows = self.prefix.take(idx), self.rows[idx]
        if self.sampling is not None:
            self.sampling.take(idx)
        if self.cache is not None:
            self.cache.keep_rows(idx)

    def extend(self, block: np.ndarray) -> None:
        """A finished block (B,L) joins the prefix."""
        self.prefix = self.prefix.extend(block)

    def _sampling_inputs(self, plan: Plan, steps: np.ndarray | None) -> dict | None:
        """None (greedy), or the sampling inputs: branch w's read columns serve base-rule step
        ``steps[:, w]`` (B,W); every other column step 0 (its outputs are not read)."""
        if self.sampling is None:
            return None
        cols = np.zeros(plan.ids.shape, dtype=np.int64)                          # (B,T)
        if steps is not None:
            cols[:, plan.read] = steps[:, :, None]
        return self.sampling.inputs(plan.positions, cols)

    def run(self, plan: Plan, steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One engine call: top ids/probs (B,W,L,K) at the plan's read columns; ``steps`` (B,W)
        int64: the base-rule step each branch's outputs serve (None: 0, a block-start call). A
        schema-1 artifact's excluded ids are demoted here, the one place engine results come back."""
        be, cache = self.backend, self.cache
        if plan.cache != "reuse":
            cache = be.new_cache(*plan.ids.shape)
            if plan.cache == "new":
                self.cache = cache
        sampling = self._sampling_inputs(plan, steps)
        if plan.keep:
            out = be.prefill(cache, plan.ids, plan.positions, plan.mask, plan.keep, sampling)
        else:
            out = be.verify(cache, plan.ids, plan.positions, plan.mask, sampling)
        top_i, top_p = demote_excluded(*out, be.host_excluded) if be.host_excluded else out   # (B,T,K)
        return top_i[:, plan.read], top_p[:, plan.read]
