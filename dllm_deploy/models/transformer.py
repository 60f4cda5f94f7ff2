"""The export-friendly dLLM transformer (RMSNorm, RoPE, SwiGLU, GQA).

Dimension legend
    B  batch (or packed branches)      T  new tokens in this call
    P  cached prefix tokens            S  P + T, keys a new token may attend
    C  hidden size                     V  vocabulary
    H  query heads   Hkv  key/value heads   D  head dim   F  SwiGLU width
A layer's MLP is a dense SwiGLU or, in a mixture-of-experts model, models/moe.py's MoE.

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

from .config import KV_IO, DLLMConfig
from . import rope
from .moe import MOE_FORMS, MoE, SwiGLU


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int | None = None,
               rot: int | None = None) -> torch.Tensor:
    """``half``: half the rotated width when known (the exported graph then slices at a constant
    instead of reading x's shape); ``rot``: the rotated width when it is less than D (partial
    rotary: the dims after it pass unchanged; the tables are rot wide)."""
    if rot is not None and rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin, rot // 2), x[..., rot:]], dim=-1)
    half = x.shape[-1] // 2 if half is None else half
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class _Reshape(torch.autograd.Function):
    """``x.reshape(shape)``, where 0 keeps the input's dim there (ONNX Reshape's rule). Traced into
    one Reshape with a constant shape: ``x.view(b, t, ...)`` would trace into a Shape / Gather /
    Unsqueeze / Concat chain per call, and on a small model those nodes cost as much as the
    matrix products (docs/export.md, "The graph's form")."""

    @staticmethod
    def forward(ctx, x, shape):
        return x.reshape([x.shape[i] if s == 0 else s for i, s in enumerate(shape)])

    @staticmethod
    def symbolic(g, x, shape):
        return g.op("Reshape", x, g.op("Constant", value_t=torch.tensor(shape, dtype=torch.int64)))


def reshape(x: torch.Tensor, *shape: int) -> torch.Tensor:
    return _Reshape.apply(x, list(shape))


class Attention(nn.Module):
    impl = "sdpa"  # or "eager"; set for the whole model by DLLM.set_attention()
    kv_io = "append"  # or "new" (the eager graph's KV outputs); set for the whole model by DLLM.set_kv_io()

    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rot = cfg.rotary_dim if cfg.rotary_dim < cfg.head_dim else None
        c = cfg.hidden_size
        if cfg.fused_qkv:
            self.qkv_proj = nn.Linear(c, (self.h + 2 * self.hkv) * self.d, bias=cfg.qkv_bias)
        else:
            self.q_proj = nn.Linear(c, self.h * self.d, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(c, self.hkv * self.d, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(c, self.hkv * self.d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, c, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, mask, past_k, past_v, qs=None):
        """``qs``: None, or (B,T) factors q is multiplied by after RoPE (models/rope.py query_scale)."""
        if self.impl == "eager":
            return self._graph(x, cos, sin, mask, past_k, past_v, qs)
        b, t, _ = x.shape                                                   # training / torch runtime
        if hasattr(self, "qkv_proj"):     # each projection a module call (the int8 calibration hooks them)
            q, k, v = self.qkv_proj(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.h, self.d).transpose(1, 2)                    # (B,H,T,D)
        k = k.view(b, t, self.hkv, self.d).transpose(1, 2)                  # (B,Hkv,T,D)
        v = v.view(b, t, self.hkv, self.d).transpose(1, 2)                  # (B,Hkv,T,D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin, rot=self.rot), apply_rope(k, cos, sin, rot=self.rot)
        if qs is not None:
            q = q * qs[:, None, :, None].to(q.dtype)
        k = torch.cat([past_k, k], dim=2)                                   # (B,Hkv,S,D)
        v = torch.cat([past_v, v], dim=2)                                   # (B,Hkv,S,D)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b, t, self.h * self.d)
        return self.o_proj(out), k, v

    def qkv_weights(self) -> list:
        """The projection weights q, k and v are read from: [q, k, v], or [qkv] when fused."""
        return [self.qkv_proj.weight] if hasattr(self, "qkv_proj") else [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]

    def qkv(self, q_scale: float = 1.0):
        """One (weight, bias) for q, k and v (rows q | k | v), q's rows times ``q_scale``."""
        if hasattr(self, "qkv_proj"):
            w, b = self.qkv_proj.weight, self.qkv_proj.bias
            if q_scale == 1.0:
                return w, b
            s = torch.ones(w.shape[0], dtype=w.dtype, device=w.device)
            s[: self.h * self.d] = q_scale
            return w * s[:, None], None if b is None else b * s
        ws = [self.q_proj.weight * q_scale, self.k_proj.weight, self.v_proj.weight]
        bs = [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]
        return torch.cat(ws), None if bs[0] is None else torch.cat([bs[0] * q_scale, bs[1], bs[2]])

    def _projection(self):
        """``qkv`` with the attention scale 1/sqrt(D) folded into q's rows unless q is normalized
        first. Built from the parameters alone, so the exporter's constant folding stores it as one
        initializer."""
        return self.qkv(1.0 if self.q_norm is not None else self.d ** -0.5)

    def _graph(self, x, cos, sin, mask, past_k, past_v, qs=None):
        """The ONNX graph's attention: the same function as the sdpa path in plain operators.
        x (B,T,C); cos, sin (B,T,1,1,D); mask (B,1,R*T,S) bool, the (B,1,T,S) mask repeated R =
        H/Hkv times. The R query heads that share a key / value head are stacked along the tokens
        (B,Hkv,R*T,D), so K and V are never repeated per query head, and every reshape keeps B and T
        without reading them (``reshape``)."""
        h, hkv, d = self.h, self.hkv, self.d
        rep = h // hkv
        w, bias = self._projection()
        q, k, v = F.linear(x, w, bias).split([h * d, hkv * d, hkv * d], dim=-1)
        q, k = reshape(q, 0, -1, hkv, rep, d), reshape(k, 0, -1, hkv, 1, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q) * (d ** -0.5), self.k_norm(k)
        half = (self.rot or d) // 2
        q, k = apply_rope(q, cos, sin, half, self.rot), apply_rope(k, cos, sin, half, self.rot)
        if qs is not None:                                                   # q (B,T,Hkv,R,D)
            q = q * qs[:, :, None, None, None].to(q.dtype)
        q = reshape(q.permute(0, 2, 3, 1, 4), 0, 0, -1, d)                  # (B,Hkv,R*T,D)
        k = reshape(k, 0, -1, hkv, d).transpose(1, 2)                         # (B,Hkv,T,D)
        v = reshape(v, 0, -1, hkv, d).transpose(1, 2)
        keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)   # (B,Hkv,S,D)
        scores = torch.matmul(q, keys.transpose(-1, -2))                     # (B,Hkv,R*T,S)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1), values)            # (B,Hkv,R*T,D)
        out = reshape(out, 0, 0, rep, -1, d).permute(0, 3, 1, 2, 4)          # (B,T,Hkv,R,D)
        if self.kv_io == "new":          # present: the new tokens' keys and values only
            return self.o_proj(reshape(out, 0, -1, h * d)), k, v
        return self.o_proj(reshape(out, 0, -1, h * d)), keys, values


