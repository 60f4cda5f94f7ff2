"""Memory model: estimated bytes of one decode configuration, and the beam-width cap it implies.

    weights      = params * bytes(precision)
    kv           = batch * max_seq * 2 * layers * Hkv * D * bytes(kv dtype)       (the prefix cache)
    verify act.  = batch * N * (S * H * 4 * 2          attention scores + probabilities (fp32)
                                + (4 C + 3 F) * bytes   q/k/v/o and SwiGLU intermediates, one layer live
                                + V * 4 * 2)            logits + softmax before TopK
                   with N = W * L new tokens and S = max_seq keys
The cap is the largest W whose total fits in ``fraction * free - reserve`` (and is at most the
profile's / artifact's max_beam_width). The estimate is checked against measured peak memory.
"""
from __future__ import annotations

import os

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


def param_count(cfg: dict) -> int:
    c, f, v, nl = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_layers"]
    h, hkv, d = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    per_layer = c * h * d + 2 * c * hkv * d + h * d * c + 3 * c * f + 2 * c
    return nl * per_layer + v * c * (1 if cfg.get("tie_word_embeddings") else 2) + c


def estimate_bytes(cfg: dict, precision: str = "fp32", batch: int = 1, beam_width: int = 1, block_length: int = 32,
                   max_seq: int | None = None) -> dict:
    b = BYTES[precision]
    kv_b = 4 if precision in ("fp32", "int8") else 2        # int8 quantizes weights only
    s = int(max_seq or cfg["max_seq"])
    n = beam_width * block_length
    c, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    weights = param_count(cfg) * b
    kv = batch * s * 2 * cfg["num_layers"] * cfg["num_kv_heads"] * cfg["head_dim"] * kv_b
    act = batch * n * (s * cfg["num_heads"] * 4 * 2 + (4 * c + 3 * f) * kv_b + v * 4 * 2)
    return {"weights": weights, "kv": kv, "activations": act, "total": weights + kv + act}


def beam_width_cap(cfg: dict, free_bytes: int, fraction: float = 0.5, reserve_mb: int = 512, precision: str = "fp32",
                   batch: int = 1, block_length: int = 32, max_seq: int | None = None, limit: int = 64) -> int:
    """Largest W (>= 1 when even W = 1 does not fit: the caller decides whether to refuse) whose
    estimate fits the budget."""
    budget = fraction * free_bytes - reserve_mb * 2**20
    best = 1
    for w in range(1, limit + 1):
        if estimate_bytes(cfg, precision, batch, w, block_length, max_seq)["total"] <= budget:
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
