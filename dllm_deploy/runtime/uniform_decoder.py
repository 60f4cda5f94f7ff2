"""A uniform-noise diffusion model (DiffusionGemma) behind the Runtime's ordinary surface:
``generate`` / ``stream`` / ``chat`` with text in and out, per-row seeds, budgets and stop strings,
the chunks of docs/streaming.md and RowResults, so the CLI, ``serve`` and the OpenAI frontend drive
it as they drive the other families. The decode itself is runtime/uniform_diffusion.py.

A canvas's tokens are final when the canvas is (its last step's argmax), so a row's text comes
one canvas at a time. Decode keywords it reads: ``gen_length`` (the call's token budget, whole
canvases), ``steps`` (= ``max_denoising_steps``), the rule's own options by name
(``max_denoising_steps``, ``entropy_bound``, ``t_min``, ``t_max``, ``stability_threshold``,
``confidence_threshold``; Python only) and the row keywords seed, max_tokens and stop; sampling
keywords other than the defaults are refused: the rule's temperatures are its schedule's.
"""
from __future__ import annotations

import time
from dataclasses import fields
from typing import Callable, Iterator

from ..options import OPTIONS, given_options, option_error
from ..errors import UserError
from .loop import RowResult, collect
from .rows import RowOptions
from .stream import RowText
from .uniform_diffusion import UniformDiffusionOptions, UniformRun

STRATEGY = "uniform-diffusion"       # the one rule of these models (Runtime.strategies)
RULE = tuple(f.name for f in fields(UniformDiffusionOptions) if f.name not in ("max_new_tokens", "seed"))
ROW_OPTIONS = ("seed", "max_tokens", "stop", "temperature", "top_k", "top_p")
READS = ("strategy", "gen_length", "steps", *RULE, *ROW_OPTIONS)


def options(defaults: dict, **decode) -> UniformDiffusionOptions:
    """The call's UniformDiffusionOptions: ``defaults`` (the artifact's, from its
    generation_config.json) with the decode keywords given (None / empty: default), every one
    checked. The row keywords are checked here and read per row."""
    given = given_options(decode, READS, "uniform-diffusion",
                          f"--gen-length, --max-tokens, --steps, --seed, --stop; from Python also {', '.join(RULE)}")
    if given.get("strategy", STRATEGY) != STRATEGY:
        raise UserError(f"unknown strategy {given['strategy']!r} for a uniform-diffusion model (it has one: {STRATEGY})")
    for k in ("gen_length", "steps", "max_tokens", "seed", "stop", "temperature", "top_k", "top_p"):
        if k in given and (err := option_error(k, given[k], OPTIONS[k].flag)):
            raise err
    for k in ("temperature", "top_k", "top_p"):
        if k in given and given[k] != OPTIONS[k].default:
            raise UserError(f"{OPTIONS[k].flag} does not apply to a uniform-diffusion model (its temperatures are "
                            "its schedule's: t_max to t_min over the steps)")
    if "steps" in given and "max_denoising_steps" in given:
        raise UserError("give steps or max_denoising_steps, not both")
    if "max_tokens" in given and "gen_length" not in given:
        given["gen_length"] = given["max_tokens"]
    rule = {**defaults, **{k: given[k] for k in RULE if k in given}}
    if "steps" in given:
        rule["max_denoising_steps"] = given["steps"]
    out = UniformDiffusionOptions(**rule, max_new_tokens=given.get("gen_length", OPTIONS["gen_length"].default))
    _check(out)
    if given.get("max_tokens") is not None and given["max_tokens"] > out.max_new_tokens:
        raise UserError(f"max tokens ({given['max_tokens']}) exceeds gen length ({out.max_new_tokens})")
    return out


def _check(o: UniformDiffusionOptions) -> None:
    for name, ok, want in (("max_new_tokens", o.max_new_tokens >= 1, ">= 1"),
                           ("max_denoising_steps", o.max_denoising_steps >= 1, ">= 1"),
                           ("entropy_bound", o.entropy_bound >= 0, ">= 0"),
                           ("t_min", 0 < o.t_min <= o.t_max, "in (0, t_max]"),
                           ("stability_threshold", o.stability_threshold >= 0, ">= 0"),
                           ("confidence_threshold", o.confidence_threshold >= 0, ">= 0")):
        if not ok:
            raise UserError(f"{name} must be {want}, got {getattr(o, name)}")


