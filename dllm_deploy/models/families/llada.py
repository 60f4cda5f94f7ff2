"""LLaDA (GSAI-ML/LLaDA-8B-Base and -Instruct): OLMo-style tensor names, bidirectional attention,
``mask_token_id`` in config.json (126336 when absent)."""
from __future__ import annotations

from ..capabilities import bidirectional
from ..config import DLLMConfig
from ..registry import Family, NameMap

NAMES = NameMap(pairs=(
    ("model.embed_tokens.weight", "model.transformer.wte.weight"),
    ("model.norm.weight", "model.transformer.ln_f.weight"),
    ("lm_head.weight", "model.transformer.ff_out.weight"),
    ("model.layers.{i}.input_layernorm.weight", "model.transformer.blocks.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "model.transformer.blocks.{i}.ff_norm.weight"),
    ("model.layers.{i}.self_attn.{p:q|k|v}_proj.{w:weight|bias}", "model.transformer.blocks.{i}.{p:q|k|v}_proj.{w:weight|bias}"),
    ("model.layers.{i}.self_attn.o_proj.weight", "model.transformer.blocks.{i}.attn_out.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "model.transformer.blocks.{i}.ff_proj.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "model.transformer.blocks.{i}.up_proj.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "model.transformer.blocks.{i}.ff_out.weight"),
), ignored=())


def config(raw: dict, source: str) -> DLLMConfig:
    heads = int(raw["n_heads"])
    return DLLMConfig(
        layout="llada", model_type=str(raw.get("model_type", "")).lower(),
        vocab_size=int(raw.get("embedding_size") or raw["vocab_size"]),
        hidden_size=int(raw["d_model"]), num_layers=int(raw["n_layers"]),
        num_heads=heads, num_kv_heads=int(raw.get("n_kv_heads") or heads),
        intermediate_size=int(raw["mlp_hidden_size"]),
        mask_token_id=int(raw.get("mask_token_id", 126336)),
        eos_token_id=int(raw.get("eos_token_id", 126081)),
        pad_token_id=int(raw.get("pad_token_id", raw.get("eos_token_id", 126081))),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_seq=int(raw.get("max_sequence_length", 4096)),
        block_size=int(raw.get("block_size", 32)),
        attention="bidirectional", qkv_bias=bool(raw.get("include_bias", False)),
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
    )


FAMILY = Family(name="llada", model_types=("llada",), architectures=("LLaDAModelLM",), config=config,
                capabilities=lambda cfg: bidirectional(), names=NAMES)
