"""A self-speculative model behind the Runtime's ordinary surface: ``generate`` / ``stream`` /
``chat`` with the decode keywords, per-row sampling and stopping (RowOptions), the chunks of
docs/streaming.md and RowResults, so the CLI, ``serve`` and the OpenAI frontend drive it as they
drive the masked families (runtime/loop.py's Decoder). The decode itself is runtime/self_spec.py.

Decode keywords it reads: ``strategy`` (ar | linear-spec | tree-spec | fastdiffuser),
``beam_width``, ``block_length`` (the draft block L), ``gen_length`` (the call's token budget),
``threshold`` (fastdiffuser) and the row keywords (temperature, top_k, top_p, seed, max_tokens,
stop); any other is refused in one line.
"""
from __future__ import annotations

import time
import warnings
from typing import Callable, Iterator

from ..options import OPTIONS, given_options, option_error
from ..errors import UserError
from .loop import RowResult, collect
from .rows import RowOptions
from .self_spec import GREEDY_ONLY, STRATEGIES, SelfSpecOptions, SelfSpecRun
from .stream import RowText

DEFAULT_STRATEGY = "tree-spec"   # never fewer tokens per round than linear-spec (it holds the chain); on a CPU
                                 # linear-spec is the faster of the two (docs/self_speculation.md)
# batch-wide decode keyword -> SelfSpecOptions field
BATCH_OPTIONS = {"strategy": "strategy", "beam_width": "beam_width", "block_length": "block_size",
                 "gen_length": "max_new_tokens", "threshold": "threshold"}
ROW_OPTIONS = ("temperature", "top_k", "top_p", "seed", "max_tokens", "stop")
READS = (*BATCH_OPTIONS, *ROW_OPTIONS)


def options(block_size: int, **decode) -> SelfSpecOptions:
    """SelfSpecOptions from decode keywords (None / empty: default), every one checked, with the
    model's ``block_size`` as L by default (0: checked without a model). The row keywords are
    checked here and read per row (``RowOptions``)."""
    given = given_options(decode, READS, "self-speculative", ", ".join(OPTIONS[k].flag for k in READS))
    for k, v in given.items():
        if k != "strategy" and (err := option_error(k, v, OPTIONS[k].flag)):
            raise err
    if "max_tokens" in given and "gen_length" not in given:
        given["gen_length"] = given["max_tokens"]          # gen_length defaults to max_tokens
    opts = SelfSpecOptions(strategy=DEFAULT_STRATEGY, block_size=block_size,
                           max_new_tokens=OPTIONS["gen_length"].default)
    for k, field in BATCH_OPTIONS.items():
        if k in given:
            setattr(opts, field, given[k])
    opts.check()
    if given.get("max_tokens") is not None and given["max_tokens"] > opts.max_new_tokens:
        raise UserError(f"max tokens ({given['max_tokens']}) exceeds gen length ({opts.max_new_tokens})")
    return opts


