"""The mixture-of-experts MLP: router -> top-k -> routed SwiGLU experts (+ shared experts).

Dimension legend
    N  tokens (B * T, flattened)     C  hidden size     E  routed experts     k  experts per token
    G  router groups                 F  one expert's SwiGLU width

Two routers (``DLLMConfig.router``), each computed in fp32:
- ``softmax`` (Qwen3-MoE, SDAR-MoE): p = softmax(gate(x)); the k largest p; renormalised to sum 1
  when ``normalize_routing``.
- ``sigmoid`` (LLaDA 2.x, DeepSeek-V3's router): s = sigmoid(gate(x)); experts are *chosen* by
  s + expert_bias, limited to the best ``router_topk_groups`` of G groups (a group scores the sum
  of its two best biased scores), and *weighed* by s alone, renormalised when
  ``normalize_routing``; then times ``routing_scale``.

The routed experts run in one of two forms that compute the same function (``MoE.form``, set for
the whole model by ``DLLM.set_moe_form``):
- ``gather``: tokens gathered per expert (a NonZero per expert, the expert's SwiGLU on those rows,
  added back with ScatterElements): standard ONNX operators, for TensorRT and every provider;
- ``contrib``: ONNX Runtime's ``com.microsoft.MoE`` operator over the experts' stacked weights
  (export/moe_op.py builds the node), fed routing weights computed by the router above.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import MOE_FORMS, DLLMConfig  # noqa: F401  (MOE_FORMS re-exported)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), width F (the dense MLP, one expert, the shared experts)."""

    fused = False   # gate and up in one product (the exported graph's form); set by DLLM.set_attention

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.width = width

    def forward(self, x):
        if self.fused:
            gate, up = F.linear(x, torch.cat([self.gate_proj.weight, self.up_proj.weight])).split([self.width] * 2, -1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """gate(x) -> (weights (N,k) fp32, expert ids (N,k) int64)."""

    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))       # (E,C)
        self.expert_bias = nn.Parameter(torch.zeros(cfg.num_experts)) if cfg.router == "sigmoid" else None
        self.cfg = cfg

    def forward(self, x):
        c = self.cfg
        logits = F.linear(x.float(), self.weight.float())                               # (N,E)
        if c.router == "softmax":
            scores = torch.softmax(logits, dim=-1)
            weights, ids = torch.topk(scores, c.experts_per_token, dim=-1)              # (N,k)
        else:
            scores = torch.sigmoid(logits)
            choice = scores + self.expert_bias.float()
            if c.router_groups > 1:
                choice = self._limit_groups(choice)
            ids = torch.topk(choice, c.experts_per_token, dim=-1).indices               # (N,k)
            weights = scores.gather(-1, ids)
        if c.normalize_routing:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if c.router == "sigmoid" else 0.0))
        return weights * c.routing_scale, ids

    def _limit_groups(self, choice):
        """``choice`` (N,E) with the experts outside a token's best groups at -inf."""
        c = self.cfg
        g = c.router_groups
        grouped = choice.reshape(choice.shape[0], g, -1)                               # (N,G,E/G)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)                             # (N,G)
        best = group_score.topk(c.router_topk_groups, dim=-1).indices                   # (N,topk_groups)
        keep = torch.zeros_like(group_score).scatter(1, best, 1.0) > 0                   # (N,G)
        return grouped.masked_fill(~keep[..., None], float("-inf")).reshape(choice.shape)


