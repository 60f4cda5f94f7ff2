"""Where an export may write, and how: ``check_target`` refuses any ``out`` but a new or empty
folder or an artifact this tool wrote (``--force``), ``make_parent`` creates the folders above it,
and ``swap_in`` writes into a scratch folder beside it and swaps the result in by renames
(artifact/fsio.py), so the target is at every instant the whole old artifact or the whole new one."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..artifact import MANIFEST
from ..artifact.fsio import remove_temp_dir, replace_dir, temp_dir
from ..errors import UserError


def swap_in(out: Path, write):
    """``write(folder)`` into a scratch folder beside ``out``, then swapped in by renames (under the
    caller's lock); the scratch folder is removed whatever happens. Returns what ``write`` returns."""
    try:
        scratch = temp_dir(out)
    except OSError as e:
        raise UserError(f"{out}: cannot write in {out.parent} ({e.strerror})") from None
    try:
        work = scratch / "artifact"
        work.mkdir()
        result = write(work)
        replace_dir(work, out, scratch)
    except OSError as e:
        raise UserError(f"{out}: cannot write the artifact: {e.filename or out}: {e.strerror}") from None
    finally:
        remove_temp_dir(scratch)
    return result


def is_artifact(folder: Path) -> bool:
    """Whether ``folder`` holds a manifest this tool wrote (schema_version, or a family's format
    such as DiffusionGemma's, and exporter_version)."""
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and ("schema_version" in m or "format" in m) and "exporter_version" in m


def check_target(out: Path, src: Path, force: bool) -> None:
    """Refuse an ``out`` (resolved) that export must not write or replace; reads only, so a
    refusal leaves everything as it was. An existing empty folder is used as is."""
    if out == Path(out.anchor):
        raise UserError(f"{out}: refusing to replace the root folder")
    if Path.cwd().resolve().is_relative_to(out):
        raise UserError(f"{out}: refusing to replace the current folder or one of its parents")
    if src.is_relative_to(out):
        what = "the source model's folder" if src == out else f"a folder holding the source model {src}"
        raise UserError(f"{out}: refusing to replace {what}")
    try:
        if not os.path.lexists(out):
            return
        if not out.is_dir():
            raise UserError(f"{out}: exists and is not a folder (export writes an artifact folder; choose another --out)")
        if not any(out.iterdir()):
            return
    except OSError as e:
        raise UserError(f"{out}: cannot read it ({e.strerror})") from None
    if not force:
        raise UserError(f"{out}: already exists (pass --force to replace an artifact written by dllm-deploy export)")
    if not is_artifact(out):
        raise UserError(f"{out}: not an artifact written by dllm-deploy export (no manifest.json of ours); "
                        "--force replaces only those, so move or delete it yourself")


def make_parent(out: Path) -> None:
    """Create the folders above ``out``; a one-line error naming the path when that is impossible."""
    blocker = next((p for p in out.parents if os.path.lexists(p) and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"{out}: {blocker} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create {e.filename or out.parent} ({e.strerror})") from None
