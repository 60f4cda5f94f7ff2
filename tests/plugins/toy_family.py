"""A model family from outside the package, in one file, registered as a user would register one
from their own package (docs/families.md): "toy_llada", a LLaDA variant with config keys and
tensor names of its own, and a layer pattern the built-in families do not have: odd layers keep
one key/value head (multi-query), even layers the config's ``kv_heads``, so the KV cache differs
by layer. Importing this module registers it."""
from __future__ import annotations

import dataclasses

import dllm_deploy as dd
from dllm_deploy.models.capabilities import bidirectional
from dllm_deploy.models.config import DLLMConfig

# a config.json of the family (random weights: tests/conftest.py::write_random_checkpoint)
CONFIG = {"model_type": "toy_llada", "vocab": 300, "width": 64, "depth": 4, "heads": 4, "kv_heads": 2, "ffn": 96,
          "mask_id": 299, "eos_id": 298, "max_len": 256, "rope_base": 10000.0}


def config(raw: dict, source: str) -> DLLMConfig:
    return DLLMConfig(layout="toy_llada", model_type="toy_llada", vocab_size=int(raw["vocab"]),
                      hidden_size=int(raw["width"]), num_layers=int(raw["depth"]), num_heads=int(raw["heads"]),
                      num_kv_heads=int(raw["kv_heads"]), intermediate_size=int(raw["ffn"]),
                      mask_token_id=int(raw["mask_id"]), eos_token_id=int(raw["eos_id"]),
                      pad_token_id=int(raw.get("pad_id", raw["eos_id"])), max_seq=int(raw.get("max_len", 4096)),
                      rope_theta=float(raw.get("rope_base", 10000.0)), attention="bidirectional")


def kv_shapes(cfg: DLLMConfig) -> list[tuple[int, int]]:
    """(Hkv, D) per layer: one key/value head on odd layers."""
    return [(1 if i % 2 else cfg.num_kv_heads, cfg.head_dim) for i in range(cfg.num_layers)]


def build(cfg: DLLMConfig):
    """The built-in transformer with the odd layers' attention rebuilt for their Hkv."""
    from dllm_deploy.models.transformer import DLLM, Attention
    model = DLLM(cfg)
    for layer, (hkv, _) in zip(model.model.layers, kv_shapes(cfg)):
        if hkv != cfg.num_kv_heads:
            layer.self_attn = Attention(dataclasses.replace(cfg, num_kv_heads=hkv))
    return model


NAMES = dd.NameMap(pairs=(
    ("model.embed_tokens.weight", "embed.weight"),
    ("model.norm.weight", "out_norm.scale"),
    ("lm_head.weight", "unembed.weight"),
    ("model.layers.{i}.input_layernorm.weight", "layer{i}.pre_attn_norm.scale"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layer{i}.pre_mlp_norm.scale"),
    ("model.layers.{i}.self_attn.{p:q|k|v|o}_proj.weight", "layer{i}.attn.w{p:q|k|v|o}"),
    ("model.layers.{i}.mlp.{p:gate|up|down}_proj.weight", "layer{i}.mlp.{p:gate|up|down}"),
))

FAMILY = dd.register_family(dd.Family(
    name="toy_llada", model_types=("toy_llada",), config=config, capabilities=lambda cfg: bidirectional(),
    names=NAMES, module=build, kv_shapes=kv_shapes),
    replace=True)
