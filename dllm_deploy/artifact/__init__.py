"""The artifact contract (DESIGN §3): ``manifest.json`` read/write, file hashes, schema checks.

Both the exporter and the runtimes (Python and C++) stand on this module; the runtime never
imports the exporter. The runtime trusts nothing that is not in the manifest.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import UserError, file_error, read_text

SCHEMA_VERSION = 4
# 4: the model's "family" and its "capabilities" (models/capabilities.py), "kv_shapes" ([Hkv, D]
#    per layer), "graphs" keyed by role (the capabilities' "graphs" list them). The graphs exclude
#    the mask token and a pad token distinct from EOS (special_ids.excluded) and sample (inputs
#    sample_u, temperature, top_k, top_p; "sampling": {"pool", "noise"}), as since schema 3.
# 5: schema 4 with "kv_io": "new": prefill's present outputs hold only the new tokens' keys and
#    values (B,Hkv,T,D) and the runtime keeps the cache in a buffer it writes in place (export/
#    graphs.py). Written only for such artifacts ("kv_io": "append" is schema 4), so a runtime that
#    reads 4 alone refuses them instead of taking a new-only present for the whole cache.
# Schemas 1-3 are not read (CHANGELOG.md, 0.2.0): such an artifact is refused in one line asking
# for a re-export.
READABLE = (4, 5)
MANIFEST = "manifest.json"
SAMPLING_INPUTS = ("sample_u", "temperature", "top_k", "top_p")   # schema 3: the graphs' last inputs
SAMPLING_NOISE = "philox4x64-10/v1"   # the noise the sampling inputs come from (runtime/noise.py)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path, manifest: dict) -> None:
    manifest = dict(manifest)
    manifest["schema_version"] = 5 if manifest.get("kv_io") == "new" else SCHEMA_VERSION
    manifest["files"] = {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*"))
                         if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _load_json(path: Path) -> object:
    """The manifest's JSON value; a file that cannot be read or parsed is the user's mistake."""
    text = read_text(path, "corrupt manifest (not UTF-8 text)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: corrupt manifest ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise UserError(f"{path}: corrupt manifest (nested too deeply)") from None


def _check_shape(m: dict, path: Path) -> None:
    """The types of the keys every reader indexes into, and file names that stay inside the
    artifact folder, so a damaged manifest is reported as such instead of failing later."""
    for key in ("model", "precisions", "files", "graphs", "tokenizer", "capabilities", "sampling"):
        if key not in m:
            raise UserError(f"{path}: corrupt manifest (no {key!r})")
        if not isinstance(m[key], dict):
            raise UserError(f"{path}: corrupt manifest ({key!r} is not an object)")
    if not isinstance(m.get("family"), str) or not m["family"]:
        raise UserError(f"{path}: corrupt manifest (no 'family' name)")
    kv = m.get("kv_shapes")
    if not isinstance(kv, list) or not kv or not all(
            isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s)
            for s in kv):
        raise UserError(f"{path}: corrupt manifest ('kv_shapes' is not a list of [kv heads, head dim] per layer)")
    roles = m["capabilities"].get("graphs")
    if not isinstance(roles, list) or set(roles) != set(m["graphs"]):
        raise UserError(f"{path}: corrupt manifest (the graphs are not those of the capabilities' roles)")
    for key in ("topk", "max_beam_width", "block_length"):
        if key in m and (not isinstance(m[key], int) or isinstance(m[key], bool) or m[key] < 1):
            raise UserError(f"{path}: corrupt manifest ({key!r} is not a positive integer)")
    pool = m["sampling"].get("pool")
    if not isinstance(pool, int) or isinstance(pool, bool) or pool < 1:
        raise UserError(f"{path}: corrupt manifest ('sampling' has no positive integer 'pool')")
    for graph, spec in m["graphs"].items():
        if not (isinstance(spec, dict) and all(isinstance(spec.get(k), list) and all(isinstance(x, str) for x in spec[k])
                                               for k in ("inputs", "outputs"))):
            raise UserError(f"{path}: corrupt manifest (graph {graph!r} has no lists of input and output names)")
    for prec, files in m["precisions"].items():
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise UserError(f"{path}: corrupt manifest (precision {prec!r} does not map graphs to file names)")
    for rel, digest in m["files"].items():
        if not isinstance(digest, str):
            raise UserError(f"{path}: corrupt manifest (the sha256 of {rel!r} is not a string)")
    for rel in [*m["files"], *(v for files in m["precisions"].values() for v in files.values())]:
        p = Path(rel)
        if not rel or "\0" in rel or p.is_absolute() or ".." in p.parts:
            raise UserError(f"{path}: corrupt manifest (file name {rel!r} is not inside the artifact folder)")


def artifact_format(folder: str | Path) -> str | None:
    """The manifest's ``format`` (artifacts of another layout than the masked families', e.g.
    "diffusion_gemma/1"), or None: none named, or no manifest readable (read_manifest says why)."""
    try:
        m = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return m.get("format") if isinstance(m, dict) and isinstance(m.get("format"), str) else None


def read_manifest(folder: str | Path, verify: bool = True, precision: str | None = None) -> dict:
    """Load and check a manifest: schema version, and the sha256 of every file the chosen
    precision needs (all files when precision is None)."""
    folder = Path(folder)
    try:
        if not folder.exists():
            raise UserError(f"{folder}: no such artifact folder")
        if not folder.is_dir():
            raise UserError(f"{folder}: not a folder (an artifact is a folder with {MANIFEST})")
        path = folder / MANIFEST
        if not path.exists():
            raise UserError(f"{folder}: not an artifact (no {MANIFEST})")
    except OSError as e:         # a folder the user may not enter
        raise file_error(folder, e) from None
    m = _load_json(path)
    if isinstance(m, dict) and m.get("format") == "diffusion_gemma/1":
        raise UserError(f"{folder}: a DiffusionGemma artifact; this command does not run it yet (generate, serve "
                        "and Runtime.load do: docs/diffusion_gemma.md)")
    if not isinstance(m, dict) or "schema_version" not in m:
        raise UserError(f"{path}: corrupt manifest (no schema_version)")
    version = m["schema_version"]
    if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < READABLE[0]:
        raise UserError(f"{path}: schema_version {version} was written by an older dllm-deploy; "
                        f"re-export the model (this runtime reads {', '.join(map(str, READABLE))}; CHANGELOG.md)")
    if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE:
        raise UserError(f"{path}: unknown schema_version {version!r} "
                        f"(this runtime reads {', '.join(map(str, READABLE))})")
    _check_shape(m, path)
    if (version == 5) != (m.get("kv_io", "append") == "new"):
        raise UserError(f"{path}: corrupt manifest (schema_version {version} with kv_io {m.get('kv_io')!r})")
    if precision is not None and precision not in m["precisions"]:
        raise UserError(f"{folder}: the artifact has no {precision!r} variant (it has {', '.join(sorted(m['precisions']))})")
    if verify:
        wanted = m["files"]
        if precision is not None:
            need = set(m["precisions"][precision].values())
            wanted = {k: v for k, v in wanted.items() if k in need or not k.endswith((".onnx", ".bin"))}
        for rel, digest in wanted.items():
            f = folder / rel
            try:
                if not f.exists():
                    raise UserError(f"{f}: missing (listed in the manifest)")
                actual = sha256(f)
            except OSError as e:
                raise file_error(f, e) from None
            if actual != digest:
                raise UserError(f"{f}: sha256 mismatch (the file changed after export)")
    return m


def sample_pool(manifest: dict) -> int:
    """The pool the artifact's graphs sample from."""
    return manifest["sampling"]["pool"]


def kv_shape(manifest: dict, name: str) -> tuple[int, int]:
    """(Hkv, D) of a past or present tensor (``past_key_values.{i}.key``, ``present.{i}.value``):
    layer i's entry of the manifest's kv_shapes."""
    hkv, d = manifest["kv_shapes"][int(name.split(".")[-2])]
    return hkv, d
