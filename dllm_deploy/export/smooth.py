"""SmoothQuant-style smoothing for the int8 variant (Xiao et al., 2023, arXiv 2211.10438).

Dynamic int8 (``onnxruntime.quantization.quantize_dynamic``) quantizes each MatMul's activation
as one tensor with one scale, so a few outlier channels (the MLP's down-projection input reaches
about 90 where the rest stay below 8 on the core-vocabulary weights, lab/tiny-core) leave
every other channel a few steps of resolution. Smoothing divides each input channel j of a
product by s_j and multiplies row j of its weight by s_j, with s_j = max|X_j|^alpha /
max|W_j|^(1 - alpha): the product is unchanged, the activation's range is evened out and the
weights (int8 with a scale per output channel) take part of it.

The division is folded into the op that produces the activation, so the graph gains no operator:
- q/k/v (one product in the exported graph) and gate/up: into the RMSNorm weight before them (in a
  mixture-of-experts layer one scale for every expert, the shared experts and the router, which
  all read that norm's output);
- the down-projection: into the up-projection's output rows (gate * up is linear in up);
- the LM head: into the final norm (not with tied embeddings, where it would rescale them).
The attention output (o_proj) is left alone: folding it into V would change the KV cache the
precision variants share in meaning, and its range is narrow.

Calibration runs the fp32 module over prompts and records max |x| per input channel of every
Linear, one forward per prompt: [prompt | one block of the answer, partly masked] (``input_ranges``).
"""
from __future__ import annotations

import random
from pathlib import Path

from ..errors import UserError

DEFAULT_ALPHA = 0.5
CALIBRATION_TEXTS = 32


def calibration_texts(path: str | Path | None, n: int = CALIBRATION_TEXTS) -> tuple[list[tuple[str, str]], str]:
    """((prompt, answer) pairs, source): each line of ``path`` as a prompt with no answer (blank
    lines skipped), else ``n`` prompts with their answers drawn from the task families' training
    inputs, never an evaluation prompt (dllm_deploy/evals/tasks.py)."""
    if path is not None:
        try:
            lines = [x for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: cannot read the calibration texts ({getattr(e, 'strerror', None) or e})") from None
        if not lines:
            raise UserError(f"{path}: no calibration text (one text per line)")
        return [(x, "") for x in lines], Path(path).name
    from ..evals import tasks
    rng, held = random.Random(0), tasks.eval_prompts()
    out: list[tuple[str, str]] = []
    while len(out) < n:
        ex = tasks.GENERATORS[tasks.FAMILIES[len(out) % len(tasks.FAMILIES)]](rng, "core")
        if ex.prompt not in held:
            out.append((ex.prompt, ex.answer))
    return out, "tasks"


def input_ranges(module, cfg, tok, texts: list[tuple[str, str]], block_length: int, max_prompt: int = 256,
                 seed: int = 0) -> dict:
    """max |x| per input channel (C_in,) of every nn.Linear of ``module``, by name, over one
    forward per (prompt, answer): [prompt | one block], the block the answer's first L tokens with
    a random share of them masked (a state the decode passes through), the rest masks."""
    import numpy as np
    import torch

    from ..models.masks import block_causal_mask
    from ..models.registry import capabilities_of
    causal = capabilities_of(cfg).block_causal
    amax: dict = {}
    rng = np.random.default_rng(seed)

    def hook(name):
        def record(_mod, inp, _out):
            x = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0).float()
            amax[name] = torch.maximum(amax[name], x) if name in amax else x
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    impl = module.model.layers[0].self_attn.impl
    module.set_attention("sdpa")            # the exported form fuses q/k/v and gate/up: no per-Linear call
    from ..models.moe import MoE
    form = next((m.form for m in module.modules() if isinstance(m, MoE)), None)
    if form is not None:                    # the contrib form runs the experts from stacked weights:
        module.set_moe_form("gather")       # no per-expert call to record
    try:
        with torch.no_grad():
            for prompt, answer in texts:
                p = tok.encode(prompt)[-max_prompt:]
                block = np.full(block_length, cfg.mask_token_id)
                a = np.asarray(tok.encode(answer)[:block_length], dtype=np.int64)
                keep = rng.random(a.size) >= rng.random()
                block[: a.size] = np.where(keep, a, cfg.mask_token_id)
                ids = p + block.tolist()
                n = len(ids)
                if causal:
                    mask = block_causal_mask(np.repeat([0, 1], [len(p), block_length]))
                else:
                    mask = np.ones((n, n), dtype=bool)
                module(torch.tensor([ids]), torch.arange(n)[None], torch.from_numpy(np.asarray(mask))[None, None])
    finally:
        module.set_attention(impl)
        if form is not None:
            module.set_moe_form(form)
        for h in handles:
            h.remove()
    return amax


