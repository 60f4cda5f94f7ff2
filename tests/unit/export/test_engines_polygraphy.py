"""The Polygraphy loader chain build-engines calls, as constructed here (Polygraphy installs and
runs without TensorRT; calling the chain needs TensorRT and a GPU: tests/gpu/check_trt.py).
TensorRT enum members are named by the ``enum`` argument; here it spells them as strings."""
import io
import sys

import pytest

from dllm_deploy.artifact import SAMPLING_INPUTS
from dllm_deploy.artifact.engines import build_settings, engine_shapes
from dllm_deploy.errors import UserError
from dllm_deploy.export.engines import (
    config_arguments,
    engine_loaders,
    import_polygraphy,
    optimization_profile,
    trtexec_command,
)
from dllm_deploy.profiles import load_profiles

pg = pytest.importorskip("polygraphy.backend.trt", reason="polygraphy is in the dev extra")

INPUTS = ["input_ids", "position_ids", "attention_mask",
          *[f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")], *SAMPLING_INPUTS]
MANIFEST = {"model": {"num_layers": 2, "num_kv_heads": 8, "head_dim": 128, "max_seq": 4096},
            "block_length": 32, "max_beam_width": 16, "kv_shapes": [[8, 128]] * 2,
            "graphs": {g: {"inputs": INPUTS} for g in ("prefill", "verify")}}
DECODE = {"batch": 8, "beam_width": 4, "max_beam_width": 8, "max_seq": 1024}


def _name(kind, member):
    return f"{kind}.{member}"


def _ranges(prof) -> dict[str, dict[str, tuple[int, ...]]]:
    """A Polygraphy Profile as plain tuples (its ShapeTuples compare by identity)."""
    return {n: {"min": tuple(p.min), "opt": tuple(p.opt), "max": tuple(p.max)} for n, p in prof.items()}


def _trtexec_ranges(cmd: list[str]) -> dict[str, dict[str, tuple[int, ...]]]:
    """{input: {"min"|"opt"|"max": dims}} read back from a trtexec command line."""
    out: dict = {}
    for flag, key in (("--minShapes=", "min"), ("--optShapes=", "opt"), ("--maxShapes=", "max")):
        spec = next(c for c in cmd if c.startswith(flag))[len(flag):]
        for item in spec.split(","):
            name, dims = item.rsplit(":", 1)
            out.setdefault(name, {})[key] = tuple(int(x) for x in dims.split("x"))
    return out


def test_profile_has_every_input_with_the_shapes_min_opt_max():
    shapes = engine_shapes(MANIFEST, DECODE)
    for graph in ("prefill", "verify"):
        prof = optimization_profile(pg, shapes[graph])
        assert list(prof.keys()) == list(shapes[graph])
        for name, s in shapes[graph].items():
            assert (tuple(prof[name].min), tuple(prof[name].opt), tuple(prof[name].max)) == (s.min, s.opt, s.max)
    v = optimization_profile(pg, shapes["verify"])
    assert tuple(v["input_ids"].max) == (8, 256) and tuple(v["input_ids"].opt) == (8, 128)
    assert tuple(v["past_key_values.1.value"].max) == (8, 8, 992, 128)


def test_profile_matches_the_trtexec_command_of_the_dry_run():
    shapes = engine_shapes(MANIFEST, DECODE)["verify"]
    prof = optimization_profile(pg, shapes)
    ranges = _trtexec_ranges(trtexec_command("v.onnx", "v.plan", shapes))
    assert _ranges(prof) == ranges


def test_config_arguments_come_from_the_profile_settings():
    shapes = engine_shapes(MANIFEST, DECODE)["prefill"]
    args = config_arguments(pg, shapes, build_settings(load_profiles()["h100"]), b"cache", _name)
    assert args["tf32"] is False
    assert args["memory_pool_limits"] == {"MemoryPoolType.WORKSPACE": 8192 << 20}
    assert args["builder_optimization_level"] == 4
    assert "hardware_compatibility_level" not in args
    assert args["load_timing_cache"].read() == b"cache"
    assert len(args["profiles"]) == 1 and tuple(args["profiles"][0]["input_ids"].max) == (8, 1024)
    compat = {"workspace_mb": 512, "opt_level": 2, "hardware_compatibility": "ampere_plus"}
    args = config_arguments(pg, shapes, compat, b"", _name)
    assert args["hardware_compatibility_level"] == "HardwareCompatibilityLevel.AMPERE_PLUS"
    assert args["memory_pool_limits"] == {"MemoryPoolType.WORKSPACE": 512 << 20}


def test_loader_chain_parses_the_file_strongly_typed_and_saves_the_cache_in_memory(tmp_path):
    shapes = engine_shapes(MANIFEST, DECODE)["verify"]
    saved = io.BytesIO()
    chain = engine_loaders(pg, tmp_path / "fp16" / "verify.onnx", shapes, build_settings(load_profiles()["l4"]),
                           b"", saved, _name)
    assert isinstance(chain.network, pg.NetworkFromOnnxPath) and chain.network.path == str(tmp_path / "fp16/verify.onnx")
    assert chain.network.strongly_typed is True
    assert isinstance(chain.config, pg.CreateConfig) and chain.config.tf32 is False
    assert chain.config.builder_optimization_level == 3
    assert [_ranges(p) for p in chain.config.profiles] == [_ranges(optimization_profile(pg, shapes))]
    assert isinstance(chain.engine, pg.EngineBytesFromNetwork) and chain.engine.timing_cache_path is saved
    assert list(tmp_path.iterdir()) == []           # constructing the chain writes nothing


def test_missing_polygraphy_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "polygraphy.backend", None)       # import -> ImportError
    with pytest.raises(UserError, match=r"Polygraphy is not installed.*pip install 'dllm-deploy\[trt\]'") as e:
        import_polygraphy()
    assert "\n" not in str(e.value)
