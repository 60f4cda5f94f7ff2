"""The quantized precision variants of an artifact's fp32 graphs, through ONNX Runtime's quantizers:
int8 (dynamic, weights per output channel, chosen products kept in fp32) and int4 (MatMulNBits,
blockwise); a mixture of experts' routed experts by moe_quant.py; routers never."""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from .graphs import GRAPHS
from .moe_quant import quantize_experts

# the weight products of the exported graph, by the node names torch gives them (module paths),
# that the int8 variant can keep in fp32 (docs/precision.md: the MLP's down-projection reads the
# widest activations, and keeping it more than halves int8's logit error on the core-vocabulary
# weights (lab/tiny-core))
INT8_PRODUCTS = {"qkv": r"/self_attn/MatMul$", "o_proj": r"/o_proj/MatMul$", "gate_up": r"/mlp/MatMul$",
                 "down_proj": r"/down_proj/MatMul$", "lm_head": r"/lm_head/MatMul$"}
# a mixture-of-experts router's product: never quantized (its weights are few, and a rounded score
# can route a token to other experts)
ROUTER = r"/mlp/gate/MatMul$"


def all_tensors(graph):
    """The initializers and the tensors of node attributes (torch stores large Constant values
    as external data too)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def int4_variant(fp32_dir: Path, opts: dict, spill: Path) -> tuple[dict, dict]:
    """Weight-only int4 (ONNX Runtime's MatMulNBits, the format of ONNX Runtime GenAI's LLMs) of
    the fp32 graphs: every MatMul with a constant weight, in blocks of ``opts['block_size']``
    input rows, one fp32 scale (and, asymmetric, one 4-bit zero point) per block;
    ``opts['accuracy_level']`` (4: activations quantized to int8 per block for the product). One graph at a
    time: each is written with its weights beside it under ``spill`` before the next is loaded.
    Returns (graphs without their weights loaded, their folders) for share_weights."""
    import onnx
    graphs, bases = {}, {}
    with _quiet_root_logger():
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        for g in GRAPHS:
            # the weights stay in their file: the quantizer reads each one as it quantizes it
            model = onnx.load(str(fp32_dir / f"{g}.onnx"), load_external_data=False)
            _absolute_locations(model, fp32_dir)
            q = MatMulNBitsQuantizer(model, bits=4, block_size=opts["block_size"], is_symmetric=opts["symmetric"],
                                     accuracy_level=opts.get("accuracy_level") or None,
                                     op_types_to_quantize=tuple(opts["op_types"]),
                                     nodes_to_exclude=_matmuls(model.graph, [ROUTER]))
            q.process()
            quantize_experts(q.model.model, 4, opts["block_size"])
            bases[g] = spill / g
            bases[g].mkdir(parents=True)
            onnx.save_model(q.model.model, str(bases[g] / f"{g}.onnx"), save_as_external_data=True,
                            all_tensors_to_one_file=True, location="data", size_threshold=1024)
            del q, model
            graphs[g] = onnx.load(str(bases[g] / f"{g}.onnx"), load_external_data=False)
    return graphs, bases


def _absolute_locations(model, base: Path) -> None:
    """Point every external tensor of ``model`` at its file by absolute path (its location is
    relative to ``base``), so a tool reading tensors one at a time (ONNX Runtime's quantizers,
    share_weights) finds them wherever the graph is saved."""
    import onnx
    for t in all_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    e.value = str((base / e.value).resolve())


@contextlib.contextmanager
def _quiet_root_logger():
    """ONNX Runtime's quantizers log through the root logger: advice to pre-process, one line per
    tensor, and ``matmul_nbits_quantizer`` calls ``logging.basicConfig(level=INFO)`` on import.
    Errors only while they run; the caller's root level and handlers as they were afterwards."""
    import logging
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)


def int8_kept(graph, products) -> list[str]:
    """The MatMul nodes of ``graph`` (onnx GraphProto) that compute one of ``products`` (names of
    INT8_PRODUCTS) or a router, which the int8 variant leaves in fp32."""
    return _matmuls(graph, [INT8_PRODUCTS[p] for p in products] + [ROUTER])


def _matmuls(graph, patterns: list[str]) -> list[str]:
    """The MatMul nodes of ``graph`` whose names match one of ``patterns``."""
    pats = [re.compile(p) for p in patterns]
    return [n.name for n in graph.node if n.op_type == "MatMul" and any(p.search(n.name) for p in pats)]


def int8_variant(fp32_dirs: dict, sub: Path, opts: dict) -> dict:
    """Dynamic int8 quantization of the fp32 graphs in ``fp32_dirs[graph]`` (the artifact's, or
    the smoothed module's trace), for CPU / edge: MatMul weights int8 (``opts['per_channel']``: a
    scale per output channel; ``opts['reduce_range']``: in -64..64), activations quantized per call;
    the products named in ``opts['fp32_products']`` stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    graphs = {}
    for g in GRAPHS:
        dst = sub / f"{g}.q.onnx"
        src = fp32_dirs[g] / f"{g}.onnx"
        kept = int8_kept(onnx.load(str(src), load_external_data=False).graph, opts["fp32_products"])
        with _quiet_root_logger():
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=opts["per_channel"],
                             reduce_range=bool(opts.get("reduce_range")), nodes_to_exclude=kept,
                             op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})
        graphs[g] = onnx.load(str(dst))
        quantize_experts(graphs[g], 8, None)
        dst.unlink()
        for leftover in sub.glob("*.data"):
            leftover.unlink()
    return graphs
