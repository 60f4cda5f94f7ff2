"""DiffusionGemma (google/diffusiongemma-26B-A4B-it; transformers 5.23 ``diffusion_gemma``): the
text model as an export-friendly torch module, and its loader.

One set of Gemma-4 weights runs twice: a causal **encoder** over the prompt (and finished
canvases) that writes the KV cache, and a bidirectional **decoder** over a canvas of
``canvas_length`` tokens that reads it and writes none. Only the ``layer_scalar`` of each layer
and the decoder's self-conditioning block differ between the two.

Dimension legend
    B batch    T tokens of this call    P cached prefix tokens    S = P + T keys
    C hidden   H query heads    Hkv / D: a layer's KV heads and head width (sliding and full
    layers differ)    V vocabulary    E experts    k experts a token    F one expert's width

A layer (the same in both roles; ``layer_scalar`` is the role's):
    x = x + post_attn_norm(attn(input_norm(x)))
    x = (x + post_ff_norm(post_ff_norm_1(geglu(pre_ff_norm(x)))
                          + post_ff_norm_2(experts(pre_ff_norm_2(x), router(x))))) * layer_scalar
Attention: q / k norms (scaled), a scale-free v norm, attention scale 1.0. Sliding layers
("sliding_attention") have their own head width and KV heads and normal RoPE; full layers have
no v_proj (V is the k projection, v-normed, without RoPE) and "proportional" RoPE (the first
quarter of the pairs rotate at frequencies computed over the full head width, pairs (i, i + D/2)).
Norms are RMSNorms computed in fp32 with the weight used as is. The router: a scale-free norm of
the residual times ``scale`` / sqrt(C), softmax over E, top k renormalised, times the chosen
experts' ``per_expert_scale``. Experts and MLPs are GeGLU (tanh GELU). Embeddings are scaled by
sqrt(C) (cast to the weight dtype); the head is the embedding (tied) and its logits are
softcapped 30 tanh(z / 30) in fp32.

Masks are explicit, one per layer type (``{"full": (B,1,T,S), "sliding": (B,1,T,S)}``, True =
attend), so no cache length is baked in: the caller builds them (``encoder_masks``,
``decoder_masks``). Masked scores take fp32's lowest value (the softmax runs in fp32), not -inf,
as transformers' masks do in fp32, so a query row with nothing to see (a left pad) stays finite.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from .masks import window_decoder_masks, window_encoder_masks

MODEL_TYPE = "diffusion_gemma"
ARCHITECTURES = ("DiffusionGemmaForBlockDiffusion",)
SLIDING, FULL = "sliding", "full"


@dataclass
class DiffusionGemmaConfig:
    vocab_size: int
    hidden_size: int                 # C
    intermediate_size: int           # the dense GeGLU MLP's width (and the self-conditioning block's)
    num_layers: int
    num_heads: int                   # H, every layer
    layer_types: tuple               # "sliding" | "full" per layer (the last is full)
    kv_heads: tuple                  # Hkv per layer
    head_dims: tuple                 # D per layer
    sliding_window: int              # W: an encoder query sees W keys (itself included); the cache keeps W - 1
    num_experts: int                 # E (every layer)
    experts_per_token: int           # k
    expert_size: int                 # F
    rope_theta_sliding: float = 10_000.0
    rope_theta_full: float = 1_000_000.0
    full_rotary_fraction: float = 0.25
    rms_norm_eps: float = 1e-6
    softcap: float = 30.0
    canvas_length: int = 256
    pad_token_id: int = 0
    eos_token_id: int = 1
    bos_token_id: int = 2
    max_seq: int = 131_072
    layout: str = MODEL_TYPE
    tie_word_embeddings = False      # (not a field) the head reads the embedding parameter itself: one name

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf(cls, raw: dict, source: str = "config.json") -> "DiffusionGemmaConfig":
        """The text model of a DiffusionGemma config.json (``text_config`` nested; the vision
        tower is ignored). Options no released checkpoint uses are refused in one line."""
        if str(raw.get("model_type", "")).lower() != MODEL_TYPE:
            raise UserError(f"{source}: model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
        t = raw.get("text_config")
        if not isinstance(t, dict):
            raise UserError(f"{source}: a DiffusionGemma config needs a 'text_config' object")
        try:
            return cls._from_text(raw, t, source)
        except KeyError as e:
            raise UserError(f"{source}: missing key text_config.{e.args[0]} for a DiffusionGemma model") from None
        except (TypeError, ValueError) as e:
            raise UserError(f"{source}: bad value in text_config ({e})") from None

    @classmethod
    def _from_text(cls, raw: dict, t: dict, source: str) -> "DiffusionGemmaConfig":
        n = int(t["num_hidden_layers"])
        kinds = t.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
        if len(kinds) != n or any(k not in ("sliding_attention", "full_attention") for k in kinds):
            raise ValueError(f"layer_types must name {n} layers, each sliding_attention or full_attention")
        kinds = [SLIDING if k == "sliding_attention" else FULL for k in kinds]
        kinds[-1] = FULL                                  # as transformers forces it
        refuse = {"use_bidirectional_attention": (None, "vision"), "attention_bias": (False,),
                  "hidden_activation": ("gelu_pytorch_tanh",), "final_logit_softcapping": (30.0, None)}
        for key, allowed in refuse.items():
            if t.get(key, allowed[0]) not in allowed:
                raise ValueError(f"{key} {t[key]!r} is not supported (supported: {', '.join(map(repr, allowed))})")
        if not t.get("num_experts") or not t.get("top_k_experts") or not t.get("moe_intermediate_size"):
            raise ValueError("num_experts, top_k_experts and moe_intermediate_size are required (every layer has experts)")
        per = {int(k): v for k, v in (t.get("per_layer_config") or {}).items()}
        head_dims = tuple(int(per.get(i, {}).get("head_dim", t.get("head_dim", 256))) for i in range(n))
        kv_heads = tuple(int(per.get(i, {}).get("num_key_value_heads", t["num_key_value_heads"])) for i in range(n))
        for kind in (SLIDING, FULL):
            dims = {head_dims[i] for i in range(n) if kinds[i] == kind}
            if len(dims) > 1:
                raise ValueError(f"{kind} layers of different head widths {sorted(dims)} are not supported")
        h = int(t["num_attention_heads"])
        if any(h % x for x in kv_heads):
            raise ValueError(f"num_attention_heads {h} is not a multiple of every layer's KV heads {kv_heads}")
        rope = t.get("rope_parameters") or {}
        full = rope.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                              "rope_theta": 1_000_000.0}
        sliding = rope.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0}
        if full.get("rope_type", "proportional") != "proportional" or sliding.get("rope_type", "default") != "default" \
                or full.get("factor", 1.0) != 1.0:
            raise ValueError("rope_parameters: supported are proportional RoPE (factor 1) on full layers and "
                             "default RoPE on sliding ones")
        eos = t.get("eos_token_id", 1)
        return cls(vocab_size=int(t["vocab_size"]), hidden_size=int(t["hidden_size"]),
                   intermediate_size=int(t["intermediate_size"]), num_layers=n, num_heads=h, layer_types=tuple(kinds),
                   kv_heads=kv_heads, head_dims=head_dims, sliding_window=int(t.get("sliding_window", 512)),
                   num_experts=int(t["num_experts"]), experts_per_token=int(t["top_k_experts"]),
                   expert_size=int(t["moe_intermediate_size"]), rope_theta_sliding=float(sliding.get("rope_theta", 1e4)),
                   rope_theta_full=float(full.get("rope_theta", 1e6)),
                   full_rotary_fraction=float(full.get("partial_rotary_factor", 0.25)),
                   rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
                   softcap=float(t.get("final_logit_softcapping") or 30.0),
                   canvas_length=int(raw.get("canvas_length") or 256), pad_token_id=int(t.get("pad_token_id") or 0),
                   eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
                   bos_token_id=int(t.get("bos_token_id") or 2),
                   max_seq=int(t.get("max_position_embeddings", 131_072)))

    @classmethod
    def from_file(cls, path: str | Path) -> "DiffusionGemmaConfig":
        from ..errors import read_text
        try:
            raw = json.loads(read_text(Path(path)))
        except ValueError as e:
            raise UserError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise UserError(f"{path}: not a JSON object")
        return cls.from_hf(raw, str(path))

    def kv_shapes(self) -> list[tuple[int, int]]:
        """(Hkv, D) of every layer."""
        return list(zip(self.kv_heads, self.head_dims))


class RMSNorm(nn.Module):
    """x / rms(x) (* weight, used as is), in fp32, back to x's dtype."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x):
        y = x.float()
        y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.to(x.dtype)


