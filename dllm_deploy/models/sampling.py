"""The token choice of every backend (schema 3): greedy or seeded sampling, in one torch function.

The exported graphs (export/graphs.py) and the torch backend both call ``sample``, so ONNX Runtime,
TensorRT, the C++ runtime and torch choose alike. The noise comes in as one uniform per position
(runtime/noise.py, host side); the graph draws by inverse CDF over the pool of the P most probable
tokens, tempered and filtered by top-k / top-p: the distribution of LLaDA's Gumbel-max choice
(argmax(logits / T + Gumbel)) restricted to that pool, with one uniform per position instead of one
per vocabulary entry and no bitwise integer ops in the graph (docs/algorithms.md, "Sampling").

Output slot 0 is the choice with its probability at temperature 1 (the confidence the rules rank
and threshold, LLaDA's x0_p); slots 1..K-1 the pool in order without it. Temperature 0 chooses the
top-1: the outputs equal the greedy top-K of schema 2 exactly.
"""
from __future__ import annotations

import torch

DEFAULT_POOL = 64


def default_pool(vocab_size: int) -> int:
    return min(vocab_size, DEFAULT_POOL)


def sample(logits, sample_u, temperature, top_k, top_p, pool: int, k: int):
    """logits (B,T,V) with the excluded ids at -inf; sample_u (B,T) float32; temperature, top_p
    (B,) float32; top_k (B,) int64 (0: off). Returns (ids (B,T,k) int64, probs (B,T,k) float32)."""
    probs = logits.float().softmax(dim=-1)
    pool_p, pool_i = probs.topk(pool, dim=-1)                                # (B,T,P), sorted
    temp = temperature[:, None, None]
    greedy = temp <= 0
    t = torch.where(greedy, torch.ones_like(temp), temp)
    q = (pool_p.log() / t).softmax(dim=-1)                                   # tempered, over the pool
    rank = torch.arange(pool, device=logits.device)
    k_eff = torch.where(top_k > 0, top_k, torch.full_like(top_k, pool))[:, None, None]
    keep = (rank < k_eff) & (q.cumsum(dim=-1) - q < top_p[:, None, None])    # the first entry always
    c = (q * keep).cumsum(dim=-1)
    j = (c <= sample_u[..., None] * c[..., -1:]).sum(dim=-1, keepdim=True).clamp(max=pool - 1)   # (B,T,1)
    j = torch.where(greedy, torch.zeros_like(j), j)
    rest = torch.arange(k - 1, device=logits.device)
    order = torch.cat([j, rest + (rest >= j).long()], dim=-1)                # (B,T,k): j, then the pool without it
    return pool_i.gather(-1, order), pool_p.gather(-1, order)

