"""The TensorRT engine records of an artifact (``manifest.json["engines"]``): what both the
engine builder (export/engines.py) and the TensorRT runner (runtime/backends/trt.py) read,
so that the runner never imports the exporter.

    engine_shapes(manifest, decode)     optimization-profile shape ranges (Shapes) per graph and input
    build_settings(profile)             the profile's ``trt`` section over the defaults
    engine_record / stale_reasons       the key (ONNX + weights sha256, TensorRT version, compute
                                        capability, profile hash) and why a recorded one cannot serve
    recorded_engines / record_engines   read / write one profile's record in the manifest
    import_tensorrt()                   tensorrt (10 or newer) or a one-line error
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .fsio import atomic_write

GRAPHS = ("prefill", "verify")
DEFAULT_TRT = {"workspace_mb": 4096, "opt_level": 3, "hardware_compatibility": "none"}


@dataclass(frozen=True)
class Shapes:
    """min / opt / max of one input (TensorRT optimization profile)."""
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self):
        for a, b, c in zip(self.min, self.opt, self.max):
            if not a <= b <= c:
                raise UserError(f"bad shape range min {self.min} opt {self.opt} max {self.max}")


def engine_shapes(manifest: dict, decode: dict) -> dict[str, dict[str, Shapes]]:
    """Per graph, per dynamic input: the shape ranges the profile's decode limits need.

    prefill: T from 1 to max_seq (a whole prompt + first block; a commit is 2L); keys P + T <= max_seq.
    verify:  T from L (one branch) to max_beam_width * L; past P from 0 to max_seq - L; keys P + T
             up to max_seq - L + max_beam_width * L (the last block's branches all attend the prefix)."""
    m = manifest["model"]
    L = int(manifest["block_length"])
    batch = int(decode.get("batch", 1))
    w_opt = int(decode.get("beam_width", 1))
    w_max = min(int(decode.get("max_beam_width", w_opt)), int(manifest.get("max_beam_width", w_opt)))
    w_opt = min(w_opt, w_max)
    max_seq = min(int(decode.get("max_seq", m["max_seq"])), int(m["max_seq"]))
    out: dict[str, dict[str, Shapes]] = {}
    for graph, (t_min, t_opt, t_max) in {"prefill": (1, 2 * L, max_seq), "verify": (L, w_opt * L, w_max * L)}.items():
        p_opt = max(0, min(max_seq // 2, max_seq - t_opt))
        p_max = max(0, max_seq - t_min)
        s_max = max_seq if graph == "prefill" else p_max + t_max
        shapes = {
            "input_ids": Shapes((1, t_min), (batch, t_opt), (batch, t_max)),
            "position_ids": Shapes((1, t_min), (batch, t_opt), (batch, t_max)),
            "attention_mask": Shapes((1, 1, t_min, t_min), (batch, 1, t_opt, p_opt + t_opt), (batch, 1, t_max, s_max)),
        }
        for i, (hkv, d) in enumerate(manifest["kv_shapes"]):           # each layer's (Hkv, D)
            for kind in ("key", "value"):
                shapes[f"past_key_values.{i}.{kind}"] = Shapes((1, hkv, 0, d), (batch, hkv, p_opt, d), (batch, hkv, p_max, d))
        shapes["sample_u"] = Shapes((1, t_min), (batch, t_opt), (batch, t_max))
        shapes.update({n: Shapes((1,), (batch,), (batch,)) for n in ("temperature", "top_k", "top_p")})
        out[graph] = shapes
    return out


def cache_key(onnx_sha256: str, trt_version: str, compute_capability: str, profile: dict) -> str:
    """Engines are valid for one (graph, TensorRT version, GPU arch, profile settings)."""
    blob = json.dumps({"onnx": onnx_sha256, "trt": trt_version, "cc": compute_capability, "profile": profile},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_settings(profile, workspace_mb: int | None = None, opt_level: int | None = None) -> dict:
    """The profile's ``trt`` section over the defaults, with command-line overrides on top."""
    out = {**DEFAULT_TRT, **getattr(profile, "trt", {})}
    if workspace_mb is not None:
        out["workspace_mb"] = int(workspace_mb)
    if opt_level is not None:
        out["opt_level"] = int(opt_level)
    if not 0 <= out["opt_level"] <= 5:
        raise UserError(f"builder optimization level must be 0..5, got {out['opt_level']}")
    if out["workspace_mb"] < 1:
        raise UserError(f"workspace must be >= 1 MB, got {out['workspace_mb']}")
    return out


def shapes_json(shapes: dict[str, dict[str, Shapes]]) -> dict:
    return {g: {n: {"min": list(s.min), "opt": list(s.opt), "max": list(s.max)} for n, s in d.items()}
            for g, d in shapes.items()}


def profile_fingerprint(precision: str, shapes: dict[str, dict[str, Shapes]], settings: dict) -> dict:
    """What makes an engine valid besides the graph, TensorRT and the GPU: the precision variant,
    the optimization-profile shapes and the hardware-compatibility level. Workspace and builder
    level change speed, not validity (rebuild with --force to apply new ones)."""
    return {"precision": precision, "shapes": shapes_json(shapes),
            "hardware_compatibility": settings.get("hardware_compatibility", "none")}


def graph_digest(manifest: dict, files: dict, graph: str) -> str:
    """sha256 over the graph file and the weights it reads (both listed in the manifest)."""
    listed = manifest.get("files", {})
    parts = [listed.get(files[graph], "?"), listed.get(files.get("weights", ""), "?")]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()


def engine_record(manifest: dict, profile_name: str, precision: str, shapes: dict, settings: dict,
                  trt_version: str, compute_capability: str) -> dict:
    """The manifest entry for one profile's engines: the key parts, the key per graph, the plans."""
    files = manifest["precisions"][precision]
    fp = profile_fingerprint(precision, shapes, settings)
    phash = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    graphs = {}
    for g in GRAPHS:
        digest = graph_digest(manifest, files, g)
        graphs[g] = {"onnx_sha256": digest, "plan": f"engines/{profile_name}/{g}.plan",
                     "key": cache_key(digest, trt_version, compute_capability, fp)}
    return {"profile": profile_name, "precision": precision, "trt_version": trt_version,
            "compute_capability": compute_capability, "profile_hash": phash, "settings": dict(settings),
            "graphs": graphs}


def stale_reasons(built: dict | None, wanted: dict) -> list[str]:
    """Why engines recorded as ``built`` cannot serve ``wanted`` (empty list: they can)."""
    if not built:
        return ["no engines recorded for this profile"]
    why = []
    if built.get("trt_version") != wanted["trt_version"]:
        why.append(f"built with TensorRT {built.get('trt_version')}, this is {wanted['trt_version']}")
    if built.get("compute_capability") != wanted["compute_capability"]:
        why.append(f"built for compute capability {built.get('compute_capability')}, this GPU is {wanted['compute_capability']}")
    if built.get("precision") != wanted["precision"]:
        why.append(f"built from the {built.get('precision')} variant, {wanted['precision']} wanted")
    elif any(built.get("graphs", {}).get(g, {}).get("onnx_sha256") != wanted["graphs"][g]["onnx_sha256"] for g in GRAPHS):
        why.append("the ONNX graphs or weights changed since the build")
    if built.get("profile_hash") != wanted["profile_hash"]:
        why.append("the profile's shapes or hardware compatibility changed since the build")
    if not why and any(built["graphs"][g].get("key") != wanted["graphs"][g]["key"] for g in GRAPHS):
        why.append("cache key mismatch")
    return why


def recorded_engines(manifest: dict, profile_name: str) -> dict | None:
    return (manifest.get("engines") or {}).get(profile_name)


def record_engines(folder: str | Path, profile_name: str, record: dict) -> None:
    """Write ``record`` into manifest.json["engines"][profile] (atomically; the file hashes the
    manifest lists are not touched: engines are derived data, keyed, not part of the artifact)."""
    path = Path(folder) / "manifest.json"
    m = json.loads(path.read_text())
    m.setdefault("engines", {})[profile_name] = record
    atomic_write(path, json.dumps(m, indent=2, sort_keys=True) + "\n")


def import_tensorrt():
    """tensorrt (10 or newer), or a one-line error saying how to get it."""
    try:
        import tensorrt as trt
    except ImportError:
        raise UserError("TensorRT is not installed (pip install 'dllm-deploy[trt]' on a machine with an NVIDIA GPU; "
                        "on Jetson it comes with JetPack)") from None
    major = int(str(getattr(trt, "__version__", "0")).split(".")[0] or 0)
    if major < 10:
        raise UserError(f"TensorRT {trt.__version__} is too old: engines are built and run with the TensorRT 10 API "
                        "(set_input_shape, set_tensor_address, execute_async_v3)")
    return trt
