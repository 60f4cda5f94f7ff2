"""Attention-mask primitives: pure numpy functions, True = may attend.

runtime/canvas.py builds every mask the decode loop feeds an engine from these (it adds rows,
left pads and the batch and head axes); profiles/memory.py and bench/run.py use them for synthetic
calls. They sit here, below profiles and runtime, so that both may import them.

Shapes: a mask for T new tokens over P cached + T new keys is (T, P+T).
"""
from __future__ import annotations

import numpy as np


def block_causal_mask(block_ids: np.ndarray, past_block_ids: np.ndarray | None = None) -> np.ndarray:
    """Token i attends to token j iff block(j) <= block(i).

    ``block_ids`` (T,) gives each new token's block (the prompt is one block, block 0);
    ``past_block_ids`` (P,) those of the cached tokens. Within a block attention is bidirectional;
    between blocks it is causal, so the KV of a finished block never changes (exact cache).
    """
    q = np.asarray(block_ids)
    k = q if past_block_ids is None else np.concatenate([np.asarray(past_block_ids), q])
    return k[None, :] <= q[:, None]


def tree_mask(p: int, branch_len: int, n_branches: int, prefix_valid: np.ndarray | None = None) -> np.ndarray:
    """Tree-attention mask of the verifier: W branches of L tokens packed after a shared prefix.

    Each branch attends to the whole (valid) prefix and bidirectionally to its own L tokens,
    never to another branch. Shape (W*L, P + W*L).
    """
    n = branch_len * n_branches
    m = np.zeros((n, p + n), dtype=bool)
    m[:, :p] = True if prefix_valid is None else np.asarray(prefix_valid, dtype=bool)[None, :]
    branch = np.repeat(np.arange(n_branches), branch_len)
    m[:, p:] = branch[:, None] == branch[None, :]
    return m


def tree_positions(p: int, branch_len: int, n_branches: int) -> np.ndarray:
    """Position ids (W*L,): every branch sits at positions P..P+L-1."""
    return np.tile(np.arange(p, p + branch_len), n_branches)


def window_encoder_masks(keep: np.ndarray, p: int, t: int, window: int) -> dict:
    """A sliding-window model's encoder masks (DiffusionGemma) for ``t`` new tokens after ``p``
    cached ones; ``keep`` (B,P+T) bool, False at padding. "full" (B,1,T,P+T): causal; "sliding"
    (B,1,T,Ps+T) over the Ps = min(P, W - 1) cached keys a sliding layer holds and the new ones:
    causal within the last ``window`` keys (itself included)."""
    q = np.arange(p, p + t)[:, None]
    k = np.arange(p + t)[None, :]
    causal = (k <= q)[None, None] & keep[:, None, None, :]
    ps = min(p, window - 1)
    return {"full": causal, "sliding": (causal & (q - k < window)[None, None])[..., p - ps:]}


def window_decoder_masks(keep: np.ndarray, p: int, t: int, window: int) -> dict:
    """A sliding-window model's denoiser masks for a canvas of ``t`` tokens after ``p`` cached
    ones; ``keep`` (B,P) bool, False at padding. Every canvas token sees the whole canvas and its
    layer's cached keys: "full" (B,1,T,P+T) the whole prefix, "sliding" (B,1,T,Ps+T) the last
    Ps = min(P, W - 1)."""
    b = keep.shape[0]
    ps = min(p, window - 1)
    full = np.concatenate([keep, np.ones((b, t), dtype=bool)], axis=1)[:, None, None, :]
    full = np.broadcast_to(full, (b, 1, t, p + t))
    return {"full": full, "sliding": full[..., p - ps:]}
