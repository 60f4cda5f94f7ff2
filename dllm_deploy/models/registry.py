"""The model-family registry: a checkpoint's ``model_type`` / ``architectures`` -> its ``Family``.

A family is one record in one file (``models/families/<name>.py``, or a user's own package): what
it accepts, how its Hugging Face config maps onto ``DLLMConfig``, its tensor names (one table,
read in both directions: by the loader, the distill writer and the test checkpoint writer), the
module it builds, its graphs' roles, its capabilities and per-layer KV shapes. Nothing outside
the families branches on a family's name; everything else asks the record (DESIGN §10).

    fam = family_for({"model_type": "sdar", ...})     # the block_causal family
    fam.to_ours("model.transformer.wte.weight")        # LLaDA: 'model.embed_tokens.weight'
    register_family(Family(name="my_llada", ...))      # an out-of-tree family (docs/families.md)

Built-in families are imported on first lookup (as vLLM's registry imports model classes lazily).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UserError
from .capabilities import Capabilities

# the modules under models/families/ that hold the built-in families, one family each
BUILTIN = ("llada", "dream", "block_causal", "sdar_moe", "llada2", "llada_moe", "nemotron_diffusion")

_FIELD = re.compile(r"\{(\w+)(?::([\w|]+))?\}")


def _pattern(template: str) -> re.Pattern:
    """A name template as a regex with one group per field: '{i}' is any dot-free part,
    '{p:q|k|v}' one of the listed ones ('model.layers.{i}.self_attn.{p:q|k|v}_proj.weight')."""
    parts, pos = [], 0
    for m in _FIELD.finditer(template):
        parts += [re.escape(template[pos:m.start()]), f"(?P<{m.group(1)}>{m.group(2) or '[^.]+'})"]
        pos = m.end()
    return re.compile("".join(parts) + re.escape(template[pos:]))


def _format(template: str, fields: dict) -> str:
    return _FIELD.sub(lambda m: fields[m.group(1)], template)


@dataclass(frozen=True)
class NameMap:
    """Our module's parameter names <-> the checkpoint's, as pairs of templates with the same
    fields: ("model.layers.{i}.self_attn.o_proj.weight", "model.transformer.blocks.{i}.attn_out.weight").
    No pairs: the checkpoint uses our names. ``ignored``: checkpoint tensors the module does not use."""
    pairs: tuple = ()
    ignored: tuple = (r".*rotary_emb\.inv_freq",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ours", [(_pattern(o), t) for o, t in self.pairs])
        object.__setattr__(self, "_theirs", [(_pattern(t), o) for o, t in self.pairs])

    @staticmethod
    def _map(table, name: str) -> str | None:
        for pat, template in table:
            m = pat.fullmatch(name)
            if m:
                return _format(template, m.groupdict())
        return None

    def to_ours(self, name: str) -> str | None:
        """Checkpoint tensor name -> module parameter name (None: a tensor the module does not use)."""
        if any(re.fullmatch(p, name) for p in self.ignored):
            return None
        return self._map(self._theirs, name) if self.pairs else name

    def to_theirs(self, name: str) -> str:
        """Module parameter name -> the checkpoint's name for it."""
        if not self.pairs:
            return name
        theirs = self._map(self._ours, name)
        if theirs is None:
            raise KeyError(f"no checkpoint name for {name!r}")
        return theirs


def uniform_kv(cfg) -> list[tuple[int, int]]:
    """(Hkv, D) of every layer: the same for all (the dense families)."""
    return [(cfg.num_kv_heads, cfg.head_dim)] * cfg.num_layers


