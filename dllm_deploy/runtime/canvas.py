"""Engine calls as plain values: the tokens, positions and masks of every forward the loop makes.

A ``Plan`` is one engine call; one builder per kind of call makes it from the rows' ``Prefix``
and the block being decoded. Nothing here runs a model (numpy only): the loop runs a plan with
``PrefixState.run`` (prefix.py), the C++ runtime mirrors these builders, and
tests/data/golden/ hold plans dumped from them.

    block-causal model (cache exact | none | delayed)   bidirectional model (LLaDA, Dream: none | prefix | dual)
    first_block    [prompt | block]                   refresh        [prefix | block | suffix]
    tree_verify    W branches of the block                             dual: [prefix | suffix | block]
    commit_next    [block | next block]               canvas_verify  W branches [anchor | node | suffix]
    held_verify    delayed: [fresh | masked] of the block

Block-causal attention makes a finished block's KV final, so ``exact`` caches it once; mode
``none`` feeds the prefix again in every call. A bidirectional canvas ends in the suffix of
masks up to the generation budget: ``prefix`` caches the prefix at each block's start, ``dual``
the prefix and the suffix, ``none`` feeds the whole canvas every time. ``delayed`` (block-causal,
W = 1) is exact at block boundaries and approximate inside a block: a committed position's KV is
cached by the first verify call after its commit (it is fed once with its token), and later calls
feed only the positions committed since the last call and the masked ones (dKV-Cache's delayed
caching); those in-block keys are dropped when the block is committed. Dream predicts position i
from row i - 1 (shifted logits): under ``prefix``/``dual`` the prefix's last token (the anchor)
stays out of the cache and rides just before the block in every call.

Dimension legend: B rows, P prefix positions (left-padded prompt + committed blocks), L block
length, W branches (beam width), S suffix positions, G positions of one branch, T tokens fed,
C cached positions the fed tokens attend besides themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ..models.masks import block_causal_mask, tree_mask

CACHES = ("reuse", "new", "scratch")


@dataclass(frozen=True)
class Prefix:
    """The rows' committed tokens: what every call attends before the block."""
    ids: np.ndarray          # (B,P) left-padded prompt, then committed blocks
    positions: np.ndarray    # (B,P) position ids (a pad takes position 0)
    valid: np.ndarray        # (B,P) False: left pad, attended by nothing but itself
    blocks: np.ndarray       # (B,P) block id: the prompt 0, generated blocks 1, 2, ...

    @classmethod
    def of_prompts(cls, prompts: list[list[int]], pad_id: int) -> Prefix:
        b, p = len(prompts), max(len(x) for x in prompts)
        ids = np.full((b, p), pad_id, dtype=np.int64)                     # (B,P)
        valid = np.zeros((b, p), dtype=bool)                              # (B,P)
        for r, x in enumerate(prompts):
            ids[r, p - len(x):] = x
            valid[r, p - len(x):] = True
        positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)           # (B,P)
        return cls(ids, positions, valid, np.zeros((b, p), dtype=np.int64))

    def take(self, rows: np.ndarray) -> Prefix:
        """The prefix of the given rows only (finished rows leave the batch)."""
        return Prefix(self.ids[rows], self.positions[rows], self.valid[rows], self.blocks[rows])

    def extend(self, block: np.ndarray) -> Prefix:
        """A finished block (B,L) joins the prefix as the next block id."""
        return Prefix(np.concatenate([self.ids, block], axis=1),
                      np.concatenate([self.positions, self.next_positions(block.shape[1])], axis=1),
                      np.concatenate([self.valid, np.ones(block.shape, dtype=bool)], axis=1),
                      np.concatenate([self.blocks, np.broadcast_to(self.blocks[:, -1:] + 1, block.shape)], axis=1))

    def pad_left(self, n: int, pad_id: int) -> Prefix:
        """n more pad columns on the left (attended by nothing but themselves): rows of different
        prefix lengths stay right-aligned when they share one batch."""
        b = len(self.ids)
        return Prefix(np.concatenate([np.full((b, n), pad_id, dtype=np.int64), self.ids], axis=1),
                      np.concatenate([np.zeros((b, n), dtype=np.int64), self.positions], axis=1),
                      np.concatenate([np.zeros((b, n), dtype=bool), self.valid], axis=1),
                      np.concatenate([np.zeros((b, n), dtype=np.int64), self.blocks], axis=1))

    def drop_left(self, n: int) -> Prefix:
        """The prefix without its first n columns (pads of every row)."""
        return Prefix(self.ids[:, n:], self.positions[:, n:], self.valid[:, n:], self.blocks[:, n:])

    def stack(self, other: Prefix) -> Prefix:
        """These rows, then ``other``'s (the same width)."""
        return Prefix(*(np.concatenate([a, b]) for a, b in zip(
            (self.ids, self.positions, self.valid, self.blocks), (other.ids, other.positions, other.valid, other.blocks))))

    def next_positions(self, n: int) -> np.ndarray:
        """(B,n) the positions of the n tokens after the prefix."""
        return self.positions[:, -1:] + np.arange(1, n + 1)


