"""Routed experts of the int8 / int4 variants: every com.microsoft.MoE node of a graph becomes a
com.microsoft.QMoE node over the same experts quantized (models/moe.py's contrib form).

ONNX Runtime's weight quantizers (MatMulNBits, dynamic int8) rewrite MatMul nodes only, so without
this the experts, most of a mixture-of-experts model's weights, would stay fp32. QMoE layout (the
operator's schema, checked on the CPU provider in tests/integration/export/test_moe_quant.py):
- weights uint8 (E, N, K * bits / 8), N output rows of K inputs, packed low bits first (4 bits:
  element 2j in the low nibble of byte j);
- scales (E, N) (one per row) or (E, N, K / block) (blocked), fp32;
- symmetric: stored q + 2^(bits-1), no zero-point input (the operator's default zero point).
QMoE takes the same router input as MoE; without its router_weights input it renormalises the
top-k softmax, which leaves the contrib form's weights (already summing to 1 on the chosen k) as
they are.
"""
from __future__ import annotations

import numpy as np


def quantize_rows(w: np.ndarray, bits: int, block: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 (E, N, K * bits / 8), scales (E, N) or (E, N, K / block)) of fp32 ``w``
    (E, N, K), symmetric, round to nearest."""
    e, n, k = w.shape
    groups = w.reshape(e, n, k // block, block) if block else w[:, :, None, :]           # (E,N,G,b)
    top = 2 ** (bits - 1) - 1
    scale = np.abs(groups).max(-1) / top                                                  # (E,N,G)
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(groups / scale[..., None]), -top - 1, top).astype(np.int32) + (top + 1)
    q = q.reshape(e, n, k).astype(np.uint8)
    per = 8 // bits
    packed = np.zeros((e, n, k // per), np.uint8)
    for j in range(per):
        packed |= q[:, :, j::per] << (j * bits)
    return packed, scale if block else scale[..., 0]


def dequantize_rows(packed: np.ndarray, scale: np.ndarray, bits: int, block: int | None) -> np.ndarray:
    """The fp32 weights QMoE computes with (the inverse of ``quantize_rows`` up to rounding)."""
    per, mask = 8 // bits, (1 << bits) - 1
    e, n, kb = packed.shape
    q = np.empty((e, n, kb * per), np.int32)
    for j in range(per):
        q[:, :, j::per] = (packed >> (j * bits)) & mask
    q -= 2 ** (bits - 1)
    if block:
        return (q.reshape(e, n, -1, block) * scale[..., None]).reshape(e, n, -1).astype(np.float32)
    return (q * scale[..., None]).astype(np.float32)


def quantize_experts(model, bits: int, block_size: int | None) -> int:
    """Replace every com.microsoft.MoE node of ``model`` (onnx ModelProto; weights loaded, or
    external with absolute locations: each read when its node is quantized) by a QMoE node over its
    experts quantized to ``bits`` (4 or 8), ``block_size`` inputs per scale (None, or a block not
    dividing both widths: one scale per row). Returns the nodes replaced."""
    from onnx import helper, numpy_helper

    from .streamed import tensor_array
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    done = 0
    for i, node in enumerate(list(graph.node)):
        if node.op_type != "MoE" or node.domain != "com.microsoft":
            continue
        fc1, fc2 = tensor_array(inits[node.input[2]]), tensor_array(inits[node.input[4]])
        hidden, width = fc1.shape[2], fc2.shape[2]
        block = block_size if block_size and hidden % block_size == 0 and width % block_size == 0 else None
        names = []
        for src, w in ((node.input[2], fc1), (node.input[4], fc2)):
            packed, scale = quantize_rows(w.astype(np.float32), bits, block)
            names += [f"{src}_q{bits}", f"{src}_scale"]
            graph.initializer.extend([numpy_helper.from_array(packed, names[-2]), numpy_helper.from_array(scale, names[-1])])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs.update(expert_weight_bits=bits, **({"block_size": block} if block else {}))
        q = helper.make_node("QMoE", [node.input[0], node.input[1], names[0], names[1], "", names[2], names[3]],
                             list(node.output), name=f"{node.name}_q{bits}", domain="com.microsoft", **attrs)
        graph.node.remove(node)
        graph.node.insert(i, q)
        done += 1
    used = {x for n in graph.node for x in n.input}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)
    return done
