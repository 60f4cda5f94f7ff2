"""Typed model configuration, read from a Hugging Face ``config.json``.

One config type serves every family; ``layout`` names the family (models/registry.py), whose
record maps the checkpoint's config keys onto these fields and its tensor names onto the module's.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

from ..errors import UserError, file_error


# field annotation -> the JSON values it accepts (from_dict); sizes that must be positive
_FIELD_TYPES = {"int": Integral, "float": Real, "str": str, "bool": bool}
_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
          "mask_token_id", "eos_token_id", "pad_token_id", "head_dim", "max_seq", "block_size")
# how a mixture-of-experts model's routed experts run in a graph (models/moe.py)
MOE_FORMS = ("gather", "contrib")
KV_IO = ("append", "new")     # what a graph's present outputs hold (DLLM.set_kv_io, export/graphs.py)
_COUNTS = ("rotary_dim", "rope_original_max", "num_experts", "experts_per_token", "expert_size", "shared_expert_size", "dense_layers")


@dataclass
class DLLMConfig:
    layout: str                      # the model family (models/registry.py): its names, module, capabilities
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
    attention: str = "bidirectional"  # "bidirectional" (LLaDA, Dream), "block_causal" (exact KV) or "causal" (self-speculative)
    qkv_bias: bool = False           # q/k/v projections carry a bias (Qwen2 / Dream)
    qk_norm: bool = False            # per-head RMSNorm on q and k (Qwen3 / SDAR)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    shift_logits: bool = False       # logits at i-1 predict token i (Dream); undone in forward()
    rotary_dim: int = 0              # RoPE rotates the first rotary_dim dims of each head, the rest pass; 0: all (D)
    fused_qkv: bool = False          # q|k|v in one projection (qkv_proj), as the checkpoint stores it (LLaDA 2.x)
    model_type: str = ""             # the checkpoint's own model_type string
    # mixture of experts (docs/moe.md); num_experts 0: every layer has a dense SwiGLU MLP
    num_experts: int = 0             # routed experts per MoE layer (E)
    experts_per_token: int = 0       # experts each token is routed to (k)
    expert_size: int = 0             # SwiGLU width of one routed expert
    shared_expert_size: int = 0      # SwiGLU width of the shared expert(s) every token also runs; 0: none
    dense_layers: int = 0            # the first layers keep a dense MLP of intermediate_size (LLaDA 2.x)
    router: str = "softmax"          # "softmax" (Qwen3-MoE) | "sigmoid" (LLaDA 2.x: a per-expert bias added to choose, not to weigh)
    router_groups: int = 1           # experts fall into this many groups of E / groups ...
    router_topk_groups: int = 1      # ... and a token's experts come from its best this many groups
    normalize_routing: bool = True   # the k routing weights rescaled to sum to 1
    routing_scale: float = 1.0       # the routed experts' sum multiplied by this (routed_scaling_factor)
    # position encoding beyond plain RoPE (models/rope.py); the defaults are plain RoPE
    rope_type: str = "default"       # "default" | "yarn" (YaRN context extension)
    rope_factor: float = 1.0         # YaRN: the context extension factor
    rope_original_max: int = 0       # YaRN and query scaling: the pretraining context (original_max_position_embeddings)
    rope_beta_fast: float = 32.0     # YaRN: the ramp's extrapolation bound (rotations)
    rope_beta_slow: float = 1.0      # YaRN: the ramp's interpolation bound (rotations)
    rope_attention_factor: float = 1.0  # YaRN: cos and sin multiplied by this (from mscale / mscale_all_dim)
    rope_truncate: bool = True       # YaRN: the ramp's bounds rounded outwards to whole dims
    q_scale_beta: float = 0.0        # Llama-4 query scaling: q *= 1 + beta*log(1 + floor(pos / rope_original_max)); 0: off

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.rotary_dim == 0:
            self.rotary_dim = self.head_dim
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise UserError(f"rotary_dim {self.rotary_dim} must be even and in [2, head_dim {self.head_dim}]")
        if not self.layout:
            raise UserError("a model config needs its family ('layout')")
        if self.num_experts:
            self._check_moe()
        if self.rope_type not in ("default", "yarn"):
            raise UserError(f"unknown rope_type {self.rope_type!r} (default or yarn)")
        if (self.rope_type == "yarn" or self.q_scale_beta) and self.rope_original_max < 1:
            raise UserError("YaRN and query scaling need rope_original_max (original_max_position_embeddings) >= 1")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def _check_moe(self) -> None:
        e, k, g = self.num_experts, self.experts_per_token, self.router_groups
        if not 1 <= k <= e:
            raise UserError(f"experts_per_token {k} must be in [1, num_experts {e}]")
        if self.expert_size < 1:
            raise UserError("a mixture-of-experts model needs expert_size (moe_intermediate_size) >= 1")
        if self.router not in ("softmax", "sigmoid"):
            raise UserError(f"unknown router score function {self.router!r} (softmax or sigmoid)")
        if g < 1 or e % g or not 1 <= self.router_topk_groups <= g or k > self.router_topk_groups * (e // g):
            raise UserError(f"router groups: {e} experts in {g} groups, {self.router_topk_groups} kept, "
                            f"cannot give {k} experts a token")

    def moe_layer(self, i: int) -> bool:
        """Layer ``i`` routes its tokens to experts (else: a dense MLP of intermediate_size)."""
        return self.num_experts > 0 and i >= self.dense_layers

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
            if k in _COUNTS and v < 0:
                raise UserError(f"{source}: {k!r} must be >= 0, got {v}")
        return cls(**{k: v for k, v in d.items() if k in fields})

    @classmethod
    def from_hf(cls, raw: dict, source: str = "config.json") -> "DLLMConfig":
        """Map a Hugging Face config dict of any registered family onto DLLMConfig."""
        from .registry import config_from_hf
        return config_from_hf(raw, source)

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
