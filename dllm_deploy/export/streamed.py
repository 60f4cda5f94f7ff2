"""Export without the model in memory: graphs traced over placeholder weights, the real weights
streamed from the checkpoint into the graphs one tensor at a time.

Tracing a loaded module holds the fp32 module, torch's folded copy of every weight and, under
protobuf's 2 GB limit, the serialised graph at once (6.5 times a 1.45 GB checkpoint, measured).
Here:

- ``placeholder_module`` builds the family's module with every parameter a stride-0 view of one
  number (no memory), distinct per parameter (the tracer merges parameters of equal value);
- the graphs are traced with ``export_params=False`` and no constant folding, so each parameter is
  a graph input of its own name and everything torch computes from the weights alone (transposes,
  fused q|k|v with the attention scale, gate|up, stacked experts, fp16 casts) stays in the graph;
- ``fold_weights`` evaluates those weight-only nodes (ONNX's reference evaluator, one node at a
  time), reading each parameter from the checkpoint when a node needs it (``WeightSource``), and
  writes each result to an external-data file as the initializer the graph reads: the constant
  folding torch would do, with at most one layer's weights resident;
- ``materialized`` runs the placeholder module with real weights one unit (a layer, the
  embeddings, the head) at a time, for the parity check's reference outputs and int8 calibration.

A bf16 / fp16 checkpoint is never copied to fp32 as a whole; its tensors are cast as they are read.
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import numpy as np

from ..errors import UserError, file_error
from ..models.loading import open_shards

PARAM_PREFIX = "model."       # the graph wrappers (export/graphs.py) hold the model as ``.model``
_ALIGN = 64


class WeightSource:
    """The module's parameters, read from the checkpoint folder one tensor at a time by module
    name, checked against the module's shapes up front (without reading any data). ``scaled``
    gives a source that applies smoothing factors (export/smooth.py) to each tensor as it is read."""

    def __init__(self, folder: Path, family, cfg, shapes: dict):
        self.folder, self.shapes = folder, shapes
        self.index: dict[str, tuple[Path, str]] = {}
        self.factors: dict[str, list] = {}
        self.deltas: dict[str, tuple] = {}
        for f, st in open_shards(folder):
            for name in st.keys():
                ours = family.to_ours(name)
                if ours not in shapes:
                    continue
                shape = tuple(st.get_slice(name).get_shape())
                if shape != shapes[ours]:
                    raise UserError(f"{folder}: tensor {name} has shape {shape}, expected {shapes[ours]}")
                self.index[ours] = (f, name)
        self.tied = {"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_word_embeddings else {}
        missing = sorted(n for n in shapes if n not in self.index and n not in self.tied)
        if missing:
            raise UserError(f"{folder}: missing tensor {missing[0]} ({len(missing)} missing in all)")

    def scaled(self, ops: list) -> "WeightSource":
        """This source with each parameter of ``ops`` [(name, "mul" | "div", factor)] multiplied or
        divided by its factors (broadcast, in order) as it is read (export/smooth.py)."""
        out = copy.copy(self)
        out.factors = {}
        for name, op, factor in ops:
            out.factors.setdefault(name, []).append((op, factor))
        return out

    def with_deltas(self, deltas: dict) -> "WeightSource":
        """This source with a low-rank delta added to each parameter of ``deltas`` (name -> an
        export/lora.py entry) as it is read, before any smoothing factor."""
        out = copy.copy(self)
        out.deltas = dict(deltas)
        return out

    def get(self, name: str, dtype=None):
        """Parameter ``name`` (the module's name) as a torch tensor of ``dtype`` (default fp32)."""
        import torch
        from safetensors import SafetensorError, safe_open
        name = self.tied.get(name, name)
        f, theirs = self.index[name]
        try:
            with open(f, "rb"):     # the library reports an unreadable file as a missing one
                pass
            with safe_open(str(f), framework="pt") as st:
                t = st.get_tensor(theirs)
        except OSError as e:
            raise file_error(f, e) from None
        except (SafetensorError, ValueError) as e:
            raise UserError(f"{f}: corrupt safetensors file ({e})") from None
        t = t.float()
        if name in self.deltas:
            from .lora import delta
            t = t + delta(self.deltas[name])
        for op, factor in self.factors.get(name, ()):
            t = t.mul(factor) if op == "mul" else t.div(factor)
        return t.to(dtype or torch.float32)


def _mark(i: int, dtype):
    """A number of ``dtype`` distinct for every ``i`` < 63486 (fp16's finite non-zero values)."""
    import torch
    if dtype != torch.float16:
        return torch.tensor(float(i + 1), dtype=dtype)
    n = 0x7BFF                               # the largest finite positive fp16 bit pattern
    if i >= 2 * n:
        raise UserError(f"the model has more than {2 * n} weight tensors: too many to trace in fp16")
    v = torch.tensor([i % n + 1], dtype=torch.int16).view(torch.float16)[0]
    return v if i < n else -v


def placeholder_module(family, cfg, dtype):
    """The family's module for ``cfg`` with every parameter a placeholder of its shape and
    ``dtype`` (no memory); tied parameters stay one parameter."""
    import torch
    with torch.device("meta"):
        module = family.build(cfg)
    made: dict[int, torch.nn.Parameter] = {}
    for owner in module.modules():
        for pn, p in list(owner._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(_mark(len(made), dtype).expand(p.shape), requires_grad=False)
            owner._parameters[pn] = made[id(p)]
    return module.eval()


@contextlib.contextmanager
def params_as_inputs():
    """While inside, torch's TorchScript ONNX exporter treats a module's parameters as plain graph
    inputs in its passes. Its shape inference otherwise propagates constant values through the
    parameters (transposes, stacked experts: each materialised from the placeholders and kept
    until the export ends, about twice the model); with export_params=False and no folding the
    graph is the same without them."""
    try:
        from torch.onnx._internal.torchscript_exporter import utils
        named = utils._get_named_param_dict
    except (ImportError, AttributeError):      # another torch layout: the same graph, more memory
        yield
        return
    utils._get_named_param_dict = lambda graph, params: {}
    try:
        yield
    finally:
        utils._get_named_param_dict = named


def param_shapes(module) -> dict:
    """Module parameter name -> shape, tied parameters under each of their names."""
    return {n: tuple(p.shape) for n, p in module.named_parameters(remove_duplicate=False)}


def _units(module) -> list:
    """(prefix, submodule) the reference forward loads one at a time: each element of the
    outermost ModuleLists (the layers), and every other module that owns parameters itself."""
    import torch
    out, inside = [], set()
    for name, m in module.named_modules():
        if any(name.startswith(p) for p in inside):
            continue
        if isinstance(m, torch.nn.ModuleList):
            for i, child in enumerate(m):
                out.append((f"{name}.{i}", child))
            inside.add(name + ".")
        elif any(p is not None for p in m._parameters.values()):
            out.append((name, m))
            inside.add(name + ".")
    return out


def _swap_in(prefix: str, unit, source: WeightSource, dtype, held: list) -> None:
    """Replace the parameters of ``unit`` (named ``prefix`` in its module) by their real weights,
    noting the placeholders in ``held``."""
    for mname, owner in unit.named_modules():
        for pn, p in list(owner._parameters.items()):
            if p is not None:
                full = ".".join(x for x in (prefix, mname, pn) if x)
                held.append((owner, pn, p))
                owner._parameters[pn] = type(p)(source.get(full, dtype or p.dtype), requires_grad=False)


def _swap_out(held: list) -> None:
    while held:
        owner, pn, p = held.pop()
        owner._parameters[pn] = p


@contextlib.contextmanager
def materialized(module, source: WeightSource, dtype=None, resident: tuple = ()):
    """While inside, ``module`` (a placeholder_module) computes with its real weights: each unit's
    parameters are read from ``source`` just before the unit runs and dropped just after it.
    ``resident``: names of submodules whose weights are read outside their own forward (an
    embedding the head reuses, scalars another module reads): loaded for the whole context."""
    held: list = []
    handles = []
    kept: list = []
    for name in resident:
        _swap_in(name, module.get_submodule(name), source, dtype, kept)
    for prefix, unit in _units(module):
        if any(prefix == r or prefix.startswith(r + ".") for r in resident):
            continue
        handles += [unit.register_forward_pre_hook(lambda u, _a, prefix=prefix: _swap_in(prefix, u, source, dtype, held)),
                    unit.register_forward_hook(lambda _u, _a, _o: _swap_out(held))]
    try:
        yield module
    finally:
        _swap_out(held)
        _swap_out(kept)
        for h in handles:
            h.remove()


@contextlib.contextmanager
def loaded(module, source: WeightSource, unit, dtype=None):
    """While inside, the submodule ``unit`` of ``module`` holds its real weights."""
    prefix = next(n for n, m in module.named_modules() if m is unit)
    held: list = []
    _swap_in(prefix, unit, source, dtype, held)
    try:
        yield unit
    finally:
        _swap_out(held)


def tensor_bytes(t, base: Path | None = None) -> bytes:
    """The raw little-endian bytes of initializer ``t``: inline, or read from its external file
    (ONNX external data: location relative to ``base``, or absolute; optional offset and length)."""
    import onnx
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return t.raw_data if t.raw_data else onnx.numpy_helper.to_array(t).tobytes()
    info = {e.key: e.value for e in t.external_data}
    with open(Path(base or ".") / info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0)))
        return f.read(int(info["length"])) if "length" in info else f.read()