class SelfSpecDecoder:
    """Runs SelfSpecOptions over a causal backend (prefill + draft graphs)."""

    strategies = STRATEGIES

    def __init__(self, backend, tokenizer, config, max_beam_width: int | None = None):
        self.backend, self.tok, self.config = backend, tokenizer, config
        self.max_beam_width = max_beam_width
        self.cap_reason = "the artifact's max_beam_width"

    def options(self, **decode) -> SelfSpecOptions:
        """``options`` with this model's block size."""
        return options(self.config.block_size, **decode)

    def check_sampling(self, rows: list[RowOptions], opts: SelfSpecOptions | None = None) -> None:
        """Rows' sampling the backend can do (top-k within its pool) and the strategy allows."""
        k = max((o.top_k for o in rows), default=0)
        pool = self.backend.sample_pool
        if k and (pool is None or k > pool):
            raise UserError(f"top k {k} is over the {pool or 0} tokens {getattr(self.backend, 'folder', self.backend.name)} "
                            "samples from (its sampling pool; export --sample-pool sets it)")
        if opts is not None and opts.strategy in GREEDY_ONLY and any(o.sampling for o in rows):
            raise UserError(f"{opts.strategy} decodes greedily (temperature 0)")

    def _width(self, opts: SelfSpecOptions) -> tuple[SelfSpecOptions, int]:
        """opts with W within the cap (a warning says when it was lowered), and the W requested."""
        requested = opts.beam_width
        if opts.strategy == "tree-spec" and self.max_beam_width is not None and requested > self.max_beam_width:
            warnings.warn(f"beam width {requested} lowered to {self.max_beam_width} (cap from {self.cap_reason})",
                          stacklevel=3)
            opts = SelfSpecOptions(**{**opts.__dict__, "beam_width": self.max_beam_width})
        return opts, requested

    def _row_text(self):
        incremental = getattr(self.tok, "incremental", None)
        return incremental() if incremental else self.tok.decode

    def stream(self, prompts: list[str], opts: SelfSpecOptions, rows: list[RowOptions] | None = None,
               join: Callable[[], list] | None = None, cancel: Callable[[], list] | None = None) -> Iterator[dict]:
        """The chunks of docs/streaming.md: a round's tokens are final, so each round releases its
        text (held back only at an incomplete character or a stop string's start). Every check runs
        before the generator starts. ``join`` (continuous batching): called before every round, it
        returns [(prompt, RowOptions)] that join the batch there, numbered after the rows so far;
        ``cancel``: called after every forward, the rows to end now (finish_reason "cancelled")."""
        if not prompts:
            raise UserError("no prompt given")
        rows = [RowOptions()] * len(prompts) if rows is None else list(rows)
        self.check_sampling(rows, opts)
        opts, requested = self._width(opts)
        c = self.config
        take = None
        if join is not None:
            def take() -> list:
                new = list(join())
                self.check_sampling([o for _, o in new], opts)
                return [(self._encode(p), o) for p, o in new]
        run = SelfSpecRun(self.backend, [self._encode(p) for p in prompts], opts, c.mask_token_id, c.eos_token_id,
                          c.block_size, rows=rows, max_seq=c.max_seq, join=take)
        return self._chunks(run, opts, requested, cancel)

    def _encode(self, prompt: str) -> list[int]:
        ids = self.tok.encode(prompt)
        if not ids:
            raise UserError("empty prompt")
        return ids

    def _chunks(self, run: SelfSpecRun, opts: SelfSpecOptions, requested: int, cancel) -> Iterator[dict]:
        eos, res = self.config.eos_token_id, run.res
        texts: list[RowText] = []
        first: list = []
        started = run.started
        for report in run:
            while len(texts) < len(run.options):      # the call's rows, then rows that joined
                texts.append(RowText(self._row_text(), eos, run.options[len(texts)].stop, run.budget[len(texts)]))
                first.append(None)
            for row, tokens, stop in report:
                t = texts[row]
                if t.finish_reason is not None:
                    continue
                delta, new, reason = t.update(list(tokens) + ([eos] if stop == "eos" else []))
                if reason and stop is None:          # a stop string: the row leaves before the next forward
                    run.end([row], reason)
                if new and first[row] is None:
                    first[row] = time.perf_counter() - started[row]
                yield {"index": row, "delta": delta, "token_ids": new, "forwards": res.row_forwards[row],
                       "tokens": t.sent, "finish_reason": reason}
            for row in (cancel() if cancel else ()):
                if row < len(texts) and texts[row].finish_reason is None:
                    texts[row].finish_reason = "cancelled"
                    run.end([row], "cancelled")
                    yield {"index": row, "delta": "", "token_ids": [], "forwards": res.row_forwards[row],
                           "tokens": texts[row].sent, "finish_reason": "cancelled"}
        end, width = time.perf_counter(), opts.width()
        return [{"forwards": res.row_forwards[i], "accepted_hist": _hist(res.accepted[i]),
                 "finish_reason": t.finish_reason, "time_to_first_token_s": first[i], "wall_s": end - started[i],
                 "beam_width_used": width, "beam_width_requested": requested if opts.strategy == "tree-spec" else width}
                for i, t in enumerate(texts)]

    def generate(self, prompts: list[str], opts: SelfSpecOptions, rows: list[RowOptions] | None = None,
                 on_chunk: Callable[[dict], None] | None = None) -> list[RowResult]:
        """The stream collected (loop.collect): one RowResult per prompt; ``accepted_hist`` counts
        the rounds by the tokens each emitted."""
        return collect(self.stream(prompts, opts, rows), len(prompts), on_chunk)


def _hist(rounds: list[int]) -> dict:
    out: dict = {}
    for n in rounds:
        out[n] = out.get(n, 0) + 1
    return out
