"""The TensorRT backend: runs ``engines/<profile>/{prefill,verify}.plan`` (built by
``dllm-deploy build-engines``) behind the interface of backends/base.py, like the ONNX Runtime one.

Loader + runner (Polygraphy style). The loader checks the engines' key recorded in the manifest
(ONNX + weights sha256, TensorRT version, compute capability, profile hash) against this machine
and refuses stale engines with the command that rebuilds them; then deserializes both engines
and creates one execution context each. The runner uses the TensorRT 10/11 API only:
``set_input_shape``, ``set_tensor_address``, ``execute_async_v3`` on torch's current CUDA stream.
``tensorrt`` and ``torch`` (device buffers) are imported lazily, on load.

Memory: each engine has grow-only device buffers per I/O tensor (they reach the largest shape
the loop uses and are reused; the context's own memory is sized by TensorRT for the engine's max
shapes). The KV cache is one flat device buffer per layer and kind, sized for the requested
capacity, of which the first B*Hkv*P*D elements are the contiguous (B, Hkv, P, D) past; a commit
copies the graph's present into it once per block. One host sync per forward: the (B, T, K) top
ids / probs coming back.

Dimension legend: B rows, T new tokens, P cached tokens, Hkv KV heads, D head dim, K top-k, V vocab.

Verified here: the pure parts (I/O shape planning, range checks, key checks, missing-package
errors) by unit tests. The GPU path is checked by tests/gpu/check_trt.py, which has not yet run
on a machine with TensorRT.
"""
from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np

from ...artifact import SAMPLING_INPUTS, kv_shape, sample_pool
from ...artifact.engines import (
    GRAPHS,
    Shapes,
    build_settings,
    engine_record,
    engine_shapes,
    import_tensorrt,
    recorded_engines,
    stale_reasons,
)
from ...errors import UserError
from .base import Loaded, artifact_capabilities, artifact_tokenizer, sampling_feeds

# tensorrt.DataType member name -> torch dtype attribute name
TRT_TO_TORCH = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64", "INT32": "int32",
                "BOOL": "bool", "INT8": "int8", "UINT8": "uint8"}


# ---------------------------------------------------------------- pure parts (unit-tested on CPU)

def io_shapes(manifest: dict, graph: str, batch: int, tokens: int, past: int) -> dict[str, tuple[int, ...]]:
    """Every input and output shape of one call of ``graph`` with B = batch, T = tokens, P = past."""
    m, names = manifest["model"], manifest["graphs"][graph]
    v, k = int(m["vocab_size"]), int(manifest["topk"])
    b, t, p = batch, tokens, past
    shapes: dict[str, tuple[int, ...]] = {"input_ids": (b, t), "position_ids": (b, t), "attention_mask": (b, 1, t, p + t)}
    for name in names["inputs"][3:]:
        if name in SAMPLING_INPUTS:
            shapes[name] = (b, t) if name == "sample_u" else (b,)
        else:
            hkv, d = kv_shape(manifest, name)
            shapes[name] = (b, hkv, p, d)                                   # past (B,Hkv,P,D)
    for name in names["outputs"]:
        if name == "logits":
            shapes[name] = (b, t, v)                                        # (B,T,V)
        elif name in ("top_ids", "top_probs"):
            shapes[name] = (b, t, k)                                        # (B,T,K)
        else:
            hkv, d = kv_shape(manifest, name)
            shapes[name] = (b, hkv, p + t, d)                               # present (B,Hkv,P+T,D)
    return shapes


def check_in_range(shapes: dict[str, tuple[int, ...]], ranges: dict[str, Shapes], graph: str, block_length: int) -> None:
    """A one-line error naming the first input outside the engine's optimization profile, and what
    to do about it (never a failure deep inside TensorRT)."""
    for name, r in ranges.items():
        s = shapes[name]
        if len(s) == len(r.min) and all(lo <= x <= hi for x, lo, hi in zip(s, r.min, r.max)):
            continue
        if s[0] > r.max[0]:
            hint = f"batch {s[0]} is over the engine's {r.max[0]} (the profile's decode.batch; rebuild to change it)"
        elif name == "input_ids" and graph == "verify" and s[1] > r.max[1]:
            hint = (f"W*L = {s[1]} tokens is over the engine's {r.max[1]}: use beam width <= {r.max[1] // block_length} "
                    "or rebuild the engines with a larger decode.max_beam_width")
        elif name.startswith("past_key_values") or name == "attention_mask":
            hint = "the sequence is longer than the engine's max_seq (the profile's decode.max_seq; rebuild to change it)"
        else:
            hint = "rebuild the engines for this shape"
        raise UserError(f"TensorRT {graph} engine: {name} shape {s} is outside {r.min}..{r.max}: {hint}")


