"""The Qwen2 / Qwen3 config keys Dream, the block-causal and the MoE families share (not a family itself)."""
from __future__ import annotations


def qwen_fields(raw: dict, family: str, **fallback) -> dict:
    """DLLMConfig fields read from Qwen2-style config.json keys; ``fallback``: a family's values for
    keys its config.json may leave out (rope_theta, rms_norm_eps, max_position_embeddings,
    intermediate_size), by config.json key."""
    def get(key, default=None):
        return raw.get(key, fallback.get(key, default))

    heads = int(raw["num_attention_heads"])
    if get("intermediate_size") is None:
        raise KeyError("intermediate_size")
    return dict(
        layout=family, model_type=str(raw.get("model_type", "")).lower(),
        vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        intermediate_size=int(get("intermediate_size")),
        head_dim=int(raw.get("head_dim") or 0),
        rope_theta=float(get("rope_theta", 10000.0)),
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        max_seq=int(get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


def head_dim(raw: dict) -> int:
    """D: config.json's head_dim, else hidden_size / num_attention_heads."""
    return int(raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"]))
