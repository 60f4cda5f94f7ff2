"""Self-speculative decoding of a model that drafts by diffusion and verifies causally
(Nemotron-Labs-Diffusion; docs/self_speculation.md). Pure numpy over a backend's two graphs:
``prefill`` runs the causal forwards (the prompt, each verification; it writes KV) and
``verify`` the draft (bidirectional over a block of masks after the prefix; it writes none).

    ar           one token per causal forward: the reference output and the baseline
    linear-spec  NVIDIA's LinearSpec: draft the block [seed, MASK x (L-1)] in one forward, verify
                 it in one causal forward, accept the longest prefix on which the draft equals the
                 causal prediction, plus the causal prediction after it (the bonus, next seed)
    tree-spec    as linear-spec, but the verification checks a tree: the W most probable
                 sequences under the draft's top-K per position, merged into a trie, in the same
                 single causal forward (each node attends the prefix and its ancestors); the
                 longest root path whose every token equals its parent's causal prediction is
                 accepted. W 1 is linear-spec.
    fastdiffuser the block-diffusion mode (lossy; NVIDIA's "FastDiffuser"): the block [seed, MASK x
                 (L-1)] is denoised by draft forwards, each committing the masked positions whose
                 confidence reaches ``threshold`` (at least the most confident one), then one causal
                 forward over the finished block writes its KV and predicts the next seed

For the first three, every emitted token is a causal prediction whose whole context is prefix + accepted tokens, so
the output is the model's own autoregressive output (greedy, or sampled with the counter-based
noise of the predicted position: runtime/noise.py, counter (position, 0, request, 0)). Rows of a
batch run in lock step; each keeps the KV of its accepted path only (the cache columns another
row accepted are masked out for it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..errors import UserError
from .prefix import RowSampling
from .rows import RowOptions
from .self_spec_trie import Trie, accepted_path, build_trie

STRATEGIES = ("ar", "linear-spec", "tree-spec", "fastdiffuser")
LOSSY = ("fastdiffuser",)            # strategies whose output is not ar's
GREEDY_ONLY = ("fastdiffuser",)      # strategies that do not sample
# precisions whose activation scales are computed per call (dynamic int8): a token's result depends on the
# other tokens of its forward, so a verification's causal predictions may differ from ar's one-token
# forwards at near-ties (docs/self_speculation.md, "Precisions"); a profile's int8 gives way to fp32
CALL_DEPENDENT = ("int8",)


@dataclass
class SelfSpecOptions:
    strategy: str = "linear-spec"    # ar | linear-spec | tree-spec | fastdiffuser
    block_size: int = 0              # L: the draft block (the seed and L-1 masks); 0: the model's
    beam_width: int = 4              # tree-spec: W draft sequences verified together (1: linear-spec)
    max_new_tokens: int = 64         # tokens per row (the first comes from the prompt's forward)
    temperature: float = 0.0         # 0: greedy; else sampled with counter-based noise (seed, request, position)
    seed: int = 0
    threshold: float = 0.9           # fastdiffuser: the confidence a masked position commits at
    draft_ahead: bool = False        # linear-spec / tree-spec: the verify forward also drafts the next block
                                     # (fewer forwards; on a CPU, where a forward costs per token, slower)

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UserError(f"unknown strategy {self.strategy!r} for a self-speculative model "
                            f"(one of {', '.join(STRATEGIES)})")
        if self.block_size < 0 or self.block_size == 1:
            raise UserError(f"block_size must be >= 2 (or 0: the model's), got {self.block_size}")
        if self.beam_width < 1:
            raise UserError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.threshold <= 1:
            raise UserError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.strategy in GREEDY_ONLY and self.temperature > 0:
            raise UserError(f"{self.strategy} decodes greedily (temperature 0)")

    def width(self) -> int:
        """W: the draft sequences a round verifies (0 for ar, which drafts nothing)."""
        return {"ar": 0, "linear-spec": 1, "fastdiffuser": 1}.get(self.strategy, self.beam_width)


@dataclass
class SelfSpecResult:
    tokens: list = field(default_factory=list)      # per row: generated ids (EOS and after it dropped)
    stop: list = field(default_factory=list)        # per row: "eos" | "length" | a reason SelfSpecRun.end gave
    accepted: list = field(default_factory=list)    # per row: tokens emitted per round (after the first token)
    forwards: int = 0                               # model calls for the whole batch (prefill, drafts, verifies)
    row_forwards: list = field(default_factory=list)  # per row: the model calls it took part in
    verify_tokens: int = 0                          # query tokens the causal verifications ran (the tree cost)
    seconds: float = 0.0

    def tokens_per_round(self) -> float:
        return mean_round([a for row in self.accepted for a in row])

    def rows(self, decode) -> list[dict]:
        """One dict per row (``decode``: the tokenizer's ids -> text): text, token_ids, tokens,
        finish_reason ("stop": EOS, "length"), rounds, tokens_per_round."""
        return [{"text": decode(t), "token_ids": t, "tokens": len(t),
                 "finish_reason": {"eos": "stop"}.get(self.stop[r], self.stop[r]), "rounds": len(self.accepted[r]),
                 "tokens_per_round": round(mean_round(self.accepted[r]), 3)} for r, t in enumerate(self.tokens)]


def mean_round(rounds: list[int]) -> float:
    """Tokens emitted per round, on average (0 with no round)."""
    return sum(rounds) / len(rounds) if rounds else 0.0


class _Batch:
    """The rows being decoded and their cache bookkeeping: ``valid`` (B,P) marks the cache
    columns each row attends (its prompt and its accepted tokens); ``seed`` (B,) each row's next
    block's first token; ``sampling`` the rows' sampling options (None: every row is greedy)."""

    def __init__(self, backend, prompts, mask_id, eos_id, pad_id, rows: list[RowOptions]):
        self.backend, self.mask_id, self.eos, self.pad = backend, mask_id, eos_id, pad_id
        self.rows = list(range(len(prompts)))             # result row of each batch row
        self.sampling = RowSampling(rows) if any(o.sampling for o in rows) else None
        self.cache = backend.new_cache(len(prompts), 0)
        self.valid = np.zeros((len(prompts), 0), dtype=bool)
        self.next_pos = np.array([len(p) for p in prompts], dtype=np.int64)
        self.seed = np.zeros(len(prompts), dtype=np.int64)
        self.ahead: list = [None] * len(prompts)        # per row: the next block's draft (ids, probs), or None

    def inputs(self, pos: np.ndarray) -> dict | None:
        """The graphs' sampling inputs for queries at ``pos`` (B,T): each predicts position pos+1."""
        return None if self.sampling is None else self.sampling.inputs(pos + 1, np.zeros_like(pos))

    def mask(self, new: np.ndarray) -> np.ndarray:
        """(B,1,T,P+T): the valid cache columns, then ``new`` (B,T,T) among the new tokens."""
        b, t, _ = new.shape
        old = np.broadcast_to(self.valid[:, None, None, :], (b, 1, t, self.valid.shape[1]))
        return np.ascontiguousarray(np.concatenate([old, new[:, None]], axis=3))

    def keep(self, rows: np.ndarray) -> None:
        self.cache.keep_rows(rows)
        self.valid, self.next_pos, self.seed = self.valid[rows], self.next_pos[rows], self.seed[rows]
        if self.sampling is not None:
            self.sampling.take(rows)
        self.rows = [self.rows[r] for r in rows]
        self.ahead = [self.ahead[r] for r in rows]
        self.trim()

    def trim(self) -> None:
        """Drop the leading cache columns no live row attends (a finished row's, a joining row's
        padding), so a batch that rows keep joining grows no wider than its oldest live row's span."""
        if not self.rows:
            return
        used = self.valid.any(axis=0)
        lead = int(used.argmax()) if used.any() else used.size
        if lead:
            self.cache.drop_left(lead)
            self.valid = self.valid[:, lead:]

    def add(self, other: "_Batch") -> None:
        """``other``'s rows after these: the narrower cache is padded on the left with columns no
        row attends (a row's positions are its own, so its KV and outputs do not change)."""
        for a, b in ((self, other), (other, self)):
            n = b.valid.shape[1] - a.valid.shape[1]
            if n > 0:
                a.cache.pad_left(n)
                a.valid = np.concatenate([np.zeros((len(a.valid), n), dtype=bool), a.valid], axis=1)
        self.cache.add_rows(other.cache)
        self.valid = np.concatenate([self.valid, other.valid])
        self.next_pos, self.seed = np.concatenate([self.next_pos, other.next_pos]), np.concatenate([self.seed, other.seed])
        if self.sampling is not None or other.sampling is not None:
            mine = self.sampling or RowSampling([RowOptions()] * len(self.rows))
            mine.stack(other.sampling or RowSampling([RowOptions()] * len(other.rows)))
            self.sampling = mine
        self.rows = self.rows + other.rows
        self.ahead = self.ahead + other.ahead
        self.trim()


class SelfSpecRun:
    """One decode of ``prompts`` (token ids, each non-empty) with ``opts.strategy``. Iterating it
    runs the forwards: after every forward that gave rows tokens it yields [(row, tokens so far,
    stop reason or None)] for the rows it served (a round's tokens are final); ``end`` takes rows
    out between forwards. ``res`` holds the result.

    ``block_size``: the model's L (used when opts.block_size is 0); ``rows``: each row's
    RowOptions (sampling, seed, request word, token budget ``max_tokens`` <= opts.max_new_tokens;
    default: opts' temperature and seed for every row, request words 0, 1, ... or ``requests``);
    ``max_seq``: the model's longest sequence (a prompt whose decode could pass it is refused);
    ``join``: continuous batching, called before every round: [(prompt ids, RowOptions)] of rows
    that join the batch there (numbered after the rows so far)."""

    def __init__(self, backend, prompts: list[list[int]], opts: SelfSpecOptions, mask_id: int, eos_id: int,
                 block_size: int, rows: list[RowOptions] | None = None, requests=None, pad_id: int | None = None,
                 max_seq: int | None = None, join: Callable[[], list] | None = None):
        opts.check()
        if rows is None:
            req = range(len(prompts)) if requests is None else requests
            rows = [RowOptions(temperature=opts.temperature, seed=opts.seed, request=int(r)) for r in req]
        self.backend, self.opts, self.join = backend, opts, join
        self.mask_id, self.eos, self.pad = mask_id, eos_id, eos_id if pad_id is None else pad_id
        self.L, self.max_seq = opts.block_size or block_size, max_seq
        self.res = SelfSpecResult()
        self.budget: list[int] = []
        self.options: list[RowOptions] = []     # each result row's
        self.started: list[float] = []          # when each result row started (perf_counter): the call or its join
        self._check(prompts, rows)
        self.prompts = prompts
        self.st = self._new_rows(prompts, rows)

    def _check(self, prompts: list[list[int]], rows: list[RowOptions]) -> None:
        rows = list(rows)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UserError("every prompt needs at least one token")
        if len(rows) != len(prompts):
            raise UserError(f"{len(rows)} row options given for {len(prompts)} prompts (one per prompt)")
        for o in rows:
            if o.max_tokens is not None and not 1 <= o.max_tokens <= self.opts.max_new_tokens:
                raise UserError(f"max tokens ({o.max_tokens}) is outside 1..{self.opts.max_new_tokens} (the call's gen length)")
            if o.sampling and self.opts.strategy in GREEDY_ONLY:
                raise UserError(f"{self.opts.strategy} decodes greedily (temperature 0)")
        longest = max(len(p) for p in prompts) + self.opts.max_new_tokens + self.L
        if self.max_seq is not None and longest > self.max_seq:
            raise UserError(f"prompt ({max(len(p) for p in prompts)} tokens) + max_new_tokens {self.opts.max_new_tokens} + "
                            f"a block of {self.L} exceeds the model's max_seq {self.max_seq}")

    def _new_rows(self, prompts: list[list[int]], rows: list[RowOptions]) -> _Batch:
        """A batch of new rows, numbered after the result rows so far."""
        first, n = len(self.res.tokens), len(prompts)
        res = self.res
        res.tokens += [[] for _ in range(n)]
        res.stop += ["length"] * n
        res.accepted += [[] for _ in range(n)]
        res.row_forwards += [0] * n
        self.budget += [o.max_tokens or self.opts.max_new_tokens for o in rows]
        self.options += list(rows)
        self.started += [time.perf_counter()] * n
        st = _Batch(self.backend, prompts, self.mask_id, self.eos, self.pad, list(rows))
        st.rows = list(range(first, first + n))
        return st

    def __iter__(self) -> Iterator[list]:
        st, res, opts = self.st, self.res, self.opts
        t0 = time.perf_counter()
        yield _prefill(st, self.prompts, res, self.budget)
        while st.rows:
            if self.join is not None and (new := self.join()):
                yield self._add(new)
            if opts.strategy == "fastdiffuser":
                block = _diffuse(st, self.L, opts.threshold, res)
                yield _commit_block(st, block, res, self.budget)
            else:
                tries = _draft(st, self.L, opts.width(), res)
                yield _verify(st, tries, res, self.budget, self.L if opts.draft_ahead else 0)
            res.seconds = time.perf_counter() - t0
        res.seconds = time.perf_counter() - t0

    def _add(self, new: list) -> list:
        """Rows that join at a round boundary (continuous batching): their prompts' forward (their
        own batch: their first tokens are what they would be alone), then they decode with the
        others. ``new``: [(prompt ids, RowOptions)]. Returns the prompts' forward's report."""
        prompts, rows = [p for p, _ in new], [o for _, o in new]
        self._check(prompts, rows)
        other = self._new_rows(prompts, rows)
        report = _prefill(other, prompts, self.res, self.budget)
        self.st.add(other)
        return report

    def end(self, rows, reason: str) -> None:
        """End result rows ``rows`` now with stop reason ``reason`` (a stop string, a cancel): they
        leave the batch before the next forward, their cache with them."""
        gone = set(rows)
        for row in gone:
            self.res.stop[row] = reason
        self.st.keep(np.array([r for r, row in enumerate(self.st.rows) if row not in gone], dtype=np.int64))


def generate(backend, prompts: list[list[int]], opts: SelfSpecOptions, mask_id: int, eos_id: int,
             block_size: int, requests=None, pad_id: int | None = None, max_seq: int | None = None,
             on_tokens=None, rows: list[RowOptions] | None = None) -> SelfSpecResult:
    """The whole decode (SelfSpecRun's arguments); ``on_tokens(row, tokens, stop)``: called after
    every forward that gave row ``row`` tokens, with all of its tokens so far and its stop reason
    once it has one (None while it goes on)."""
    run = SelfSpecRun(backend, prompts, opts, mask_id, eos_id, block_size, rows, requests, pad_id, max_seq)
    for report in run:
        for row, tokens, stop in report:
            if on_tokens is not None:
                on_tokens(row, tokens, stop)
    return run.res


def _forward(st: _Batch, res: SelfSpecResult, served=None) -> None:
    """Count one model call: the batch's, and each row's it served (``served``: batch rows, default
    all; a row whose block is finished waits through the others' draft steps uncounted)."""
    res.forwards += 1
    for r in range(len(st.rows)) if served is None else served:
        res.row_forwards[st.rows[r]] += 1


def _prefill(st: _Batch, prompts: list, res: SelfSpecResult, budget: list) -> list:
    """The prompts' causal forward (left-padded: a pad column attends only itself): their KV, and
    each row's first token (the first seed)."""
    n, lp = len(prompts), max(len(p) for p in prompts)
    ids = np.full((n, lp), st.pad, dtype=np.int64)
    real = np.zeros((n, lp), dtype=bool)
    for b, p in enumerate(prompts):
        ids[b, lp - len(p):] = p
        real[b, lp - len(p):] = True
    pos = np.maximum(np.arange(lp)[None] - (lp - st.next_pos)[:, None], 0)
    causal = np.tril(np.ones((lp, lp), dtype=bool))[None] & real[:, None, :]
    causal |= np.eye(lp, dtype=bool)[None]
    top, _ = st.backend.prefill(st.cache, ids, pos, causal[:, None], keep=lp, sampling=st.inputs(pos))
    _forward(st, res)
    st.valid = real
    seed = top[:, -1, 0].astype(np.int64)
    return _advance(st, res, budget, [[int(s)] for s in seed], seed, first=True)


def _draft(st: _Batch, L: int, width: int, res: SelfSpecResult) -> list:
    """Each row's verification trie: the seed alone (ar, ``width`` 0), or the ``width`` best
    sequences of its draft of [seed, MASK x (L-1)]: the one the last verification made ahead
    (``st.ahead``), else one draft forward (run for the batch when a row needs it, counted for
    the rows it served)."""
    if width == 0:
        return [Trie(np.array([s]), np.array([-1]), np.array([0])) for s in st.seed]
    b = len(st.rows)
    need = [r for r in range(b) if st.ahead[r] is None]
    drafts = list(st.ahead)
    if need:
        block = np.full((b, L), st.mask_id, dtype=np.int64)
        block[:, 0] = st.seed
        bpos = st.next_pos[:, None] + np.arange(L)[None]
        d_ids, d_p = st.backend.verify(st.cache, block, bpos, st.mask(np.ones((b, L, L), dtype=bool)))
        _forward(st, res, need)
        for r in need:
            drafts[r] = (d_ids[r], d_p[r])
    st.ahead = [None] * b
    return [build_trie(int(st.seed[r]), drafts[r][0][1:], drafts[r][1][1:], width) for r in range(b)]


def _verify(st: _Batch, tries: list, res: SelfSpecResult, budget: list, ahead: int = 0) -> list:
    """One causal forward over every row's trie (a filler node attends itself); each row keeps the
    KV of its accepted path and emits its tokens and the bonus (the next seed). ``ahead`` (L, or 0):
    the same forward also drafts the next block after each row's first chain (the trie's nodes
    0..L-1): L masks after it, bidirectional among themselves, each attending the prefix and the
    chain, at the positions after it, greedy. A row that accepts that whole chain drafts its next
    round from them (``st.ahead``) instead of a draft forward; what is drafted never changes the
    output, which is the causal predictions'."""
    b = len(tries)
    sizes = [len(tr.tokens) for tr in tries]
    t = max(sizes) + ahead
    tok = np.full((b, t), st.pad, dtype=np.int64)
    depth = np.zeros((b, t), dtype=np.int64)
    tree = np.broadcast_to(np.eye(t, dtype=bool), (b, t, t)).copy()
    for r, tr in enumerate(tries):
        m = sizes[r]
        tok[r, :m], depth[r, :m], tree[r, :m, :m] = tr.tokens, tr.depth, tr.ancestors()
        if ahead:
            tok[r, m:m + ahead] = st.mask_id
            depth[r, m:m + ahead] = ahead + np.arange(ahead)     # after the chain of ahead (= L) nodes
            tree[r, m:m + ahead, :ahead] = True
            tree[r, m:m + ahead, m:m + ahead] = True
    qpos = st.next_pos[:, None] + depth
    paths: list = []

    def keep(top_ids, _probs):
        paths.extend(accepted_path(tr, top_ids[r, :len(tr.tokens), 0]) for r, tr in enumerate(tries))
        n = max(len(p) for p in paths)
        return np.array([p + [p[-1]] * (n - len(p)) for p in paths], dtype=np.int64)

    sampling = st.inputs(qpos)
    if ahead and sampling is not None:        # the drafted block is greedy (u 0: the top-1, then the pool)
        sampling["sample_u"] = sampling["sample_u"].copy()
        for r in range(b):
            sampling["sample_u"][r, sizes[r]:sizes[r] + ahead] = 0.0
    top, probs = st.backend.prefill(st.cache, tok, qpos, st.mask(tree), keep=keep, sampling=sampling)
    _forward(st, res)
    res.verify_tokens += int(sum(sizes))
    n = max(len(p) for p in paths)
    st.valid = np.concatenate([st.valid, np.array([[i < len(p) for i in range(n)] for p in paths])], axis=1)
    emitted, seed = [], np.zeros(b, dtype=np.int64)
    for r, (tr, p) in enumerate(zip(tries, paths)):
        seed[r] = top[r, p[-1], 0]
        emitted.append([int(x) for x in tr.tokens[p[1:]]] + [int(seed[r])])
        st.next_pos[r] += len(p)
        if ahead and p == list(range(ahead)):
            st.ahead[r] = (top[r, sizes[r]:sizes[r] + ahead], probs[r, sizes[r]:sizes[r] + ahead])
    return _advance(st, res, budget, emitted, seed)


def _diffuse(st: _Batch, L: int, threshold: float, res: SelfSpecResult) -> np.ndarray:
    """The rows' blocks [seed, MASK x (L-1)] denoised by draft forwards (bidirectional over the
    prefix, no KV written): each commits a row's masked positions whose top-1 probability reaches
    ``threshold``, and at least its most confident one. (B,L) finished blocks."""
    b = len(st.rows)
    block = np.full((b, L), st.mask_id, dtype=np.int64)
    block[:, 0] = st.seed
    bpos = st.next_pos[:, None] + np.arange(L)[None]
    mask = st.mask(np.ones((b, L, L), dtype=bool))
    while (masked := block == st.mask_id).any():
        d_ids, d_p = st.backend.verify(st.cache, block, bpos, mask)
        _forward(st, res, np.flatnonzero(masked.any(axis=1)))
        conf = np.where(masked, d_p[:, :, 0], -1.0)
        take = masked & (conf >= threshold)
        rows = np.flatnonzero(masked.any(axis=1))
        take[rows, conf[rows].argmax(axis=1)] = True
        block[take] = d_ids[:, :, 0][take]
    return block


def _commit_block(st: _Batch, block: np.ndarray, res: SelfSpecResult, budget: list) -> list:
    """One causal forward over the finished blocks: their KV, and each row's next seed. Emits the
    block after its seed, then the new seed."""
    b, L = block.shape
    bpos = st.next_pos[:, None] + np.arange(L)[None]
    top, _ = st.backend.prefill(st.cache, block, bpos, st.mask(np.broadcast_to(np.tril(np.ones((L, L), bool)), (b, L, L))),
                                keep=L)
    _forward(st, res)
    res.verify_tokens += b * L
    st.valid = np.concatenate([st.valid, np.ones((b, L), dtype=bool)], axis=1)
    seed = top[:, -1, 0].astype(np.int64)
    st.next_pos += L
    return _advance(st, res, budget, [[int(x) for x in block[r, 1:]] + [int(seed[r])] for r in range(b)], seed)


def _advance(st: _Batch, res: SelfSpecResult, budget: list, emitted: list, seed: np.ndarray,
             first: bool = False) -> list:
    """The rows' emitted tokens to their results (cut at EOS and at each row's ``budget``); the
    finished rows leave the batch (their cache with them). Returns the report: [(row, tokens so
    far, stop reason or None)] of every row the forward served."""
    st.seed = seed
    report = []
    going = []
    for r, toks in enumerate(emitted):
        row = st.rows[r]
        if not first:
            res.accepted[row].append(len(toks))
        for x in toks:
            if x == st.eos:
                res.stop[row] = "eos"
                break
            if len(res.tokens[row]) >= budget[row]:
                break
            res.tokens[row].append(x)
        alive = res.stop[row] != "eos" and len(res.tokens[row]) < budget[row]
        report.append((row, res.tokens[row], None if alive else res.stop[row]))
        if alive:
            going.append(r)
    if len(going) < len(emitted):          # a finished row leaves, its cache with it (no copy otherwise)
        st.keep(np.array(going, dtype=np.int64))
    return report