def max_beam_width_of(ranges: dict[str, Shapes], block_length: int) -> int:
    """The widest W the verify engine takes: its max tokens / L."""
    return max(1, ranges["input_ids"].max[1] // block_length)


def torch_dtype(torch, trt_dtype) -> object:
    name = getattr(trt_dtype, "name", str(trt_dtype).split(".")[-1])
    if name not in TRT_TO_TORCH:
        raise UserError(f"TensorRT tensor type {name} is not supported by this runner")
    return getattr(torch, TRT_TO_TORCH[name])


def check_engines(folder: str | Path, manifest: dict, profile, trt_version: str, compute_capability: str) -> dict:
    """The recorded engine entry for ``profile`` if it is valid on this TensorRT and GPU; else a
    one-line error with the command that (re)builds it."""
    folder = Path(folder)
    rebuild = f"dllm-deploy build-engines --artifact {folder} --profile {profile.name}"
    built = recorded_engines(manifest, profile.name)
    if built is None:
        raise UserError(f"{folder}: no TensorRT engines for profile {profile.name!r}; build them: {rebuild}")
    precision = profile.precision if profile.precision in manifest["precisions"] else "fp32"   # as plan_engines
    wanted = engine_record(manifest, profile.name, precision, engine_shapes(manifest, profile.decode),
                           build_settings(profile), trt_version, compute_capability)
    why = stale_reasons(built, wanted)
    if why:
        raise UserError(f"{folder}/engines/{profile.name} are stale ({'; '.join(why)}); rebuild: {rebuild}")
    for g in GRAPHS:
        if not (folder / built["graphs"][g]["plan"]).exists():
            raise UserError(f"{folder / built['graphs'][g]['plan']}: missing (listed in the manifest); rebuild: {rebuild}")
    return built


# ---------------------------------------------------------------- GPU parts (tests/gpu/check_trt.py)

def import_torch_cuda():
    try:
        import torch
    except ImportError:
        raise UserError("the TensorRT backend keeps its device buffers in torch: install torch with CUDA") from None
    if not torch.cuda.is_available():
        raise UserError("the TensorRT backend needs a CUDA device (torch.cuda.is_available() is False)")
    return torch


class _Engine:  # pragma: no cover - needs a GPU with TensorRT
    """One deserialized engine, its execution context, and grow-only device buffers per tensor."""

    def __init__(self, trt, torch, path: Path, expected_io: list[str], rebuild: str):
        self.torch = torch
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise UserError(f"{path}: TensorRT could not deserialize the engine (another TensorRT version or GPU?); rebuild: {rebuild}")
        e = self.engine
        names = [e.get_tensor_name(i) for i in range(e.num_io_tensors)]
        if sorted(names) != sorted(expected_io):
            raise UserError(f"{path}: the engine's tensors do not match the artifact's graph; rebuild: {rebuild}")
        self.inputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: torch_dtype(torch, e.get_tensor_dtype(n)) for n in names}
        self.ranges = {n: Shapes(*(tuple(int(x) for x in dims) for dims in e.get_tensor_profile_shape(n, 0)))
                       for n in self.inputs}
        self.context = e.create_execution_context()
        if self.context is None:
            raise UserError(f"{path}: TensorRT could not create an execution context (out of device memory?)")
        self.buffers: dict = {}

    def buffer(self, name: str, shape: tuple[int, ...]):
        """A (shape) view of ``name``'s device buffer, grown (never shrunk) to fit."""
        n = prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < max(n, 1):
            buf = self.torch.empty(max(n, 1), dtype=self.dtypes[name], device="cuda")
            self.buffers[name] = buf
        return buf[:n].view(shape)

    def run(self, feeds: dict, graph: str) -> dict:
        ctx = self.context
        for name in self.inputs:
            t = feeds[name]
            if t.dtype != self.dtypes[name]:
                raise UserError(f"TensorRT {graph} engine: {name} is {self.dtypes[name]}, got {t.dtype}")
            if not ctx.set_input_shape(name, tuple(t.shape)):
                raise UserError(f"TensorRT {graph} engine refused {name} shape {tuple(t.shape)}")
            ctx.set_tensor_address(name, t.data_ptr())
        outs = {}
        for name in self.outputs:
            outs[name] = self.buffer(name, tuple(ctx.get_tensor_shape(name)))
            ctx.set_tensor_address(name, outs[name].data_ptr())
        if not ctx.execute_async_v3(self.torch.cuda.current_stream().cuda_stream):
            raise RuntimeError(f"TensorRT {graph} engine: execute_async_v3 failed (see the TensorRT log)")
        return outs


