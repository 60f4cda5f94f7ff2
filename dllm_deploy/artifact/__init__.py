"""The artifact contract (DESIGN §3): ``manifest.json`` read/write, file hashes, schema checks.

Both the exporter and the runtimes (Python and C++) stand on this module; the runtime never
imports the exporter. The runtime trusts nothing that is not in the manifest.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import UserError

SCHEMA_VERSION = 2
# 1: the graphs may emit the mask token (the runtime excludes it on the host, with a warning);
# 2: the graphs exclude the mask token and a pad token distinct from EOS (special_ids.excluded)
READABLE = (1, 2)
MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path, manifest: dict) -> None:
    manifest = dict(manifest)
    manifest["schema_version"] = SCHEMA_VERSION
    manifest["files"] = {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*"))
                         if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: str | Path, verify: bool = True, precision: str | None = None) -> dict:
    """Load and check a manifest: schema version, and the sha256 of every file the chosen
    precision needs (all files when precision is None)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such artifact folder")
    path = folder / MANIFEST
    if not path.exists():
        raise UserError(f"{folder}: not an artifact (no {MANIFEST})")
    try:
        m = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: corrupt manifest ({e.msg}, line {e.lineno})") from None
    if not isinstance(m, dict) or "schema_version" not in m:
        raise UserError(f"{path}: corrupt manifest (no schema_version)")
    if m["schema_version"] not in READABLE or isinstance(m["schema_version"], bool):
        raise UserError(f"{path}: unknown schema_version {m['schema_version']!r} "
                        f"(this runtime reads {', '.join(map(str, READABLE))})")
    for key in ("model", "precisions", "files", "graphs", "tokenizer"):
        if key not in m:
            raise UserError(f"{path}: corrupt manifest (no {key!r})")
    if precision is not None and precision not in m["precisions"]:
        raise UserError(f"{folder}: the artifact has no {precision!r} variant (it has {', '.join(sorted(m['precisions']))})")
    if verify:
        wanted = m["files"]
        if precision is not None:
            need = set(m["precisions"][precision].values())
            wanted = {k: v for k, v in wanted.items() if k in need or not k.endswith((".onnx", ".bin"))}
        for rel, digest in wanted.items():
            f = folder / rel
            if not f.exists():
                raise UserError(f"{f}: missing (listed in the manifest)")
            if sha256(f) != digest:
                raise UserError(f"{f}: sha256 mismatch (the file changed after export)")
    return m


def graphs_exclude(manifest: dict) -> bool:
    """Whether the artifact's graphs exclude the mask (and a distinct pad) token themselves."""
    return manifest["schema_version"] >= 2
