"""fp16 on ONNX Runtime's CPU provider on x86 runs as fp32 (runtime/backends/ort.py::fp16_runs_as_fp32):
the optimized graph ONNX Runtime makes of the fp16 variant reads fp32 weights in every product,
and Runtime.load says so when asked for fp16 there (and sizes its memory estimate as fp32)."""
import platform
import warnings

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from dllm_deploy.runtime.api import Runtime
from dllm_deploy.runtime.backends.ort import fp16_runs_as_fp32

X86 = platform.machine() in ("x86_64", "AMD64")
PRODUCTS = ("MatMul", "FusedMatMul", "Gemm")


def _product_weight_types(model) -> list[int]:
    inits = {t.name: t.data_type for t in model.graph.initializer}
    return [inits[n.input[1]] for n in model.graph.node if n.op_type in PRODUCTS and n.input[1] in inits]


def test_fp16_runs_as_fp32_on_the_cpu_provider_of_x86_only():
    cpu = ["CPUExecutionProvider"]
    assert fp16_runs_as_fp32("fp16", cpu, "x86_64") and fp16_runs_as_fp32("fp16", cpu, "AMD64")
    assert not fp16_runs_as_fp32("fp16", cpu, "aarch64")
    assert not fp16_runs_as_fp32("fp16", ["CUDAExecutionProvider", *cpu], "x86_64")
    assert not fp16_runs_as_fp32("fp32", cpu, "x86_64") and not fp16_runs_as_fp32("int8", cpu, "x86_64")


@pytest.mark.skipif(not X86, reason="x86's CPU provider has no fp16 products; other CPUs may have them")
def test_the_cpu_provider_reads_fp32_weights_in_the_fp16_variants_products(fp16_artifact, tmp_path):
    src = onnx.load(str(fp16_artifact / "fp16" / "verify.onnx"), load_external_data=False)
    assert set(_product_weight_types(src)) == {TensorProto.FLOAT16}          # fp16 weights on disk
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(fp16_artifact / "fp16" / "verify.onnx"), so, providers=["CPUExecutionProvider"])
    opt = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    types = _product_weight_types(opt)
    assert types and set(types) == {TensorProto.FLOAT}, "ONNX Runtime now keeps fp16 weights: revisit fp16_runs_as_fp32"
    assert any(n.op_type == "Cast" for n in opt.graph.node)


@pytest.mark.skipif(not X86, reason="the warning is for x86 CPUs")
def test_loading_fp16_on_this_cpu_warns_once_and_fp32_does_not(fp16_artifact):
    with pytest.warns(UserWarning, match="fp16 on ONNX Runtime's CPU provider on x86") as seen:
        rt = Runtime.load(artifact=str(fp16_artifact), precision="fp16")
    assert sum("fp16 on ONNX Runtime's CPU provider" in str(w.message) for w in seen) == 1
    assert rt.backend.precision == "fp16"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Runtime.load(artifact=str(fp16_artifact), precision="fp32")
    assert not [w for w in seen if "fp16" in str(w.message)]
