"""The export-friendly dLLM transformer (RMSNorm, RoPE, SwiGLU, GQA).

Dimension legend
    B  batch (or packed branches)      T  new tokens in this call
    P  cached prefix tokens            S  P + T, keys a new token may attend
    C  hidden size                     V  vocabulary
    H  query heads   Hkv  key/value heads   D  head dim   F  SwiGLU width

Every forward is explicit about what it attends: the boolean ``attention_mask`` (B,1,T,S) is an
input (True = may attend), positions come in as ``position_ids`` (B,T), and the per-layer KV
cache goes in as ``past`` and comes out as ``present`` (DESIGN §3). Nothing is hidden in module
state, so the same module exports to ONNX unchanged. Parameter names follow the Qwen2 layout; the
loader maps other layouts onto them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DLLMConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables (B,1,T,D) for rotate-half RoPE at the given positions."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids.device) / head_dim))
    ang = position_ids.to(torch.float32)[..., None] * inv            # (B,T,D/2)
    emb = torch.cat([ang, ang], dim=-1)[:, None]                      # (B,1,T,D)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class Attention(nn.Module):
    impl = "sdpa"  # or "eager"; set for the whole model by DLLM.set_attention()

    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        c = cfg.hidden_size
        self.q_proj = nn.Linear(c, self.h * self.d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(c, self.hkv * self.d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(c, self.hkv * self.d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, c, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, mask, past_k, past_v):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)      # (B,H,T,D)
        k = self.k_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)    # (B,Hkv,T,D)
        v = self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)    # (B,Hkv,T,D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = torch.cat([past_k, k], dim=2)                                   # (B,Hkv,S,D)
        v = torch.cat([past_v, v], dim=2)                                   # (B,Hkv,S,D)
        if self.impl == "sdpa":                                              # training / torch runtime
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            out = out.transpose(1, 2).reshape(b, t, self.h * self.d)
            return self.o_proj(out), k, v
        rep = self.h // self.hkv                                              # "eager": plain ops for export
        kk = k[:, :, None].expand(b, self.hkv, rep, k.shape[2], self.d).reshape(b, self.h, k.shape[2], self.d)
        vv = v[:, :, None].expand(b, self.hkv, rep, v.shape[2], self.d).reshape(b, self.h, v.shape[2], self.d)
        scores = torch.matmul(q, kk.transpose(-1, -2)) * (self.d ** -0.5)  # (B,H,T,S)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, vv)                                        # (B,H,T,D)
        out = out.transpose(1, 2).reshape(b, t, self.h * self.d)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Backbone(nn.Module):
    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DLLM(nn.Module):
    """forward(input_ids, position_ids, attention_mask, past) -> (logits, present).

    input_ids (B,T) int64; position_ids (B,T) int64; attention_mask (B,1,T,P+T) bool;
    past: list of (key, value), each (B,Hkv,P,D), one per layer (P may be 0).
    Returns logits (B,T,V) where logits[:, i] predicts the token at position i (Dream's one-step
    shift is undone here), and present: list of (key, value), each (B,Hkv,P+T,D).
    """

    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_attention(self, impl: str) -> "DLLM":
        """"sdpa" (fused kernel, for torch runs) or "eager" (plain matmul/softmax, for ONNX export)."""
        assert impl in ("sdpa", "eager"), impl
        for layer in self.model.layers:
            layer.self_attn.impl = impl
        return self

    def empty_past(self, batch: int, device=None, dtype=torch.float32):
        c = self.config
        z = torch.zeros(batch, c.num_kv_heads, 0, c.head_dim, device=device, dtype=dtype)
        return [(z, z) for _ in range(c.num_layers)]

    def forward(self, input_ids, position_ids, attention_mask, past=None):
        c = self.config
        if past is None:
            past = self.empty_past(input_ids.shape[0], input_ids.device, self.lm_head.weight.dtype)
        x = self.model.embed_tokens(input_ids)                               # (B,T,C)
        cos, sin = rope_tables(position_ids, c.head_dim, c.rope_theta)       # (B,1,T,D)
        present = []
        for layer, (pk, pv) in zip(self.model.layers, past):
            x, k, v = layer(x, cos, sin, attention_mask, pk, pv)
            present.append((k, v))
        logits = self.lm_head(self.model.norm(x))                            # (B,T,V)
        if c.shift_logits:   # Dream: row i-1 predicts row i, so a caller keeps each block's left
            # neighbour in the row just before it (runtime/loop.py: the anchor of the bidirectional caches)
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits, present