def tensor_array(t, base: Path | None = None) -> np.ndarray:
    """Initializer ``t`` as a numpy array (external data read as ``tensor_bytes`` does)."""
    import onnx
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return onnx.numpy_helper.to_array(t)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    return np.frombuffer(tensor_bytes(t, base), dtype=dtype).reshape(tuple(t.dims))


def _evaluate(node, values: list):
    """The outputs of one ONNX node on numpy ``values``."""
    from onnx.reference import ReferenceEvaluator
    ins = [i for i in node.input if i]
    feeds = dict(zip(ins, values))
    return ReferenceEvaluator(node).run(None, feeds)


def fold_weights(model, weight, folder: Path, data_name: str = "data", min_bytes: int = 1024) -> int:
    """Constant-fold ``model`` (a graph traced by ``placeholder_module`` with export_params=False)
    in place: every node computed from weights and constants alone is evaluated, parameter inputs
    (``PARAM_PREFIX`` + module name) read through ``weight(module name) -> numpy array`` when a
    node needs them, and each result a remaining node reads becomes an initializer stored in
    ``folder / data_name`` (external data; under ``min_bytes``: in the graph), written before the
    next is computed. Returns the number of initializers written."""
    import onnx
    from onnx import numpy_helper
    g = model.graph
    params = {i.name for i in g.input if i.name.startswith(PARAM_PREFIX)}
    const = set(params) | {t.name for t in g.initializer}
    const |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    fold = []
    for n in g.node:
        ins = [i for i in n.input if i]
        if n.op_type != "Constant" and n.domain in ("", "ai.onnx") and ins and all(i in const for i in ins):
            fold.append(n)
            const.update(n.output)
    folded = {id(n) for n in fold}
    produced = {o for n in fold for o in n.output} | params
    needed = {i for n in g.node if id(n) not in folded for i in n.input if i in produced}
    needed |= {o.name for o in g.output if o.name in produced}
    uses: dict[str, int] = {}
    for n in fold:
        for i in n.input:
            if i:
                uses[i] = uses.get(i, 0) + 1
    constants = {o: numpy_helper.to_array(a.t) for n in g.node if n.op_type == "Constant"
                 for o, a in zip(n.output, n.attribute) if a.name == "value"}
    values: dict[str, np.ndarray] = {}
    written = []
    with open(folder / data_name, "wb") as f:

        def write(name: str, arr: np.ndarray) -> None:
            arr = np.ascontiguousarray(arr)
            if arr.nbytes < min_bytes:          # shapes, indices, norms: in the graph (ONNX Runtime's
                written.append(numpy_helper.from_array(arr, name))   # shape inference reads them)
                return
            f.write(b"\0" * ((-f.tell()) % _ALIGN))
            off = f.tell()
            f.write(memoryview(arr.reshape(-1)).cast("B") if arr.nbytes >= 1 << 20 else arr.tobytes())
            t = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                 dims=arr.shape, data_location=onnx.TensorProto.EXTERNAL)
            for k, v in (("location", data_name), ("offset", str(off)), ("length", str(arr.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            written.append(t)

        def read(name: str):
            if name in values:
                return values[name]
            if name in constants:
                return constants[name]
            if name in params:
                return weight(name[len(PARAM_PREFIX):])
            raise KeyError(name)

        for p in sorted(params & needed):           # parameters a remaining node reads as they are
            write(p, weight(p[len(PARAM_PREFIX):]))
        for n in fold:
            outs = _evaluate(n, [read(i) for i in n.input if i])
            for i in n.input:
                if i:
                    uses[i] -= 1
                    if uses[i] == 0:
                        values.pop(i, None)
            for name, arr in zip(n.output, outs):
                if name in needed:
                    write(name, arr)
                if uses.get(name):
                    values[name] = arr
    keep = [n for n in g.node if id(n) not in folded]
    read_by = {i for n in keep for i in n.input} | {o.name for o in g.output}
    keep = [n for n in keep if n.op_type != "Constant" or any(o in read_by for o in n.output)]
    del g.node[:]
    g.node.extend(keep)
    inputs = [i for i in g.input if i.name not in params]
    del g.input[:]
    g.input.extend(inputs)
    g.initializer.extend(written)
    return len(written)
