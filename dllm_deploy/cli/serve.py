"""``dllm-deploy serve``: the model on Triton Inference Server; the request defaults and limits that
triton-repo and loadtest read from the same flags."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError
from .common import add_decode_flags, artifact_kind, check_decode_flags, decode_kwargs, runtime


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="serve the model with Triton Inference Server (docs/serving.md)")
    add_decode_flags(sv, json_flag=False)
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; 0.0.0.0 for every interface)")
    sv.add_argument("--http-port", type=int, default=8000)
    sv.add_argument("--grpc-port", type=int, default=8001)
    sv.add_argument("--metrics-port", type=int, default=8002)
    add_limit_flags(sv)
    sv.add_argument("--static-batches", action="store_true",
                    help="requests wait for the next batch instead of joining a running one at a block boundary")
    sv.add_argument("--openai-port", type=int, default=None,
                    help="also serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) on this port")
    sv.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                    help="on SIGTERM / SIGINT: refuse new requests and let those in flight finish for up to S "
                         "seconds, then end the rest with an error and exit 0")
    sv.add_argument("--chat-template", default=None, metavar="FILE",
                    help="render chat requests with this template instead of the artifact's")
    sv.add_argument("--served-model-name", default=None,
                    help="the model id OpenAI clients send (default: the artifact folder's name)")
    sv.set_defaults(func=run)


def run(a) -> int:
    from ..serving.server import check_environment, check_ports, serve
    check_serve_flags(a)
    ports = {"--http-port": a.http_port, "--grpc-port": a.grpc_port, "--metrics-port": a.metrics_port}
    if a.openai_port is not None:
        ports["--openai-port"] = a.openai_port
    if not 0 <= a.drain_timeout <= 3600:
        raise UserError(f"--drain-timeout {a.drain_timeout:g}: expected seconds in 0..3600")
    check_environment()
    check_ports(a.host, ports)
    rt = runtime(a)
    if a.chat_template:
        from ..text import check_template, load_chat_template
        rt.chat_template = check_template(load_chat_template(".", override=a.chat_template))
    defaults, limits = serve_limits(a, rt)
    serve(rt, a.host, ports, limits, defaults, instances=a.max_batch_size, continuous=not a.static_batches,
          model_name=a.served_model_name or Path(a.artifact or a.model or "tiny").resolve().name,
          drain_timeout=a.drain_timeout)
    return 0


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded together (and dllm's instances)")
    p.add_argument("--max-queue", type=int, default=64, help="requests queued or decoding; more are refused")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt (default: the model's max_seq less the generated canvas)")
    p.add_argument("--request-timeout", type=float, default=0.0, metavar="S",
                   help="a request that sets no timeout of its own is cancelled S seconds after it arrives "
                        "(0: never)")


def serve_defaults(a, rt) -> tuple[dict, object]:
    """The decode options every request starts from (the flags set; gen_length fixed: every batch
    decodes the same canvas, whatever its rows' max_tokens) and their DecodeConfig. serve and
    loadtest (for its offline references) both read them from the same flags."""
    defaults = {k: v for k, v in decode_kwargs(a).items() if v is not None}
    cfg = rt.decode_config(**defaults)
    if rt.kind == "self_spec":
        return {**defaults, "strategy": cfg.strategy, "gen_length": cfg.max_new_tokens}, cfg
    if rt.kind == "uniform":
        return {**defaults, "strategy": rt.strategies[0], "gen_length": cfg.max_new_tokens}, cfg
    return {**defaults, "gen_length": cfg.gen_length}, cfg


def check_serve_flags(a) -> None:
    """serve's and triton-repo's limit flags and decode flags, checked before a model loads."""
    for flag, value in (("--max-batch-size", a.max_batch_size), ("--max-queue", a.max_queue),
                        ("--max-prompt-tokens", a.max_prompt_tokens or 1)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1 (got {value})")
    if not 0 <= a.request_timeout <= 86400:
        raise UserError(f"--request-timeout {a.request_timeout:g}: expected seconds in 0..86400 (0: no deadline)")
    check_decode_flags(a, artifact_kind(a.artifact))


def serve_limits(a, rt):
    """The request defaults and the Limits a server (serve, or a triton-repo model) enforces."""
    from ..serving.contract import Limits
    defaults, cfg = serve_defaults(a, rt)
    gen = defaults["gen_length"]
    if rt.kind == "self_spec":       # the tokens and the last round's draft block
        canvas = gen + (cfg.block_size or rt.config.block_size)
    elif rt.kind == "uniform":       # whole canvases
        canvas = -(-gen // rt.config.canvas_length) * rt.config.canvas_length
    else:
        canvas = -(-gen // cfg.block_length) * cfg.block_length
    if not a.max_prompt_tokens and rt.config.max_seq - canvas < 1:
        raise UserError(f"a canvas of {canvas} tokens (--gen-length {gen}) leaves no room for a prompt in the "
                        f"model's {rt.config.max_seq} positions: pass a smaller --gen-length")
    return defaults, Limits(max_prompt_tokens=a.max_prompt_tokens or rt.config.max_seq - canvas,
                            max_tokens=gen, max_beam_width=rt.max_beam_width or getattr(cfg, "beam_width", 1),
                            max_queue=a.max_queue, timeout=a.request_timeout)
