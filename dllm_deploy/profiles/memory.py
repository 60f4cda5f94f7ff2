"""Memory model: estimated bytes of one decode configuration, the beam-width cap it implies, and
the budget it is checked against (the measured peak it is compared with: dllm_deploy/bench/memory.py).

Dimension legend
    B  batch          W  beam width (branches verified per forward)   L  block length
    N  = W * L, tokens in one verification forward                    P  cached prefix tokens
    S  = P + N, keys a verified token attends                         T  tokens of a prefill
    C  hidden   F  SwiGLU width (mlp_width: a mixture's active set)   V  vocabulary   H  query heads
    Hkv  KV heads   D  head dim
    b  bytes of a weight (precision)   a  bytes of an activation / KV element (fp32 for int8, int4)

Terms (bytes)
    weights   = copies_w * params * b      (params: weight_products and the small parameters; a
                                            mixture-of-experts model counts every expert, all resident)
                int4 (MatMulNBits): every MatMul weight (K, N) as N * ceil(K / block) blocks of
                block / 2 bytes + a 4-byte scale (+ half a byte of zero point, asymmetric); the
                other parameters (embedding, norms) stay fp32
                int8 (the exporter's default): every MatMul weight (K, N) as K * N bytes + a 4-byte
                scale and a 1-byte zero point per output channel, but the down-projections
                (INT8_FP32_DEFAULT), which stay fp32 like the other parameters; a mixture's routers
                stay fp32 in both (the contrib form's QMoE quantizes the experts' down-projections
                too: the estimate is then a little high)
    kv        = B * P * sum over layers of 2 * Hkv * D * a              the prefix cache (each layer's Hkv, D)
    prefill   = copies_p * B * T * (tok(T) + V * 4 + sum over layers of 2 * Hkv * D * a)
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

import os

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
INT4_BLOCK = 32          # the exporter's default --int4-block-size
INT8_FP32_DEFAULT = ("down_proj",)   # the exporter's default --int8-fp32: products int8 keeps in fp32

# multiples of each term a backend keeps resident (see the module docstring)
RESIDENCY = {
    "ort": {"weights": 2, "prefill": 1, "verify": 2},   # measured on the CPU provider (docs/profiles.md)
    # two engines embed their own weights; an execution context holds device memory for its
    # profile's max shapes (pass the engine's max W as beam_width); not measured here (no GPU)
    "trt": {"weights": 2, "prefill": 1, "verify": 1},
}


def kv_shapes(cfg: dict) -> list[tuple[int, int]]:
    """(Hkv, D) per layer: the artifact's ``kv_shapes`` when ``cfg`` carries them (layers may
    differ), else the config's Hkv and D for every layer."""
    shapes = cfg.get("kv_shapes") or [(cfg["num_kv_heads"], cfg["head_dim"])] * cfg["num_layers"]
    return [(int(hkv), int(d)) for hkv, d in shapes]


def weight_products(cfg: dict) -> list[tuple[int, int, int, str]]:
    """(K, N, count, kind) of every weight product of the graphs: per layer q, k, v, o and the MLP,
    then the LM head. A mixture-of-experts layer (``num_experts``, past the ``dense_layers``) has
    a router (C, E), E experts of width ``expert_size`` and the shared experts, all resident; kind
    "down" (the int8 variant keeps it fp32), "router" (never quantized), "expert" / "expert_down"
    (a routed expert's; the latter kept fp32 by int8 like "down"), "" otherwise."""
    c, v, h = cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"]
    out = []
    for i, (hkv, d) in enumerate(kv_shapes(cfg)):
        out += [(c, h * d, 1, ""), (c, hkv * d, 2, ""), (h * d, c, 1, "")]
        e = cfg.get("num_experts", 0)
        if not e or i < cfg.get("dense_layers", 0):
            out += [(c, cfg["intermediate_size"], 2, ""), (cfg["intermediate_size"], c, 1, "down")]
            continue
        fe, fs = cfg["expert_size"], cfg.get("shared_expert_size", 0)
        out += [(c, e, 1, "router"), (c, fe, 2 * e, "expert"), (fe, c, e, "expert_down")]
        out += [(c, fs, 2, ""), (fs, c, 1, "down")] if fs else []
    return out + [(c, v, 1, "")]


