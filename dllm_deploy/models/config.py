"""Typed model configuration, read from a Hugging Face ``config.json``.

One config type serves every supported layout; ``layout`` says which tensor names to load:

- ``llada``        LLaDA (OLMo-style names, bidirectional attention, ``mask_token_id`` in config)
- ``dream``        Dream (Qwen2 names with q/k/v bias, GQA, logits shifted one position)
- ``block_causal`` SDAR / Fast-dLLM v2 / the bundled tiny dLLM (Qwen2/Qwen3 names, ``block_size``)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

from ..errors import UserError, file_error

LAYOUTS = ("llada", "dream", "block_causal")

# model_type (lower-cased) -> layout
_MODEL_TYPES = {
    "llada": "llada",
    "llada_moe": None,  # recognised, but a mixture-of-experts model is not supported
    "dream": "dream",
    "sdar": "block_causal",
    "fast_dllm_v2": "block_causal",
    "fast_dllm_qwen": "block_causal",
    "dllm_block": "block_causal",
}


# field annotation -> the JSON values it accepts (from_dict); sizes that must be positive
_FIELD_TYPES = {"int": Integral, "float": Real, "str": str, "bool": bool}
_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
          "mask_token_id", "eos_token_id", "pad_token_id", "head_dim", "max_seq", "block_size")


@dataclass
class DLLMConfig:
    layout: str                      # one of LAYOUTS: which tensor names the checkpoint uses
    vocab_size: int                  # rows of the embedding / columns of the LM head
    hidden_size: int                 # model width (C)
    num_layers: int                  # transformer blocks
    num_heads: int                   # query heads (H)
    num_kv_heads: int                # key/value heads (Hkv); H % Hkv == 0 (GQA)
    intermediate_size: int           # SwiGLU hidden width
    mask_token_id: int               # the [MASK] id the diffusion process fills
    eos_token_id: int                # end of sequence
    pad_token_id: int                # padding (never attended by real tokens)
    head_dim: int = 0                # per-head width (D); 0 = hidden_size // num_heads
    rope_theta: float = 10000.0      # RoPE base
    rms_norm_eps: float = 1e-6       # RMSNorm epsilon
    max_seq: int = 4096              # longest prompt + generation the model supports (tokens)
    block_size: int = 32             # diffusion block length (L) the model was trained with
    attention: str = "bidirectional"  # "bidirectional" (LLaDA, Dream) or "block_causal" (exact KV)
    qkv_bias: bool = False           # q/k/v projections carry a bias (Qwen2 / Dream)
    qk_norm: bool = False            # per-head RMSNorm on q and k (Qwen3 / SDAR)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    shift_logits: bool = False       # logits at i-1 predict token i (Dream); undone in forward()
    model_type: str = ""             # the checkpoint's own model_type string

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.layout not in LAYOUTS:
            raise UserError(f"unknown layout {self.layout!r} (expected one of {', '.join(LAYOUTS)})")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "model config") -> "DLLMConfig":
        """The config an artifact's manifest records (``to_dict``); every field is checked for
        its type and sizes for being positive, so a hand-edited manifest fails here in one line."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for f in fields.values():
            if f.name not in d and f.default is dataclasses.MISSING:
                raise UserError(f"{source}: no {f.name!r}")
        for k, v in d.items():
            want = _FIELD_TYPES.get(fields[k].type) if k in fields else None
            if want and (not isinstance(v, want) or (want is not bool and isinstance(v, bool))):
                raise UserError(f"{source}: {k!r} must be {fields[k].type}, got {v!r}")
            if k in _SIZES and v < (0 if k == "head_dim" else 1):
                raise UserError(f"{source}: {k!r} must be positive, got {v}")
        return cls(**{k: v for k, v in d.items() if k in fields})

    @classmethod
    def from_hf(cls, raw: dict, source: str = "config.json") -> "DLLMConfig":
        """Map a Hugging Face config dict of any supported layout onto DLLMConfig."""
        model_type = str(raw.get("model_type", "")).lower()
        if model_type not in _MODEL_TYPES:
            known = ", ".join(k for k, v in _MODEL_TYPES.items() if v)
            raise UserError(f"{source}: unknown model_type {raw.get('model_type')!r} (supported: {known})")
        layout = _MODEL_TYPES[model_type]
        if layout is None:
            raise UserError(f"{source}: model_type {model_type!r} is recognised but not supported")
        try:
            if layout == "llada":
                heads = int(raw["n_heads"])
                return cls(
                    layout=layout, model_type=model_type,
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
            heads = int(raw["num_attention_heads"])
            common = dict(
                layout=layout, model_type=model_type,
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
            if layout == "dream":
                return cls(
                    **common, attention="bidirectional", qkv_bias=True, shift_logits=True,
                    mask_token_id=int(raw.get("mask_token_id", 151666)),
                    eos_token_id=int(raw.get("eos_token_id", 151643)),
                    pad_token_id=int(raw.get("pad_token_id", 151643)),
                    block_size=int(raw.get("block_size", 32)),
                )
            block = raw.get("block_size", raw.get("bd_size"))
            if block is None:
                raise UserError(f"{source}: block-causal model_type {model_type!r} needs block_size (or bd_size)")
            return cls(
                **common, attention="block_causal", block_size=int(block),
                qkv_bias=bool(raw.get("qkv_bias", model_type != "sdar")),
                qk_norm=bool(raw.get("qk_norm", model_type == "sdar")),
                mask_token_id=int(raw["mask_token_id"]),
                eos_token_id=int(raw["eos_token_id"]),
                pad_token_id=int(raw.get("pad_token_id", raw["eos_token_id"])),
            )
        except KeyError as e:
            raise UserError(f"{source}: missing key {e.args[0]!r} for a {layout} model") from None
        except (TypeError, ValueError) as e:
            raise UserError(f"{source}: bad value ({e})") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "DLLMConfig":
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"{path}: no config.json") from None
        except OSError as e:
            raise file_error(path, e) from None
        except UnicodeDecodeError:
            raise UserError(f"{path}: not valid JSON (not UTF-8 text)") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise UserError(f"{path}: expected a JSON object")
        return cls.from_hf(raw, source=str(path))
