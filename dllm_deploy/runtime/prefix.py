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


def _read_columns(plan: Plan) -> np.ndarray:
    """(B,W*L) each row's read columns: the plan's (W,L) for every row, or its own (B,W,L)."""
    b, (w, n) = len(plan.ids), plan.read.shape[-2:]
    return np.broadcast_to(plan.read, (b, w, n)).reshape(b, w * n)


def _read(read: np.ndarray, *outs: np.ndarray) -> tuple[np.ndarray, ...]:
    """(B,W,L,K) each the read columns of a call's outputs ``outs`` (B,T,K): ``read`` (W,L) the
    same columns of every row, or (B,W,L) each row's own."""
    b = len(outs[0])
    if read.ndim == 2:
        at, shape = (slice(None), read.ravel()), (b, *read.shape, -1)
    else:
        cols = read.reshape(b, -1) if len(read) == b else np.broadcast_to(read, (b, *read.shape[1:])).reshape(b, -1)
        at, shape = (np.arange(b)[:, None], cols), (b, *read.shape[1:], -1)
    return tuple([o[at].reshape(shape) for o in outs])


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

    def stack(self, other: RowSampling) -> None:
        """``other``'s rows after these."""
        for name, arr in vars(self).items():
            setattr(self, name, np.concatenate([arr, getattr(other, name)]))

    def inputs(self, positions: np.ndarray, steps: np.ndarray) -> dict:
        """The graphs' sampling inputs for a call at ``positions`` (B,T) serving ``steps`` (B,T)."""
        u = uniforms(self.seed[:, None], self.request[:, None], positions, steps)
        return {"sample_u": u, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


class PrefixState:
    """The live rows' ``Prefix``, sampling options and engine cache; ``rows[r]`` is live row r's
    original row."""

    def __init__(self, backend, prefix: Prefix, capacity: int = 0, options: list[RowOptions] | None = None):
        """``capacity``: positions of a cache that lives through the whole decode (modes exact, delayed);
        0 when the calls bring their own (a refresh's new cache, mode none's scratch ones).
        ``options``: each row's; the calls are greedy (no sampling inputs) when no row samples."""
        self.backend, self.prefix = backend, prefix
        self.rows = np.arange(len(prefix.ids))
        self.cache = backend.new_cache(len(self.rows), capacity) if capacity else None
        self.held = np.zeros((len(self.rows), 0), dtype=bool)    # (B,E) in-block keys after the prefix (mode delayed)
        self.sampling = RowSampling(options) if options and any(o.sampling for o in options) else None

    def keep(self, live: np.ndarray) -> None:
        """Only the ``live`` rows (B,) bool go on."""
        idx = np.flatnonzero(live)
        if idx.size == len(self.rows):
            return
        self.prefix, self.rows, self.held = self.prefix.take(idx), self.rows[idx], self.held[idx]
        if self.sampling is not None:
            self.sampling.take(idx)
        if self.cache is not None:
            self.cache.keep_rows(idx)

    def join(self, other: PrefixState, pad_id: int) -> None:
        """``other``'s rows (a batch that joins at a block boundary, exact cache) after these: the
        narrower prefix and its cache gain pad columns on the left, so every row stays
        right-aligned; a row's own positions and mask are unchanged, so its tokens are too."""
        width, theirs = self.prefix.ids.shape[1], other.prefix.ids.shape[1]
        for state, n in ((self, theirs - width), (other, width - theirs)):
            if n > 0:
                state.prefix = state.prefix.pad_left(n, pad_id)
                state.cache.pad_left(n)
        self.prefix, self.rows = self.prefix.stack(other.prefix), np.concatenate([self.rows, other.rows])
        self.cache.add_rows(other.cache)
        self.held = np.zeros((len(self.rows), 0), dtype=bool)     # rows join at a block boundary: nothing held
        if self.sampling is not None or other.sampling is not None:
            mine = self.sampling or RowSampling([RowOptions()] * (len(self.rows) - len(other.rows)))
            mine.stack(other.sampling or RowSampling([RowOptions()] * len(other.rows)))
            self.sampling = mine

    def trim(self) -> None:
        """Drops the left columns no live row attends (the pads of rows that left), so a batch that
        rows keep joining never grows past its longest live row."""
        n = int(self.prefix.valid.argmax(axis=1).min()) if self.prefix.valid.any() else 0
        if n > 0:
            self.prefix = self.prefix.drop_left(n)
            self.cache.drop_left(n)

    def hold(self, slots: np.ndarray) -> None:
        """A ``canvas.held_verify`` call's kept columns joined the cache: ``slots`` (B,F), False
        for a pad slot."""
        self.held = np.concatenate([self.held, slots], axis=1)

    def drop_held(self) -> None:
        """The block's held in-block keys leave the cache: it holds the prefix again."""
        if self.held.shape[1]:
            self.cache.truncate(self.cache.length - self.held.shape[1])
            self.held = self.held[:, :0]

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
            np.put_along_axis(cols, _read_columns(plan), np.repeat(steps, plan.read.shape[-1], axis=1), axis=1)
        return self.sampling.inputs(plan.positions, cols)

    def run(self, plan: Plan, steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One engine call: top ids/probs (B,W,L,K) at the plan's read columns; ``steps`` (B,W)
        int64: the base-rule step each branch's outputs serve (None: 0, a block-start call). A
        schema-1 artifact's excluded ids are demoted here, the one place engine results come back."""
        be, cache = self.backend, self.cache
        if plan.cache != "reuse":   # a cache of this call's kept tokens (a scratch one keeps none)
            cache = be.new_cache(len(plan.ids), plan.keep if isinstance(plan.keep, int) else 0)
            if plan.cache == "new":
                self.cache = cache
        sampling = self._sampling_inputs(plan, steps)
        if plan.keep:
            out = be.prefill(cache, plan.ids, plan.positions, plan.mask, plan.keep, sampling)
        else:
            out = be.verify(cache, plan.ids, plan.positions, plan.mask, sampling)
        return _read(plan.read, *out)                                                       # (B,W,L,K) twice
