"""What the commands share: the decode flags (declared in decode_options.json), the runtime they
load, list and boolean flag values, atomic file writes, a progress bar."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..options import OPTIONS
from ..errors import UserError


def progress(total: int, label: str, enabled: bool):
    """A small stderr progress bar (no dependency); returns an advance(n) callable."""
    state = {"done": 0}

    def advance(n: int = 1) -> None:
        if not enabled:
            return
        state["done"] += n
        frac = state["done"] / max(total, 1)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{label} [{bar:<30}] {state['done']}/{total}")
        if state["done"] >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return advance


def bool_flag(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


FLAG_TYPES = {"int": int, "float": float, "str": str, "bool": bool_flag}
FLAG_OPTIONS = [o for o in OPTIONS.values() if o.runtime and o.flag]    # decode_options.json


def add_decode_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="'tiny' (bundled) or a Hugging Face folder; runs on torch")
    src.add_argument("--artifact", default=None, help="an exported artifact folder; runs on ONNX Runtime")
    p.add_argument("--precision", default=None, help="artifact precision variant (fp32, fp16, int8, int4; default fp32)")
    p.add_argument("--profile", default="auto", help="device profile name, or 'auto' (detect)")
    for o in FLAG_OPTIONS:
        p.add_argument(o.flag, dest=o.name, type=FLAG_TYPES[o.type], default=None, help=o.help_text(profiles=True),
                       action="append" if o.multiple else "store")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def decode_kwargs(a) -> dict:
    return {o.name: getattr(a, o.name) for o in FLAG_OPTIONS}


def runtime(a):
    from ..runtime.api import Runtime
    if a.artifact:
        return Runtime.load(artifact=a.artifact, precision=a.precision, profile=a.profile)
    return Runtime.load(model=a.model or "tiny")


def csv_list(text: str, cast=str) -> list:
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad list {text!r}") from None


def artifact_kind(folder: str | None) -> str:
    """How the artifact decodes (Runtime.kind): "uniform" (a DiffusionGemma artifact), "self_spec"
    (its capabilities' attention is causal) or "masked"; "masked" too when its manifest cannot be
    read (the command's own checks then report why, in their order)."""
    from ..artifact import artifact_format, read_manifest
    from ..runtime.api import UNIFORM_FORMAT
    if not folder:
        return "masked"
    if artifact_format(folder) == UNIFORM_FORMAT:
        return "uniform"
    try:
        causal = read_manifest(folder, verify=False).get("capabilities", {}).get("attention") == "causal"
    except UserError:
        return "masked"
    return "self_spec" if causal else "masked"


def check_decode_flags(a, kind: str) -> None:
    """The decode flags checked for the artifact's kind, before a model loads."""
    if kind == "self_spec":
        from ..runtime.self_spec_decoder import options
        options(0, **decode_kwargs(a))
    elif kind == "uniform":
        from ..runtime.uniform_decoder import options
        options({}, **decode_kwargs(a))
    else:
        from ..runtime.api import decode_config
        decode_config(**{k: v for k, v in decode_kwargs(a).items() if v is not None})


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (never a half-written file in place); one-line error
    naming the path when the folder cannot be created or written."""
    from ..artifact.fsio import atomic_write
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror})") from None


def check_overlay_target(path: Path) -> None:
    """``bench --tune`` replaces only a profile overlay it wrote (a YAML mapping with a ``tuned``
    section); any other file at that path is the user's and is refused."""
    import yaml
    if not os.path.lexists(path):
        return
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("tuned"), dict)):
        raise UserError(f"{path}: exists and is not a profile overlay written by bench --tune; "
                        "refusing to replace it (choose another --tune-out)")


def write_yaml(path: Path, data: dict) -> None:
    import yaml
    check_overlay_target(path)
    write_file(path, yaml.safe_dump(data, sort_keys=False))


def add_json_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--json``, a flag as in every command (``what`` as JSON on stdout, instead of the table),
    and ``--json-out PATH`` (``what`` written to PATH, atomically). ``--json PATH``, the older
    form, still writes PATH, with a warning."""
    p.add_argument("--json", nargs="?", const=True, default=False, metavar="OUT",
                   help=f"print {what} as JSON on stdout instead of the table")
    p.add_argument("--json-out", default=None, metavar="PATH", help=f"write {what} as JSON to PATH")


def json_outputs(a) -> None:
    """``a.json`` a bool and ``a.json_out`` a path or None, from either form of the flags."""
    if isinstance(a.json, str):
        if a.json_out:
            raise UserError("give --json-out PATH alone (--json PATH is its older spelling)")
        print(f"dllm-deploy: warning: --json {a.json} is spelled --json-out {a.json} now "
              "(--json alone prints the JSON)", file=sys.stderr)
        a.json_out, a.json = a.json, False