def _rope(x, cos, sin):
    """x (B,T,heads,D) rotated in pairs (i, i + D/2); cos / sin (B,T,1,D)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def rope_tables(position_ids, head_dim: int, theta: float, fraction: float = 1.0, dtype=torch.float32):
    """cos, sin (B,T,1,D) of ``position_ids`` (B,T): default RoPE (``fraction`` 1) or proportional
    RoPE: the first fraction * D / 2 pairs at theta^(-2i/D), the others at frequency 0."""
    angles = int(fraction * head_dim // 2)
    inv = 1.0 / theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim)
    inv = torch.cat([inv, torch.zeros(head_dim // 2 - angles)])
    freqs = position_ids[..., None].float() * inv                                   # (B,T,D/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None]                             # (B,T,1,D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig, i: int):
        super().__init__()
        c, h, self.hkv, self.d = cfg.hidden_size, cfg.num_heads, cfg.kv_heads[i], cfg.head_dims[i]
        self.sliding = cfg.layer_types[i] == SLIDING
        self.q_proj = nn.Linear(c, h * self.d, bias=False)
        self.k_proj = nn.Linear(c, self.hkv * self.d, bias=False)
        self.v_proj = nn.Linear(c, self.hkv * self.d, bias=False) if self.sliding else None
        self.o_proj = nn.Linear(h * self.d, c, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.v_norm = RMSNorm(self.d, cfg.rms_norm_eps, scale=False)
        self.h = h

    def forward(self, x, cos, sin, mask, past_k, past_v):
        """x (B,T,C) -> (out (B,T,C), keys (B,Hkv,S,D), values (B,Hkv,S,D)): past + this call's."""
        b, t, _ = x.shape
        q = _rope(self.q_norm(self.q_proj(x).view(b, t, self.h, self.d)), cos, sin).transpose(1, 2)
        raw_k = self.k_proj(x).view(b, t, self.hkv, self.d)
        raw_v = self.v_proj(x).view(b, t, self.hkv, self.d) if self.v_proj is not None else raw_k
        k = _rope(self.k_norm(raw_k), cos, sin).transpose(1, 2)
        v = self.v_norm(raw_v).transpose(1, 2)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        rep = self.h // self.hkv
        scores = torch.matmul(q, k.repeat_interleave(rep, dim=1).transpose(2, 3))          # (B,H,T,S), scale 1
        # fp32's lowest (fp16's in fp16): the softmax runs in fp32, where a lower fill would be -inf
        scores = scores.masked_fill(~mask, max(torch.finfo(scores.dtype).min, torch.finfo(torch.float32).min))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v.repeat_interleave(rep, dim=1)).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out), k, v


