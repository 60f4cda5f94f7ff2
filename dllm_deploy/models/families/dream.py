"""Dream (Dream-org/Dream-v0-Base-7B, -Instruct): Qwen2 names with q/k/v bias, GQA, bidirectional
attention, logits shifted one position (row i-1 predicts token i; the module undoes it and the
canvas keeps each block's left neighbour as an anchor row)."""
from __future__ import annotations

from ..capabilities import bidirectional
from ..config import DLLMConfig
from ..registry import Family
from .qwen2 import qwen_fields


def config(raw: dict, source: str) -> DLLMConfig:
    return DLLMConfig(
        **qwen_fields(raw, "dream"), attention="bidirectional", qkv_bias=True, shift_logits=True,
        mask_token_id=int(raw.get("mask_token_id", 151666)),
        eos_token_id=int(raw.get("eos_token_id", 151643)),
        pad_token_id=int(raw.get("pad_token_id", 151643)),
        block_size=int(raw.get("block_size", 32)),
    )


FAMILY = Family(name="dream", model_types=("dream",), architectures=("DreamModel",), config=config,
                capabilities=lambda cfg: bidirectional(shift_logits=True))
