"""The value rules of decode options, in one place below both of their readers: ``decode_config``
(the runtime, for flags and API keywords) and the profile loader (for a profile's ``decode:``
section, which it checks when the file is read, before any runtime exists).

    problem("beam_width", 0)   'beam width must be >= 1, got 0'
    problem("beam_width", 4)   None
"""
from __future__ import annotations

from numbers import Integral, Real

STRATEGIES = ("vanilla", "threshold", "spd")
SELECTS = ("lossless", "threshold")
BASES = ("vanilla", "threshold")
PRESETS = ("chain", "binary", "wide", "fork")      # spd tree shapes (runtime/tree.py builds them)


def _one_of(name: str, allowed: tuple, expected: str | None = None):
    expected = expected or f"one of {', '.join(allowed)}"
    return lambda v: None if isinstance(v, str) and v in allowed else f"unknown {name} {v!r} (expected {expected})"


def _at_least(name: str, low: int):
    def rule(v):
        if not isinstance(v, Integral) or isinstance(v, bool):
            return f"{name} must be an integer, got {v!r}"
        return None if v >= low else f"{name} must be >= {low}, got {v}"
    return rule


def _unit(name: str):
    def rule(v):
        ok = isinstance(v, Real) and not isinstance(v, bool) and 0.0 < v <= 1.0
        return None if ok else f"{name} must be in (0, 1], got {v}"
    return rule


RULES = {
    "strategy": _one_of("strategy", STRATEGIES),
    "select": _one_of("selection", SELECTS),
    "base": _one_of("base rule", BASES, "vanilla or threshold"),
    "tree": _one_of("tree preset", PRESETS),
    "threshold": _unit("threshold"),
    "draft_tau": _unit("draft tau"),
    "beam_width": _at_least("beam width", 1),
    "max_beam_width": _at_least("max beam width", 1),
    "tokens_per_step": _at_least("tokens per step", 1),
    "steps": _at_least("--steps", 1),
    "candidates": _at_least("candidates", 0),
    "block_length": _at_least("block length", 1),
    "gen_length": _at_least("gen length", 1),
    "max_seq": _at_least("max seq", 1),
    "batch": _at_least("batch", 1),
}


def problem(key: str, value) -> str | None:
    """What is wrong with ``value`` for decode option ``key`` (None: nothing, or not given)."""
    rule = RULES.get(key)
    return None if rule is None or value is None else rule(value)