class GeGLU(nn.Module):
    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, scale=False)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.k, self.root = cfg.experts_per_token, cfg.hidden_size ** -0.5

    def forward(self, x):
        """x (N,C) -> (weights (N,k), expert ids (N,k))."""
        probs = torch.softmax(self.proj(self.norm(x) * self.scale * self.root), dim=-1, dtype=torch.float32)
        w, ids = torch.topk(probs, self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return w * self.per_expert_scale.index_select(0, ids.reshape(-1)).reshape(ids.shape), ids


class Experts(nn.Module):
    """E GeGLU experts stored stacked, as the checkpoint stores them: gate_up_proj (E,2F,C) (gate
    rows then up rows), down_proj (E,C,F)."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        e, c, f = cfg.num_experts, cfg.hidden_size, cfg.expert_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, c))
        self.down_proj = nn.Parameter(torch.empty(e, c, f))

    def forward(self, x, weights, ids):
        """sum over a token's k experts of weight * expert(x); x (N,C), weights / ids (N,k). Every
        expert runs on the tokens that chose it (gathered), added back by index."""
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            tok, slot = torch.where(ids == e)                                              # (n_e,) each
            gate, up = F.linear(x.index_select(0, tok), self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.gelu(gate, approximate="tanh") * up, self.down_proj[e])
            y = (y * weights.reshape(-1).index_select(0, tok * weights.shape[1] + slot)[:, None]).to(x.dtype)
            out = out.scatter_add(0, tok[:, None].expand(-1, x.shape[-1]), y)           # rows distinct per expert
        return out


class Layer(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig, i: int):
        super().__init__()
        c, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, i)
        self.mlp = GeGLU(c, cfg.intermediate_size)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                     "pre_feedforward_layernorm_2"):
            setattr(self, name, RMSNorm(c, eps))
        self.router = Router(cfg)
        self.experts = Experts(cfg)
        self.layer_scalar = nn.Parameter(torch.ones(1))      # the decoder's; the encoder's: _EncoderScalars

    def forward(self, x, cos, sin, mask, past_k, past_v, scalar=None):
        """``scalar``: the encoder's layer scalar (None: this layer's own, the decoder's)."""
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + self.post_attention_layernorm(a)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.router(flat)
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), weights, ids).reshape(x.shape)
        x = x + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(routed))
        return x * (self.layer_scalar if scalar is None else scalar), k, v


