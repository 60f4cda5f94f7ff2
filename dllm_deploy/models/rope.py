"""Rotary position encodings: plain RoPE, YaRN context extension, and Llama-4 query scaling.

    inv_freq(cfg)                 the (rotary_dim/2,) inverse frequencies (YaRN: blended per dim)
    attention_factor(raw)         YaRN's cos/sin multiplier from a config's mscale / mscale_all_dim
    query_scale(position_ids, cfg)  (B,T) factors q is multiplied by after RoPE (None: off)

YaRN (arXiv 2309.00071) as transformers' ``_compute_yarn_parameters`` computes it: dims that turn
fewer than ``beta_slow`` times over the original context are interpolated (frequency / factor),
those turning more than ``beta_fast`` times keep their frequency, a linear ramp in between; cos and
sin are multiplied by the attention factor. Query scaling (Llama 4, Ministral 3, Nemotron-Labs-
Diffusion) multiplies q by ``1 + beta * log(1 + floor(pos / original_max))``: the identity inside
the original context.
"""
from __future__ import annotations

import math

import torch


def _correction_dim(rotations: float, dim: int, base: float, original_max: int) -> float:
    """The rotary dim whose wavelength turns ``rotations`` times over the original context."""
    return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))


def inv_freq(cfg) -> torch.Tensor:
    """The (rotary_dim/2,) float32 inverse frequencies of ``cfg``'s RoPE."""
    dim, base = cfg.rotary_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    if cfg.rope_type == "default":
        return extrapolation
    interpolation = 1.0 / (cfg.rope_factor * pos_freqs)
    low = _correction_dim(cfg.rope_beta_fast, dim, base, cfg.rope_original_max)
    high = _correction_dim(cfg.rope_beta_slow, dim, base, cfg.rope_original_max)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp                      # 1: the dim keeps its frequency (extrapolation)
    return interpolation * (1 - keep) + extrapolation * keep


def attention_factor(params: dict) -> float:
    """YaRN's cos/sin multiplier for a config's rope parameters (``attention_factor`` when given)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = float(params["factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    return float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)


def tables(position_ids: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B,1,T,rotary_dim) for rotate-half RoPE at the given positions."""
    inv = inv_freq(cfg).to(position_ids.device)
    ang = position_ids.to(torch.float32)[..., None] * inv             # (B,T,D/2)
    emb = torch.cat([ang, ang], dim=-1)[:, None]                       # (B,1,T,D)
    cos, sin = emb.cos(), emb.sin()
    if cfg.rope_type == "yarn" and cfg.rope_attention_factor != 1.0:
        cos, sin = cos * cfg.rope_attention_factor, sin * cfg.rope_attention_factor
    return cos, sin


def query_scale(position_ids: torch.Tensor, cfg) -> torch.Tensor | None:
    """(B,T) float32 factors for q after RoPE, or None when the config has no query scaling."""
    if not cfg.q_scale_beta:
        return None
    blocks = torch.floor(position_ids.to(torch.float32) / cfg.rope_original_max)
    return 1 + cfg.q_scale_beta * torch.log(1 + blocks)
