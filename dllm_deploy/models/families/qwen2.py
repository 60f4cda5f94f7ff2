"""The Qwen2 / Qwen3 config keys Dream and the block-causal models share (not a family itself)."""
from __future__ import annotations


def qwen_fields(raw: dict, family: str) -> dict:
    """DLLMConfig fields read from Qwen2-style config.json keys."""
    heads = int(raw["num_attention_heads"])
    return dict(
        layout=family, model_type=str(raw.get("model_type", "")).lower(),
        vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        intermediate_size=int(raw["intermediate_size"]),
        head_dim=int(raw.get("head_dim") or 0),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_seq=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )
