"""One DiffusionGemma denoising step in torch, and transformers' generate as its reference.

``step_outputs`` is what a step reads from the decoder's logits (the exported denoise graph ends
in it); ``TorchDenoiser`` runs models/diffusion_gemma.py's module behind
runtime/uniform_diffusion.py's backend interface; ``transformers_generate`` runs transformers'
generate() with its draws replaced by ours, so both decode the same function (tests, and
``bench --reference``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import UserError
from .diffusion_gemma import DiffusionGemma, decoder_masks, encoder_masks


def inverse_cdf(probs, u):
    """The sampled id of each row of ``probs`` (..., V): the first id whose cumulative probability
    exceeds its uniform ``u`` (...), over the whole vocabulary (the last id if rounding leaves u
    above the total)."""
    below = torch.cumsum(probs, dim=-1) <= u[..., None]
    return below.sum(-1).clamp(max=probs.shape[-1] - 1)


def step_outputs(logits, temperature, u):
    """What one denoising step reads from the decoder's logits (B,T,V) at ``temperature`` (B,)
    and uniforms ``u`` (B,T), all fp32 as transformers computes them: the tempered logits z =
    logits / T; the argmax of z; the sampled ids (inverse CDF of softmax(z) at u); the entropy of
    softmax(z) per position (torch.distributions.Categorical's); and z itself (the next step's
    self-conditioning)."""
    z = logits.float() / temperature.float()[:, None, None]
    probs = torch.softmax(z, dim=-1, dtype=torch.float32)
    normalized = z - z.logsumexp(dim=-1, keepdim=True)
    entropy = -(normalized.clamp(min=torch.finfo(z.dtype).min) * probs).sum(-1)
    return z.argmax(-1), inverse_cdf(probs, u.float()), entropy, z


class TorchDenoiser:
    """The module behind runtime/uniform_diffusion.py's backend interface (numpy ids and masks in,
    numpy decisions out; the KV cache and the self-conditioning state stay torch tensors)."""

    def __init__(self, module: DiffusionGemma, dtype=torch.float32):
        self.module, self.dtype, self.config = module, dtype, module.config

    def empty(self, batch: int) -> list:
        return self.module.empty_past(batch, self.dtype)

    def encode(self, ids, positions, keep, past: list) -> list:
        """Append ``ids`` (B,T) at ``positions`` (B,T) to the cache ``past``; ``keep`` (B,P+T)."""
        p, t = keep.shape[1] - ids.shape[1], ids.shape[1]
        masks = encoder_masks(torch.from_numpy(keep), p, t, self.config.sliding_window)
        with torch.no_grad():
            return self.module.encode(torch.from_numpy(ids), torch.from_numpy(positions), masks, past)

    def denoise(self, canvas, positions, keep, past: list, state, temperature, u, frozen):
        """One step over ``canvas`` (B,T): (argmax, sampled, entropy) numpy and the next
        self-conditioning state; rows where ``frozen`` (B,) keep their state."""
        b, t = canvas.shape
        masks = decoder_masks(torch.from_numpy(keep), keep.shape[1], t, self.config.sliding_window)
        with torch.no_grad():
            soft = (torch.zeros(b, t, self.config.hidden_size, dtype=self.dtype) if state is None
                    else self.module.soft_embeddings(state.to(self.dtype)))
            logits = self.module.denoise(torch.from_numpy(canvas), torch.from_numpy(positions), masks, past, soft)
            am, sampled, entropy, z = step_outputs(logits, torch.from_numpy(temperature), torch.from_numpy(u))
            if state is not None:
                z = torch.where(torch.from_numpy(frozen)[:, None, None], state, z)
        return am.numpy(), sampled.numpy(), entropy.numpy(), z


def load_transformers_reference(folder: str, threads: int | None = None):
    """transformers' DiffusionGemmaForBlockDiffusion of a checkpoint (fp32, eval), the peer that
    ``bench --reference`` runs; a UserError where transformers cannot load it."""
    try:
        from transformers import DiffusionGemmaForBlockDiffusion
    except ImportError:
        raise UserError("--reference needs transformers >= 5.11 (pip install 'dllm-deploy[dev]')") from None
    if threads:
        torch.set_num_threads(threads)
    try:
        return DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float32).eval()
    except (OSError, ValueError) as e:
        raise UserError(f"--reference {folder}: not a DiffusionGemma checkpoint transformers loads ({e})") from None


def transformers_generate(model, prompts: list[list[int]], opts, eos_ids, pad_id: int, draws):
    """transformers' generate() of ``prompts`` (left-padded) with its draws replaced by ``draws``
    (runtime/uniform_diffusion.py's TransformersDraws for this batch: the counter-based noise in
    transformers' draw order), so it decodes the function ours decodes: (new tokens (B, N) numpy,
    decoder forwards per row)."""
    p = max(len(x) for x in prompts)
    ids = torch.tensor([[pad_id] * (p - len(x)) + list(x) for x in prompts])
    keep = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    saved = torch.randint, torch.multinomial
    torch.randint = lambda low, high, size, **kw: torch.from_numpy(draws.randint(high, size[0]))
    torch.multinomial = lambda probs, num_samples=1, **kw: inverse_cdf(
        probs, torch.from_numpy(draws.uniforms(probs.shape[0])))[:, None]
    options = {k: getattr(opts, k) for k in ("max_new_tokens", "max_denoising_steps", "t_min", "t_max",
                                             "stability_threshold", "confidence_threshold")}
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=keep, eos_token_id=list(eos_ids), pad_token_id=pad_id, **options)
    finally:
        torch.randint, torch.multinomial = saved
    new = out.sequences[:, p:].numpy()
    forwards = ((new != pad_id).sum(-1) / np.maximum(out.tokens_per_forward.numpy(), 1e-9)).round()
    return new, forwards.astype(np.int64)
