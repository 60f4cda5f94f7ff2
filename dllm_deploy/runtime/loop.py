"""The decode loop: one loop for every strategy, every backend, every cache mode.

Per block (L positions, all [MASK] at the start), per iteration (``_Run.decode_block``):
    nodes, tree = policy.plan(S, f(S))     # W drafted block states (node 0 = base rule's step)
    f(nodes) = run(verify plan)            # ONE forward, W branches under a tree mask
    S, f(S) = policy.select(nodes, tree, f)   # as deep as verification allows
until the block is full (``block_status``). Then ``next_block``: for a block-causal model one
fused forward commits the block's KV and predicts the next block's first state (the prompt
prefill is fused the same way with the first block: ``first_block``); for a bidirectional
model (LLaDA, Dream) the block joins the prefix and one forward over the canvas [prefix | block
| suffix of masks] refreshes the cache. Under cache mode ``delayed`` (block-causal, W = 1) the
verify forward is ``canvas.held_verify`` over the block's held keys, which leave the cache before
the commit. What each forward feeds is a canvas.py plan; the rows' prefix and cache live in
prefix.py. Every forward counts.

Rows of a batch move block by block in lockstep; a row whose block is full waits for the
others (its results are ignored and it is not charged the forward); a finished row (EOS with
every position before it committed, a stop string, or the budget spent) leaves the batch at the
end of the block. After every forward the loop reports each live row's final tokens
(``_Run.report``): ``Decoder.stream`` turns them into chunks of text (stream.py), and
``Decoder.generate`` is that stream collected (docs/streaming.md). With an exact cache at block
boundaries (modes exact and delayed), rows may join a running batch there (``join``: continuous
batching, docs/serving.md).

Dimension legend: B rows, L block length, W beam width, K top-k.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..errors import UserError
from . import canvas
from ..options import OPTIONS, option_error
from ..errors import OptionError
from ..models.capabilities import EXACT_AT_BOUNDARY, Capabilities, resolve_cache
from .prefix import PrefixState
from .rows import RowOptions
from .stream import RowText
from .strategies import DecodeConfig, Policy
from .trace import Tracer
from .tree import node_depths



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
    finished: bool = False          # True: stopped at EOS or a stop string; False: the token budget ran out
    beam_width_requested: int = 1   # the W asked for; beam_width_used is lower when a cap applied
    finish_reason: str = "length"   # eos | stop | length | cancelled (docs/streaming.md)
    time_to_first_token_s: float | None = None   # call start -> the row's first chunk with token ids

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["accepted_hist"] = {str(k): v for k, v in sorted(self.accepted_hist.items())}
        return d


def block_status(tokens: np.ndarray, mask_id: int, eos_id: int) -> tuple[bool, int | None]:
    """(done, stop) of a block state (L,): stop is the index just past the first EOS when every
    position before it is committed (the row ends), else None; done when it ends or is full.
    (Asked twice per row and forward: on the L ids as a list, cheaper than numpy at this size.)"""
    t = tokens.tolist()
    if eos_id in t:
        e = t.index(eos_id)
        if mask_id not in t[:e]:
            return True, e + 1
    return mask_id not in t, None


class _Run:
    """One ``generate`` call: the batch's blocks, each decoded plan -> verify -> select. ``decode``
    is a generator: one report per forward, [(row, final ids)] for the live rows."""

    def __init__(self, backend, config, caps: Capabilities, encoded: list[list[int]], policy: Policy, mode: str,
                 n_blocks: int, L: int, rows: list[RowOptions], join: Callable[[], list] | None = None,
                 trace: Callable[[dict], None] | None = None):
        """``join``: called at every block boundary, the (prompt ids, RowOptions) of rows that join
        the batch there (continuous batching; modes exact and delayed only, see ``joins``).
        ``trace``: called with each decision record (trace.py) once its iteration is over."""
        self.tracer = Tracer(policy, trace) if trace else None
        self.backend, self.policy, self.mode, self.n_blocks, self.L = backend, policy, mode, n_blocks, L
        self.mask_id, self.eos_id, self.anchor = config.mask_token_id, config.eos_token_id, caps.shift_logits
        self.pad_id = config.pad_token_id
        self.bidi = not caps.block_causal   # LLaDA / Dream: the canvas carries the suffix of masks
        self.bc_mode = "exact" if mode == "delayed" else mode   # delayed: exact at block boundaries
        self.join = join if joins(backend, caps, mode) else None
        self.gen: list[list[int]] = []          # each row's finished blocks' ids (each cut just after its EOS)
        self.final: list[list[int]] = []        # each row's final ids so far (report), extended in place
        self.options: list[RowOptions] = []     # each row's, in row order
        self.budget: list[int] = []             # final ids a row may have
        self.blocks: list[int] = []             # blocks a row has finished
        self.started: list[float] = []          # when a row started (perf_counter): the call's start or its join
        self.stats: list[dict] = []
        self.stopped: set[int] = set()      # rows finished by their report (stop string, budget): they leave
        self.state = self._new_rows(encoded, rows)

    def _new_rows(self, encoded: list[list[int]], rows: list[RowOptions]) -> PrefixState:
        """The PrefixState of new rows, numbered after the rows so far."""
        prefix = canvas.Prefix.of_prompts(encoded, self.pad_id)
        width = prefix.ids.shape[1] + self.n_blocks * self.L
        cached = {"exact": width, "delayed": width + self.L}.get(self.mode, 0)    # delayed: a block's held keys too
        state = PrefixState(self.backend, prefix, cached, rows)
        state.rows = state.rows + len(self.gen)
        now, span = time.perf_counter(), self.n_blocks * self.L
        for o in rows:
            self.gen.append([])
            self.final.append([])
            self.options.append(o)
            self.budget.append(min(o.max_tokens or span, span))
            self.blocks.append(0)
            self.started.append(now)
            self.stats.append({"forwards": 0, "accepted_hist": {}})
        return state

    def decode(self) -> Iterator[list[tuple[int, list[int]]]]:
        block, f_ids, f_probs = self.first_block()
        k = 0
        while True:
            yield from self.decode_block(k, block, f_ids, f_probs)
            live = self.finish_block(block)
            joiners = self.join() if self.join else []
            if not (live.any() or joiners):
                return
            block, f_ids, f_probs = self.advance(k, block, live, joiners)
            k += 1

    def advance(self, k: int, block: np.ndarray, live: np.ndarray, joiners: list):
        """The live rows' next block and the joiners' first one (their prompts prefilled in one
        call of their own), as one batch (B,L) and f of it."""
        parts = []
        if live.any():
            self.state.keep(live)
            parts.append(self.next_block(k, block[live]))
        if joiners:
            new = self._new_rows([ids for ids, _ in joiners], [o for _, o in joiners])
            parts.append(self.first_block(new))
            if live.any():
                self.state.join(new, self.pad_id)
                self.state.trim()
            else:
                self.state = new
        return tuple(np.concatenate(x) for x in zip(*parts))

    def stop(self, row: int) -> None:
        """Row ``row`` (original numbering) has finished: its block counts as done, and it leaves
        the batch at the end of the block."""
        self.stopped.add(row)

    def report(self, block: np.ndarray) -> list[tuple[int, list[int]]]:
        """Each live row's final ids: its finished blocks, then the committed left-to-right prefix
        of ``block`` (B,L), cut just after EOS and to the row's budget. Final ids only grow: each
        row's list is extended in place by the ids that became final since the last report."""
        out = []
        for row, t in zip(self.state.rows.tolist(), block.tolist()):
            ids, base = self.final[row], len(self.gen[row])        # base: the finished blocks' ids
            head = t.index(self.mask_id) if self.mask_id in t else len(t)
            if self.eos_id in t[:head]:
                head = t.index(self.eos_id) + 1
            upto = min(base + head, self.budget[row])
            if upto > len(ids):                                      # (len(ids) >= base unless at the budget)
                ids.extend(t[len(ids) - base: upto - base])
            out.append((row, ids))
        return out

    def _suffix_len(self, k: int) -> int:
        """Masked positions after block k up to the budget (bidirectional canvas only)."""
        return (self.n_blocks - k - 1) * self.L

    def _forward(self, plan: canvas.Plan, state: PrefixState | None = None):
        """A block-start forward (every row of ``state``, default the live rows, is charged):
        f(block) (B,L,K) twice."""
        state = state or self.state
        top_ids, top_probs = state.run(plan)
        for row in state.rows.tolist():
            self.stats[row]["forwards"] += 1
        return top_ids[:, 0], top_probs[:, 0]

    def first_block(self, state: PrefixState | None = None):
        """The first block's state (B,L), all masks, and f of it; the prompt is prefilled here
        (``state``: rows that join, default the live rows)."""
        state = state or self.state
        prefix = state.prefix
        block = np.full((len(prefix.ids), self.L), self.mask_id, dtype=np.int64)   # (B,L)
        if self.bidi:
            plan = canvas.refresh(prefix, block, self._suffix_len(0), self.mask_id, self.mode, self.anchor)
        else:
            plan = canvas.first_block(prefix, block, self.bc_mode)
        return (block, *self._forward(plan, state))

    def next_block(self, k: int, block: np.ndarray):
        """Block k (B,L) joins the prefix; the next block's state (all masks) and f of it."""
        nxt = np.full_like(block, self.mask_id)                                    # (B,L)
        if self.bidi:
            self.state.extend(block)
            plan = canvas.refresh(self.state.prefix, nxt, self._suffix_len(k + 1), self.mask_id, self.mode, self.anchor)
        else:
            plan = canvas.commit_next(self.state.prefix, block, nxt, self.bc_mode)
            self.state.extend(block)
        return (nxt, *self._forward(plan))

    def _verify(self, k: int, nodes: np.ndarray, steps: np.ndarray, cached: np.ndarray):
        """f(node) (B,W,L,K) twice for the drafted states (B,W,L) of block k: one forward; node w
        of row r serves base-rule step ``steps[r, w]`` (its sampling noise). ``cached`` (B,L):
        the block's held positions (mode delayed)."""
        prefix = self.state.prefix
        if self.mode == "delayed":
            return self._held_verify(nodes, cached, steps)
        if self.bidi:
            return self.state.run(canvas.canvas_verify(prefix, nodes, self._suffix_len(k), self.mask_id,
                                                       self.mode, self.anchor), steps)
        return self.state.run(canvas.tree_verify(prefix, nodes, self.mode), steps)

    def _held_verify(self, nodes: np.ndarray, cached: np.ndarray, steps: np.ndarray):
        """Cache mode delayed: f(node 0) (B,1,L,K) over the prefix and the block's held keys;
        the positions committed since the last call join the held keys (``cached`` (B,L) bool,
        updated in place)."""
        state = nodes[:, 0]
        fresh = (state != self.mask_id) & ~cached                                   # (B,L)
        plan = canvas.held_verify(self.state.prefix, self.state.held, state, fresh, self.mask_id, self.pad_id)
        out = self.state.run(plan, steps)
        self.state.hold(np.arange(plan.keep)[None] < fresh.sum(axis=1)[:, None])
        cached |= fresh
        return out

    def decode_block(self, k: int, block: np.ndarray, f_ids: np.ndarray, f_probs: np.ndarray) -> Iterator[list]:
        """Fills block k (B,L) in place, given f of it (f_ids/f_probs (B,L,K)), until every row's
        block is full or ended; reports after every forward, once node 0 (the base rule's step
        from its results, which every selection reaches) is committed."""
        b, policy = len(block), self.policy
        f = list(zip(f_ids, f_probs))                                              # row r: f(block[r]) (L,K) twice
        step = [0] * b                                                             # rule steps taken
        done = [False] * b                                                         # block full (or EOS)
        cached = np.zeros(block.shape, dtype=bool)                                 # mode delayed: held positions
        while True:
            drafts = [policy.plan(block[r], *f[r], step[r]) for r in range(b)]
            nodes = np.stack([d[0] for d in drafts]) if b > 1 else drafts[0][0][None]   # (B,W,L)
            rows = self.state.rows.tolist()
            for r in range(b):
                if not done[r]:
                    if self.tracer:
                        self.tracer.plan(r, rows[r], k, step[r], self.stats[rows[r]]["forwards"], block[r], f[r][1],
                                         nodes[r], drafts[r][1])
                    block[r] = nodes[r, 0]
                    done[r] = block_status(block[r], self.mask_id, self.eos_id)[0]
            yield self.report(block)
            if self.stopped:
                done = [d or row in self.stopped for d, row in zip(done, rows)]
            need = [r for r in range(b) if not done[r]]
            if not need:
                self.state.drop_held()                                              # mode delayed's, if any
                if self.tracer:
                    self.tracer.flush()
                return
            v_ids, v_probs = self._verify(k, nodes, self._serves(step, drafts), cached)   # (B,W,L,K)
            for r in need:
                cur, steps = policy.select(nodes[r], drafts[r][1], v_ids[r], v_probs[r], step[r])
                if self.tracer:
                    self.tracer.select(r, nodes[r], drafts[r][1], v_probs[r], step[r], cur, steps)
                st = self.stats[rows[r]]
                st["forwards"] += 1
                st["accepted_hist"][steps] = st["accepted_hist"].get(steps, 0) + 1
                f[r] = v_ids[r, cur], v_probs[r, cur]
                step[r] += steps
                if cur:                                   # node 0 is the block already
                    block[r] = nodes[r, cur]
                    done[r] = block_status(block[r], self.mask_id, self.eos_id)[0]
            if self.tracer:
                self.tracer.flush()

    def _serves(self, step: list[int], drafts: list) -> np.ndarray | None:
        """(B,W) the base-rule step each drafted node serves (its sampling noise); None when no
        row samples (a greedy call feeds no noise)."""
        if self.state.sampling is None:
            return None
        return np.stack([step[r] + 1 + np.asarray(node_depths(d[1])) for r, d in enumerate(drafts)])

    def finish_block(self, block: np.ndarray) -> np.ndarray:
        """Appends each row's tokens (up to its EOS); (B,) True for the rows that go on (not ended,
        not stopped, blocks left in their canvas)."""
        live = np.ones(len(block), dtype=bool)
        for r, row in enumerate(self.state.rows.tolist()):
            stop = block_status(block[r], self.mask_id, self.eos_id)[1]
            self.gen[row].extend(block[r, :stop].tolist())
            self.blocks[row] += 1
            live[r] = stop is None and row not in self.stopped and self.blocks[row] < self.n_blocks
        return live


