"""TensorRT engines from an artifact: the build plan (precision, files, shapes, settings), the
equivalent ``trtexec`` command line, and the build itself (TensorRT 10/11 Python API, imported
lazily). The engine records, shapes and keys the runner also reads live in artifact/engines.py.

    plan_engines(folder, manifest, profile)    what would be built: precision, files, shapes, settings, trtexec
    build_engines(folder, manifest, plan)      builds engines/<profile>/{prefill,verify}.plan unless up to date
    check_engine_targets(folder, built, wanted, cache)   refuses to replace files it did not write

Verified here: the pure parts (shapes, settings, key, staleness, command) by unit tests. The build
and the runner need a GPU with TensorRT; tests/gpu/check_trt.py holds that check (not yet run on
hardware).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..artifact.engines import (
    GRAPHS,
    Shapes,
    build_settings,
    engine_record,
    engine_shapes,
    import_tensorrt,
    record_engines,
    recorded_engines,
    shapes_json,
    stale_reasons,
)
from ..artifact.fsio import atomic_write, lock_target
from ..errors import UserError

# profile value -> trtexec --hardwareCompatibilityLevel / tensorrt.HardwareCompatibilityLevel member
HW_COMPAT = {"none": ("none", "NONE"), "ampere_plus": ("ampere+", "AMPERE_PLUS"),
             "same_compute_capability": ("sameComputeCapability", "SAME_COMPUTE_CAPABILITY")}


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
        engines.append({"graph": g, "onnx": files[g], "shapes": shapes_json({g: shapes[g]})[g], "trtexec": cmd})
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
