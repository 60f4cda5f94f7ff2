"""TensorRT engines from an artifact: optimization-profile shapes, the cache key, the equivalent
``trtexec`` command line, and the build itself (TensorRT 10/11 Python API, imported lazily).

Verified here: the pure parts (shapes, key, command) by unit tests. The build and the runner
need a GPU with TensorRT; `tests/gpu/` holds that check.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError


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

    prefill: T from 1 (a commit of one block is L) to max_seq (a whole prompt + first block);
    verify:  T from L (one branch) to max_beam_width * L; past P from 0 to max_seq - L."""
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
        shapes = {
            "input_ids": Shapes((1, t_min), (batch, t_opt), (batch, t_max)),
            "position_ids": Shapes((1, t_min), (batch, t_opt), (batch, t_max)),
            "attention_mask": Shapes((1, 1, t_min, t_min), (batch, 1, t_opt, p_opt + t_opt), (batch, 1, t_max, max_seq)),
        }
        for i in range(int(m["num_layers"])):
            for kind in ("key", "value"):
                shapes[f"past_key_values.{i}.{kind}"] = Shapes((1, hkv, 0, d), (batch, hkv, p_opt, d), (batch, hkv, p_max, d))
        out[graph] = shapes
    return out


def _dims(t: tuple[int, ...]) -> str:
    return "x".join(str(x) for x in t)


def trtexec_command(onnx_path: str, engine_path: str, shapes: dict[str, Shapes], workspace_mb: int = 4096,
                    opt_level: int = 3, timing_cache: str = "timing.cache") -> list[str]:
    """The trtexec command line that builds the same engine (for users who prefer the CLI)."""
    def spec(attr: str) -> str:
        return ",".join(f"{name}:{_dims(getattr(s, attr))}" for name, s in shapes.items())
    return ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}", "--stronglyTyped",
            f"--minShapes={spec('min')}", f"--optShapes={spec('opt')}", f"--maxShapes={spec('max')}",
            f"--memPoolSize=workspace:{workspace_mb}M", f"--builderOptimizationLevel={opt_level}",
            f"--timingCacheFile={timing_cache}"]


def cache_key(onnx_sha256: str, trt_version: str, compute_capability: str, profile: dict) -> str:
    """Engines are valid for one (graph, TensorRT version, GPU arch, profile settings)."""
    blob = json.dumps({"onnx": onnx_sha256, "trt": trt_version, "cc": compute_capability, "profile": profile},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_engine(onnx_path: Path, engine_path: Path, shapes: dict[str, Shapes], workspace_mb: int, opt_level: int,
                 timing_cache: Path) -> None:  # pragma: no cover - needs a GPU with TensorRT (tests/gpu)
    try:
        import tensorrt as trt
    except ImportError:
        raise UserError("TensorRT is not installed (pip install 'dllm-deploy[trt]' on a machine with an NVIDIA GPU)") from None
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"{onnx_path}: TensorRT could not parse the graph ({errs[:300]})")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.builder_optimization_level = opt_level
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
    engine_path.write_bytes(bytes(plan))
    timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