class TrtCache:  # pragma: no cover - needs a GPU
    """Per layer and kind one flat device buffer; its first B*Hkv*P*D elements are the contiguous
    (B, Hkv, P, D) past the engines read in place (Hkv, D: the layer's, from kv_shapes)."""

    def __init__(self, torch, shapes: list, batch: int, capacity: int, dtype):
        self.torch, self.batch, self.shapes, self.dtype = torch, batch, list(shapes), dtype
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self._alloc()

    def _alloc(self) -> None:
        sizes = [self.batch * hkv * self.capacity * d for hkv, d in self.shapes]
        self.k = [self.torch.empty(n, dtype=self.dtype, device="cuda") for n in sizes]
        self.v = [self.torch.empty(n, dtype=self.dtype, device="cuda") for n in sizes]

    def _view(self, i: int, flat, length: int):
        hkv, d = self.shapes[i]
        return flat[: self.batch * hkv * length * d].view(self.batch, hkv, length, d)

    def past(self) -> list:
        return [(self._view(i, k, self.length), self._view(i, v, self.length)) for i, (k, v) in enumerate(zip(self.k, self.v))]

    def store(self, presents: list, end: int) -> None:
        """Keep the first ``end`` positions of each layer's present (B, Hkv, P+T, D)."""
        if end > self.capacity:                                   # the loop sizes capacity; grow if asked for more
            self.capacity = end
            self._alloc()
        for i, (pk, pv) in enumerate(presents):
            self._view(i, self.k[i], end).copy_(pk[:, :, :end])
            self._view(i, self.v[i], end).copy_(pv[:, :, :end])
        self.length = end

    def truncate(self, n: int) -> None:
        """Only the first n cached positions stay (cache mode delayed drops a block's held keys)."""
        kept = [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in self.past()]
        for i, (k, v) in enumerate(kept):
            self._view(i, self.k[i], n).copy_(k)
            self._view(i, self.v[i], n).copy_(v)
        self.length = n

    def keep_rows(self, rows: np.ndarray) -> None:
        idx = self.torch.as_tensor(np.asarray(rows), device="cuda")
        kept = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.past()]
        self.batch = len(rows)
        for i, (k, v) in enumerate(kept):
            self._view(i, self.k[i], self.length).copy_(k)
            self._view(i, self.v[i], self.length).copy_(v)


