"""The ONNX Runtime backend: runs an exported artifact with no torch.

Sessions per graph; execution providers and threads come from the profile (CPU here, with
CUDA / TensorRT / OpenVINO options built from the same profile where those providers exist).
Intra-op threads do not spin between calls (``session_threads``).
The KV cache is one contiguous (B, Hkv, P, D) array per layer that ONNX Runtime reads in
place: a verification step copies no KV; a commit replaces the arrays once per block (``OrtCache``,
artifacts of kv_io "append"). An artifact of kv_io "new" returns only the new tokens' keys and
values, and the cache is a (B, Hkv, capacity, D) buffer per layer that a commit writes in place
(``OrtBufferCache``): no copy of the cached positions at any call.
"""
from __future__ import annotations

import os

from pathlib import Path

import numpy as np

from ...artifact import MANIFEST, read_manifest, sample_pool
from ...errors import UserError, file_error
from .base import Loaded, artifact_capabilities, artifact_tokenizer, kept_tokens, sampling_feeds


FP16_ON_X86_CPU = ("fp16 on ONNX Runtime's CPU provider on x86: it has no fp16 matrix kernels there and converts "
                   "the weights to fp32 when it loads the graphs, so fp16 takes fp32's time and more than fp32's "
                   "memory; use fp32, or int8 for speed (docs/precision.md)")


def fp16_runs_as_fp32(precision: str, providers: list[str], machine: str | None = None) -> bool:
    """Whether ``precision`` on sessions whose first provider is ``providers[0]`` runs as fp32:
    fp16 on the CPU provider of an x86 machine. ONNX Runtime (1.32) has no fp16 MatMul kernel for
    x86 CPUs; it places Casts around the fp16 nodes and folds the fp16 weights into fp32 ones at
    load, so the products read fp32 weights (tests/integration/runtime/test_fp16_cpu.py checks the
    optimized graph). ``machine``: platform.machine() unless given."""
    import platform
    return (precision == "fp16" and bool(providers) and providers[0] == "CPUExecutionProvider"
            and (machine or platform.machine()) in ("x86_64", "AMD64", "i386", "i686"))


def provider_list(providers: list[str], options: dict | None = None) -> list:
    """The (name, options) list ONNX Runtime takes, keeping only providers this build has,
    in the profile's order; CPU is always last as the fallback."""
    import onnxruntime as ort
    have = set(ort.get_available_providers())
    out = []
    for p in providers:
        if p in have and p != "CPUExecutionProvider":
            out.append((p, dict((options or {}).get(p, {}))))
    out.append(("CPUExecutionProvider", {}))
    return out


def session_threads(so, threads: int | None) -> None:
    """Intra-op threads for one of the loop's sessions, with spinning off.

    The decode loop alternates two sessions (verify each step, prefill at each commit), each with
    its own intra-op pool. With spinning on (ONNX Runtime's default) the pool that just ran keeps
    its workers busy-waiting on the cores the other session needs: on 2 CPU cores a verification
    step took about twice as long inside the loop as when run back to back. A process-wide shared
    pool would avoid it too, but ONNX Runtime then refuses every session in the process that does
    not opt in, a user's own included."""
    if threads:
        so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")


def _zeros_beside(x: np.ndarray, n: int, left: bool) -> np.ndarray:
    """``x`` (B,Hkv,P,D) with n zero positions before (``left``) or after it."""
    z = np.zeros(x.shape[:2] + (n,) + x.shape[3:], x.dtype)
    return np.concatenate([z, x] if left else [x, z], axis=2)


