"""int4 weight-only variant (MatMulNBits) and the exporter's streamed external-data path."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from dllm_deploy.artifact import read_manifest
from dllm_deploy.errors import UserError


def test_int4_variant_is_matmulnbits_with_recorded_options(tiny_artifact):
    folder, report = tiny_artifact
    m = read_manifest(folder, precision="int4")
    assert m["precisions"]["int4"] == {"prefill": "int4/prefill.onnx", "verify": "int4/verify.onnx",
                                       "weights": "int4/weights.bin"}
    assert m["quantization"]["int4"] == {"method": "MatMulNBits", "bits": 4, "block_size": 32, "symmetric": True,
                                         "accuracy_level": 0, "op_types": ["MatMul"]}
    g = onnx.load(str(folder / "int4/verify.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in g.node]
    # 4 products per layer (q/k/v fused, o, gate/up fused, down) + the LM head, none left as an
    # fp32 MatMul on a constant weight
    assert ops.count("MatMulNBits") == 4 * m["model"]["num_layers"] + 1
    consts = {t.name for t in g.initializer}
    assert not [n for n in g.node if n.op_type == "MatMul" and n.input[1] in consts]
    par = report["parity"]["int4"]
    assert "top-1 may differ" in par["note"]
    # reported, not judged: quantized weights move the probabilities (accuracy: docs/precision.md)
    assert 0 < par["max_abs_diff"]["prefill_logits"] < float("inf")


def test_int4_weights_file_matches_the_memory_model(tiny_artifact):
    """weights.bin of int4 = the estimate's int4 weight bytes + the same non-parameter constants
    (rotary tables) that the fp32 file holds beyond its parameters."""
    from dllm_deploy.profiles.memory import param_count, weight_bytes
    folder, _ = tiny_artifact
    cfg = read_manifest(folder)["model"]
    extra = (folder / "weights.bin").stat().st_size - param_count(cfg) * 4
    assert 0 <= extra < 0.05 * param_count(cfg) * 4
    int4 = (folder / "int4/weights.bin").stat().st_size
    est = weight_bytes(cfg, "int4") + extra
    assert abs(int4 - est) / int4 < 0.01, (int4, est)
    assert int4 < 0.4 * (folder / "weights.bin").stat().st_size
    assert weight_bytes(cfg, "int4", symmetric=False) > weight_bytes(cfg, "int4")
    assert weight_bytes(cfg, "int4", block_size=128) < weight_bytes(cfg, "int4")


def test_int4_runtime_generates(tiny_artifact):
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(tiny_artifact[0]), precision="int4")
    r = rt.generate("upper: hello world\n", strategy="vanilla")[0]
    assert r.tokens > 0


@pytest.mark.parametrize("size", [0, 24, 8])
def test_bad_int4_block_size_is_refused_before_writing(tmp_path, size):
    from dllm_deploy.export.exporter import export
    with pytest.raises(UserError, match="--int4-block-size must be a power of two >= 16"):
        export("tiny", tmp_path / "out", precisions=["int4"], int4_block_size=size, log=lambda m: None)
    assert not (tmp_path / "out").exists()
