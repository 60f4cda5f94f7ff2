"""TensorRT engines from an artifact: optimization-profile shapes, build settings from the device
profile, the cache key recorded in the manifest, the equivalent ``trtexec`` command line, and the
build itself (TensorRT 10/11 Python API, imported lazily).

    plan_engines(folder, manifest, profile)    what would be built: precision, files, shapes, settings, trtexec
    build_engines(folder, manifest, plan)      builds engines/<profile>/{prefill,verify}.plan unless up to date
    engine_record / stale_reasons              the key (ONNX + weights sha256, TensorRT version, compute
                                               capability, profile hash) kept in manifest.json["engines"]

Verified here: the pure parts (shapes, settings, key, staleness, command) by unit tests. The build
and the runner need a GPU with TensorRT; tests/gpu/check_trt.py holds that check (not yet run on
hardware).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..artifact.fsio import atomic_write, lock_target
from ..errors import UserError

GRAPHS = ("prefill", "verify")
# profile value -> trtexec --hardwareCompatibilityLevel / tensorrt.HardwareCompatibilityLevel member
HW_COMPAT = {"none": ("none", "NONE"), "ampere_plus": ("ampere+", "AMPERE_PLUS"),
             "same_compute_capability": ("sameComputeCapability", "SAME_COMPUTE_CAPABILITY")}
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
    hkv, d = int(m["num_kv_heads"]), int(m["head_dim"])
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
        for i in range(int(m["num_layers"])):
            for kind in ("key", "value"):
                shapes[f"past_key_values.{i}.{kind}"] = Shapes((1, hkv, 0, d), (batch, hkv, p_opt, d), (batch, hkv, p_max, d))
        out[graph] = shapes
    return out


def _dims(t: tuple[int, ...]) -> str:
    return "x".join(str(x) for x in t)


def trtexec_command(onnx_path: str, engine_path: str, shapes: dict[str, Shapes], workspace_mb: int = 4096,
                    opt_level: int = 3, timing_cache: str = "timing.cache", hardware_compatibility: str = "none") -> list[str]:
    """The trtexec command line that builds the same engine (for users who prefer the CLI)."""
    def spec(attr: str) -> str:
        return ",".join(f"{name}:{_dims(getattr(s, attr))}" for name, s in shapes.items())
    cmd = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}", "--stronglyTyped",
           f"--minShapes={spec('min')}", f"--optShapes={spec('opt')}", f"--maxShapes={spec('max')}",
           f"--memPoolSize=workspace:{workspace_mb}M", f"--builderOptimizationLevel={opt_level}",
           f"--timingCacheFile={timing_cache}"]
    if hardware_compatibility != "none":
        cmd.append(f"--hardwareCompatibilityLevel={HW_COMPAT[hardware_compatibility][0]}")
    return cmd


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


def _shapes_json(shapes: dict[str, dict[str, Shapes]]) -> dict:
    return {g: {n: {"min": list(s.min), "opt": list(s.opt), "max": list(s.max)} for n, s in d.items()}
            for g, d in shapes.items()}


def profile_fingerprint(precision: str, shapes: dict[str, dict[str, Shapes]], settings: dict) -> dict:
    """What makes an engine valid besides the graph, TensorRT and the GPU: the precision variant,
    the optimization-profile shapes and the hardware-compatibility level. Workspace and builder
    level change speed, not validity (rebuild with --force to apply new ones)."""
    return {"precision": precision, "shapes": _shapes_json(shapes),
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


def check_engine_targets(folder: str | Path, built: dict | None, wanted: dict, timing_cache: Path) -> None:
    """build-engines replaces only engine files it wrote: a plan file the manifest records for this
    profile, and the profile's timing cache once engines are recorded. Any other file in their
    place is the user's: refused in one line, before anything is built."""
    folder = Path(folder)
    ours = {e.get("plan") for e in (built or {}).get("graphs", {}).values()}
    for g in GRAPHS:
        rel = wanted["graphs"][g]["plan"]
        if os.path.lexists(folder / rel) and rel not in ours:
            raise UserError(f"{folder / rel}: exists but manifest.json records no engine there; refusing to replace it "
                            "(move or delete it)")
    if os.path.lexists(timing_cache) and not built:
        raise UserError(f"{timing_cache}: exists but manifest.json records no engines for profile {wanted['profile']!r}; "
                        "refusing to replace it (move or delete it)")