def _scales(x_max, weights, alpha: float):
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha) over the weights that read channel j."""
    import torch
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    return x_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1 - alpha)


def _swiglus(mlp, name: str) -> list:
    """(module name, SwiGLU) of a layer's MLP: itself, or a mixture's experts and shared experts."""
    if not hasattr(mlp, "experts"):
        return [(name, mlp)]
    out = [(f"{name}.experts.{e}", x) for e, x in enumerate(mlp.experts)]
    return out + ([(f"{name}.shared_experts", mlp.shared_experts)] if mlp.shared_experts is not None else [])


def smoothing(module, cfg, amax: dict, alpha: float = DEFAULT_ALPHA, real=None) -> tuple[list, list[str]]:
    """The smoothing of ``module``: ([(parameter name, "mul" | "div", factor)] in the order they
    apply, names of the products smoothed). Every factor is computed from the unsmoothed weights.
    ``real(submodule)``: a context in which the submodule's parameters are its real weights (for a
    placeholder module, export/streamed.py); default: they are."""
    import contextlib

    import torch
    real = real or (lambda _m: contextlib.nullcontext())
    ops: list = []
    done = []
    with torch.no_grad():
        for i, layer in enumerate(module.model.layers):
            a, m, p = layer.self_attn, layer.mlp, f"model.layers.{i}"
            fused = hasattr(a, "qkv_proj")
            with real(layer):
                qkv = a.qkv_weights()
                s = _scales(amax[f"{p}.self_attn.{'qkv_proj' if fused else 'q_proj'}"], qkv, alpha)
                ops.append((f"{p}.input_layernorm.weight", "div", s))
                ops += [(f"{p}.self_attn.{x}_proj.weight", "mul", s) for x in (("qkv",) if fused else "qkv")]
                units = _swiglus(m, f"{p}.mlp")                  # (name, SwiGLU) reading the normed input
                seen = [amax[f"{n}.gate_proj"] for n, _ in units if f"{n}.gate_proj" in amax]
                s = _scales(torch.stack(seen).amax(0), [w for _, u in units for w in (u.gate_proj.weight, u.up_proj.weight)], alpha)
                ops.append((f"{p}.post_attention_layernorm.weight", "div", s))
                ops += [(f"{n}.{x}_proj.weight", "mul", s) for n, _ in units for x in ("gate", "up")]
                if hasattr(m, "gate"):                           # a router reads the same input
                    ops.append((f"{p}.mlp.gate.weight", "mul", s))
                for n, u in units:
                    if f"{n}.down_proj" in amax:                # (an expert no calibration token chose keeps its scale)
                        s = _scales(amax[f"{n}.down_proj"], [u.down_proj.weight], alpha)
                        ops += [(f"{n}.up_proj.weight", "div", s[:, None]), (f"{n}.down_proj.weight", "mul", s)]
            done += [f"{p}.self_attn.qkv", f"{p}.mlp.gate_up", f"{p}.mlp.down_proj"]
        if not cfg.tie_word_embeddings:
            with real(module.lm_head):
                s = _scales(amax["lm_head"], [module.lm_head.weight], alpha)
            ops += [("model.norm.weight", "div", s), ("lm_head.weight", "mul", s)]
            done.append("lm_head")
    return ops, done


def smooth_(module, cfg, amax: dict, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """Smooths ``module`` in place (its function is unchanged up to rounding); returns the names
    of the products smoothed."""
    import torch
    ops, done = smoothing(module, cfg, amax, alpha)
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, op, s in ops:
            getattr(params[name], op + "_")(s)
    return done
