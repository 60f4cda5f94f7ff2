"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base and -Instruct): OLMoE names (q/k/v, per-head q/k
norm, ``mlp.gate``, ``mlp.experts.{e}``), bidirectional attention like LLaDA, a softmax router whose
k largest probabilities weigh the experts as they are (never renormalised). Its config.json says
``model_type: llada``, as dense LLaDA's does: the family is found by ``architectures``."""
from __future__ import annotations

from ...errors import UserError
from ..capabilities import bidirectional
from ..config import DLLMConfig
from ..registry import Family
from .qwen2 import head_dim, qwen_fields


def config(raw: dict, source: str) -> DLLMConfig:
    for key in ("moe_router_enable_expert_bias", "shared_expert_intermediate_size", "clip_qkv"):
        if raw.get(key):
            raise UserError(f"{source}: {key} is not supported for LLaDA-MoE (the released checkpoints do not set it)")
    if str(raw.get("moe_router_score_function", "softmax")) != "softmax":
        raise UserError(f"{source}: moe_router_score_function {raw['moe_router_score_function']!r} is not supported")
    freq = raw.get("moe_layer_freq", 1)
    if not all(int(x) == 1 for x in (freq if isinstance(freq, list) else [freq])):
        raise UserError(f"{source}: dense layers among the experts (moe_layer_freq) are not supported")
    return DLLMConfig(
        **qwen_fields(raw, "llada_moe", rope_theta=50000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                      intermediate_size=raw.get("dense_intermediate_size") or raw["expert_intermediate_size"]),
        rotary_dim=int(head_dim(raw) * float(raw.get("partial_rotary_factor", 1.0))),
        attention="bidirectional", block_size=int(raw.get("block_size", 32)),
        qkv_bias=bool(raw.get("attention_bias", False)), qk_norm=bool(raw.get("qk_layernorm", True)),
        num_experts=int(raw["num_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
        expert_size=int(raw["expert_intermediate_size"]), router="softmax", normalize_routing=False,
        mask_token_id=int(raw.get("mask_token_id", 156895)),
        eos_token_id=int(raw.get("eos_token_id", 156892)),
        pad_token_id=int(raw.get("pad_token_id", 156892)),
    )


FAMILY = Family(name="llada_moe", model_types=("llada_moe", "lladamoe"), architectures=("LLaDAMoEModelLM",),
                config=config, capabilities=lambda cfg: bidirectional())