def plan_engines(folder: str | Path, manifest: dict, profile, workspace_mb: int | None = None,
                 opt_level: int | None = None) -> dict:
    """Everything about the build that needs no GPU: precision variant (the profile's, else fp32),
    graph files, optimization-profile shapes, settings, and the equivalent trtexec commands."""
    folder = Path(folder)
    precision = profile.precision if profile.precision in manifest["precisions"] else "fp32"
    files = manifest["precisions"][precision]
    settings = build_settings(profile, workspace_mb, opt_level)
    shapes = engine_shapes(manifest, profile.decode)
    out_dir = folder / "engines" / profile.name
    engines = []
    for g in GRAPHS:
        cmd = trtexec_command(str(folder / files[g]), str(out_dir / f"{g}.plan"), shapes[g],
                              workspace_mb=settings["workspace_mb"], opt_level=settings["opt_level"],
                              timing_cache=str(out_dir / "timing.cache"),
                              hardware_compatibility=settings["hardware_compatibility"])
        engines.append({"graph": g, "onnx": files[g], "shapes": _shapes_json({g: shapes[g]})[g], "trtexec": cmd})
    return {"profile": profile.name, "precision": precision, "settings": settings, "out_dir": str(out_dir),
            "engines": engines, "_shapes": shapes, "_files": files}


def device_compute_capability() -> str:
    """This machine's GPU compute capability ('9.0'): NVML or the Jetson device tree (profiles.detect),
    else torch.cuda; a one-line error when none can be found."""
    from ..profiles import detect
    cc = detect().get("compute_capability")
    if cc:
        return cc
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
    except ImportError:
        pass
    raise UserError("cannot tell this GPU's compute capability (no NVML, no Jetson device tree, no torch.cuda): "
                    "install nvidia-ml-py (pip install 'dllm-deploy[gpu]')")


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


def build_engines(folder: str | Path, manifest: dict, plan: dict, force: bool = False,
                  log=print) -> dict:  # pragma: no cover - needs a GPU with TensorRT (tests/gpu)
    """Build the planned engines unless the manifest records up-to-date ones (same key); record
    the new key. Returns {"built": bool, "record": ..., "reasons": why it (re)built}."""
    trt = import_tensorrt()
    folder = Path(folder)
    cc = device_compute_capability()
    wanted = engine_record(manifest, plan["profile"], plan["precision"], plan["_shapes"], plan["settings"],
                           trt.__version__, cc)
    built = recorded_engines(manifest, plan["profile"])
    why = stale_reasons(built, wanted)
    plans_exist = all((folder / wanted["graphs"][g]["plan"]).exists() for g in GRAPHS)
    if not why and plans_exist and not force:
        return {"built": False, "record": built, "reasons": []}
    if not plans_exist and not why:
        why = ["plan files missing"]
    if force:
        why = why or ["--force"]
    timing_cache = Path(plan["out_dir"]) / "timing.cache"
    with lock_target(folder.resolve()):        # the lock export takes: no artifact swap mid-build
        check_engine_targets(folder, built, wanted, timing_cache)
        try:
            for g in GRAPHS:
                log(f"building {g} engine ({'; '.join(why)}) ...")
                build_engine(folder / plan["_files"][g], folder / wanted["graphs"][g]["plan"], plan["_shapes"][g],
                             plan["settings"]["workspace_mb"], plan["settings"]["opt_level"], timing_cache,
                             hardware_compatibility=plan["settings"]["hardware_compatibility"])
            record_engines(folder, plan["profile"], wanted)
        except OSError as e:
            raise UserError(f"{e.filename or folder}: cannot write engines there ({e.strerror})") from None
    return {"built": True, "record": wanted, "reasons": why}


def build_engine(onnx_path: Path, engine_path: Path, shapes: dict[str, Shapes], workspace_mb: int, opt_level: int,
                 timing_cache: Path, hardware_compatibility: str = "none") -> None:  # pragma: no cover - GPU + TensorRT
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # strongly typed: precision comes from the graph (the artifact's fp16 / fp32 variant), not flags
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"{onnx_path}: TensorRT could not parse the graph ({errs[:300]})")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.builder_optimization_level = opt_level
    if hasattr(trt.BuilderFlag, "TF32"):   # an fp32 graph means fp32 math (TF32 is on by default)
        config.clear_flag(trt.BuilderFlag.TF32)
    if hardware_compatibility != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, HW_COMPAT[hardware_compatibility][1])
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    prof = builder.create_optimization_profile()
    for name, s in shapes.items():
        prof.set_shape(name, s.min, s.opt, s.max)
    config.add_optimization_profile(prof)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise UserError(f"{onnx_path}: TensorRT failed to build an engine (see the log above)")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(engine_path, bytes(plan))
    atomic_write(timing_cache, bytes(config.get_timing_cache().serialize()))