class MoE(nn.Module):
    form = "gather"   # or "contrib" (module docstring); set for the whole model by DLLM.set_moe_form

    def __init__(self, cfg: DLLMConfig):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden_size, cfg.expert_size) for _ in range(cfg.num_experts))
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.shared_expert_size) if cfg.shared_expert_size else None
        self.k = cfg.experts_per_token

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])                                                  # (N,C)
        weights, ids = self.gate(flat)                                                   # (N,k)
        if self.form == "contrib":
            out = self._contrib(flat, weights, ids)
        elif torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            out = self._gathered(flat, weights, ids, range(len(self.experts)))
        else:   # eager torch: only the experts some token chose
            out = self._gathered(flat, weights, ids, ids.unique().tolist())
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.reshape(shape)

    def _gathered(self, flat, weights, ids, experts):
        """sum over the chosen experts e of weight * expert_e(x), each expert on its tokens only
        (a token chooses an expert at most once, so the rows an expert adds to are distinct). The
        sum is kept in fp32 whatever the model's precision (ONNX Runtime's CPU provider has no fp16
        ScatterElements add)."""
        out = torch.zeros(flat.shape, dtype=torch.float32, device=flat.device)          # (N,C)
        slots = weights.reshape(-1).float()                                              # (N*k,)
        for e in experts:
            tok, slot = torch.where(ids == e)                                            # (n_e,) each
            y = self.experts[e](flat.index_select(0, tok)).float()                       # (n_e,C)
            y = y * slots.index_select(0, tok * self.k + slot)[:, None]
            out = out.scatter_add(0, tok[:, None].expand(-1, flat.shape[-1]), y)
        return out.to(flat.dtype)

    def stacked(self):
        """The experts' weights as com.microsoft.MoE reads them: fc1 (E,2F,C), gate and up rows
        interleaved (swiglu_fusion=1: row 2i gate_i, row 2i+1 up_i), and fc2 (E,C,F). Built from
        the parameters alone, so the exporter's constant folding stores each as one initializer."""
        fc1 = torch.stack([torch.stack([e.gate_proj.weight, e.up_proj.weight], 1).reshape(-1, e.gate_proj.weight.shape[1])
                           for e in self.experts])
        return fc1, torch.stack([e.down_proj.weight for e in self.experts])

    def _contrib(self, flat, weights, ids):
        """The routed experts as one com.microsoft.MoE node. The op has no input for routing
        weights: it softmaxes its ``router_probs`` and takes the top k. Fed log(w / S) (-inf off
        the chosen experts), its softmax is w / S on exactly the chosen k; times S (the weights'
        sum) after it, that is any router's weights, sigmoid and scaled ones included."""
        total = weights.sum(-1, keepdim=True)                                            # (N,1) S
        dense = torch.zeros(flat.shape[0], len(self.experts), dtype=weights.dtype, device=flat.device)
        log_w = (dense.scatter(1, ids, weights) / total).log().to(flat.dtype)            # (N,E)
        fc1, fc2 = self.stacked()
        return _ContribMoE.apply(flat, log_w, fc1.to(flat.dtype), fc2.to(flat.dtype), self.k) * total.to(flat.dtype)


class _ContribMoE(torch.autograd.Function):
    """ONNX Runtime's com.microsoft.MoE (SwiGLU experts, fc1 gate/up interleaved): traced into the
    one node by ``symbolic``; ``forward`` computes what the node computes, for torch runs and for
    the exporter's parity check."""

    @staticmethod
    def forward(ctx, x, router_logits, fc1, fc2, k: int):
        w, ids = torch.topk(torch.softmax(router_logits.float(), -1), k, dim=-1)                  # (N,k)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            tok, slot = torch.where(ids == e)
            gate, up = F.linear(x[tok], fc1[e]).view(len(tok), -1, 2).unbind(-1)                # (n_e,F) each
            out[tok] += F.linear(F.silu(gate) * up, fc2[e]) * w[tok, slot, None].to(x.dtype)
        return out

    @staticmethod
    def symbolic(g, x, router_logits, fc1, fc2, k: int):
        none = g.op("prim::Constant")
        none.setType(torch._C.NoneType.get())                  # an omitted optional input ('')
        return g.op("com.microsoft::MoE", x, router_logits, fc1, none, fc2, k_i=k, activation_type_s="swiglu",
                    swiglu_fusion_i=1, normalize_routing_weights_i=0).setType(x.type())