class OrtCache:
    """Per-layer KV as contiguous (B, Hkv, P, D) arrays (Hkv, D: the layer's, from the manifest's
    kv_shapes): ONNX Runtime reads them in place (no copy per verification step); a commit replaces
    them once per block with the graph's present."""

    def __init__(self, shapes: list, batch: int, dtype):
        self.k = [np.zeros((batch, hkv, 0, d), dtype=dtype) for hkv, d in shapes]
        self.v = list(self.k)
        self.length = 0

    def feeds(self, mask: np.ndarray) -> tuple[list, list, np.ndarray]:
        """(keys, values to feed per layer, the mask over them): the arrays as they are."""
        return self.k, self.v, mask

    def write(self, present: list, idx: np.ndarray | None, keep: int) -> None:
        """A prefill's ``present`` (k0, v0, k1, ...) of (B,Hkv,P+T,D) becomes the cache: its first
        P + ``keep`` positions, or the P cached and the new tokens ``idx`` (B,n) per row."""
        p = self.length
        if idx is not None:                      # rows keep the KV of chosen new tokens
            at = np.concatenate([np.broadcast_to(np.arange(p), (len(idx), p)), idx + p], axis=1)[:, None, :, None]
            # take_along_axis returns a strided array; ONNX Runtime would copy it on every later call
            kept = lambda x: np.ascontiguousarray(np.take_along_axis(x, at, axis=2))  # noqa: E731
            self.length = p + idx.shape[1]
        else:
            end = p + keep
            kept = lambda x: x if x.shape[2] == end else np.ascontiguousarray(x[:, :, :end])  # noqa: E731
            self.length = end
        self.k, self.v = [kept(k) for k in present[0::2]], [kept(v) for v in present[1::2]]

    def keep_rows(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        self.k = [np.ascontiguousarray(k[rows]) for k in self.k]
        self.v = [np.ascontiguousarray(v[rows]) for v in self.v]

    def pad_left(self, n: int) -> None:
        """n zero positions before the cached ones (masked out: pads of a joining batch)."""
        self.k, self.v = [_zeros_beside(k, n, True) for k in self.k], [_zeros_beside(v, n, True) for v in self.v]
        self.length += n

    def truncate(self, n: int) -> None:
        """Only the first n cached positions stay (cache mode delayed drops a block's held keys)."""
        self.k = [np.ascontiguousarray(k[:, :, :n]) for k in self.k]
        self.v = [np.ascontiguousarray(v[:, :, :n]) for v in self.v]
        self.length = n

    def drop_left(self, n: int) -> None:
        self.k = [np.ascontiguousarray(k[:, :, n:]) for k in self.k]
        self.v = [np.ascontiguousarray(v[:, :, n:]) for v in self.v]
        self.length -= n

    def add_rows(self, other: "OrtCache") -> None:
        """``other``'s rows after these (the same length)."""
        self.k = [np.concatenate([a, b]) for a, b in zip(self.k, other.k)]
        self.v = [np.concatenate([a, b]) for a, b in zip(self.v, other.v)]


class OrtBufferCache:
    """Per-layer KV in (B, Hkv, capacity, D) buffers, positions [0, length) written (kv_io "new"):
    a commit writes its kept tokens' keys and values after them, in place. A call reads the
    buffers whole, the mask leaving the unwritten positions out, or just the written part when
    that is the whole buffer or nothing (then no position is read in vain). Past its capacity
    the buffer grows by a quarter at least (the decode loop sizes it for the whole decode)."""

    def __init__(self, shapes: list, batch: int, dtype, capacity: int):
        self.k = [np.zeros((batch, hkv, capacity, d), dtype=dtype) for hkv, d in shapes]
        self.v = [np.zeros((batch, hkv, capacity, d), dtype=dtype) for hkv, d in shapes]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def feeds(self, mask: np.ndarray) -> tuple[list, list, np.ndarray]:
        """(keys, values to feed per layer, the mask over them): ``mask`` (B,1,T,P+T) over the
        written positions, widened with unattended columns when the buffer is fed whole."""
        p, cap = self.length, self.capacity
        if p in (0, cap):
            return [k[:, :, :p] for k in self.k], [v[:, :, :p] for v in self.v], mask
        b, _, t, _ = mask.shape
        wide = np.zeros((b, 1, t, cap + t), dtype=bool)
        wide[..., :p], wide[..., cap:] = mask[..., :p], mask[..., p:]
        return self.k, self.v, wide

    def _grow_to(self, cap: int) -> None:
        extra = cap - self.capacity
        if extra > 0:
            self.k = [_zeros_beside(k, extra, False) for k in self.k]
            self.v = [_zeros_beside(v, extra, False) for v in self.v]

    def _room(self, n: int) -> None:
        if n > self.capacity:
            self._grow_to(max(n, self.capacity + max(self.capacity // 4, 1)))

    def write(self, new: list, idx: np.ndarray | None, keep: int) -> None:
        """The kept new tokens' keys and values after the written positions: ``new`` a call's
        present outputs (k0, v0, k1, ...) of (B,Hkv,T,D); ``idx`` (B,n) the kept tokens per row, or
        None: the first ``keep``."""
        n = keep if idx is None else idx.shape[1]
        p = self.length
        self._room(p + n)
        at = None if idx is None else idx[:, None, :, None]
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            nk, nv = new[2 * i], new[2 * i + 1]
            k[:, :, p:p + n] = nk[:, :, :n] if at is None else np.take_along_axis(nk, at, axis=2)
            v[:, :, p:p + n] = nv[:, :, :n] if at is None else np.take_along_axis(nv, at, axis=2)
        self.length = p + n

    def keep_rows(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        self.k, self.v = [k[rows] for k in self.k], [v[rows] for v in self.v]

    def pad_left(self, n: int) -> None:
        """n zero positions before the written ones (masked out: pads of a joining batch)."""
        self.k, self.v = [_zeros_beside(k, n, True) for k in self.k], [_zeros_beside(v, n, True) for v in self.v]
        self.length += n

    def truncate(self, n: int) -> None:
        """Only the first n written positions stay (the rest are written over later)."""
        self.length = min(n, self.length)

    def drop_left(self, n: int) -> None:
        self.k = [np.ascontiguousarray(k[:, :, n:]) for k in self.k]
        self.v = [np.ascontiguousarray(v[:, :, n:]) for v in self.v]
        self.length -= n

    def add_rows(self, other: "OrtBufferCache") -> None:
        """``other``'s rows after these (the same length; the larger capacity)."""
        cap = max(self.capacity, other.capacity)
        self._grow_to(cap)
        other._grow_to(cap)
        self.k = [np.concatenate([a, b]) for a, b in zip(self.k, other.k)]
        self.v = [np.concatenate([a, b]) for a, b in zip(self.v, other.v)]


class OrtBackend:
    name = "ort"
    joins_batches = True        # its cache pads and stacks: rows may join a running batch (loop.joins)

    def __init__(self, folder: str | Path, manifest: dict, precision: str = "fp32", providers=None,
                 provider_options: dict | None = None, threads: int | None = None):
        import onnxruntime as ort
        from ...models.config import DLLMConfig
        self.folder, self.manifest, self.precision = Path(folder), manifest, precision
        self.config = DLLMConfig.from_dict(manifest["model"], f"{self.folder / MANIFEST}: model")
        self.topk = manifest.get("topk")
        if self.topk is None:
            raise UserError(f"{self.folder / MANIFEST}: corrupt manifest (no 'topk')")
        self.capabilities = artifact_capabilities(manifest, self.folder)
        files = manifest["precisions"][precision]
        so = ort.SessionOptions()
        so.log_severity_level = 3
        session_threads(so, threads)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        plist = provider_list(providers or ["CPUExecutionProvider"], provider_options)
        self.sessions = {g: _session(self.folder, files, g, so, plist) for g in self.capabilities.graphs}
        for g, sess in self.sessions.items():     # the loop feeds and fetches by the manifest's names
            have = {"inputs": [i.name for i in sess.get_inputs()], "outputs": [o.name for o in sess.get_outputs()]}
            for k in ("inputs", "outputs"):
                if manifest["graphs"].get(g, {}).get(k) != have[k]:
                    raise UserError(f"{self.folder / MANIFEST}: corrupt manifest (graph {g!r}: its {k} are not "
                                    f"those of {files[g]})")
        self.loaded = LoadedFiles(self.folder, files.values())
        self.providers = self.sessions["verify"].get_providers()
        inp = self.sessions["prefill"].get_inputs()
        self.kv_dtype = np.float16 if "float16" in inp[3].type else np.float32
        self.names = manifest["graphs"]
        self.past_names = [n for n in self.names["prefill"]["inputs"] if n.startswith("past_key_values.")]
        self.kv_shapes = [tuple(x) for x in manifest["kv_shapes"]]
        self.kv_io = manifest.get("kv_io", "append")
        self.sample_pool = sample_pool(manifest)
        # the decode loop never needs prefill's full logits (B,T,V): not fetching them lets ONNX
        # Runtime free them as an intermediate instead of returning T*V floats per call
        self.prefill_fetch = [n for n in self.names["prefill"]["outputs"] if n != "logits"]

    def new_cache(self, batch: int, capacity: int) -> OrtCache | OrtBufferCache:
        if self.kv_io == "new":
            return OrtBufferCache(self.kv_shapes, batch, self.kv_dtype, capacity)
        return OrtCache(self.kv_shapes, batch, self.kv_dtype)

    def run(self, role: str, feeds: dict, fetch: list[str] | None = None) -> list:
        """One call of the graph of ``role`` (outputs ``fetch``, default all), by the manifest's names."""
        return self.sessions[role].run(fetch, feeds)

    def _feeds(self, cache, ids, pos, mask, sampling=None):
        ks, vs, mask = cache.feeds(mask)
        feeds = {"input_ids": np.ascontiguousarray(ids, dtype=np.int64),
                 "position_ids": np.ascontiguousarray(pos, dtype=np.int64),
                 "attention_mask": np.ascontiguousarray(mask, dtype=bool)}
        for i, (k, v) in enumerate(zip(ks, vs)):
            feeds[self.past_names[2 * i]] = k
            feeds[self.past_names[2 * i + 1]] = v
        feeds.update(sampling_feeds(sampling, *ids.shape))
        return feeds

    def prefill(self, cache, ids, pos, mask, keep: int, sampling=None):
        outs = self.run("prefill", self._feeds(cache, ids, pos, mask, sampling), self.prefill_fetch)
        top_i, top_p = outs[0], outs[1]
        cache.write(outs[2:], kept_tokens(keep, top_i, top_p), keep)
        return top_i, top_p.astype(np.float32, copy=False)

    def logits(self, cache, ids, pos, mask) -> np.ndarray:
        """Full logits (B,T,V) from the prefill graph (for likelihood scoring); cache unchanged."""
        out = self.run("prefill", self._feeds(cache, ids, pos, mask), ["logits"])[0]
        return out.astype(np.float32, copy=False)

    def verify(self, cache, ids, pos, mask, sampling=None):
        top_i, top_p = self.run("verify", self._feeds(cache, ids, pos, mask, sampling))
        return top_i, top_p.astype(np.float32, copy=False)


class LoadedFiles:
    """The artifact files a session reads, held open from load on. ONNX Runtime maps weights.bin
    into memory: a program that truncates or overwrites that very file (not ``export --force``,
    which swaps in new files and leaves the old ones whole) changes what the sessions compute, or
    ends the process with SIGBUS when they touch a page past the new end. ``changed`` tells,
    from the held descriptors (the inodes actually mapped), before it is too late."""

    def __init__(self, folder: Path, names):
        self.seen: dict = {}
        for name in sorted(set(names)):
            path = folder / name
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            st = os.fstat(fd)
            self.seen[name] = (fd, st.st_size, st.st_mtime_ns)

    def changed(self) -> str | None:
        """A one-line description of the first file changed since load, or None."""
        for name, (fd, size, mtime) in self.seen.items():
            st = os.fstat(fd)
            if (st.st_size, st.st_mtime_ns) != (size, mtime):
                return (f"{name} changed on disk after it was loaded ({size} -> {st.st_size} bytes): "
                        "this process's model is no longer the file's; restart it")
        return None

    def __del__(self, _close=os.close):
        # os.close bound at definition: at interpreter exit the os module may be gone already
        for fd, *_ in self.seen.values():
            try:
                _close(fd)
            except OSError:
                pass


def _session(folder: Path, files: dict, graph: str, options, providers):
    """One ONNX Runtime session for ``graph``; a missing, unreadable or broken file is the
    user's mistake, reported in one line naming the file."""
    import onnxruntime as ort
    if graph not in files:
        raise UserError(f"{folder / MANIFEST}: corrupt manifest (no {graph!r} graph in the precision's files)")
    path = folder / files[graph]
    try:
        with open(path, "rb"):      # names the cause ONNX Runtime's own message leaves out
            pass
        return ort.InferenceSession(str(path), options, providers=providers)
    except OSError as e:
        raise file_error(path, e) from None
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        raise UserError(f"{path}: cannot load the ONNX graph ({type(e).__name__}: {msg})") from None


def load_ort(folder, precision: str = "fp32", threads: int | None = None, providers=None, provider_options=None,
             threads_default: int | None = None, max_beam_width: int | None = None) -> Loaded:
    """The ONNX Runtime parts of an artifact: backend, tokenizer and the W cap (the artifact's,
    lowered to ``max_beam_width`` when given)."""
    m = read_manifest(folder, verify=True, precision=precision)
    be = OrtBackend(folder, m, precision=precision, providers=providers, provider_options=provider_options,
                    threads=threads or threads_default)
    cap = m.get("max_beam_width", 8)
    if max_beam_width is not None:
        cap = min(cap, int(max_beam_width))
    return Loaded(be, artifact_tokenizer(m, folder, be.config.eos_token_id), cap)