def param_count(cfg: dict) -> int:
    """Every parameter: the weight products, norms (q/k norms too), q/k/v biases, router biases
    (sigmoid routers), the embedding (and an untied LM head, counted with the products)."""
    c, v, h = cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"]
    products = sum(k * n * m for k, n, m, _ in weight_products(cfg)) - c * v
    small = 0
    for i, (hkv, d) in enumerate(kv_shapes(cfg)):
        small += 2 * c + (2 * d if cfg.get("qk_norm") else 0) + ((h + 2 * hkv) * d if cfg.get("qkv_bias") else 0)
        if cfg.get("num_experts") and i >= cfg.get("dense_layers", 0) and cfg.get("router") == "sigmoid":
            small += cfg["num_experts"]
    return products + small + v * c * (1 if cfg.get("tie_word_embeddings") else 2) + c


def active_param_count(cfg: dict) -> int:
    """The parameters one token's forward reads: every parameter but the routed experts a token
    skips (E - k of them per mixture-of-experts layer); param_count for a dense model."""
    skipped = sum(m * k * n for k, n, m, kind in weight_products(cfg) if kind in ("expert", "expert_down"))
    e = cfg.get("num_experts", 0)
    return param_count(cfg) - (skipped * (e - cfg["experts_per_token"]) // e if e else 0)


def matmul_weight_shapes(cfg: dict) -> list[tuple[int, int]]:
    """(K, N) of every MatMul weight of the graphs, one entry each (weight_products expanded)."""
    return [(k, n) for k, n, m, _ in weight_products(cfg) for _ in range(m)]


def weight_bytes(cfg: dict, precision: str = "fp32", block_size: int = INT4_BLOCK, symmetric: bool = True) -> int:
    """Bytes of one copy of the weights in ``precision`` (int8, int4: module docstring)."""
    if precision not in ("int8", "int4"):
        return param_count(cfg) * BYTES[precision]
    keep = ("router", "down", "expert_down") if precision == "int8" and "down_proj" in INT8_FP32_DEFAULT else ("router",)
    quant = matmul = 0
    for k, n, m, kind in weight_products(cfg):
        if kind in keep:
            continue                                      # counted with the fp32 parameters
        matmul += m * k * n
        if precision == "int8":
            quant += m * (k * n + 5 * n)
        else:
            kb = -(-k // block_size)                      # blocks per output column: ceil(K / block)
            quant += m * (n * kb * (block_size // 2 + 4) + (0 if symmetric else n * -(-kb // 2)))
    return quant + max(param_count(cfg) - matmul, 0) * 4


def _act_bytes(precision: str) -> int:
    return 4 if precision in ("fp32", "int8", "int4") else 2      # int8 / int4 quantize weights only


def mlp_width(cfg: dict) -> int:
    """F of tok(S): the SwiGLU width a token runs through in its widest layer (a mixture-of-experts
    layer: its k experts and the shared experts, the active set)."""
    dense = cfg["intermediate_size"] if not cfg.get("num_experts") or cfg.get("dense_layers", 0) else 0
    routed = cfg["experts_per_token"] * cfg["expert_size"] + cfg.get("shared_expert_size", 0) if cfg.get("num_experts") else 0
    return max(dense, routed)


def _per_token(cfg: dict, keys: int, a: int) -> int:
    """tok(S): live activation bytes per new token attending ``keys`` keys (one layer at a time)."""
    c, f, v = cfg["hidden_size"], mlp_width(cfg), cfg["vocab_size"]
    return keys * cfg["num_heads"] * a * 2 + (4 * c + 3 * f) * a + v * (a + 4)


def kv_bytes_per_token(cfg: dict, precision: str = "fp32") -> int:
    return sum(2 * hkv * d for hkv, d in kv_shapes(cfg)) * _act_bytes(precision)


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
    """Available host memory (MemAvailable); the GPU path uses NVML's free memory instead. With
    DLLM_DEPLOY_ROOT set (profiles.ROOT_ENV: another board's files), that folder's proc/meminfo,
    as the profile's detection reads it (the C++ runtime's W cap reads the same)."""
    root = os.environ.get("DLLM_DEPLOY_ROOT")
    try:
        with open(os.path.join(root, "proc/meminfo") if root else "/proc/meminfo") as f:
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