@dataclass(frozen=True)
class Plan:
    """One engine call."""
    ids: np.ndarray          # (B,T) tokens fed
    positions: np.ndarray    # (B,T) their position ids
    mask: np.ndarray         # (B,1,T,C+T) True: may attend; keys are [cache | fed tokens]
    keep: int                # fed tokens (from the front) whose KV the cache keeps; 0: verify only
    cache: str               # "reuse" the rows' cache, start a "new" one (refresh), or a "scratch" one (mode none)
    read: np.ndarray         # (W,L) output column of each branch position, or (B,W,L) per row: results are (B,W,L,K)


def _attend(valid: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """(B,1,S,S) among S fed tokens: a token attends the valid tokens of its block and of earlier
    blocks (one block id everywhere: bidirectional); a pad attends itself."""
    s = valid.shape[1]
    m = valid[:, None, :] & (blocks[:, None, :] <= blocks[:, :, None]) | np.eye(s, dtype=bool)   # (B,S,S)
    return m[:, None]


def _over_cache(cached_valid: np.ndarray, new: np.ndarray) -> np.ndarray:
    """(B,1,T,C+T): every fed token attends the valid cached keys; ``new`` (T,T) among the fed."""
    b, c = cached_valid.shape
    t = new.shape[-1]
    mask = np.empty((b, 1, t, c + t), dtype=bool)
    mask[..., :c] = cached_valid[:, None, None, :]
    mask[..., c:] = new
    return mask


@lru_cache(maxsize=64)
def _branches(g: int, w: int) -> np.ndarray:
    """(W*G, W*G) read-only: W branches of G tokens, each attending itself only (asked at every
    verification, the same for a whole decode)."""
    m = tree_mask(0, g, w)
    m.setflags(write=False)
    return m


@lru_cache(maxsize=64)
def _eye(t: int) -> np.ndarray:
    """(T,T) read-only identity: each fed token attends itself (a pad only itself)."""
    m = np.eye(t, dtype=bool)
    m.setflags(write=False)
    return m


@lru_cache(maxsize=64)
def _columns(w: int, n: int) -> np.ndarray:
    """(W,L) read-only: 0..W*L-1, branch by branch (tree_verify's read columns)."""
    m = np.arange(w * n).reshape(w, n)
    m.setflags(write=False)
    return m


def _recomputed(prefix: Prefix, plan: Plan) -> Plan:
    """Mode ``none`` of a block-causal model: the prefix rides in front of ``plan`` (whose mask
    already has the prefix as its cached keys) in a scratch cache, attending itself block-causally."""
    b, p = prefix.ids.shape
    t = plan.ids.shape[1]
    top = np.concatenate([_attend(prefix.valid, prefix.blocks), np.zeros((b, 1, p, t), dtype=bool)], axis=-1)
    return Plan(np.concatenate([prefix.ids, plan.ids], axis=1),                     # (B,P+T)
                np.concatenate([prefix.positions, plan.positions], axis=1),         # (B,P+T)
                np.concatenate([top, plan.mask], axis=2),                           # (B,1,P+T,P+T)
                keep=0, cache="scratch", read=plan.read + p)


def _block_causal(mode: str) -> None:
    if mode not in ("exact", "none"):
        raise ValueError(f"cache mode {mode!r} is not one of a block-causal model's (exact, none)")


def first_block(prefix: Prefix, block: np.ndarray, mode: str) -> Plan:
    """Block-causal: the prompt prefill fused with the first block's forward. [prompt | block]:
    the prompt attends its valid tokens, the block the valid prompt and itself."""
    _block_causal(mode)
    (b, p), n = prefix.ids.shape, block.shape[1]
    valid = np.concatenate([prefix.valid, np.ones((b, n), dtype=bool)], axis=1)                 # (B,P+L)
    blocks = np.concatenate([np.zeros((b, p), dtype=np.int64), np.ones((b, n), dtype=np.int64)], axis=1)
    plan = Plan(np.concatenate([prefix.ids, block], axis=1),                                    # (B,P+L)
                np.concatenate([prefix.positions, prefix.next_positions(n)], axis=1),
                _attend(valid, blocks), keep=p, cache="reuse", read=p + np.arange(n)[None])
    return plan if mode == "exact" else replace(plan, keep=0, cache="scratch")


def tree_verify(prefix: Prefix, nodes: np.ndarray, mode: str) -> Plan:
    """Block-causal: W drafted block states (B,W,L) in one call, each branch at the block's
    positions, attending the prefix and itself, never another branch."""
    _block_causal(mode)
    b, w, n = nodes.shape
    pos = prefix.next_positions(n)                                                            # (B,L)
    plan = Plan(nodes.reshape(b, w * n), pos if w == 1 else np.tile(pos, (1, w)),             # (B,W*L)
                _over_cache(prefix.valid, _branches(n, w)), keep=0, cache="reuse",
                read=_columns(w, n))
    return plan if mode == "exact" else _recomputed(prefix, plan)


def commit_next(prefix: Prefix, block: np.ndarray, nxt: np.ndarray, mode: str) -> Plan:
    """Block-causal: a finished block's KV joins the cache, fused with the next block's first
    forward. [block | next], block-causal between the two."""
    _block_causal(mode)
    n = block.shape[1]
    plan = Plan(np.concatenate([block, nxt], axis=1), prefix.next_positions(2 * n),            # (B,2L)
                _over_cache(prefix.valid, block_causal_mask(np.repeat([0, 1], n))), keep=n,
                cache="reuse", read=n + np.arange(n)[None])
    return plan if mode == "exact" else _recomputed(prefix, plan)


def _anchored(anchor: bool, mode: str) -> int:
    """1 when the prefix's last token rides in the call rather than in the cache (Dream, cached)."""
    if mode not in ("none", "prefix", "dual"):
        raise ValueError(f"cache mode {mode!r} is not one of a bidirectional model's (none, prefix, dual)")
    return int(anchor and mode != "none")


def refresh(prefix: Prefix, block: np.ndarray, suffix_len: int, mask_id: int, mode: str, anchor: bool) -> Plan:
    """Bidirectional: one call over the whole canvas, every token attending every valid one.
    ``prefix`` keeps the prefix KV (less the anchor); ``dual`` orders the suffix before the block
    so one ``keep`` covers prefix and suffix (RoPE positions, not order, place it); ``none``
    keeps nothing. Reads the block (B,1,L,K)."""
    a = _anchored(anchor, mode)
    (b, p), n, s = prefix.ids.shape, block.shape[1], suffix_len
    ids = np.concatenate([prefix.ids, block, np.full((b, s), mask_id, dtype=np.int64)], axis=1)   # (B,P+L+S)
    pos = np.concatenate([prefix.positions, prefix.next_positions(n + s)], axis=1)
    valid = np.concatenate([prefix.valid, np.ones((b, n + s), dtype=bool)], axis=1)
    if mode == "dual":                   # [prefix (less the anchor) | suffix | anchor | block]
        order = np.r_[0:p - a, p + n:p + n + s, p - a:p, p:p + n]
        ids, pos, valid = ids[:, order], pos[:, order], valid[:, order]
    at = p + s if mode == "dual" else p
    keep = 0 if mode == "none" else p - a + (s if mode == "dual" else 0)
    return Plan(ids, pos, _attend(valid, np.zeros_like(ids)), keep=keep,
                cache="scratch" if mode == "none" else "new", read=at + np.arange(n)[None])


def canvas_verify(prefix: Prefix, nodes: np.ndarray, suffix_len: int, mask_id: int, mode: str,
                  anchor: bool) -> Plan:
    """Bidirectional: W block states (B,W,L) over the cache of the last refresh, each branch
    [anchor | node | suffix] (``dual``: the suffix is cached) attending the cache and itself.
    Mode ``none`` caches nothing: the whole canvas of node 0 (W = 1)."""
    if mode == "none":
        return refresh(prefix, nodes[:, 0], suffix_len, mask_id, mode, anchor)
    a = _anchored(anchor, mode)
    (b, w, n), p = nodes.shape, prefix.ids.shape[1]
    fed = 0 if mode == "dual" else suffix_len                       # suffix positions in each branch
    g = a + n + fed
    head = np.broadcast_to(prefix.ids[:, None, p - a:], (b, w, a))
    ids = np.concatenate([head, nodes, np.full((b, w, fed), mask_id, dtype=np.int64)], axis=2)   # (B,W,G)
    pos = np.concatenate([prefix.positions[:, p - a:], prefix.next_positions(n + fed)], axis=1)  # (B,G)
    cached = np.concatenate([prefix.valid[:, :p - a], np.ones((b, suffix_len - fed), dtype=bool)], axis=1)
    return Plan(ids.reshape(b, w * g), np.tile(pos, (1, w)), _over_cache(cached, _branches(g, w)),
                keep=0, cache="reuse", read=g * np.arange(w)[:, None] + a + np.arange(n))


def held_verify(prefix: Prefix, held: np.ndarray, block: np.ndarray, fresh: np.ndarray, mask_id: int,
                pad_id: int) -> Plan:
    """Block-causal, cache mode ``delayed`` (W = 1): the block state (B,L) over a cache of the
    prefix and ``held`` (B,E) in-block keys (False: a pad slot). Each row feeds [its fresh
    positions | its masked positions], each part right-padded to the batch's longest, and the
    cache keeps the fresh part. ``fresh`` (B,L): committed positions whose KV is not cached yet.
    A fed token attends the valid cache and the row's fed tokens (one block: bidirectional); a
    pad attends only itself. Reads (B,1,L): each masked position's column (a W = 1 rule reads no
    other position; the rest read column 0)."""
    b, n = block.shape
    fed = [(f.nonzero()[0].tolist(), m.nonzero()[0].tolist()) for f, m in zip(fresh, block == mask_id)]
    wf, wm = (max(len(row[k]) for row in fed) for k in (0, 1))                   # F, M
    src = np.array([f + [-1] * (wf - len(f)) + m + [-1] * (wm - len(m)) for f, m in fed],
                   dtype=np.int64).reshape(b, wf + wm)                           # (B,T) block position, -1: pad
    real = src >= 0
    read = np.zeros((b, 1, n), dtype=np.int64)
    for r, (_, m) in enumerate(fed):
        read[r, 0, m] = np.arange(wf, wf + len(m))
    at = np.arange(b)[:, None], np.maximum(src, 0)
    ids = np.where(real, block[at], pad_id)                                      # (B,T)
    pos = prefix.next_positions(n)[at]                                           # (B,T) (a pad: the block's first)
    t, c = src.shape[1], prefix.valid.shape[1] + held.shape[1]
    mask = np.empty((b, 1, t, c + t), dtype=bool)                                 # keys [prefix | held | fed]
    mask[:, 0, :, :c] = np.concatenate([prefix.valid, held], axis=1)[:, None, :] & real[:, :, None]
    mask[:, 0, :, c:] = real[:, None, :] & real[:, :, None] | _eye(t)
    return Plan(ids, pos, mask, keep=wf, cache="reuse", read=read)
