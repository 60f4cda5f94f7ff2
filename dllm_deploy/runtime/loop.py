"""The decode loop: one loop for every strategy, every backend, every cache mode.

Per block (L positions, all [MASK] at the start), per iteration:
    nodes, tree = policy.plan(S, f(S))     # W drafted block states (node 0 = base rule's step)
    f(nodes) = backend.verify(nodes)       # ONE forward, W branches under a tree mask
    S, f(S) = policy.select(nodes, tree, f)   # as deep as verification allows
When a block is full (block-causal model): one fused forward commits its KV and predicts the
next block's first state; the prompt prefill is fused the same way with the first block. For a
bidirectional model (LLaDA, Dream) every forward carries the whole canvas [prefix | block | suffix
of masks]: one forward over it at each block start refreshes the cache (`prefix`: prefix KV;
`dual`: prefix and suffix KV), and in mode `none` every step recomputes it (LLaDA's generate).
Every forward counts.

Rows of a batch move block by block in lockstep; a row whose block is full waits for the
others (its results are ignored and it is not charged the forward); a finished row (EOS with
every position before it committed, or the budget spent) leaves the batch.

Dimension legend: B rows, L block length, W beam width, P cached positions, K top-k.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from .strategies import DecodeConfig, Policy

CACHE_MODES = ("none", "prefix", "dual", "exact", "auto")


@dataclass
class RowResult:
    text: str
    token_ids: list[int]
    forwards: int = 0
    tokens: int = 0
    tpf: float = 0.0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    beam_width_used: int = 1
    accepted_hist: dict = field(default_factory=dict)
    finished: bool = False          # True: stopped at EOS; False: the token budget ran out
    beam_width_requested: int = 1   # the W asked for; beam_width_used is lower when a cap applied

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["accepted_hist"] = {str(k): v for k, v in sorted(self.accepted_hist.items())}
        return d


def resolve_cache(mode: str, attention: str, width: int) -> str:
    if mode not in CACHE_MODES:
        raise UserError(f"unknown cache mode {mode!r} (expected one of {', '.join(CACHE_MODES)})")
    if mode == "auto":
        return "exact" if attention == "block_causal" else "prefix"
    if mode == "exact" and attention != "block_causal":
        raise UserError("cache mode 'exact' needs a block-causal model; use 'prefix' or 'none' for a bidirectional one")
    if mode == "none" and attention != "block_causal" and width > 1:
        raise UserError("cache mode 'none' on a bidirectional model verifies one branch per forward: use beam width 1, 'prefix' or 'dual'")
    if mode in ("prefix", "dual") and attention == "block_causal":
        return "exact"  # for a block-causal model the prefix cache is exact and there is no suffix to cache
    return mode


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


class _Batch:
    """Prefix bookkeeping + the engine cache for the rows still decoding."""

    def __init__(self, backend, attention: str, mode: str, prompts: list[list[int]], pad_id: int, capacity: int,
                 anchor: bool = False):
        self.backend, self.attention, self.mode = backend, attention, mode
        # anchor (shifted logits, Dream; bidirectional caches): the prefix's last token stays out of
        # the cache and rides in every call, since its row predicts the block's first position
        self.anchor = anchor and mode in ("prefix", "dual")
        b, p = len(prompts), max(len(x) for x in prompts)
        self.ids = np.full((b, p), pad_id, dtype=np.int64)           # (B,P) left-padded prompt
        self.valid = np.zeros((b, p), dtype=bool)                     # (B,P) real token?
        for r, x in enumerate(prompts):
            self.ids[r, p - len(x):] = x
            self.valid[r, p - len(x):] = True
        self.prompt_len = np.array([len(x) for x in prompts], dtype=np.int64)
        self.pos = np.maximum(np.cumsum(self.valid, axis=1) - 1, 0)   # (B,P) position ids
        self.blk = np.zeros((b, p), dtype=np.int64)                   # (B,P) block id (prompt = 0)
        self.rows = np.arange(b)                                      # original row of each live row
        self.cache = backend.new_cache(b, capacity) if mode != "none" else None
        self.prefix_len = 0                                           # P: tokens already in prefix
        self.suffix_len = 0                                           # dual: suffix KV after the prefix
        self.verify_mask = None     # verify_canvas's mask: the same from one refresh to the next

    def _engine(self, graph: str, cache, ids, pos, mask, keep: int = 0):
        """The one place engine results come back: ``prefill`` (keeps the KV of ``keep`` new
        tokens) or ``verify``; a schema-1 artifact's excluded ids are demoted here."""
        be = self.backend
        out = be.prefill(cache, ids, pos, mask, keep) if graph == "prefill" else be.verify(cache, ids, pos, mask)
        return demote_excluded(*out, be.host_excluded) if be.host_excluded else out

    def keep(self, live: np.ndarray) -> None:
        idx = np.flatnonzero(live)
        if idx.size == len(self.rows):
            return
        self.verify_mask = None
        for name in ("ids", "valid", "pos", "blk", "prompt_len", "rows"):
            setattr(self, name, getattr(self, name)[idx])
        if self.cache is not None:
            self.cache.keep_rows(idx)

    def forward(self, new_ids, new_pos, new_mask, new_blk, keep: int):
        """new_ids/new_pos (B,T); new_mask (B,T,T) among the new tokens; keep: how many of the
        new tokens join the prefix (0 = verify). Returns top ids/probs (B,T,K)."""
        b, t = new_ids.shape
        if self.mode != "none":
            p = self.cache.length
            pre = self.valid[:, None, None, :p] if p else np.zeros((b, 1, 1, 0), dtype=bool)
            mask = np.concatenate([np.broadcast_to(pre, (b, 1, t, p)), new_mask[:, None]], axis=-1)
            out = self._engine("prefill" if keep else "verify", self.cache, new_ids, new_pos, mask, keep)
        else:
            p = self.ids.shape[1] if self.prefix_len else 0
            ids = np.concatenate([self.ids[:, :p], new_ids], axis=1)
            pos = np.concatenate([self.pos[:, :p], new_pos], axis=1)
            mask = np.zeros((b, p + t, p + t), dtype=bool)
            v = self.valid[:, :p]
            if self.attention == "block_causal":
                mask[:, :p, :p] = v[:, None, :] & (self.blk[:, None, :p] <= self.blk[:, :p, None])
            else:
                mask[:, :p, :p] = v[:, None, :]
                mask[:, :p, p:] = True
            mask[:, :p, :p] |= np.eye(p, dtype=bool)[None]           # pad rows attend themselves
            mask[:, p:, :p] = v[:, None, :]
            mask[:, p:, p:] = new_mask
            cache = self.backend.new_cache(b, p + t)
            top_i, top_p = self._engine("verify", cache, ids, pos, mask[:, None])
            out = (top_i[:, p:], top_p[:, p:])
        if keep:
            if self.prefix_len:                       # a committed block (the prompt is already in)
                self._extend(new_ids[:, :keep], new_pos[:, :keep], new_blk[:, :keep])
            self.prefix_len += keep
        return out

    # -- bidirectional models: the whole canvas [prefix | block | suffix of masks] (LLaDA) --------

    def _canvas(self, parts):
        """Concatenate (ids, pos) parts after the prefix; key validity for all of them."""
        ids = np.concatenate([self.ids] + [x for x, _ in parts], axis=1)
        pos = np.concatenate([self.pos] + [y for _, y in parts], axis=1)
        n_new = ids.shape[1] - self.ids.shape[1]
        valid = np.concatenate([self.valid, np.ones((len(ids), n_new), dtype=bool)], axis=1)
        return ids, pos, valid

    @staticmethod
    def _full_mask(valid: np.ndarray) -> np.ndarray:
        """(B,1,S,S): every token attends every valid token; left-pad tokens attend themselves."""
        s = valid.shape[1]
        return (valid[:, None, :] | np.eye(s, dtype=bool)[None])[:, None]

    def refresh(self, block, block_pos, suffix, suffix_pos):
        """At a block's start (and, in mode ``none``, at every step): one forward over the whole
        canvas. ``prefix`` keeps the prefix KV (Fast-dLLM's prefix cache, refreshed per block);
        ``dual`` keeps the prefix and suffix KV (the suffix is ordered before the block so one
        ``keep`` covers both; RoPE positions, not order, place it). Returns f(block) (B,L,K)."""
        b, p = self.ids.shape
        L, s = block.shape[1], suffix.shape[1]
        a = int(self.anchor)          # the anchor (prefix's last token) moves after the cached part
        parts = [(suffix, suffix_pos), (block, block_pos)] if self.mode == "dual" else [(block, block_pos), (suffix, suffix_pos)]
        ids, pos, valid = self._canvas(parts)
        if a and self.mode == "dual":     # [prefix[:-1] | suffix | anchor | block]
            order = np.r_[0:p - 1, p:p + s, p - 1, p + s:p + s + L]
            ids, pos, valid = ids[:, order], pos[:, order], valid[:, order]
        mask = self._full_mask(valid)
        at = p + s if self.mode == "dual" else p
        if self.mode == "none":
            top_i, top_p = self._engine("verify", self.backend.new_cache(b, ids.shape[1]), ids, pos, mask)
        else:
            self.cache = self.backend.new_cache(b, ids.shape[1])
            self.verify_mask = None
            top_i, top_p = self._engine("prefill", self.cache, ids, pos, mask, p - a + (s if self.mode == "dual" else 0))
            self.suffix_len = s if self.mode == "dual" else 0
        return top_i[:, at:at + L], top_p[:, at:at + L]

    def verify_canvas(self, nodes, block_pos, suffix, suffix_pos):
        """f(node) for W block states (B,W,L) of a bidirectional model, in one forward."""
        b, w, L = nodes.shape
        if self.mode == "none":                          # W = 1: the whole canvas, nothing cached
            return tuple(x[:, None] for x in self.refresh(nodes[:, 0], block_pos, suffix, suffix_pos))
        s = 0 if self.mode == "dual" else suffix.shape[1]  # prefix mode: every branch carries the suffix
        a = int(self.anchor)                             # each branch: [anchor | node | suffix]
        g = a + L + s
        head = [np.broadcast_to(self.ids[:, None, -1:], (b, w, 1))] if a else []
        ids = np.concatenate(head + [nodes, np.broadcast_to(suffix[:, None, :s], (b, w, s))], axis=2).reshape(b, w * g)
        pos = np.tile(np.concatenate([self.pos[:, -1:]] * a + [block_pos, suffix_pos[:, :s]], axis=1), (1, w))
        if self.verify_mask is None or self.verify_mask.shape[2] != w * g:   # once per refresh
            p = self.cache.length
            pre = np.concatenate([self.valid[:, :self.valid.shape[1] - a], np.ones((b, self.suffix_len), dtype=bool)], axis=1)
            pre = pre[:, None, None, :p]
            new = np.kron(np.eye(w, dtype=bool), np.ones((g, g), dtype=bool))
            self.verify_mask = np.concatenate([np.broadcast_to(pre, (b, 1, w * g, p)),
                                               np.broadcast_to(new, (b, 1, w * g, w * g))], axis=-1)
        top_i, top_p = self._engine("verify", self.cache, ids, pos, self.verify_mask)
        k = top_i.shape[-1]
        return (top_i.reshape(b, w, g, k)[:, :, a:a + L], top_p.reshape(b, w, g, k)[:, :, a:a + L])

    def commit_block(self, block, block_pos):
        """A finished block joins the prefix (its KV is rebuilt by the next refresh)."""
        self._extend(block, block_pos, np.zeros_like(block))

    def _extend(self, ids, pos, blk):
        self.ids = np.concatenate([self.ids, ids], axis=1)
        self.pos = np.concatenate([self.pos, pos], axis=1)
        self.blk = np.concatenate([self.blk, blk], axis=1)
        self.valid = np.concatenate([self.valid, np.ones_like(ids, dtype=bool)], axis=1)


