"""What a model family can do, asked instead of branching on its name (DESIGN §10).

A family declares its ``Capabilities``; the manifest records them (so an artifact of a family
registered out of tree still loads where that family is not), and the Python and C++ runtimes
resolve cache modes, strategies and continuous batching by looking them up:

    caps = block_causal()
    caps.cache["prefix"]     'exact'     (for a block-causal model the prefix cache is exact)
    resolve_cache("dual", bidirectional(), 1)  -> 'dual'
    resolve_cache("exact", bidirectional(), 1) -> UserError (the message table's "exact.unavailable")
"""
from __future__ import annotations

from dataclasses import dataclass

from ..options import CACHE_MESSAGES, CACHE_MODES
from ..errors import UserError

# the modes under which every finished block's KV is exact at a block boundary (rows may join there)
EXACT_AT_BOUNDARY = ("exact", "delayed")


@dataclass(frozen=True)
class Capabilities:
    attention: str                   # "bidirectional" (LLaDA, Dream) | "block_causal" (SDAR: exact KV per block)
                                     # | "causal" (self-speculative: causal verify, bidirectional draft)
    cache: dict                      # requested cache mode -> the mode that runs; a mode absent is refused
    one_branch: tuple = ()           # cache modes that verify one branch per forward (beam width 1 only)
    shift_logits: bool = False       # logits at i-1 predict token i (Dream): the canvas keeps an anchor row
    joins: bool = False              # rows may join a running batch at block boundaries (an exact cache there)
    noise: str = "mask"              # the diffusion's noise: "mask" ([MASK] tokens) | "uniform" (random ids)
    strategies: tuple = ("vanilla", "threshold", "spd")   # decode strategies that apply
    graphs: tuple = ("prefill", "verify")                 # the roles of the artifact's graphs

    @property
    def block_causal(self) -> bool:
        """Blocks attend causally to earlier blocks: a finished block's KV is exact."""
        return self.attention == "block_causal"

    def to_dict(self) -> dict:
        return {"attention": self.attention, "cache": dict(self.cache), "one_branch": list(self.one_branch),
             "shift_logits": self.shift_logits, "joins": self.joins, "noise": self.noise,
             "strategies": list(self.strategies), "graphs": list(self.graphs)}

    @classmethod
    def from_dict(cls, d: dict, source: str = "capabilities") -> "Capabilities":
        """The manifest's record, checked for the types every reader relies on."""
        if not isinstance(d, dict):
            raise UserError(f"{source}: not an object")
        for key in ("attention", "noise"):
            if not isinstance(d.get(key), str):
                raise UserError(f"{source}: {key!r} must be a string")
        cache = d.get("cache")
        if not isinstance(cache, dict) or not all(k in CACHE_MODES and v in CACHE_MODES and v != "auto"
                                                   for k, v in cache.items()) or "auto" not in cache:
            raise UserError(f"{source}: 'cache' must map cache modes (with 'auto') onto the modes that run")
        for key in ("one_branch", "strategies", "graphs"):
            if not isinstance(d.get(key, []), list) or not all(isinstance(x, str) for x in d.get(key, [])):
                raise UserError(f"{source}: {key!r} must be a list of names")
        for key in ("shift_logits", "joins"):
            if not isinstance(d.get(key, False), bool):
                raise UserError(f"{source}: {key!r} must be true or false")
        return cls(attention=d["attention"], cache=dict(cache), one_branch=tuple(d.get("one_branch", ())),
                   shift_logits=d.get("shift_logits", False), joins=d.get("joins", False), noise=d["noise"],
                   strategies=tuple(d.get("strategies", cls.strategies)), graphs=tuple(d.get("graphs", cls.graphs)))


def bidirectional(shift_logits: bool = False) -> Capabilities:
    """LLaDA / Dream: approximate prefix and dual caches (Fast-dLLM), none; rows never join."""
    return Capabilities(attention="bidirectional", shift_logits=shift_logits,
                        cache={"auto": "prefix", "prefix": "prefix", "dual": "dual", "none": "none"},
                        one_branch=("none",))


def block_causal() -> Capabilities:
    """SDAR / Fast-dLLM v2 / the bundled model: exact KV of finished blocks; the prefix and dual
    caches are that exact cache (there is no suffix to cache); delayed verifies one branch."""
    return Capabilities(attention="block_causal", joins=True,
                        cache={"auto": "exact", "exact": "exact", "prefix": "exact", "dual": "exact",
                               "delayed": "delayed", "none": "none"},
                        one_branch=("delayed",))


def self_speculative() -> Capabilities:
    """Nemotron-Labs-Diffusion: one model, causal (autoregressive) and block-bidirectional (draft)
    attention chosen by the mask. The causal KV is exact; the self-speculative strategies decode it
    (runtime/self_spec.py): ``prefill`` runs the causal forwards (prompt, verify; writes KV) and
    ``verify`` the draft (bidirectional block over the prefix; writes none)."""
    return Capabilities(attention="causal", cache={"auto": "exact", "exact": "exact"},
                        strategies=("ar", "linear-spec", "tree-spec"))


def resolve_cache(mode: str, caps: Capabilities, width: int) -> str:
    """The cache mode that runs for ``mode`` under W = ``width``, or a one-line UserError from the
    message table (decode_options.json "cache_messages"; the C++ runtime reads the same table)."""
    if mode not in CACHE_MODES:
        raise UserError(CACHE_MESSAGES["unknown"].format(mode=repr(mode), modes=", ".join(CACHE_MODES)))
    if mode not in caps.cache:
        offered = ", ".join(m for m in CACHE_MODES if m in caps.cache)
        raise UserError(CACHE_MESSAGES.get(f"{mode}.unavailable", CACHE_MESSAGES["unavailable"]).format(
            mode=repr(mode), modes=offered))
    if mode in caps.one_branch and width > 1:
        raise UserError(CACHE_MESSAGES[f"{mode}.one_branch"])
    return caps.cache[mode]
