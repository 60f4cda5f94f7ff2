"""``dllm-deploy generate``: decode prompts (masked, self-speculative and uniform-diffusion artifacts)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from .common import add_decode_flags, artifact_kind, check_decode_flags, decode_kwargs, runtime, write_file


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="decode one or more prompts")
    g.add_argument("--chat", default=None, metavar="JSON",
                   help="chat messages, e.g. '[{\"role\": \"user\", \"content\": \"upper: dog\"}]', rendered with "
                        "the model's chat template into the prompt (instead of --prompt)")
    g.add_argument("--prompt", action="append", required=False,
                   help="prompt text (repeat for a batch); bytes that are not UTF-8 become U+FFFD")
    g.add_argument("--escapes", action="store_true",
                   help="interpret \\n \\t \\r \\0 \\\\ \\\" \\' \\xHH \\uHHHH \\UHHHHHHHH in prompts and stop strings "
                        "(others are refused)")
    g.add_argument("--stream", action="store_true",
                   help="print text as it becomes final (--json: one JSON object per chunk, then the result; "
                        "docs/streaming.md)")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="write each decode step's decisions and their margins to FILE, one JSON object a line "
                        "(masked-diffusion models; docs/cpp.md \"What 'the same model' means\")")
    add_decode_flags(g)
    g.set_defaults(func=run)


def print_chunk(as_json: bool):
    """--stream: each chunk as it comes (a JSON line, or its text), flushed."""
    def show(chunk: dict) -> None:
        sys.stdout.write(json.dumps(chunk) + "\n" if as_json else chunk["delta"])
        sys.stdout.flush()
    return show


def run(a) -> int:
    from ..text import decode_escapes
    from ..runtime.api import decode_config, row_options
    if (a.chat is None) == (not a.prompt):
        raise UserError("give --prompt (one or more) or --chat, not both and not neither")
    messages = None
    if a.chat is not None:
        from ..text import check_messages
        try:
            messages = check_messages(json.loads(a.chat))
        except ValueError as e:
            raise UserError(f"--chat: not valid JSON ({e})") from None
    prompts = [decode_escapes(p) if a.escapes else p for p in a.prompt or []]
    if a.stop and a.escapes:
        a.stop = [decode_escapes(s) for s in a.stop]
    if a.stream and not a.json and len(prompts) > 1:
        raise UserError("--stream prints one prompt's text as it comes: give one --prompt, or add --json "
                        "(each chunk line names its row)")
    if artifact_kind(a.artifact) != "masked":
        if a.trace:
            raise UserError(f"--trace records the decisions of masked-diffusion models; {a.artifact} is a "
                            f"{artifact_kind(a.artifact)} one")
        return _generate_other(a, prompts, messages)
    decode_config(**decode_kwargs(a))            # bad options fail before a model is loaded
    rt = runtime(a)
    if messages is not None:
        prompts = [rt.chat_prompt(messages)]
    dcfg = rt.decode_config(**decode_kwargs(a))
    records: list[dict] = []
    results = rt.generate(prompts, [row_options(**decode_kwargs(a))] * len(prompts), config=dcfg,
                          on_chunk=print_chunk(a.json) if a.stream else None,
                          trace=records.append if a.trace else None)
    if a.trace:
        write_file(Path(a.trace), "".join(json.dumps(r) + "\n" for r in records))
        print(f"trace: {len(records)} decision records in {a.trace}", file=sys.stderr)
    if a.json:
        payload = results[0].to_dict() if len(results) == 1 else {"results": [r.to_dict() for r in results]}
        print(json.dumps(payload))
    else:
        for r in results:
            print("" if a.stream else r.text)
            print(f"[{r.tokens} tokens, {r.forwards} forwards, TPF {r.tpf:.2f}, {r.tokens_per_s:.1f} tok/s, "
                  f"beam_width {r.beam_width_used}, backend {rt.backend.name}, {r.finish_reason}]", file=sys.stderr)
    return 0


def _generate_other(a, prompts: list[str], messages) -> int:
    """generate on a self-speculative artifact (runtime/self_spec_decoder.py) or a uniform-diffusion
    one (runtime/uniform_decoder.py): prompts, chat, stop strings, streaming and JSON as for the
    masked families; their own options and summary line."""
    from ..runtime.api import row_options
    decode = decode_kwargs(a)
    check_decode_flags(a, artifact_kind(a.artifact))      # bad options fail before the model is loaded
    rt = runtime(a)
    if messages is not None:
        prompts = [rt.chat_prompt(messages)]
    opts = rt.decode_config(**decode)
    results = rt.generate(prompts, [row_options(**decode)] * len(prompts), config=opts,
                          on_chunk=print_chunk(a.json) if a.stream else None)
    spec = rt.kind == "self_spec"
    extra = [{"strategy": opts.strategy, "rounds": sum(r.accepted_hist.values()),
              "tokens_per_round": round(_per_round(r.accepted_hist), 3)} if spec else
             {"strategy": rt.strategies[0], "steps": opts.max_denoising_steps} for r in results]
    if a.json:
        rows = [{**r.to_dict(), **e, "backend": rt.backend.name} for r, e in zip(results, extra)]
        print(json.dumps(rows[0] if len(rows) == 1 else {"results": rows}))
        return 0
    for r, e in zip(results, extra):
        print("" if a.stream else r.text)
        how = (f"{e['tokens_per_round']:.2f} tokens per round, " if spec else "") + f"{r.tokens_per_s:.1f} tok/s, " + \
            (f"{opts.strategy} W {opts.width()}" if spec else f"{e['strategy']} {e['steps']} steps")
        print(f"[{r.tokens} tokens, {r.forwards} forwards, TPF {r.tpf:.2f}, {how}, backend {rt.backend.name}, "
              f"{r.finish_reason}]", file=sys.stderr)
    return 0


def _per_round(hist: dict) -> float:
    """Tokens per round of an accepted-tokens histogram {tokens: rounds}."""
    rounds = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / rounds if rounds else 0.0
