"""The torch reference backend (CPU, or CUDA where present). Imports torch lazily.

It chooses as the exported graphs do (models/exclusion.py, models/sampling.py): the mask token and
a pad token distinct from EOS are excluded before the softmax, and the same function picks the
top-1 or a sample from the pool, so torch and the artifact backends agree."""
from __future__ import annotations

import numpy as np

from ...artifact import SAMPLING_INPUTS


class TorchCache:
    def __init__(self, past, device):
        self.past = past            # list of (key, value), each (B,Hkv,P,D)
        self.device = device

    @property
    def length(self) -> int:
        return int(self.past[0][0].shape[2])

    def keep_rows(self, rows: np.ndarray) -> None:
        import torch
        idx = torch.as_tensor(np.asarray(rows), device=self.device)
        self.past = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.past]

    def pad_left(self, n: int) -> None:
        """n zero positions before the cached ones (masked out: pads of a joining batch)."""
        import torch
        pad = lambda x: torch.cat([x.new_zeros(x.shape[:2] + (n,) + x.shape[3:]), x], dim=2)  # noqa: E731
        self.past = [(pad(k), pad(v)) for k, v in self.past]

    def truncate(self, n: int) -> None:
        """Only the first n cached positions stay (cache mode delayed drops a block's held keys)."""
        self.past = [(k[:, :, :n].contiguous(), v[:, :, :n].contiguous()) for k, v in self.past]

    def drop_left(self, n: int) -> None:
        self.past = [(k[:, :, n:].contiguous(), v[:, :, n:].contiguous()) for k, v in self.past]

    def add_rows(self, other: "TorchCache") -> None:
        """``other``'s rows after these (the same length)."""
        import torch
        self.past = [(torch.cat([a, c]), torch.cat([b, d])) for (a, b), (c, d) in zip(self.past, other.past)]


class TorchBackend:
    name = "torch"
    joins_batches = True        # its cache pads and stacks: rows may join a running batch (loop.joins)

    def __init__(self, model, config, device: str = "cpu", topk: int = 2, threads: int | None = None):
        import torch

        from ...models.exclusion import excluded_ids, exclusion_mask
        from ...models.registry import capabilities_of
        from ...models.sampling import default_pool
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model = model.to(device).eval()
        self.config = config
        self.capabilities = capabilities_of(config)
        self.device = device
        self.topk = topk
        self.sample_pool = default_pool(config.vocab_size)
        self.excluded = exclusion_mask(config.vocab_size, excluded_ids(config)).to(device)

    @classmethod
    def load(cls, model: str = "tiny", device: str | None = None, topk: int = 2):
        import torch

        from ...models.loading import load_model
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        module, cfg = load_model(model)
        return cls(module, cfg, device=device, topk=topk)

    def new_cache(self, batch: int, capacity: int = 0) -> TorchCache:
        return TorchCache(self.model.empty_past(batch, self.device, self.model.lm_head.weight.dtype), self.device)

    def _run(self, cache, ids, pos, mask, sampling):
        from ...models.exclusion import exclude
        from ...models.sampling import sample
        from .base import sampling_feeds
        t = self.torch
        feeds = sampling_feeds(sampling, *ids.shape)
        with t.inference_mode():
            logits, present = self.model(
                t.as_tensor(ids, device=self.device), t.as_tensor(pos, device=self.device),
                t.as_tensor(mask, device=self.device), cache.past)
            top_i, top_p = sample(exclude(logits, self.excluded),
                                  *(t.as_tensor(feeds[n], device=self.device) for n in SAMPLING_INPUTS),
                                  pool=self.sample_pool, k=self.topk)
        return top_i.cpu().numpy(), top_p.cpu().numpy(), present

    def prefill(self, cache, ids, pos, mask, keep: int, sampling=None):
        from .base import kept_tokens
        top_i, top_p, present = self._run(cache, ids, pos, mask, sampling)
        idx = kept_tokens(keep, top_i, top_p)
        if idx is not None:                      # rows keep the KV of chosen new tokens
            p = cache.length
            cols = np.concatenate([np.broadcast_to(np.arange(p), (len(idx), p)), idx + p], axis=1)
            at = self.torch.as_tensor(cols, device=self.device)[:, None, :, None]
            pick = lambda x: x.gather(2, at.expand(x.shape[0], x.shape[1], -1, x.shape[3]))  # noqa: E731
            cache.past = [(pick(k), pick(v)) for k, v in present]
            return top_i, top_p
        end = cache.length + keep
        cache.past = [(k[:, :, :end], v[:, :, :end]) for k, v in present]
        return top_i, top_p

    def logits(self, cache, ids, pos, mask) -> np.ndarray:
        """Full logits (B,T,V) as float32, the excluded ids at -inf like the prefill graph's (for
        likelihood scoring; not used by the decode loop)."""
        from ...models.exclusion import exclude
        t = self.torch
        with t.inference_mode():
            out, _ = self.model(t.as_tensor(ids, device=self.device), t.as_tensor(pos, device=self.device),
                                t.as_tensor(mask, device=self.device), cache.past)
            out = exclude(out, self.excluded)
        return out.float().cpu().numpy()

    def verify(self, cache, ids, pos, mask, sampling=None):
        top_i, top_p, _ = self._run(cache, ids, pos, mask, sampling)
        return top_i, top_p
