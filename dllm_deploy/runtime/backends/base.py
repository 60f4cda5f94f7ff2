"""The backend interface every engine implements (torch, ONNX Runtime, TensorRT).

A backend is a loader + runner pair (Polygraphy style): the loader builds it from a model folder
or an artifact; the runner owns the KV cache and runs the two graphs of DESIGN §3:

    prefill(cache, ids, pos, mask, keep, sampling) -> (top_ids, top_probs)   # and appends KV of the
                                                                    # first `keep` new tokens to cache
    verify(cache, ids, pos, mask, sampling)        -> (top_ids, top_probs)   # cache unchanged

ids, pos (B,T) int64; mask (B,1,T,P+T) bool with P = cache.length; top_ids (B,T,K) int64,
top_probs (B,T,K) float32. All arrays are numpy: the decode loop never sees an engine's tensors.
``sampling``: None (greedy: slot 0 the top-1, the K sorted by probability) or the graphs' sampling
inputs by name (models/sampling.py: slot 0 the sampled choice): sample_u (B,T) float32,
temperature (B,) float32, top_k (B,) int64, top_p (B,) float32. ``sample_pool`` is None for a
backend that cannot sample (an artifact exported before schema 3).

No backend returns the mask token or a pad token distinct from EOS as a choice (DESIGN §8): the
graphs of a schema-2 artifact and the torch backend exclude them before the softmax. A schema-1
artifact's graphs do not; its backend lists them in ``host_excluded`` and the decode loop demotes
them where engine results come back (prefix.py::demote_excluded).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Protocol

import numpy as np

from ...artifact import graphs_exclude
from ...models.exclusion import excluded_ids


class Cache(Protocol):
    length: int                                   # P: cached positions (shared by all rows)

    def keep_rows(self, rows: np.ndarray) -> None:  # drop finished rows (batch compaction)
        ...


class Backend(Protocol):
    name: str
    topk: int
    host_excluded: tuple[int, ...]                # ids its graphs may still choose (schema 1); else ()
    sample_pool: int | None                       # the P tokens a sample is drawn from; None: greedy only

    def new_cache(self, batch: int, capacity: int) -> Cache: ...

    def prefill(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, keep: int,
                sampling: dict | None = None): ...

    def verify(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray,
               sampling: dict | None = None): ...

    def logits(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Full logits (B,T,V): for likelihood scoring only, never in the decode loop."""
        ...


def sampling_feeds(sampling: dict | None, batch: int, tokens: int) -> dict:
    """The sampling inputs of a call: ``sampling`` as given, or a greedy call's (temperature 0)."""
    if sampling is not None:
        return sampling
    return {"sample_u": np.zeros((batch, tokens), dtype=np.float32), "temperature": np.zeros(batch, dtype=np.float32),
            "top_k": np.zeros(batch, dtype=np.int64), "top_p": np.ones(batch, dtype=np.float32)}


def host_excluded(manifest: dict, config, folder: str | Path) -> tuple[int, ...]:
    """``host_excluded`` of an artifact backend: () when its graphs exclude the ids themselves;
    for a schema-1 artifact, with one warning, the ids the decode loop must demote."""
    if graphs_exclude(manifest):
        return ()
    warnings.warn(f"{folder}: a schema-1 artifact: its graphs may emit the mask token; the runtime skips it "
                  "on the host (re-export the artifact to fix this)", stacklevel=2)
    return excluded_ids(config)
