"""The backend interface every engine implements (torch, ONNX Runtime, TensorRT).

A backend is a loader + runner pair (Polygraphy style): the loader builds it from a model folder
or an artifact; the runner owns the KV cache and runs the two graphs of DESIGN §3:

    prefill(cache, ids, pos, mask, keep) -> (top_ids, top_probs)   # and appends KV of the first
                                                                    # `keep` new tokens to cache
    verify(cache, ids, pos, mask)        -> (top_ids, top_probs)   # cache unchanged

ids, pos (B,T) int64; mask (B,1,T,P+T) bool with P = cache.length; top_ids (B,T,K) int64,
top_probs (B,T,K) float32, sorted by probability. All arrays are numpy: the decode loop never
sees an engine's tensors.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Cache(Protocol):
    length: int                                   # P: cached positions (shared by all rows)

    def keep_rows(self, rows: np.ndarray) -> None:  # drop finished rows (batch compaction)
        ...


class Backend(Protocol):
    name: str
    topk: int

    def new_cache(self, batch: int, capacity: int) -> Cache: ...

    def prefill(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, keep: int): ...

    def verify(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray): ...

    def logits(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Full logits (B,T,V): for likelihood scoring only, never in the decode loop."""
        ...
