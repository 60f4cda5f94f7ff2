"""The two exportable graphs around the model (DESIGN §3).

PrefillGraph: input_ids (B,T), position_ids (B,T), attention_mask (B,1,T,P+T) bool,
              past_key_values.{i}.key/.value (B,Hkv,P,D),
              sample_u (B,T) float32, temperature (B,) float32, top_k (B,) int64, top_p (B,) float32
           -> logits (B,T,V), top_ids (B,T,K), top_probs (B,T,K), present.{i}.key/.value (B,Hkv,P+T,D)
              (kv_io "new", schema 5: present is the T new tokens' keys / values only, (B,Hkv,T,D):
              the runtime writes them into a cache buffer of fixed capacity, fed whole with the
              mask leaving its unwritten positions out)
VerifyGraph:  the same inputs -> top_ids (B,T,K) int64, top_probs (B,T,K) float32
              (the choice inside the graph; no logits, no KV leave it)

Both graphs exclude the mask token and a pad token distinct from EOS (models/exclusion.py): their
logits are -inf (in prefill's ``logits`` output too), so no backend can choose them (schema 2).
Slot 0 of top_ids is the choice: the top-1 at temperature 0, else a sample drawn with the
position's uniform ``sample_u`` (models/sampling.py; schema 3). The sampling inputs come last, so
the past keeps its place after the first three inputs.
"""
from __future__ import annotations

import torch
from torch import nn

from ..artifact import SAMPLING_INPUTS
from ..models.exclusion import exclude, excluded_ids, exclusion_mask
from ..models.sampling import sample


def io_names(num_layers: int) -> dict:
    past = [n for i in range(num_layers) for n in (f"past_key_values.{i}.key", f"past_key_values.{i}.value")]
    present = [n for i in range(num_layers) for n in (f"present.{i}.key", f"present.{i}.value")]
    inputs = ["input_ids", "position_ids", "attention_mask"] + past + list(SAMPLING_INPUTS)
    return {"prefill": {"inputs": inputs, "outputs": ["logits", "top_ids", "top_probs"] + present},
            "verify": {"inputs": inputs, "outputs": ["top_ids", "top_probs"]}}


def _pairs(past_flat) -> list:
    """(k0, v0, k1, v1, ...) -> [(k0, v0), (k1, v1), ...]"""
    return [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]


class _Graph(nn.Module):
    """The model plus the constant (V,) mask of the ids its outputs exclude; ``pool``: the P most
    probable tokens a sample is drawn from."""

    def __init__(self, model, topk: int, pool: int):
        super().__init__()
        self.model, self.topk, self.pool = model, topk, pool
        cfg = model.config
        self.register_buffer("excluded", exclusion_mask(cfg.vocab_size, excluded_ids(cfg)), persistent=False)

    def _run(self, input_ids, position_ids, attention_mask, rest):
        """(logits with the excluded ids at -inf, present, (top_ids, top_probs)); ``rest``: the
        past (k0, v0, k1, v1, ...) then the sampling inputs."""
        past_flat, sampling = rest[:-len(SAMPLING_INPUTS)], rest[-len(SAMPLING_INPUTS):]
        logits, present = self.model(input_ids, position_ids, attention_mask, _pairs(past_flat))
        logits = exclude(logits, self.excluded)
        return logits, present, sample(logits, *sampling, pool=self.pool, k=self.topk)


class PrefillGraph(_Graph):
    def forward(self, input_ids, position_ids, attention_mask, *rest):
        logits, present, (top_i, top_p) = self._run(input_ids, position_ids, attention_mask, rest)
        flat = [t for kv in present for t in kv]
        return (logits, top_i, top_p, *flat)


class VerifyGraph(_Graph):
    def forward(self, input_ids, position_ids, attention_mask, *rest):
        return self._run(input_ids, position_ids, attention_mask, rest)[2]


def dynamic_axes(num_layers: int, kv_io: str = "append") -> dict:
    ax = {"input_ids": {0: "batch", 1: "tokens"}, "position_ids": {0: "batch", 1: "tokens"},
          "attention_mask": {0: "batch", 2: "tokens", 3: "kv_len"},
          "logits": {0: "batch", 1: "tokens"}, "top_ids": {0: "batch", 1: "tokens"},
          "top_probs": {0: "batch", 1: "tokens"}, "sample_u": {0: "batch", 1: "tokens"},
          "temperature": {0: "batch"}, "top_k": {0: "batch"}, "top_p": {0: "batch"}}
    for i in range(num_layers):
        for kind in ("key", "value"):
            ax[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "past"}
            ax[f"present.{i}.{kind}"] = {0: "batch", 2: "kv_len" if kv_io == "append" else "tokens"}
    return ax


# role -> the wrapper that exports it (the dense masked families' roles, DESIGN §10)
GRAPHS = {"prefill": PrefillGraph, "verify": VerifyGraph}