class MLP(SwiGLU):
    """The dense SwiGLU MLP of intermediate_size."""

    def __init__(self, cfg: DLLMConfig):
        super().__init__(cfg.hidden_size, cfg.intermediate_size)


class Layer(nn.Module):
    def __init__(self, cfg: DLLMConfig, index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.moe_layer(index) else MLP(cfg)

    def forward(self, x, cos, sin, mask, past_k, past_v, qs=None):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v, qs)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Backbone(nn.Module):
    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg.num_layers)])
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
        """"sdpa" (fused kernel, for torch runs) or "eager", the exported graph's form: plain
        matmul / softmax, q/k/v and gate/up each in one product, constant reshapes and no K/V
        repeated per query head (Attention._graph). Both compute the same function."""
        assert impl in ("sdpa", "eager"), impl
        for layer in self.model.layers:
            layer.self_attn.impl = impl
        for m in self.modules():
            if isinstance(m, SwiGLU):
                m.fused = impl == "eager"
        return self

    def set_kv_io(self, mode: str) -> "DLLM":
        """The eager graph's KV outputs: "append" (present = past + the new tokens' keys and values,
        (B,Hkv,P+T,D)) or "new" (the new tokens' only, (B,Hkv,T,D): the runtime writes them into
        its cache in place). The same function otherwise."""
        assert mode in KV_IO, mode
        for layer in self.model.layers:
            layer.self_attn.kv_io = mode
        return self

    def set_moe_form(self, form: str) -> "DLLM":
        """How the routed experts run (models/moe.py): "gather" (standard operators) or "contrib"
        (ONNX Runtime's com.microsoft.MoE); the same function either way."""
        assert form in MOE_FORMS, form
        for m in self.modules():
            if isinstance(m, MoE):
                m.form = form
        return self

    def empty_past(self, batch: int, device=None, dtype=torch.float32):
        """An empty (B,Hkv,0,D) key and value per layer, each layer's own Hkv and D."""
        out = []
        for layer in self.model.layers:
            a = layer.self_attn
            z = torch.zeros(batch, a.hkv, 0, a.d, device=device, dtype=dtype)
            out.append((z, z))
        return out

    def forward(self, input_ids, position_ids, attention_mask, past=None):
        c = self.config
        if past is None:
            past = self.empty_past(input_ids.shape[0], input_ids.device, self.lm_head.weight.dtype)
        x = self.model.embed_tokens(input_ids)                               # (B,T,C)
        cos, sin = rope.tables(position_ids, c)                              # (B,1,T,rotary_dim)
        qs = rope.query_scale(position_ids, c)                               # (B,T) or None
        eager = self.model.layers[0].self_attn.impl == "eager"
        if eager:                                                            # Attention._graph's layouts
            cos, sin = cos.transpose(1, 2)[:, :, None], sin.transpose(1, 2)[:, :, None]     # (B,T,1,1,D)
        masks: dict = {}      # R = H/Hkv -> the mask repeated R times (B,1,R*T,S); layers may differ in Hkv
        present = []
        for layer, (pk, pv) in zip(self.model.layers, past):
            mask = attention_mask
            if eager:
                rep = layer.self_attn.h // layer.self_attn.hkv
                if rep not in masks:
                    masks[rep] = attention_mask.repeat(1, 1, rep, 1) if rep > 1 else attention_mask
                mask = masks[rep]
            x, k, v = layer(x, cos, sin, mask, pk, pv, qs)
            present.append((k, v))
        logits = self.lm_head(self.model.norm(x))                            # (B,T,V)
        if c.shift_logits:   # Dream: row i-1 predicts row i, so a caller keeps each block's left
            # neighbour in the row just before it (runtime/loop.py: the anchor of the bidirectional caches)
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits, present