def _prompt_mask(valid: np.ndarray, block_len: int) -> np.ndarray:
    """(B,P+L,P+L) among [prompt | first block]: the prompt attends its valid tokens, pads attend
    themselves, the block attends the valid prompt and itself."""
    b, p = valid.shape
    n = p + block_len
    m = np.zeros((b, n, n), dtype=bool)
    m[:, :p, :p] = valid[:, None, :]
    m[:, :p, :p] |= np.eye(p, dtype=bool)[None] & ~valid[:, :, None]
    m[:, p:, :p] = valid[:, None, :]
    m[:, p:, p:] = True
    return m


def _commit_mask(b: int, block_len: int) -> np.ndarray:
    """(B,2L,2L) among [finished block | next block]: block-causal between the two."""
    blk = np.repeat([0, 1], block_len)
    return np.broadcast_to(blk[None, :] <= blk[:, None], (b, 2 * block_len, 2 * block_len))


def _finished_at(tokens: np.ndarray, mask_id: int, eos_id: int) -> int | None:
    """Index just past the first EOS if every position before it is committed, else None."""
    hits = np.flatnonzero(tokens == eos_id)
    if hits.size and not (tokens[: hits[0]] == mask_id).any():
        return int(hits[0]) + 1
    return None


class Decoder:
    """Runs a DecodeConfig over a backend. ``generate`` returns one RowResult per prompt."""

    def __init__(self, backend, tokenizer, config, max_beam_width: int | None = None):
        self.backend, self.tok, self.config = backend, tokenizer, config
        self.max_beam_width = max_beam_width
        self.cap_reason = "the artifact's max_beam_width"   # what set max_beam_width (for the warning)

    def generate(self, prompts: list[str], dcfg: DecodeConfig) -> list[RowResult]:
        c = self.config
        if not prompts:
            raise UserError("no prompt given")
        L = dcfg.block_length
        if L < 1 or dcfg.gen_length < 1:
            raise UserError("block length and gen length must be >= 1")
        requested = width = dcfg.beam_width if dcfg.strategy == "spd" else 1
        if self.max_beam_width is not None and width > self.max_beam_width:
            width = self.max_beam_width
            warnings.warn(f"beam width {requested} lowered to {width} (cap from {self.cap_reason})", stacklevel=2)
        dcfg = DecodeConfig(**{**dcfg.__dict__, "beam_width": width})
        policy = Policy(dcfg, c.mask_token_id)
        mode = resolve_cache(dcfg.cache, c.attention, policy.width)
        n_blocks = -(-dcfg.gen_length // L)
        encoded = [self.tok.encode(p) for p in prompts]
        for x in encoded:
            if not x:
                raise UserError("empty prompt")
            if len(x) + n_blocks * L > c.max_seq:
                raise UserError(f"prompt of {len(x)} tokens + {n_blocks * L} generated exceeds the model's max_seq {c.max_seq}")
        t0 = time.perf_counter()
        results = self._run(encoded, dcfg, policy, mode, n_blocks)
        wall = time.perf_counter() - t0
        out = []
        for ids, st in results:
            r = RowResult(text=self.tok.decode(ids), token_ids=[int(i) for i in ids], **st)
            r.tpf = r.tokens / max(r.forwards, 1)
            r.wall_s = wall
            r.tokens_per_s = r.tokens / wall if wall > 0 else 0.0
            r.beam_width_used = policy.width
            r.beam_width_requested = requested
            out.append(r)
        return out

    def _run(self, encoded, dcfg: DecodeConfig, policy: Policy, mode: str, n_blocks: int):
        c, L, m = self.config, dcfg.block_length, self.config.mask_token_id
        n = len(encoded)
        gen = [[] for _ in range(n)]
        stats = [{"forwards": 0, "tokens": 0, "accepted_hist": {}, "finished": False} for _ in range(n)]
        batch = _Batch(self.backend, c.attention, mode, encoded, c.pad_token_id, max(map(len, encoded)) + n_blocks * L,
                       anchor=c.shift_logits)   # (prefix / dual only: bidirectional models)
        w = policy.width
        tree_new = np.kron(np.eye(w, dtype=bool), np.ones((L, L), dtype=bool))     # (W*L, W*L)
        ar = np.arange(L)

        bidi = c.attention != "block_causal"   # LLaDA / Dream: the canvas carries the suffix of masks

        def suffix_of(blk_i, base_):
            s_len = (n_blocks - blk_i - 1) * L if bidi else 0
            return (np.full((len(base_), s_len), m, dtype=np.int64),
                    base_[:, None] + L + np.arange(s_len))

        # prefill fused with the first block's all-mask forward
        b = n
        state = np.full((b, L), m, dtype=np.int64)                                   # (B,L)
        p = batch.ids.shape[1]
        if bidi:
            fi, fp = batch.refresh(state, batch.prompt_len[:, None] + ar, *suffix_of(0, batch.prompt_len))
        else:
            new_ids = np.concatenate([batch.ids, state], axis=1)
            new_pos = np.concatenate([batch.pos, batch.prompt_len[:, None] + ar], axis=1)
            new_blk = np.zeros_like(new_ids)
            fi, fp = batch.forward(new_ids, new_pos, _prompt_mask(batch.valid, L), new_blk, keep=p)
            fi, fp = fi[:, p:], fp[:, p:]                                            # (B,L,K)
        for s in stats:
            s["forwards"] += 1

        for blk in range(n_blocks):
            b = len(batch.rows)
            base = batch.prompt_len + blk * L                                        # (B,) first position
            step = np.zeros(b, dtype=np.int64)                                      # rule steps taken
            block_pos = base[:, None] + ar                                           # (B,L) positions
            suffix = suffix_of(blk, base) if bidi else None                          # once per block
            done = np.zeros(b, dtype=bool)                                           # block full (or EOS)
            ended = np.zeros(b, dtype=bool)                                          # EOS reached
            while True:
                plans = [policy.plan(state[r], fi[r], fp[r], int(step[r])) for r in range(b)]
                nodes = np.stack([n_ for n_, _ in plans])                               # (B,W,L)
                for r in range(b):
                    if done[r]:
                        continue
                    state[r] = nodes[r, 0]
                    if _finished_at(state[r], m, c.eos_token_id) is not None:
                        done[r] = ended[r] = True
                    elif not (state[r] == m).any():
                        done[r] = True
                need = ~done
                if not need.any():
                    break
                if bidi:
                    vi, vp = batch.verify_canvas(nodes, block_pos, *suffix)
                else:
                    vi, vp = batch.forward(nodes.reshape(b, w * L), np.tile(block_pos, (1, w)),
                                           np.broadcast_to(tree_new, (b, w * L, w * L)),
                                           None, keep=0)
                    vi = vi.reshape(b, w, L, -1)
                    vp = vp.reshape(b, w, L, -1)
                for r in np.flatnonzero(need):
                    cur, steps = policy.select(nodes[r], plans[r][1], vi[r], vp[r], int(step[r]))
                    st = stats[batch.rows[r]]
                    st["forwards"] += 1
                    st["accepted_hist"][steps] = st["accepted_hist"].get(steps, 0) + 1
                    state[r] = nodes[r, cur]
                    fi[r], fp[r] = vi[r, cur], vp[r, cur]
                    step[r] += steps
                    if _finished_at(state[r], m, c.eos_token_id) is not None:
                        done[r] = ended[r] = True
                    elif not (state[r] == m).any():
                        done[r] = True
            for r in range(b):
                row = batch.rows[r]
                toks = state[r]
                stop = _finished_at(toks, m, c.eos_token_id)
                gen[row].extend(int(x) for x in (toks if stop is None else toks[:stop]))
                if stop is not None:
                    stats[row]["finished"] = True
            live = ~ended
            if blk == n_blocks - 1 or not live.any():
                break
            batch.keep(live)
            state, fi, fp = state[live], fi[live], fp[live]
            b = len(batch.rows)
            base = batch.prompt_len + blk * L
            nxt = np.full((b, L), m, dtype=np.int64)
            if bidi:   # the finished block joins the prefix; one forward over the canvas refreshes the cache
                batch.commit_block(state, base[:, None] + ar)
                fi, fp = batch.refresh(nxt, base[:, None] + L + ar, *suffix_of(blk + 1, base + L))
                for row in batch.rows:
                    stats[row]["forwards"] += 1
                state = nxt
                continue
            ids2 = np.concatenate([state, nxt], axis=1)
            pos2 = np.concatenate([base[:, None] + ar, base[:, None] + L + ar], axis=1)
            blk2 = np.full_like(ids2, blk + 1)
            fi, fp = batch.forward(ids2, pos2, _commit_mask(b, L), blk2, keep=L)
            fi, fp = fi[:, L:], fp[:, L:]
            for row in batch.rows:
                stats[row]["forwards"] += 1
            state = nxt
        for row in range(n):
            stats[row]["tokens"] = len(gen[row])
        return list(zip(gen, stats))