class UniformDecoder:
    """Runs UniformDiffusionOptions over a denoiser backend (OrtDenoiser, TorchDenoiser)."""

    strategies = (STRATEGY,)
    max_beam_width = 1
    cap_reason = "the rule (no branches)"

    def __init__(self, backend, tokenizer, config, decoding: dict):
        """``decoding``: the artifact's (``eos_ids``, ``pad_id``, ``options``: the checkpoint's defaults)."""
        self.backend, self.tok, self.config = backend, tokenizer, config
        self.eos_ids = tuple(int(x) for x in decoding["eos_ids"])
        self.pad_id = int(decoding["pad_id"])
        self.defaults = dict(decoding.get("options", {}))
        drop = set(self.eos_ids) | {self.pad_id}
        self._decode = lambda ids: tokenizer.decode([i for i in ids if i not in drop])

    def options(self, **decode) -> UniformDiffusionOptions:
        return options(self.defaults, **decode)

    def check_sampling(self, rows: list[RowOptions], opts=None) -> None:
        """Rows may set a seed, a budget and stop strings; not a sampler (the rule has its own)."""
        for o in rows:
            if o.temperature or o.top_k or o.top_p != 1.0:
                raise UserError("temperature, top-k and top-p do not apply to a uniform-diffusion model (its "
                                "temperatures are its schedule's)")

    def stream(self, prompts: list[str], opts: UniformDiffusionOptions, rows: list[RowOptions] | None = None,
               join: Callable[[], list] | None = None, cancel: Callable[[], list] | None = None) -> Iterator[dict]:
        """The chunks of docs/streaming.md, one per row and canvas (a canvas is final when its
        steps end). ``join`` (continuous batching): called at every canvas boundary, it returns
        [(prompt, RowOptions)] that join the batch there, numbered after the rows so far;
        ``cancel``: after every step, the rows to end now (finish_reason "cancelled")."""
        if not prompts:
            raise UserError("no prompt given")
        rows = [RowOptions()] * len(prompts) if rows is None else list(rows)
        if len(rows) != len(prompts):
            raise UserError(f"{len(rows)} row options given for {len(prompts)} prompts (one per prompt)")
        encoded = [self._encode(p, o, opts) for p, o in zip(prompts, rows)]
        options = list(rows)          # every result row's, the joined ones' appended as they join

        def take() -> list:
            new = list(join())
            out = [(self._encode(p, o, opts), o.seed, o.request) for p, o in new]
            options.extend(o for _, o in new)
            return out
        run = UniformRun(self.backend, encoded, opts, vocab_size=self.config.vocab_size,
                         canvas_length=self.config.canvas_length, eos_ids=self.eos_ids, pad_id=self.pad_id,
                         seeds=[o.seed for o in rows], request_ids=[o.request for o in rows], own_positions=True,
                         join=None if join is None else take)
        return self._chunks(run, opts, options, cancel)

    def _encode(self, prompt: str, row: RowOptions, opts: UniformDiffusionOptions) -> list[int]:
        """The prompt's ids, after the checks a row passes (sampling, budget, length)."""
        self.check_sampling([row])
        if row.max_tokens is not None and row.max_tokens > opts.max_new_tokens:
            raise UserError(f"max tokens ({row.max_tokens}) exceeds gen length ({opts.max_new_tokens})")
        ids = self.tok.encode(prompt)
        if not ids:
            raise UserError("empty prompt")
        span = -(-opts.max_new_tokens // self.config.canvas_length) * self.config.canvas_length
        if len(ids) + span > self.config.max_seq:
            raise UserError(f"prompt of {len(ids)} tokens + {span} generated exceeds the model's max_seq {self.config.max_seq}")
        return ids

    def _chunks(self, run: UniformRun, opts, options: list[RowOptions], cancel) -> Iterator[dict]:
        texts: list[RowText] = []
        final: list[list[int]] = []
        first: list = []
        started: list[float] = []

        def grow():                   # the call's rows, then rows that joined
            while len(texts) < len(options):
                o = options[len(texts)]
                texts.append(RowText(self._decode, self.eos_ids, o.stop, min(o.max_tokens or opts.max_new_tokens,
                                                                             opts.max_new_tokens)))
                final.append([])
                first.append(None)
                started.append(time.perf_counter())

        def forwards(i):
            return int(run.forwards[i] + run.encoder_rows[i])

        grow()
        for event in run:
            grow()
            if event is not None:
                for i, canvas in zip(*event):
                    t = texts[i]
                    if t.finish_reason is not None:
                        continue
                    ids = [int(x) for x in canvas if x != self.pad_id]     # pad is no token (transformers' count)
                    end = next((j + 1 for j, x in enumerate(ids) if x in self.eos_ids), None)
                    final[i] += ids[:end]
                    cut = final[i][:t.budget]
                    if run.finished[i] and end is None:     # the canvases ran out: whatever the row has is all
                        t.budget = len(cut)
                    delta, new, reason = t.update(cut)
                    if reason:
                        run.end([i])
                    if new and first[i] is None:
                        first[i] = time.perf_counter() - started[i]
                    yield {"index": int(i), "delta": delta, "token_ids": new, "forwards": forwards(i),
                           "tokens": t.sent, "finish_reason": reason}
            for i in (cancel() if cancel else ()):
                if i < len(texts) and texts[i].finish_reason is None:
                    texts[i].finish_reason = "cancelled"
                    run.end([i])
                    yield {"index": i, "delta": "", "token_ids": [], "forwards": forwards(i),
                           "tokens": texts[i].sent, "finish_reason": "cancelled"}
        end_t = time.perf_counter()
        return [{"forwards": forwards(i), "accepted_hist": {}, "finish_reason": t.finish_reason,
                 "time_to_first_token_s": first[i], "wall_s": end_t - started[i], "beam_width_used": 1,
                 "beam_width_requested": 1} for i, t in enumerate(texts)]

    def generate(self, prompts: list[str], opts: UniformDiffusionOptions, rows: list[RowOptions] | None = None,
                 on_chunk: Callable[[dict], None] | None = None) -> list[RowResult]:
        """The stream collected (loop.collect): one RowResult per prompt; ``forwards`` counts the
        row's decoder steps and its encoder forwards (one per canvas)."""
        return collect(self.stream(prompts, opts, rows), len(prompts), on_chunk)

