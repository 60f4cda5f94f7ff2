"""Nemotron-Labs-Diffusion (nvidia/Nemotron-Labs-Diffusion-3B / 8B / 14B): a dense Ministral-3
transformer under ``encoder.`` with an untied ``diffusion_head``; one weight set decodes
autoregressively (causal attention) and drafts blocks by diffusion (bidirectional inside the block
over the causal prefix). YaRN RoPE and Llama-4 query scaling (models/rope.py). The self-speculative
strategies (runtime/self_spec.py, docs/self_speculation.md) decode it; their output is the model's
own autoregressive output."""
from __future__ import annotations

from ..capabilities import self_speculative
from ..config import DLLMConfig
from ..registry import Family, NameMap
from ..rope import attention_factor
from .qwen2 import qwen_fields

NAMES = NameMap(pairs=(
    ("model.embed_tokens.weight", "encoder.embed_tokens.weight"),
    ("model.norm.weight", "encoder.norm.weight"),
    ("lm_head.weight", "diffusion_head.weight"),
    ("model.layers.{i}.{n:input_layernorm|post_attention_layernorm}.weight", "encoder.layers.{i}.{n:input_layernorm|post_attention_layernorm}.weight"),
    ("model.layers.{i}.self_attn.{p:q|k|v|o}_proj.weight", "encoder.layers.{i}.self_attn.{p:q|k|v|o}_proj.weight"),
    ("model.layers.{i}.mlp.{p:gate|up|down}_proj.weight", "encoder.layers.{i}.mlp.{p:gate|up|down}_proj.weight"),
))


def rope_fields(raw: dict) -> dict:
    """DLLMConfig's rope fields from ``rope_parameters`` (transformers 5) or ``rope_scaling`` (4.x)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    out: dict = {}
    if "rope_theta" in params:
        out["rope_theta"] = float(params["rope_theta"])
    kind = params.get("rope_type", params.get("type", "default"))
    original = params.get("original_max_position_embeddings")
    if original is not None:
        out["rope_original_max"] = int(original)
    if kind == "yarn":
        out.update(rope_type="yarn", rope_factor=float(params["factor"]),
                   rope_beta_fast=float(params.get("beta_fast") or 32.0),
                   rope_beta_slow=float(params.get("beta_slow") or 1.0),
                   rope_attention_factor=attention_factor(params),
                   rope_truncate=bool(params.get("truncate", True)))
    elif kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported (default or yarn)")
    if params.get("llama_4_scaling_beta"):
        out["q_scale_beta"] = float(params["llama_4_scaling_beta"])
    return out


def config(raw: dict, source: str) -> DLLMConfig:
    fields = qwen_fields(raw, "nemotron_diffusion", rms_norm_eps=1e-5)
    fields.update(rope_fields(raw))
    eos = raw.get("eos_token_id", 11)
    eos = int(eos[0] if isinstance(eos, list) else eos)
    return DLLMConfig(
        **fields, attention="causal", block_size=int(raw.get("block_size", 32)),
        mask_token_id=int(raw.get("mask_token_id", 100)), eos_token_id=eos,
        pad_token_id=int(raw.get("pad_token_id") if raw.get("pad_token_id") is not None else eos),
    )


FAMILY = Family(name="nemotron_diffusion", model_types=("nemotron_labs_diffusion",),
                architectures=("NemotronLabsDiffusionModel",), config=config,
                capabilities=lambda cfg: self_speculative(), names=NAMES)
