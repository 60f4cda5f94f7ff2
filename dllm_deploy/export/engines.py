"""TensorRT engines from an artifact: the build plan (precision, files, shapes, settings), the
equivalent ``trtexec`` command line, and the build itself through Polygraphy's TensorRT loaders
(``NetworkFromOnnxPath`` -> ``CreateConfig`` with the optimization profile and timing cache ->
``EngineBytesFromNetwork``; Polygraphy and TensorRT imported lazily). Our code keeps the engine
records and keys, the lock, and the atomic writes of plans and timing cache. The engine records,
shapes and keys the runner also reads live in artifact/engines.py.

    plan_engines(folder, manifest, profile)    what would be built: precision, files, shapes, settings, trtexec
    build_engines(folder, manifest, plan)      builds engines/<profile>/{prefill,verify}.plan unless up to date
    check_engine_targets(folder, built, wanted, cache)   refuses to replace files it did not write

Verified here: the pure parts (shapes, settings, key, staleness, command) and the Polygraphy loader
chain as constructed (profile, config arguments, network flags; Polygraphy installs without
TensorRT) by unit tests. Calling the chain needs a GPU with TensorRT; tests/gpu/check_trt.py holds
that check (not yet run on hardware).
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import NamedTuple

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
    if manifest.get("kv_io", "append") != "append":
        raise UserError(f"{folder}: an artifact of kv_io {manifest['kv_io']!r}; the TensorRT runner reads the whole "
                        "cache from present (kv_io 'append'): re-export without --kv-io new")
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
    import_polygraphy()                       # both missing-package errors before anything else
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
                             plan["settings"], timing_cache)
            record_engines(folder, plan["profile"], wanted)
        except OSError as e:
            raise UserError(f"{e.filename or folder}: cannot write engines there ({e.strerror})") from None
    return {"built": True, "record": wanted, "reasons": why}


def import_polygraphy():
    """Polygraphy's TensorRT loaders (``polygraphy.backend.trt``), or a one-line error. Polygraphy
    imports tensorrt lazily: constructing the loaders works without it, calling them needs it."""
    try:
        from polygraphy.backend import trt as pg
    except ImportError:
        raise UserError("Polygraphy is not installed: engines are built through its TensorRT loaders "
                        "(pip install 'dllm-deploy[trt]')") from None
    return pg


def optimization_profile(pg, shapes: dict[str, Shapes]):
    """The one Polygraphy ``Profile`` of an engine: min / opt / max of every dynamic input."""
    prof = pg.Profile()
    for name, s in shapes.items():
        prof.add(name, s.min, s.opt, s.max)
    return prof


def config_arguments(pg, shapes: dict[str, Shapes], settings: dict, timing_cache: bytes, enum) -> dict:
    """``CreateConfig``'s arguments. ``enum(kind, member)`` names a TensorRT enum member (e.g.
    ``MemoryPoolType.WORKSPACE``); the build passes the real ones. TF32 stays off so an fp32 graph
    computes in fp32 (the network is strongly typed: precision comes from the graph). The timing
    cache is read from memory so the file is replaced only by an atomic write after the build."""
    args = {"tf32": False, "profiles": [optimization_profile(pg, shapes)],
            "memory_pool_limits": {enum("MemoryPoolType", "WORKSPACE"): settings["workspace_mb"] << 20},
            "builder_optimization_level": settings["opt_level"], "load_timing_cache": io.BytesIO(timing_cache)}
    if settings["hardware_compatibility"] != "none":
        args["hardware_compatibility_level"] = enum("HardwareCompatibilityLevel",
                                                    HW_COMPAT[settings["hardware_compatibility"]][1])
    return args


class EngineLoaders(NamedTuple):
    """Polygraphy's loader chain for one engine: ONNX file -> network -> config -> serialized plan."""
    network: object
    config: object
    engine: object


def engine_loaders(pg, onnx_path: Path, shapes: dict[str, Shapes], settings: dict, timing_cache: bytes,
                   saved_cache: io.BytesIO, enum) -> EngineLoaders:
    """The chain ``build_engine`` calls: the network parsed from the file (so external weights
    resolve beside it), strongly typed; the config; the engine bytes, with the updated timing
    cache written into ``saved_cache``."""
    network = pg.NetworkFromOnnxPath(str(onnx_path), strongly_typed=True)
    config = pg.CreateConfig(**config_arguments(pg, shapes, settings, timing_cache, enum))
    return EngineLoaders(network, config, pg.EngineBytesFromNetwork(network, config=config, save_timing_cache=saved_cache))


def build_engine(onnx_path: Path, engine_path: Path, shapes: dict[str, Shapes], settings: dict,
                 timing_cache: Path) -> None:  # pragma: no cover - GPU + TensorRT
    """Build one engine through Polygraphy; write the plan and the timing cache atomically."""
    trt = import_tensorrt()
    pg = import_polygraphy()
    from polygraphy.exception import PolygraphyException
    saved = io.BytesIO()
    loaders = engine_loaders(pg, onnx_path, shapes, settings,
                             timing_cache.read_bytes() if timing_cache.exists() else b"", saved,
                             enum=lambda kind, member: getattr(getattr(trt, kind), member))
    try:
        plan = loaders.engine()
    except PolygraphyException as e:
        raise UserError(f"{onnx_path}: TensorRT could not build an engine ({' '.join(str(e).split())[:300]})") from None
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(engine_path, bytes(plan))
    if saved.getvalue():
        atomic_write(timing_cache, saved.getvalue())
