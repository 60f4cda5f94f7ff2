"""The backend interface every engine implements (torch, ONNX Runtime, TensorRT).

A backend is a loader + runner pair (Polygraphy style): the loader builds it from a model folder
or an artifact; the runner owns the KV cache and runs the graphs of the roles the model's
capabilities list (the dense families: ``prefill`` and ``verify``, DESIGN §3 and §10):

    prefill(cache, ids, pos, mask, keep, sampling) -> (top_ids, top_probs)   # and appends KV of the
                                                                    # first `keep` new tokens to cache
      (``keep`` may instead be a function of (top_ids, top_probs) giving (B, n) indices of the new
      tokens whose KV is appended, row by row: a tree verification keeps its accepted path)
    verify(cache, ids, pos, mask, sampling)        -> (top_ids, top_probs)   # cache unchanged

ids, pos (B,T) int64; mask (B,1,T,P+T) bool with P = cache.length; top_ids (B,T,K) int64,
top_probs (B,T,K) float32. All arrays are numpy: the decode loop never sees an engine's tensors.
``sampling``: None (greedy: slot 0 the top-1, the K sorted by probability) or the graphs' sampling
inputs by name (models/sampling.py: slot 0 the sampled choice): sample_u (B,T) float32,
temperature (B,) float32, top_k (B,) int64, top_p (B,) float32.

No backend returns the mask token or a pad token distinct from EOS as a choice (DESIGN §8): the
graphs and the torch backend exclude them before the softmax.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ...models.capabilities import Capabilities


class Cache(Protocol):
    """Per-layer KV of the batch's rows, (B, Hkv, P, D) per layer (Hkv, D may differ by layer)."""
    length: int                                   # P: cached positions (shared by all rows)

    def keep_rows(self, rows: np.ndarray) -> None:  # drop finished rows (batch compaction)
        ...

    def pad_left(self, n: int) -> None:           # n masked positions before the cached ones (joining rows)
        ...

    def add_rows(self, other: "Cache") -> None:   # other's rows after these (the same length)
        ...

    def drop_left(self, n: int) -> None:          # the first n positions leave (a column no row attends)
        ...

    def truncate(self, n: int) -> None:           # only the first n positions stay (delayed: held keys go)
        ...


class Backend(Protocol):
    name: str
    topk: int
    capabilities: Capabilities                    # the model family's (the manifest's record for an artifact)
    sample_pool: int                              # the P tokens a sample is drawn from

    def new_cache(self, batch: int, capacity: int) -> Cache: ...

    def prefill(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, keep: int,
                sampling: dict | None = None): ...

    def verify(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray,
               sampling: dict | None = None): ...

    def logits(self, cache: Cache, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Full logits (B,T,V): for likelihood scoring only, never in the decode loop."""
        ...


def kept_tokens(keep, top_ids: np.ndarray, top_probs: np.ndarray) -> np.ndarray | None:
    """A prefill's ``keep`` as (B, n) int64 indices of new tokens, or None when it is a count."""
    if not callable(keep):
        return None
    idx = np.asarray(keep(top_ids, top_probs), dtype=np.int64)
    if idx.ndim != 2 or idx.shape[0] != top_ids.shape[0] or (idx.size and not 0 <= idx.min() <= idx.max() < top_ids.shape[1]):
        raise ValueError(f"keep gave indices of shape {idx.shape} for {top_ids.shape[:2]} new tokens")
    return idx


def sampling_feeds(sampling: dict | None, batch: int, tokens: int) -> dict:
    """The sampling inputs of a call: ``sampling`` as given, or a greedy call's (temperature 0)."""
    if sampling is not None:
        return sampling
    return {"sample_u": np.zeros((batch, tokens), dtype=np.float32), "temperature": np.zeros(batch, dtype=np.float32),
            "top_k": np.zeros(batch, dtype=np.int64), "top_p": np.ones(batch, dtype=np.float32)}


def artifact_capabilities(manifest: dict, folder: str | Path) -> Capabilities:
    """The capabilities an artifact records (its family need not be registered where it runs)."""
    return Capabilities.from_dict(manifest["capabilities"], f"{folder}/manifest.json: capabilities")


@dataclass
class Loaded:
    """What a loader gives ``Runtime``: the backend, the artifact's tokenizer and the W cap of the
    artifact and the loader's settings (the runtime applies the free-memory cap on top)."""
    backend: Backend
    tokenizer: object
    max_beam_width: int


def artifact_tokenizer(manifest: dict, folder: str | Path, eos_id: int):
    """The tokenizer the manifest names: the byte tokenizer, or the artifact's tokenizer.json."""
    from ...errors import UserError
    from ...models.tokenizer import ByteTokenizer, HFTokenizer
    kind = manifest["tokenizer"].get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        return HFTokenizer(Path(folder) / str(manifest["tokenizer"].get("file", "tokenizer.json")), eos_id)
    raise UserError(f"{folder}: unknown tokenizer kind {kind!r} in the manifest")
