"""The ids no decode step may choose (DESIGN §8): the mask token, and a pad token distinct from EOS.

Committing ``[MASK]`` leaves a position masked (the block never fills); a pad token is not text.
Their logits are set to -inf before the softmax and TopK, in the exported graphs
(export/graphs.py) and in the torch backend alike, so every backend and the C++ runtime choose
from the same vocabulary whatever the weights. torch is imported lazily: the ONNX Runtime path
reads ``excluded_ids`` only (for schema-1 artifacts, whose graphs do not exclude).
"""
from __future__ import annotations


def excluded_ids(cfg) -> tuple[int, ...]:
    """The mask id, and the pad id when it is neither EOS (ending is a real choice) nor the mask."""
    ids = [cfg.mask_token_id]
    if cfg.pad_token_id not in (cfg.eos_token_id, cfg.mask_token_id):
        ids.append(cfg.pad_token_id)
    return tuple(ids)


def exclusion_mask(vocab_size: int, ids):
    """(V,) bool tensor, True at the excluded ids: a constant of the exported graphs."""
    import torch
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[list(ids)] = True
    return mask


def exclude(logits, mask):
    """logits (..., V) with the entries ``mask`` (V,) marks at -inf (ONNX: one Where)."""
    return logits.masked_fill(mask, float("-inf"))


def top_k(logits, k: int):
    """Per-position top-k (ids int64, probabilities float32) of softmax(logits), most probable first."""
    top_p, top_i = logits.float().softmax(dim=-1).topk(k, dim=-1)
    return top_i, top_p


def choices(logits, mask, k: int):
    """top_k over the vocabulary without the excluded ids: what every backend returns."""
    return top_k(exclude(logits, mask), k)
