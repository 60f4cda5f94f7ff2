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
                                         "op_types": ["MatMul"]}
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


def test_share_weights_streams_external_tensors(tmp_path, layout_checkpoint):
    """The path of graphs over 2 GB: torch writes each weight to its own file beside the graph;
    share_weights reads them one by one into weights.bin. Forced here on a small checkpoint by
    saving its traced graphs with every tensor external; the result runs like the inline one."""
    import onnxruntime as ort
    import torch

    from dllm_deploy.export.exporter import _dummy, _trace_graphs, share_weights
    from dllm_deploy.export.graphs import io_names
    from dllm_deploy.models.loading import load_model
    _, ckpt = layout_checkpoint
    module, cfg = load_model(ckpt, attention="eager")
    inline, _ = _trace_graphs(module, cfg, 8, torch.float32, 17, tmp_path / "inline-trace", 16)
    graphs, bases = _trace_graphs(module, cfg, 8, torch.float32, 17, tmp_path / "trace", 16)
    for g, folder in bases.items():
        path = folder / f"{g}.onnx"
        onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                        size_threshold=0, convert_attribute=True)   # one file per tensor, Constants too, as torch > 2 GB
        graphs[g] = onnx.load(str(path), load_external_data=False)
    g = graphs["prefill"].graph
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in g.initializer)
    assert any(a.t.data_location == onnx.TensorProto.EXTERNAL for n in g.node for a in n.attribute if a.HasField("t"))
    out, ref = tmp_path / "streamed", tmp_path / "inline"
    out.mkdir(), ref.mkdir()
    assert share_weights(graphs, out, "weights.bin", bases=bases) == share_weights(inline, ref, "weights.bin")
    assert (out / "weights.bin").read_bytes() == (ref / "weights.bin").read_bytes()
    ids, pos, mask, rest = _dummy(cfg, 1, 8, 4, torch.float32)
    feeds = {"input_ids": ids.numpy(), "position_ids": pos.numpy(), "attention_mask": mask.numpy()}
    feeds.update({n: x.numpy() for n, x in zip(io_names(cfg.num_layers)["prefill"]["inputs"][3:], rest)})
    results = []
    for folder, gs in ((out, graphs), (ref, inline)):
        onnx.save(gs["prefill"], str(folder / "prefill.onnx"))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        results.append(ort.InferenceSession(str(folder / "prefill.onnx"), so)
                       .run(["logits"], feeds)[0])
    np.testing.assert_array_equal(results[0], results[1])
