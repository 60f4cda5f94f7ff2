"""``dllm-deploy``: one module per command, each with ``add_parser(sub)`` and ``run(args)``.

A user mistake prints one line on stderr and exits with 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from ..errors import UserError

# the modules of the commands, in the order ``dllm-deploy --help`` lists them
COMMANDS = ("generate", "trace_diff", "evaluate", "export", "bench", "report", "profiles", "build_engines", "serve",
            "openai", "triton_repo", "loadtest", "distill", "train", "train_selfspec", "demo")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dllm-deploy", description="Deploy diffusion LLMs with ONNX Runtime / TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return ap


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C: every ``finally`` and
    ``except BaseException`` on the way (the exporter's scratch-folder removal) runs."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # a second SIGTERM must not cut the cleanup short
    raise Terminated()


def main(argv=None) -> int:
    import warnings
    warnings.showwarning = lambda msg, *a, **k: print(f"dllm-deploy: warning: {msg}", file=sys.stderr)
    ap = build_parser()
    a = ap.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return a.func(a)
    except UserError as e:
        flag = getattr(e, "flag", None)      # an OptionError from a flag names it
        print(f"dllm-deploy: error: {e}{f' ({flag})' if flag and flag not in str(e) else ''}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dllm-deploy ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("dllm-deploy: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("dllm-deploy: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The console script: ``main`` of the command line, then its exit status. After SIGTERM the
    process leaves at once (streams flushed, the cleanup done): the interpreter's ordinary shutdown
    can crash (SIGSEGV) under native threads that a cut-short export or quantization still runs."""
    rc = main()
    if rc == 128 + signal.SIGTERM:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
