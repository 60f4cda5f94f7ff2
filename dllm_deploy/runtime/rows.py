"""Per-row (per-request) decode options: what may differ between the rows of one batch.

A batch shares its decode shape (strategy, block length, beam width, cache mode, threshold...:
``DecodeConfig``); each row brings its own sampling and stopping: its seed, temperature, top-k,
top-p, token budget and stop strings. ``generate(prompts, **decode)`` gives every row the same
values from the decode options; a server gives each request its own (docs/algorithms.md,
"Sampling"; docs/streaming.md).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowOptions:
    temperature: float = 0.0          # 0: greedy (the top-1 token); > 0: sample
    top_k: int = 0                    # sample among the k most likely tokens (0: off)
    top_p: float = 1.0                # sample within the top-p probability mass (1: off)
    seed: int = 0                     # the sampler's key: noise = f(seed, request, position, step)
    request: int = 0                  # the noise counter's request word (0 unless a caller sets it)
    max_tokens: int | None = None     # token budget (None: the whole canvas, gen_length)
    stop: tuple[str, ...] = ()        # stop strings: the text ends before the first one found

    @property
    def sampling(self) -> bool:
        return self.temperature > 0
