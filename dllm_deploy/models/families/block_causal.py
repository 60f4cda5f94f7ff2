"""Block-causal dLLMs: SDAR (Qwen3 names, q/k norm), Fast-dLLM v2 (Qwen2 names, q/k/v bias) and
the bundled tiny dLLM. Blocks attend causally to earlier blocks, so a finished block's KV is exact
(``block_size`` or ``bd_size`` in config.json)."""
from __future__ import annotations

from ...errors import UserError
from ..capabilities import block_causal
from ..config import DLLMConfig
from ..registry import Family
from .qwen2 import qwen_fields


def config(raw: dict, source: str) -> DLLMConfig:
    model_type = str(raw.get("model_type", "")).lower()
    block = raw.get("block_size", raw.get("bd_size"))
    if block is None:
        raise UserError(f"{source}: block-causal model_type {model_type!r} needs block_size (or bd_size)")
    sdar = model_type == "sdar"     # SDAR is Qwen3 (q/k norm, no bias); the others Qwen2
    return DLLMConfig(
        **qwen_fields(raw, "block_causal"), attention="block_causal", block_size=int(block),
        qkv_bias=bool(raw.get("qkv_bias", not sdar)),
        qk_norm=bool(raw.get("qk_norm", sdar)),
        mask_token_id=int(raw["mask_token_id"]),
        eos_token_id=int(raw["eos_token_id"]),
        pad_token_id=int(raw.get("pad_token_id", raw["eos_token_id"])),
    )


FAMILY = Family(name="block_causal", model_types=("sdar", "fast_dllm_v2", "fast_dllm_qwen", "dllm_block"),
                architectures=("SDARForCausalLM", "Fast_dLLM_QwenForCausalLM"), config=config,
                capabilities=lambda cfg: block_causal())
