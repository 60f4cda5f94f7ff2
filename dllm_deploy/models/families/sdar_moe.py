"""SDAR-MoE (JetLM/SDAR-30B-A3B-Chat and -Sci): Qwen3-MoE (its config keys and tensor names: q/k
norm, no bias, softmax router over ``num_experts`` experts, ``num_experts_per_tok`` of them per
token) with SDAR's block-causal attention (``block_size``, 4 in the released checkpoints)."""
from __future__ import annotations

from ...errors import UserError
from ..capabilities import block_causal
from ..config import DLLMConfig
from ..registry import Family
from .qwen2 import qwen_fields


def config(raw: dict, source: str) -> DLLMConfig:
    if raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1)) != 1:
        raise UserError(f"{source}: dense layers among the experts (mlp_only_layers, decoder_sparse_step) "
                        "are not supported; every layer must route to experts")
    return DLLMConfig(
        **qwen_fields(raw, "sdar_moe"), attention="block_causal", qk_norm=True,
        block_size=int(raw.get("block_size", 4)),
        num_experts=int(raw["num_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
        expert_size=int(raw["moe_intermediate_size"]), router="softmax",
        normalize_routing=bool(raw.get("norm_topk_prob", False)),
        mask_token_id=int(raw.get("mask_token_id", 151669)),
        eos_token_id=int(raw["eos_token_id"]),
        pad_token_id=int(raw.get("pad_token_id", raw["eos_token_id"])),
    )


FAMILY = Family(name="sdar_moe", model_types=("sdar_moe",), architectures=("SDARMoeForCausalLM",), config=config,
                capabilities=lambda cfg: block_causal())