@dataclass(frozen=True)
class Family:
    name: str                                   # recorded in the config and manifest ("family")
    model_types: tuple                          # config.json model_type values it accepts (lower case)
    config: Callable                            # (HF config dict, source) -> DLLMConfig (KeyError: a missing key)
    capabilities: Callable                      # DLLMConfig -> Capabilities
    names: NameMap = field(default_factory=NameMap)
    architectures: tuple = ()                   # config.json "architectures" entries it accepts
    module: str | Callable = "dllm_deploy.models.transformer:DLLM"   # DLLMConfig -> nn.Module ("pkg.mod:Class": lazy)
    kv_shapes: Callable = uniform_kv            # DLLMConfig -> [(Hkv, D)] per layer

    def build(self, cfg):
        """The family's module for ``cfg`` (torch imported here, by the module's own file)."""
        make = self.module
        if isinstance(make, str):
            mod, _, attr = make.partition(":")
            make = getattr(importlib.import_module(mod), attr)
        return make(cfg)

    def to_ours(self, name: str) -> str | None:
        return self.names.to_ours(name)

    def to_theirs(self, name: str) -> str:
        return self.names.to_theirs(name)


_FAMILIES: dict[str, Family] = {}
_BY_TYPE: dict[str, str] = {}
_BY_ARCH: dict[str, str] = {}
_loaded = False


def register_family(family: Family, replace: bool = False) -> Family:
    """Make ``family`` known to every loader, exporter and writer of this process (an exported
    artifact needs no registration: its manifest says what the runtimes need). A name or model_type
    already taken is refused unless ``replace``. Returns the family."""
    _builtin()
    taken = [t for t in family.model_types if _BY_TYPE.get(t.lower(), family.name) != family.name]
    if not replace and (family.name in _FAMILIES or taken):
        what = f"family {family.name!r}" if family.name in _FAMILIES else f"model_type {taken[0]!r}"
        raise UserError(f"{what} is registered already (pass replace=True to replace it)")
    _add(family)
    return family


def _add(family: Family) -> None:
    _FAMILIES[family.name] = family
    for t in family.model_types:
        _BY_TYPE[t.lower()] = family.name
    for a in family.architectures:
        _BY_ARCH[a] = family.name


def _builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN:
        _add(importlib.import_module(f"{__package__}.families.{mod}").FAMILY)


def families() -> dict[str, Family]:
    """Every registered family by name (built-in first)."""
    _builtin()
    return dict(_FAMILIES)


def get_family(name: str) -> Family:
    _builtin()
    if name not in _FAMILIES:
        raise UserError(f"unknown model family {name!r} (registered: {', '.join(_FAMILIES)}; "
                        "a family of your own is registered with dllm_deploy.register_family)")
    return _FAMILIES[name]


def family_for(raw: dict, source: str = "config.json") -> Family:
    """The family of a Hugging Face config dict: by an ``architectures`` entry (LLaDA-MoE's config
    says ``model_type: llada`` as dense LLaDA's does), else by ``model_type``."""
    _builtin()
    from .families import UNSUPPORTED
    model_type = str(raw.get("model_type", "")).lower()
    archs = raw.get("architectures") or []
    name = next((_BY_ARCH[a] for a in archs if isinstance(a, str) and a in _BY_ARCH), None) \
        if isinstance(archs, list) else None
    if name is None and model_type in UNSUPPORTED:
        raise UserError(f"{source}: model_type {model_type!r} is recognised but not supported "
                        f"({UNSUPPORTED[model_type]})")
    name = name or _BY_TYPE.get(model_type)
    if name is None:
        raise UserError(f"{source}: unknown model_type {raw.get('model_type')!r} (supported: {', '.join(_BY_TYPE)})")
    return _FAMILIES[name]


def config_from_hf(raw: dict, source: str = "config.json"):
    """DLLMConfig of a Hugging Face config dict of any registered family."""
    fam = family_for(raw, source)
    try:
        return fam.config(raw, source)
    except KeyError as e:
        raise UserError(f"{source}: missing key {e.args[0]!r} for a {fam.name} model") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{source}: bad value ({e})") from None


def capabilities_of(cfg) -> Capabilities:
    """The capabilities of ``cfg``'s family."""
    return get_family(cfg.layout).capabilities(cfg)
