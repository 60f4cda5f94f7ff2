"""Memory model: estimated bytes of one decode configuration, the beam-width cap it implies, the
budget it is checked against, and a measurement of the real peak (ONNX Runtime, CPU).

Dimension legend
    B  batch          W  beam width (branches verified per forward)   L  block length
    N  = W * L, tokens in one verification forward                    P  cached prefix tokens
    S  = P + N, keys a verified token attends                         T  tokens of a prefill
    C  hidden   F  SwiGLU width   V  vocabulary   H  query heads   Hkv  KV heads   D  head dim
    b  bytes of a weight (precision)   a  bytes of an activation / KV element (fp32 for int8, int4)

Terms (bytes)
    weights   = copies_w * params * b
                int4 (MatMulNBits): every MatMul weight (K, N) as N * ceil(K / block) blocks of
                block / 2 bytes + a 4-byte scale (+ half a byte of zero point, asymmetric); the
                other parameters (embedding, norms) stay fp32
    kv        = B * P * 2 * layers * Hkv * D * a                          the prefix cache
    prefill   = copies_p * B * T * (tok(T) + V * 4 + 2 * layers * Hkv * D * a)
                                                                           + the logits it returns
                                                                           + the present KV it returns
    verify    = copies_v * B * N * tok(P + N)
    tok(S)    = S * H * a * 2            attention scores + probabilities (the eager graph keeps both)
              + (4 C + 3 F) * a          q/k/v/o and SwiGLU intermediates, one layer live
              + V * (a + 4)              logits + the fp32 softmax before TopK

The copies are what a backend keeps resident (RESIDENCY): ONNX Runtime on the CPU prepacks every
MatMul weight per session, so the prefill and verify sessions hold one copy each (copies_w = 2);
its arena keeps the blocks of the first run of a shape while the memory-pattern block planned
from it serves the next runs of that shape (copies_v = 2: a decode verifies the same shape many
times per block); a prefill shape rarely repeats (copies_p = 1). Checked against measured peak
RSS in docs/profiles.md; runtime constants (library code, session graphs, thread pools: ~10 MB)
are not modelled and belong to the profile's ``reserve_mb``.

With ``prefix_len`` unset the estimate is the worst case of a max_seq budget: P = max_seq - L (the
last block being verified), T = max_seq (the first prefill of the longest prompt). The cap is the
largest W whose total fits in ``fraction * free - reserve`` (and is at most the profile's and the
artifact's max_beam_width).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
INT4_BLOCK = 32          # the exporter's default --int4-block-size

# multiples of each term a backend keeps resident (see the module docstring)
RESIDENCY = {
    "ort": {"weights": 2, "prefill": 1, "verify": 2},   # measured on the CPU provider (docs/profiles.md)
    # two engines embed their own weights; an execution context holds device memory for its
    # profile's max shapes (pass the engine's max W as beam_width); not measured here (no GPU)
    "trt": {"weights": 2, "prefill": 1, "verify": 1},
}


def param_count(cfg: dict) -> int:
    c, f, v, nl = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_layers"]
    h, hkv, d = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    per_layer = c * h * d + 2 * c * hkv * d + h * d * c + 3 * c * f + 2 * c
    return nl * per_layer + v * c * (1 if cfg.get("tie_word_embeddings") else 2) + c


def matmul_weight_shapes(cfg: dict) -> list[tuple[int, int]]:
    """(K, N) of every MatMul weight of the graphs: per layer q, k, v, o, gate, up, down, then the LM head."""
    c, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, hkv, d = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    layer = [(c, h * d), (c, hkv * d), (c, hkv * d), (h * d, c), (c, f), (c, f), (f, c)]
    return layer * cfg["num_layers"] + [(c, v)]


def weight_bytes(cfg: dict, precision: str = "fp32", block_size: int = INT4_BLOCK, symmetric: bool = True) -> int:
    """Bytes of one copy of the weights in ``precision`` (int4: module docstring)."""
    if precision != "int4":
        return param_count(cfg) * BYTES[precision]
    mm = matmul_weight_shapes(cfg)
    quant = 0
    for k, n in mm:
        kb = -(-k // block_size)                          # blocks per output column: ceil(K / block)
        quant += n * kb * (block_size // 2 + 4) + (0 if symmetric else n * -(-kb // 2))
    return quant + (param_count(cfg) - sum(k * n for k, n in mm)) * 4


def _act_bytes(precision: str) -> int:
    return 4 if precision in ("fp32", "int8", "int4") else 2      # int8 / int4 quantize weights only


def _per_token(cfg: dict, keys: int, a: int) -> int:
    """tok(S): live activation bytes per new token attending ``keys`` keys (one layer at a time)."""
    c, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    return keys * cfg["num_heads"] * a * 2 + (4 * c + 3 * f) * a + v * (a + 4)


def kv_bytes_per_token(cfg: dict, precision: str = "fp32") -> int:
    return 2 * cfg["num_layers"] * cfg["num_kv_heads"] * cfg["head_dim"] * _act_bytes(precision)


def estimate_bytes(cfg: dict, precision: str = "fp32", batch: int = 1, beam_width: int = 1, block_length: int = 32,
                   max_seq: int | None = None, prefix_len: int | None = None, backend: str = "ort") -> dict:
    """Bytes of each term and the total (module docstring). ``prefix_len`` = P of one measured
    configuration (prefill of T = P tokens); unset = the worst case under ``max_seq``."""
    a = _act_bytes(precision)
    res = RESIDENCY[backend]
    s_max = int(max_seq or cfg["max_seq"])
    p = int(prefix_len) if prefix_len is not None else max(s_max - block_length, 0)
    t = int(prefix_len) if prefix_len is not None else s_max
    n = beam_width * block_length
    kv_tok = kv_bytes_per_token(cfg, precision)
    weights = res["weights"] * weight_bytes(cfg, precision)
    kv = batch * p * kv_tok
    prefill = res["prefill"] * batch * t * (_per_token(cfg, t, a) + cfg["vocab_size"] * 4 + kv_tok)
    verify = res["verify"] * batch * n * _per_token(cfg, p + n, a)
    total = weights + kv + prefill + verify
    return {"weights": weights, "kv": kv, "prefill": prefill, "activations": verify, "total": total,
            "prefix_len": p, "backend": backend}


def beam_width_cap(cfg: dict, free_bytes: int, fraction: float = 0.5, reserve_mb: int = 512, precision: str = "fp32",
                   batch: int = 1, block_length: int = 32, max_seq: int | None = None, limit: int = 64,
                   backend: str = "ort") -> int:
    """Largest W (>= 1 when even W = 1 does not fit: the caller decides whether to refuse) whose
    estimate fits the budget."""
    budget = fraction * free_bytes - reserve_mb * 2**20
    best = 1
    for w in range(1, limit + 1):
        if estimate_bytes(cfg, precision, batch, w, block_length, max_seq, backend=backend)["total"] <= budget:
            best = w
        else:
            break
    return best


def free_memory_bytes() -> int:
    """Available host memory (MemAvailable); the GPU path uses NVML's free memory instead."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _nvml_free_bytes() -> int:
    try:
        import pynvml  # nvidia-ml-py, imported lazily
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
    except Exception:  # noqa: BLE001 -- no NVML (CPU machine, Jetson): the caller falls back to the host
        return 0


