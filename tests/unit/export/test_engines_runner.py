"""The TensorRT runner's pure parts (no GPU here): I/O shape planning, optimization-profile range
checks, engine-key checks, and the one-line errors when TensorRT or a GPU is missing. The GPU
path itself: tests/gpu/check_trt.py."""
import json
import sys

import pytest

from dllm_deploy.artifact import SAMPLING_INPUTS, write_manifest
from dllm_deploy.artifact.engines import engine_record, engine_shapes, import_tensorrt, record_engines
from dllm_deploy.cli import main
from dllm_deploy.errors import UserError
from dllm_deploy.export.engines import plan_engines
from dllm_deploy.models.capabilities import block_causal
from dllm_deploy.profiles import load_profiles
from dllm_deploy.runtime.backends.trt import (
    check_engines,
    check_in_range,
    import_torch_cuda,
    io_shapes,
    max_beam_width_of,
)

LAYERS, HKV, D, V, L = 2, 2, 16, 300, 32


def _names():
    past = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    present = [f"present.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    inputs = ["input_ids", "position_ids", "attention_mask"] + past + list(SAMPLING_INPUTS)
    return {"prefill": {"inputs": inputs, "outputs": ["logits", "top_ids", "top_probs"] + present},
            "verify": {"inputs": inputs, "outputs": ["top_ids", "top_probs"]}}


@pytest.fixture()
def artifact(tmp_path):
    """A fake artifact: dummy graph files with a real manifest (hashes), enough for everything but a build."""
    for f in ("prefill.onnx", "verify.onnx", "weights.bin"):
        (tmp_path / f).write_bytes(f.encode())
    write_manifest(tmp_path, {
        "model": {"num_layers": LAYERS, "num_kv_heads": HKV, "head_dim": D, "vocab_size": V, "max_seq": 512},
        "block_length": L, "max_beam_width": 8, "topk": 2, "graphs": _names(), "tokenizer": {"kind": "byte"},
        "family": "block_causal", "capabilities": block_causal().to_dict(), "kv_shapes": [[HKV, D]] * LAYERS,
        "sampling": {"pool": 8, "noise": "philox4x64-10/v1"},
        "precisions": {"fp32": {"prefill": "prefill.onnx", "verify": "verify.onnx", "weights": "weights.bin"}}})
    return tmp_path


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_io_shapes_of_a_verify_and_a_prefill_call(artifact):
    m = _manifest(artifact)
    v = io_shapes(m, "verify", batch=2, tokens=4 * L, past=100)
    assert v["input_ids"] == (2, 128) and v["attention_mask"] == (2, 1, 128, 228)
    assert v["past_key_values.1.value"] == (2, HKV, 100, D) and v["top_probs"] == (2, 128, 2)
    assert "present.0.key" not in v and "logits" not in v
    p = io_shapes(m, "prefill", batch=1, tokens=40, past=0)
    assert p["logits"] == (1, 40, V) and p["present.1.key"] == (1, HKV, 40, D) and p["past_key_values.0.key"] == (1, HKV, 0, D)


def test_range_checks_name_the_input_and_the_fix(artifact):
    m = _manifest(artifact)
    ranges = engine_shapes(m, {"batch": 2, "beam_width": 2, "max_beam_width": 4, "max_seq": 512})
    assert max_beam_width_of(ranges["verify"], L) == 4
    check_in_range(io_shapes(m, "verify", 2, 4 * L, 512 - L), ranges["verify"], "verify", L)   # the last block: fits
    check_in_range(io_shapes(m, "prefill", 1, 512, 0), ranges["prefill"], "prefill", L)
    cases = [(("verify", 2, 8 * L, 64), "W\\*L = 256 tokens is over the engine's 128: use beam width <= 4"),
             (("verify", 3, 2 * L, 64), "batch 3 is over the engine's 2"),
             (("verify", 1, L, 500), "longer than the engine's max_seq"),
             (("prefill", 1, 2 * L, 511), "longer than the engine's max_seq")]
    for (graph, b, t, p), msg in cases:
        with pytest.raises(UserError, match=msg) as e:
            check_in_range(io_shapes(m, graph, b, t, p), ranges[graph], graph, L)
        assert "\n" not in str(e.value)


def test_engine_key_checks(artifact):
    prof = load_profiles()["h100"]
    m = _manifest(artifact)
    with pytest.raises(UserError, match="no TensorRT engines for profile 'h100'; build them: dllm-deploy build-engines"):
        check_engines(artifact, m, prof, "10.9.0", "9.0")
    plan = plan_engines(artifact, m, prof)
    record_engines(artifact, "h100", engine_record(m, "h100", plan["precision"], plan["_shapes"], plan["settings"], "10.9.0", "9.0"))
    m = _manifest(artifact)
    with pytest.raises(UserError, match="plan: missing"):
        check_engines(artifact, m, prof, "10.9.0", "9.0")
    (artifact / "engines/h100").mkdir(parents=True)
    for g in ("prefill", "verify"):
        (artifact / f"engines/h100/{g}.plan").write_bytes(b"plan")
    assert check_engines(artifact, m, prof, "10.9.0", "9.0")["trt_version"] == "10.9.0"
    with pytest.raises(UserError, match=r"are stale \(built with TensorRT 10.9.0, this is 11.0.0; built for compute "
                                        r"capability 9.0, this GPU is 8.9\); rebuild: dllm-deploy build-engines"):
        check_engines(artifact, m, prof, "11.0.0", "8.9")
    l4 = load_profiles()["l4"]       # another profile's engines are not these
    with pytest.raises(UserError, match="no TensorRT engines for profile 'l4'"):
        check_engines(artifact, m, l4, "10.9.0", "9.0")


def test_missing_tensorrt_and_gpu_are_one_line_errors(monkeypatch, artifact, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)            # import tensorrt -> ImportError
    with pytest.raises(UserError, match=r"TensorRT is not installed \(pip install 'dllm-deploy\[trt\]'"):
        import_tensorrt()
    fake = type(sys)("tensorrt")
    fake.__version__ = "8.6.1"
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    with pytest.raises(UserError, match="TensorRT 8.6.1 is too old"):
        import_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    from dllm_deploy import Runtime
    with pytest.raises(UserError, match="TensorRT is not installed"):
        Runtime.load(artifact=str(artifact), backend="trt", profile="h100")
    rc = main(["build-engines", "--artifact", str(artifact), "--profile", "h100"])
    err = capsys.readouterr().err
    assert rc == 2 and "TensorRT is not installed" in err and err.count("\n") == 1


def test_no_cuda_device_is_a_one_line_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(UserError, match="needs a CUDA device"):
        import_torch_cuda()


def test_build_engines_dry_run_for_h100(artifact, capsys):
    assert main(["build-engines", "--artifact", str(artifact), "--profile", "h100", "--dry-run", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "h100" and d["precision"] == "fp32"                 # the artifact has no fp16 variant
    assert d["settings"] == {"workspace_mb": 8192, "opt_level": 4, "hardware_compatibility": "none"}
    v = next(e for e in d["engines"] if e["graph"] == "verify")
    assert v["shapes"]["input_ids"] == {"min": [1, 32], "opt": [8, 256], "max": [8, 256]}     # W 8 (artifact cap), batch 8
    assert "--builderOptimizationLevel=4" in v["trtexec"] and "--memPoolSize=workspace:8192M" in v["trtexec"]
    assert main(["build-engines", "--artifact", str(artifact), "--profile", "h100", "--dry-run", "--opt-level", "2"]) == 0
    out = capsys.readouterr().out
    assert "builder opt level 2" in out and "[verify]" in out and "trtexec --onnx=" in out
