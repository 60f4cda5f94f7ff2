"""LLaDA 2.x (inclusionAI/LLaDA2.0-mini and -flash, LLaDA2.1): Ling / BailingMoE names with q|k|v in
one projection, per-head q/k norm, partial rotary (``partial_rotary_factor``: the first half of each
head), block-causal attention over blocks of 32; the first ``first_k_dense_replace`` layers keep a
dense MLP, the others route with sigmoid scores, a per-expert bias that chooses but does not weigh,
group-limited top-k (``n_group``, ``topk_group``) and ``routed_scaling_factor``, plus shared
experts every token runs (docs/moe.md)."""
from __future__ import annotations

from ...errors import UserError
from ..capabilities import block_causal
from ..config import DLLMConfig
from ..registry import Family, NameMap
from .qwen2 import head_dim, qwen_fields

NAMES = NameMap(pairs=(
    ("model.embed_tokens.weight", "model.word_embeddings.weight"),
    ("model.norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.layers.{i}.{n:input_layernorm|post_attention_layernorm}.weight", "model.layers.{i}.{n:input_layernorm|post_attention_layernorm}.weight"),
    ("model.layers.{i}.self_attn.qkv_proj.{w:weight|bias}", "model.layers.{i}.attention.query_key_value.{w:weight|bias}"),
    ("model.layers.{i}.self_attn.q_norm.weight", "model.layers.{i}.attention.query_layernorm.weight"),
    ("model.layers.{i}.self_attn.k_norm.weight", "model.layers.{i}.attention.key_layernorm.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "model.layers.{i}.attention.dense.weight"),
    ("model.layers.{i}.mlp.{p:gate_proj|up_proj|down_proj}.weight", "model.layers.{i}.mlp.{p:gate_proj|up_proj|down_proj}.weight"),
    ("model.layers.{i}.mlp.gate.{w:weight|expert_bias}", "model.layers.{i}.mlp.gate.{w:weight|expert_bias}"),
    ("model.layers.{i}.mlp.experts.{e}.{p:gate_proj|up_proj|down_proj}.weight",
     "model.layers.{i}.mlp.experts.{e}.{p:gate_proj|up_proj|down_proj}.weight"),
    ("model.layers.{i}.mlp.shared_experts.{p:gate_proj|up_proj|down_proj}.weight",
     "model.layers.{i}.mlp.shared_experts.{p:gate_proj|up_proj|down_proj}.weight"),
))


def config(raw: dict, source: str) -> DLLMConfig:
    if str(raw.get("score_function", "sigmoid")) != "sigmoid":
        raise UserError(f"{source}: score_function {raw['score_function']!r} is not supported (LLaDA 2.x routes with sigmoid)")
    if raw.get("expert_capacity") or raw.get("use_bias") or raw.get("norm_head"):
        key = next(k for k in ("expert_capacity", "use_bias", "norm_head") if raw.get(k))
        raise UserError(f"{source}: {key} is not supported (no released LLaDA 2.x checkpoint sets it)")
    return DLLMConfig(
        **qwen_fields(raw, "llada2", rope_theta=600000.0, max_position_embeddings=16384),
        rotary_dim=int(head_dim(raw) * float(raw.get("partial_rotary_factor", 1.0))),
        attention="block_causal", block_size=int(raw.get("block_size", 32)),
        qkv_bias=bool(raw.get("use_qkv_bias", False)), qk_norm=bool(raw.get("use_qk_norm", True)), fused_qkv=True,
        num_experts=int(raw["num_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
        expert_size=int(raw["moe_intermediate_size"]),
        shared_expert_size=int(raw.get("moe_shared_expert_intermediate_size")
                               or int(raw["moe_intermediate_size"]) * int(raw.get("num_shared_experts") or 0)),
        dense_layers=int(raw.get("first_k_dense_replace", 0)), router="sigmoid",
        router_groups=int(raw.get("n_group") or 1), router_topk_groups=int(raw.get("topk_group") or 1),
        normalize_routing=bool(raw.get("norm_topk_prob", True)),
        routing_scale=float(raw.get("routed_scaling_factor", 1.0)),
        mask_token_id=int(raw.get("mask_token_id", 156895)),
        eos_token_id=int(raw.get("eos_token_id", 156892)),
        pad_token_id=int(raw.get("pad_token_id", 156892)),
    )


FAMILY = Family(name="llada2", model_types=("llada2_moe",), architectures=("LLaDA2MoeModelLM",), config=config,
                capabilities=lambda cfg: block_causal(), names=NAMES)
