"""The int8 variant's reduce_range (export --int8-reduce-range): 7-bit weights, so that the byte-pair
sums of ONNX Runtime's x86 kernels without VNNI (255 x 64 x 2 < 2**15) cannot saturate their
16-bit lanes (docs/precision.md); without it the weights use the full -127..127."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from dllm_deploy.cli import main
from dllm_deploy.export.graphs import GRAPHS
from dllm_deploy.export.quantize import int8_variant


def _weights(model) -> list[np.ndarray]:
    return [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]


def test_reduce_range_keeps_the_weights_in_seven_bits_and_runs(tiny_artifact, tmp_path):
    for rr, bound in ((True, 64), (False, 127)):
        sub = tmp_path / str(rr)
        sub.mkdir()
        graphs = int8_variant({g: tiny_artifact[0] for g in GRAPHS}, sub,
                              {"per_channel": True, "fp32_products": [], "reduce_range": rr})
        for g, model in graphs.items():
            w = _weights(model)
            assert w and max(int(np.abs(x.astype(np.int32)).max()) for x in w) == bound, (g, rr)
            onnx.save(model, str(sub / f"{g}.onnx"))
            ort.InferenceSession(str(sub / f"{g}.onnx"), providers=["CPUExecutionProvider"])    # loads


def test_the_flag_reaches_the_exporter(monkeypatch, tmp_path):
    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise SystemExit(0)
    monkeypatch.setattr("dllm_deploy.export.exporter.export", fake)
    for argv, want in ((["--int8-reduce-range"], True), ([], False)):
        try:
            main(["export", "--out", str(tmp_path / "a"), "--precision", "fp32,int8", *argv])
        except SystemExit:
            pass
        assert seen["int8_reduce_range"] is want