def joins(backend, caps: Capabilities, mode: str) -> bool:
    """Whether rows can join a running batch: an exact cache at block boundaries (a block-causal
    model under cache exact, or delayed, whose held in-block keys are gone by then), whose finished
    blocks are final, on a backend whose cache can be padded and stacked (ONNX Runtime, torch).
    A bidirectional canvas ends in a suffix as long as the rows' remaining budget, which rows
    at different blocks do not share: there, new rows wait for the next batch."""
    return caps.joins and mode in EXACT_AT_BOUNDARY and getattr(backend, "joins_batches", False)


class Decoder:
    """Runs a DecodeConfig over a backend. ``generate`` returns one RowResult per prompt."""

    def __init__(self, backend, tokenizer, config, max_beam_width: int | None = None,
                 capabilities: Capabilities | None = None):
        """``capabilities``: the model's (default: the backend's), e.g. a block-causal model's
        weights decoded as a bidirectional one."""
        self.backend, self.tok, self.config = backend, tokenizer, config
        self.caps: Capabilities = capabilities or backend.capabilities
        self.max_beam_width = max_beam_width
        self.cap_reason = "the artifact's max_beam_width"   # what set max_beam_width (for the warning)

    def check_sampling(self, rows: list[RowOptions]) -> None:
        """Sampling needs a top-k within the pool the graphs sample from."""
        be = self.backend
        k = max(o.top_k for o in rows)
        if k > be.sample_pool:
            raise UserError(f"top k {k} is over the {be.sample_pool} tokens {getattr(be, 'folder', be.name)} samples "
                            "from (its sampling pool; export --sample-pool sets it)")

    def _check_rows(self, rows: list[RowOptions] | None, n: int, dcfg: DecodeConfig) -> list[RowOptions]:
        """One RowOptions per prompt (default: RowOptions()), their budgets within the canvas and their
        sampling within what the backend can do."""
        if rows is None:
            return [RowOptions()] * n
        rows = list(rows)
        if len(rows) != n or not all(isinstance(r, RowOptions) for r in rows):
            raise UserError(f"{len(rows)} row options given for {n} prompts (one RowOptions per prompt)")
        for r in rows:
            err = option_error("max_tokens", r.max_tokens) or option_error("stop", r.stop)
            if err:
                raise err
            if r.max_tokens is not None and r.max_tokens > dcfg.gen_length:
                raise OptionError("bad_option", "max_tokens", f"max tokens ({r.max_tokens}) exceeds gen length "
                                  f"({dcfg.gen_length})", OPTIONS["max_tokens"].flag)
        self.check_sampling(rows)
        return rows

    def _prepare(self, prompts: list[str], dcfg: DecodeConfig, rows: list[RowOptions] | None, join=None, trace=None):
        """(the run, its policy, the W requested): every check before a forward."""
        c = self.config
        if not prompts:
            raise UserError("no prompt given")
        L = dcfg.block_length
        if L < 1 or dcfg.gen_length < 1:
            raise UserError("block length and gen length must be >= 1")
        rows = self._check_rows(rows, len(prompts), dcfg)
        requested = width = dcfg.beam_width if dcfg.strategy == "spd" else 1
        if self.max_beam_width is not None and width > self.max_beam_width:
            width = self.max_beam_width
            warnings.warn(f"beam width {requested} lowered to {width} (cap from {self.cap_reason})", stacklevel=2)
        dcfg = DecodeConfig(**{**dcfg.__dict__, "beam_width": width})
        policy = Policy(dcfg, c.mask_token_id)
        mode = resolve_cache(dcfg.cache, self.caps, policy.width)
        n_blocks = -(-dcfg.gen_length // L)
        encoded = [self._encode(p, n_blocks * L) for p in prompts]
        join = None if join is None else self._joiner(join, dcfg, n_blocks * L)
        return _Run(self.backend, c, self.caps, encoded, policy, mode, n_blocks, L, rows, join, trace), policy, requested

    def _encode(self, prompt: str, span: int) -> list[int]:
        ids = self.tok.encode(prompt)
        if not ids:
            raise UserError("empty prompt")
        if len(ids) + span > self.config.max_seq:
            raise UserError(f"prompt of {len(ids)} tokens + {span} generated exceeds the model's max_seq {self.config.max_seq}")
        return ids

    def _joiner(self, join: Callable[[], list], dcfg: DecodeConfig, span: int) -> Callable[[], list]:
        """``join`` (() -> [(prompt, RowOptions)]) with the prompts encoded and every row checked
        as the call's own rows are."""
        def take() -> list:
            new = list(join())
            if not new:
                return []
            rows = self._check_rows([o for _, o in new], len(new), dcfg)
            return [(self._encode(p, span), o) for (p, _), o in zip(new, rows)]
        return take

    def stream(self, prompts: list[str], dcfg: DecodeConfig, rows: list[RowOptions] | None = None,
               join: Callable[[], list] | None = None, cancel: Callable[[], list] | None = None,
               trace: Callable[[dict], None] | None = None) -> Iterator[dict]:
        """The chunks of docs/streaming.md as the rows' text becomes final; the generator returns
        (StopIteration.value) one dict per row of what chunks do not carry. Every check runs
        here, before the generator starts; closing it cancels the call. ``join`` (continuous
        batching): called at every block boundary, it returns [(prompt, RowOptions)] that join the
        batch there, numbered after the rows so far (a model without an exact cache: never called).
        ``cancel``: called after every forward, the rows to end now (a client gone, a deadline
        passed): each gets a last chunk with finish_reason "cancelled" and stops at once; it leaves
        the batch at the end of its block (rows stay in lockstep), and a batch whose rows have all
        ended makes no further forward. ``trace``: called with each decision record (runtime/trace.py)."""
        return self._chunks(*self._prepare(prompts, dcfg, rows, join, trace), cancel=cancel)

    def _row_text(self):
        """A row's text for RowText: the tokenizer's incremental one if it has one, else its decode."""
        incremental = getattr(self.tok, "incremental", None)
        return incremental() if incremental else self.tok.decode

    def _chunks(self, run: _Run, policy: Policy, requested: int, cancel=None) -> Iterator[dict]:
        texts, first = [], []
        for report in run.decode():
            for row, ids in report:
                while len(texts) <= row:      # rows that joined since
                    o = run.options[len(texts)]
                    texts.append(RowText(self._row_text(), self.config.eos_token_id, o.stop, run.budget[len(texts)]))
                    first.append(None)
                t = texts[row]
                if len(ids) == t.seen or t.finish_reason is not None:
                    continue
                delta, new, reason = t.update(ids)
                if reason:
                    run.stop(row)
                if new and first[row] is None:
                    first[row] = time.perf_counter() - run.started[row]
                yield {"index": row, "delta": delta, "token_ids": new, "forwards": run.stats[row]["forwards"],
                       "tokens": t.sent, "finish_reason": reason}
            for row in (cancel() if cancel else ()):
                if row < len(texts) and texts[row].finish_reason is None:
                    texts[row].finish_reason = "cancelled"
                    run.stop(row)
                    yield {"index": row, "delta": "", "token_ids": [], "forwards": run.stats[row]["forwards"],
                           "tokens": texts[row].sent, "finish_reason": "cancelled"}
        end = time.perf_counter()
        return [{**st, "finish_reason": t.finish_reason, "time_to_first_token_s": ttft, "wall_s": end - t0,
                 "beam_width_used": policy.width, "beam_width_requested": requested}
                for st, t, ttft, t0 in zip(run.stats, texts, first, run.started)]

    def generate(self, prompts: list[str], dcfg: DecodeConfig, rows: list[RowOptions] | None = None,
                 on_chunk: Callable[[dict], None] | None = None,
                 trace: Callable[[dict], None] | None = None) -> list[RowResult]:
        """The stream collected: each row's text and token ids are its chunks' concatenated
        (``on_chunk`` sees every chunk as it comes; ``trace`` every decision record, trace.py)."""
        return collect(self.stream(prompts, dcfg, rows, trace=trace), len(prompts), on_chunk)


def collect(chunks: Iterator[dict], n: int, on_chunk: Callable[[dict], None] | None = None) -> list[RowResult]:
    """One RowResult per row of a decoder's stream of ``n`` rows (its chunks, then its return value:
    one dict of stats per row); ``on_chunk`` sees every chunk as it comes."""
    text, ids = [[] for _ in range(n)], [[] for _ in range(n)]
    while True:
        try:
            c = next(chunks)
        except StopIteration as end:
            rest = end.value
            break
        text[c["index"]].append(c["delta"])
        ids[c["index"]].extend(c["token_ids"])
        if on_chunk:
            on_chunk(c)
    out = []
    for t, i, st in zip(text, ids, rest):
        wall = st["wall_s"]
        out.append(RowResult(text="".join(t), token_ids=i, tokens=len(i), tpf=len(i) / max(st["forwards"], 1),
                             tokens_per_s=len(i) / wall if wall > 0 else 0.0,
                             finished=st["finish_reason"] in ("eos", "stop"), **st))
    return out
