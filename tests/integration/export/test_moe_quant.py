"""export/moe_quant.py: a com.microsoft.MoE node becomes QMoE over its experts quantized, and
ONNX Runtime's QMoE computes what MoE computes over the dequantized weights (the packing, scale
layout and zero point as the operator reads them)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dllm_deploy.export.moe_quant import dequantize_rows, quantize_experts, quantize_rows

E, C, F, K, N = 4, 64, 32, 2, 7


def _moe_model(fc1: np.ndarray, fc2: np.ndarray):
    node = helper.make_node("MoE", ["x", "logits", "fc1", "", "fc2"], ["y"], name="moe", domain="com.microsoft",
                            k=K, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C]),
                                            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C])],
                              [numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("bits, block", [(4, 32), (4, None), (8, None)])
def test_qmoe_computes_moe_over_the_dequantized_experts(bits, block):
    g = np.random.default_rng(bits)
    fc1 = g.normal(0, 0.3, (E, 2 * F, C)).astype(np.float32)
    fc2 = g.normal(0, 0.3, (E, C, F)).astype(np.float32)
    # the contrib form's router input: log of weights summing to 1 on k experts, -inf elsewhere
    w = np.zeros((N, E), np.float32)
    for row in w:
        row[g.choice(E, K, replace=False)] = g.uniform(0.2, 1.0, K)
    with np.errstate(divide="ignore"):
        logits = np.log(w / w.sum(-1, keepdims=True)).astype(np.float32)
    feeds = {"x": g.normal(0, 1, (N, C)).astype(np.float32), "logits": logits}
    model = _moe_model(fc1, fc2)
    assert quantize_experts(model, bits, block) == 1
    assert [n.op_type for n in model.graph.node] == ["QMoE"]
    assert {t.name for t in model.graph.initializer} == {"fc1_q%d" % bits, "fc1_scale", "fc2_q%d" % bits, "fc2_scale"}
    got = _run(model, feeds)
    deq = [dequantize_rows(*quantize_rows(w, bits, block), bits, block) for w in (fc1, fc2)]
    want = _run(_moe_model(*deq), feeds)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    exact = _run(_moe_model(fc1, fc2), feeds)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 0 < err < {(4, 32): 0.2, (4, None): 0.4, (8, None): 0.02}[bits, block]     # quantized, not the fp32 weights


def test_rows_round_trip_within_half_a_step():
    w = np.random.default_rng(0).normal(0, 1, (2, 8, 64)).astype(np.float32)
    for bits, block in ((4, 16), (8, None)):
        packed, scale = quantize_rows(w, bits, block)
        assert packed.dtype == np.uint8 and packed.shape == (2, 8, 64 * bits // 8)
        back = dequantize_rows(packed, scale, bits, block)
        step = np.repeat(scale, block, -1) if block else scale[..., None]
        assert np.all(np.abs(back - w) <= step / 2 + 1e-6)


@pytest.mark.parametrize("form", ["contrib", "gather"])
def test_every_precision_of_both_forms_runs_on_the_cpu_provider(tmp_path, form):
    """fp16 included (the gather form sums in fp32: the CPU provider has no fp16 ScatterElements
    add); the quantized variants' experts are quantized (QMoE, or MatMulNBits / dynamic int8)."""
    import onnx

    from dllm_deploy.export.exporter import export
    from tests.conftest import MOE_CONFIGS, write_random_checkpoint
    rep = export(write_random_checkpoint(tmp_path / "ckpt", MOE_CONFIGS["llada2"]), tmp_path / "art",
                 precisions=["fp32", "fp16", "int8", "int4"], max_beam_width=2, moe_form=form, log=lambda m: None)
    assert "skipped" not in rep["parity"]["fp16"] and rep["parity"]["fp16"]["top1_ids_identical"]
    ops = {n.op_type for n in onnx.load(str(tmp_path / "art" / "int4" / "verify.onnx"), load_external_data=False).graph.node}
    assert ("QMoE" in ops) == (form == "contrib") and "MoE" not in ops and "MatMulNBits" in ops
