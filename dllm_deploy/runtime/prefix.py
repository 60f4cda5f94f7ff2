"""The rows still decoding: their prefix, their original row numbers and the engine cache.

``PrefixState.run`` is the one place an engine call is made and its results come back; what the
call feeds is a ``canvas.Plan``, built elsewhere. Dimension legend as in canvas.py (K top-k).
"""
from __future__ import annotations

import numpy as np

from .canvas import Plan, Prefix


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


class PrefixState:
    """The live rows' ``Prefix`` and engine cache; ``rows[r]`` is live row r's original row."""

    def __init__(self, backend, prefix: Prefix, capacity: int = 0):
        """``capacity``: positions of a cache that lives through the whole decode (mode exact);
        0 when the calls bring their own (a refresh's new cache, mode none's scratch ones)."""
        self.backend, self.prefix = backend, prefix
        self.rows = np.arange(len(prefix.ids))
        self.cache = backend.new_cache(len(self.rows), capacity) if capacity else None

    def keep(self, live: np.ndarray) -> None:
        """Only the ``live`` rows (B,) bool go on."""
        idx = np.flatnonzero(live)
        if idx.size == len(self.rows):
            return
        self.prefix, self.rows = self.prefix.take(idx), self.rows[idx]
        if self.cache is not None:
            self.cache.keep_rows(idx)

    def extend(self, block: np.ndarray) -> None:
        """A finished block (B,L) joins the prefix."""
        self.prefix = self.prefix.extend(block)

    def run(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """One engine call: top ids/probs (B,W,L,K) at the plan's read columns. A schema-1
        artifact's excluded ids are demoted here, the one place engine results come back."""
        be, cache = self.backend, self.cache
        if plan.cache != "reuse":
            cache = be.new_cache(*plan.ids.shape)
            if plan.cache == "new":
                self.cache = cache
        if plan.keep:
            out = be.prefill(cache, plan.ids, plan.positions, plan.mask, plan.keep)
        else:
            out = be.verify(cache, plan.ids, plan.positions, plan.mask)
        top_i, top_p = demote_excluded(*out, be.host_excluded) if be.host_excluded else out   # (B,T,K)
        return top_i[:, plan.read], top_p[:, plan.read]