class TrtBackend:  # pragma: no cover - needs a GPU with TensorRT
    name = "trt"

    def __init__(self, folder: str | Path, manifest: dict, profile, precision: str | None = None):
        from ...models.config import DLLMConfig
        trt = import_tensorrt()
        torch = import_torch_cuda()
        self.torch, self.folder, self.manifest = torch, Path(folder), manifest
        major, minor = torch.cuda.get_device_capability()
        built = check_engines(self.folder, manifest, profile, trt.__version__, f"{major}.{minor}")
        if precision is not None and precision != built["precision"]:
            raise UserError(f"{folder}: engines for {profile.name!r} were built from the {built['precision']} variant, "
                            f"not {precision}; rebuild with a profile of precision {precision}")
        self.precision = built["precision"]
        self.config = DLLMConfig.from_dict(manifest["model"])
        self.topk = int(manifest["topk"])
        self.capabilities = artifact_capabilities(manifest, self.folder)
        self.kv_shapes = [tuple(x) for x in manifest["kv_shapes"]]
        self.block_length = int(manifest["block_length"])
        self.providers = [f"TensorRT {trt.__version__}"]
        rebuild = f"dllm-deploy build-engines --artifact {folder} --profile {profile.name}"
        names = manifest["graphs"]
        self.engines = {g: _Engine(trt, torch, self.folder / built["graphs"][g]["plan"],
                                   names[g]["inputs"] + names[g]["outputs"], rebuild) for g in self.capabilities.graphs}
        self.past_names = [n for n in names["prefill"]["inputs"] if n.startswith("past_key_values.")]
        self.sample_pool = sample_pool(manifest)
        self.present_names = [n for n in names["prefill"]["outputs"] if n.startswith("present.")]
        self.kv_dtype = self.engines["prefill"].dtypes[self.past_names[0]]
        self.max_beam_width = max_beam_width_of(self.engines["verify"].ranges, self.block_length)

    def new_cache(self, batch: int, capacity: int) -> TrtCache:
        return TrtCache(self.torch, self.kv_shapes, batch, capacity, self.kv_dtype)

    def _host(self, eng: _Engine, name: str, arr: np.ndarray):
        """Copy a host array into ``name``'s device buffer (converting to the engine's dtype)."""
        arr = np.require(arr, requirements=["C", "W"])
        return eng.buffer(name, arr.shape).copy_(self.torch.from_numpy(arr))

    def _run(self, graph: str, cache: TrtCache, ids, pos, mask, sampling=None) -> dict:
        eng = self.engines[graph]
        b, t = ids.shape
        check_in_range(io_shapes(self.manifest, graph, b, t, cache.length), eng.ranges, graph, self.block_length)
        feeds = {"input_ids": self._host(eng, "input_ids", ids), "position_ids": self._host(eng, "position_ids", pos),
                 "attention_mask": self._host(eng, "attention_mask", mask)}
        for i, (k, v) in enumerate(cache.past()):
            feeds[self.past_names[2 * i]] = k
            feeds[self.past_names[2 * i + 1]] = v
        feeds.update({n: self._host(eng, n, x) for n, x in sampling_feeds(sampling, b, t).items()})
        return eng.run(feeds, graph)

    def _top(self, outs: dict):
        top_i = outs["top_ids"].to(self.torch.int64).cpu().numpy()            # (B,T,K): the host sync
        top_p = outs["top_probs"].float().cpu().numpy()                      # (B,T,K)
        return top_i, top_p

    def prefill(self, cache: TrtCache, ids, pos, mask, keep: int, sampling=None):
        if callable(keep):
            from ...errors import UserError
            raise UserError("the TensorRT backend keeps a prefix of the new tokens' KV only (no tree verification yet)")
        outs = self._run("prefill", cache, ids, pos, mask, sampling)
        end = cache.length + keep
        cache.store([(outs[self.present_names[2 * i]], outs[self.present_names[2 * i + 1]])
                     for i in range(len(self.kv_shapes))], end)
        return self._top(outs)

    def verify(self, cache: TrtCache, ids, pos, mask, sampling=None):
        return self._top(self._run("verify", cache, ids, pos, mask, sampling))

    def logits(self, cache: TrtCache, ids, pos, mask) -> np.ndarray:
        """Full logits (B,T,V) from the prefill engine (likelihood scoring); cache unchanged."""
        return self._run("prefill", cache, ids, pos, mask)["logits"].float().cpu().numpy()


def load_trt(folder, profile, precision: str | None = None) -> Loaded:  # pragma: no cover - GPU
    """The TensorRT parts of an artifact: backend over the engines of ``profile`` (built by
    `dllm-deploy build-engines`), tokenizer, and the W cap of the artifact, engines and profile."""
    from ...artifact import read_manifest
    m = read_manifest(folder, verify=True)
    be = TrtBackend(folder, m, profile, precision=precision)
    cap = min(int(m.get("max_beam_width", 8)), be.max_beam_width, int(profile.decode.get("max_beam_width", be.max_beam_width)))
    return Loaded(be, artifact_tokenizer(m, folder, be.config.eos_token_id), cap)