class SelfConditioning(nn.Module):
    """post_norm(embeddings + geglu(pre_norm(soft embeddings))), post_norm scale-free."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.pre_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, scale=False)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, embeddings, soft):
        s = self.pre_norm(soft)
        return self.post_norm(embeddings + self.down_proj(F.gelu(self.gate_proj(s), approximate="tanh") * self.up_proj(s)))


class _Decoder(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_conditioning = SelfConditioning(cfg)


class _ScalarOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_scalar = nn.Parameter(torch.ones(1))


class _EncoderScalars(nn.Module):
    """The encoder's own ``layer_scalar`` per layer, under the checkpoint's names
    (model.encoder.language_model.layers.N.layer_scalar)."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.language_model = nn.Module()
        self.language_model.layers = nn.ModuleList(_ScalarOnly() for _ in range(cfg.num_layers))


class _Root(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.decoder = _Decoder(cfg)
        self.encoder = _EncoderScalars(cfg)


class DiffusionGemma(nn.Module):
    """``encode`` (prompt -> KV) and ``denoise`` (canvas + KV + soft embeddings -> logits) over one
    set of weights named as the checkpoint names them."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.config = cfg
        self.model = _Root(cfg)

    def _embed(self, ids):
        w = self.model.decoder.embed_tokens.weight
        return F.embedding(ids, w) * torch.tensor(self.config.hidden_size ** 0.5).to(w.dtype)

    def _rope(self, position_ids, dtype):
        c = self.config
        d_s = next((d for d, k in zip(c.head_dims, c.layer_types) if k == SLIDING), c.head_dims[0])
        d_f = next(d for d, k in zip(c.head_dims, c.layer_types) if k == FULL)
        return {SLIDING: rope_tables(position_ids, d_s, c.rope_theta_sliding, 1.0, dtype),
                FULL: rope_tables(position_ids, d_f, c.rope_theta_full, c.full_rotary_fraction, dtype)}

    def _layers(self, x, position_ids, masks, past, encoder: bool):
        tables = self._rope(position_ids, x.dtype)
        present = []
        for i, layer in enumerate(self.model.decoder.layers):
            kind = self.config.layer_types[i]
            scalar = self.model.encoder.language_model.layers[i].layer_scalar if encoder else None
            x, k, v = layer(x, *tables[kind], masks[kind], *past[i], scalar)
            present.append((k, v))
        return x, present

    def encode(self, input_ids, position_ids, masks: dict, past: list):
        """The causal encoder over ``input_ids`` (B,T) at ``position_ids`` (B,T), after ``past``
        (per layer (keys, values) (B,Hkv,P_l,D): a full layer's whole prefix, a sliding layer's
        last W - 1 keys at most); ``masks`` from ``encoder_masks``. Returns the cache after it:
        full layers P + T keys, sliding layers the last W - 1 (as transformers' DynamicCache)."""
        present = self._layers(self._embed(input_ids), position_ids, masks, past, encoder=True)[1]
        keep = self.config.sliding_window - 1
        return [(k[:, :, -keep:], v[:, :, -keep:]) if kind == SLIDING else (k, v)
                for (k, v), kind in zip(present, self.config.layer_types)]

    def soft_embeddings(self, logits):
        """softmax(logits) (B,T,V), in fp32, times the embedding matrix and sqrt(C): the
        self-conditioning input of the next step (B,T,C)."""
        w = self.model.decoder.embed_tokens.weight
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(w.dtype)
        return torch.matmul(probs, w) * torch.tensor(self.config.hidden_size ** 0.5).to(w.dtype)

    def denoise(self, canvas_ids, position_ids, masks: dict, past: list, soft):
        """The bidirectional decoder over the canvas ``canvas_ids`` (B,T) after the encoder's KV
        ``past`` (read, not written), conditioned on ``soft`` (B,T,C) (zeros at the first step).
        Returns the softcapped logits (B,T,V) in fp32."""
        d = self.model.decoder
        x = d.self_conditioning(self._embed(canvas_ids), soft)
        x, _ = self._layers(x, position_ids, masks, past, encoder=False)
        logits = F.linear(d.norm(x), d.embed_tokens.weight).float()
        cap = self.config.softcap
        return torch.tanh(logits / cap) * cap

    def empty_past(self, batch: int, dtype=torch.float32) -> list:
        return [(torch.zeros(batch, hkv, 0, d, dtype=dtype),) * 2 for hkv, d in self.config.kv_shapes()]


def encoder_masks(keep, p: int, t: int, window: int) -> dict:
    """models/masks.py's window_encoder_masks as torch tensors (``keep`` a torch bool tensor)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in window_encoder_masks(keep.numpy(), p, t, window).items()}


def decoder_masks(keep, p: int, t: int, window: int) -> dict:
    """models/masks.py's window_decoder_masks as torch tensors (``keep`` a torch bool tensor)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in window_decoder_masks(keep.numpy(), p, t, window).items()}


def load_diffusion_gemma(folder: str | Path, dtype=None) -> tuple[DiffusionGemma, DiffusionGemmaConfig]:
    """The module of a DiffusionGemma checkpoint folder (config.json + safetensors) with its
    weights, read one tensor at a time; the vision tower's tensors are skipped."""
    from .loading import iter_tensors
    folder = Path(folder)
    cfg = DiffusionGemmaConfig.from_file(folder / "config.json")
    with torch.device("meta"):
        module = DiffusionGemma(cfg)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    tensors = {}
    for name, t in iter_tensors(folder, lambda n: n in expected):
        if tuple(t.shape) != expected[name]:
            raise UserError(f"{folder}: tensor {name} has shape {tuple(t.shape)}, expected {expected[name]}")
        tensors[name] = t.to(dtype or torch.float32)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise UserError(f"{folder}: missing tensor {missing[0]} ({len(missing)} missing in all)")
    module = module.to_empty(device="cpu")
    module.load_state_dict(tensors, strict=True, assign=True)
    return module.eval(), cfg


__all__ = ["DiffusionGemma", "DiffusionGemmaConfig", "load_diffusion_gemma", "encoder_masks", "decoder_masks",
           "rope_tables"]


# generation_config.json keys -> UniformDiffusionOptions fields (runtime/uniform_diffusion.py)
GENERATION_KEYS = {"max_new_tokens": "max_new_tokens", "max_denoising_steps": "max_denoising_steps", "t_min": "t_min",
                   "t_max": "t_max", "stability_threshold": "stability_threshold",
                   "confidence_threshold": "confidence_threshold"}


def generation_defaults(folder: str | Path, cfg: DiffusionGemmaConfig) -> dict:
    """The checkpoint's decoding defaults from its generation_config.json, as transformers reads
    them: ``eos_ids`` (a list; the text config's EOS when the file names none), ``pad_id`` and the
    decode options it sets (``entropy_bound`` from its ``sampler_config``). Unset keys are left
    to UniformDiffusionOptions' defaults (transformers')."""
    from ..errors import read_text
    path = Path(folder) / "generation_config.json"
    raw: dict = {}
    if path.exists():
        try:
            raw = json.loads(read_text(path))
        except ValueError as e:
            raise UserError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise UserError(f"{path}: not a JSON object")
    eos = raw.get("eos_token_id")
    eos = [cfg.eos_token_id] if eos is None else (list(eos) if isinstance(eos, list) else [eos])
    out = {"eos_ids": [int(x) for x in eos],
           "pad_id": int(raw["pad_token_id"]) if raw.get("pad_token_id") is not None else cfg.pad_token_id}
    options = {ours: raw[theirs] for theirs, ours in GENERATION_KEYS.items() if raw.get(theirs) is not None}
    sampler = raw.get("sampler_config")
    if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
        options["entropy_bound"] = float(sampler["entropy_bound"])
    return {**out, "options": options}