def free_bytes_for(profile, facts: dict, on_gpu: bool) -> tuple[int, str]:
    """The free memory the cap is computed from, and where that figure came from.

    on the CPU, or on a GPU that shares the host's DRAM (Jetson: ``device.shared_host_memory``
    or the detected fact): host MemAvailable; on a discrete GPU: NVML's free memory (detected
    facts, else asked now), falling back to the host when NVML is absent."""
    shared = bool(profile.device.get("shared_host_memory") or facts.get("shared_host_memory"))
    if on_gpu and not shared:
        free = int(facts.get("free_memory_gb", 0) * 2**30) or _nvml_free_bytes()
        if free:
            return free, "GPU free memory (NVML)"
    return free_memory_bytes(), "host MemAvailable" + (" (GPU shares host memory)" if on_gpu and shared else "")


# ---------------------------------------------------------------------------------------------
# measurement: peak RSS of the ONNX Runtime CPU backend, one configuration per fresh process

def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _warm_ort() -> None:
    """Run a one-node-pair session so ONNX Runtime's one-time costs (library pages, thread
    pools, allocator set-up) land in the baseline rather than in the model's figure."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"]), helper.make_node("Softmax", ["y"], ["z"])],
                          "warm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 4])])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.ones((4, 4), np.float32)})


def _measure_here(artifact: str, beam_width: int, prefix_len: int, block_length: int, batch: int, precision: str,
                  runs: int, threads: int | None) -> dict:
    """The measurement itself (run in a fresh process by measure_peak_bytes)."""
    import numpy as np

    from ..artifact import read_manifest
    from ..runtime.backends.ort_backend import OrtBackend
    _warm_ort()
    base = _status()["VmRSS"]
    m = read_manifest(artifact, verify=False, precision=precision)
    be = OrtBackend(artifact, m, precision=precision, threads=threads)            # both sessions, as the runtime
    loaded = _status()["VmRSS"]
    rng = np.random.default_rng(0)
    cache = be.new_cache(batch, prefix_len + beam_width * block_length)
    if prefix_len:                                                                  # the prefix, as the loop builds it
        ids = rng.integers(0, 256, (batch, prefix_len))                             # (B,P)
        pos = np.tile(np.arange(prefix_len), (batch, 1))                            # (B,P)
        causal = np.tril(np.ones((prefix_len, prefix_len), dtype=bool))
        be.prefill(cache, ids, pos, np.broadcast_to(causal, (batch, 1, prefix_len, prefix_len)), keep=prefix_len)
        del ids, pos, causal
    after_prefill = _status()["VmHWM"]
    n = beam_width * block_length
    ids = rng.integers(0, 256, (batch, n))                                          # (B,N)
    pos = np.tile(prefix_len + np.arange(block_length), (batch, beam_width))        # (B,N)
    tree = np.kron(np.eye(beam_width, dtype=bool), np.ones((block_length, block_length), dtype=bool))
    mask = np.concatenate([np.ones((batch, 1, n, prefix_len), dtype=bool),
                           np.broadcast_to(tree, (batch, 1, n, n))], axis=-1)      # (B,1,N,P+N)
    for _ in range(runs):
        be.verify(cache, ids, pos, mask)
    peak = _status()["VmHWM"]
    return {"baseline_bytes": base, "loaded_bytes": loaded - base, "prefill_peak_bytes": after_prefill - base,
            "peak_bytes": peak - base, "model": m["model"]}


def measure_peak_bytes(artifact: str | Path, beam_width: int = 1, prefix_len: int = 64, block_length: int | None = None,
                       batch: int = 1, precision: str = "fp32", runs: int = 3, threads: int | None = None,
                       timeout_s: float = 600) -> dict:
    """Peak memory of the ONNX Runtime CPU backend verifying ``beam_width`` branches of
    ``block_length`` tokens over a ``prefix_len``-token cached prefix, and the model's estimate.

    Runs in a fresh Python process (Linux: /proc/self/status): import onnxruntime and run a tiny
    session (baseline = VmRSS then), load the artifact's two sessions as the runtime does,
    prefill the prefix, run ``runs`` verification forwards of W*L tokens under the tree mask;
    peak = VmHWM - baseline. Returns a dict of bytes:

        peak_bytes           the figure to compare (VmHWM - baseline)
        loaded_bytes         after loading both sessions (weights and graphs)
        prefill_peak_bytes   peak after the prefill, before any verification
        baseline_bytes       VmRSS of the process before the artifact was loaded
        estimate             estimate_bytes() for the same configuration (a dict)
        ratio                estimate["total"] / peak_bytes
    plus the configuration (beam_width, prefix_len, block_length, batch, precision, runs)."""
    from ..artifact import read_manifest
    from ..errors import UserError
    if not Path("/proc/self/status").exists():
        raise UserError("memory measurement needs Linux (/proc/self/status)")
    m = read_manifest(artifact, verify=False, precision=precision)
    L = int(block_length or m["block_length"])
    args = {"artifact": str(artifact), "beam_width": int(beam_width), "prefix_len": int(prefix_len), "block_length": L,
            "batch": int(batch), "precision": precision, "runs": int(runs), "threads": threads}
    code = ("import json, sys; from dllm_deploy.profiles.memory import _measure_here; "
            "print(json.dumps(_measure_here(**json.loads(sys.argv[1]))))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout_s, env=env, check=False)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"memory measurement failed (W={beam_width}, P={prefix_len}): {last[:300]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    est = estimate_bytes(out.pop("model"), precision, batch, beam_width, L, prefix_len=prefix_len, backend="ort")
    return {**args, **out, "estimate": est, "ratio": est["total"] / max(out["peak_bytes"], 1)}


def memory_table(artifact: str | Path, widths=(1, 2, 4, 8, 16), prefixes=(64, 448), block_length: int | None = None,
                 precision: str = "fp32", runs: int = 3, progress=None) -> list[dict]:
    """measure_peak_bytes over W x P (each in its own process): the docs/profiles.md table."""
    rows = []
    for p in prefixes:
        for w in widths:
            rows.append(measure_peak_bytes(artifact, w, p, block_length, precision=precision, runs=runs))
            if progress:
                progress(rows[-1])
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown: W, P, estimate (with its terms), measured peak, ratio."""
    mb = 2**20
    out = ["| W | P | N = W·L | estimate MiB (weights + KV + prefill + verify) | measured peak MiB | loaded MiB | estimate / measured |",
           "|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        e = r["estimate"]
        out.append(f"| {r['beam_width']} | {r['prefix_len']} | {r['beam_width'] * r['block_length']} "
                   f"| {e['total'] / mb:.1f} = {e['weights'] / mb:.1f} + {e['kv'] / mb:.1f} + {e['prefill'] / mb:.1f}"
                   f" + {e['activations'] / mb:.1f} | {r['peak_bytes'] / mb:.1f} | {r['loaded_bytes'] / mb:.1f} "
                   f"| {r['ratio']:.2f} |")
    return "\n".join(out)
