"""The decode options, declared once in ``decode_options.json`` (shipped with the package; the C++
build generates its header from the same file), and the value rules built from it. Below both of
their readers: ``decode_config`` (the runtime, for flags and API keywords) and the profile loader
(for a profile's ``decode:`` section, which it checks when the file is read, before any runtime exists).

    problem("beam_width", 0)        'beam width must be >= 1, got 0'
    problem("beam_width", 4)        None
    option_error("top_k", 5).code   'unsupported'  (declared, not implemented yet)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

from .errors import OptionError, UserError

DECLARATION = Path(__file__).resolve().parent / "decode_options.json"


@dataclass(frozen=True)
class Option:
    """One declared decode option (the fields: the "about" text of decode_options.json)."""
    name: str
    type: str                       # int | float | str | bool
    default: object
    help: str
    flag: str | None = None
    label: str | None = None
    nullable: bool = False
    multiple: bool = False          # a list of values of ``type`` (a repeatable flag); default ()
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    choices: tuple | None = None
    profile: str | bool = False     # "default" | "engine" | False
    runtime: bool = True
    cpp: bool = False
    implemented: bool = True

    @property
    def called(self) -> str:
        """What messages call it."""
        return self.label or self.name.replace("_", " ")

    def help_text(self, profiles: bool = False) -> str:
        """The help, with the default unless the help speaks of it (dllm-generate prints the same;
        ``profiles``: a runtime with device profiles, whose decode defaults come first)."""
        if self.default in (None, ()) or "default" in self.help:
            return self.help
        default = self.default if self.type == "str" else _num(self.default)
        where = "the profile's, else " if profiles and self.profile == "default" else ""
        return f"{self.help} (default: {where}{default})"

    @property
    def pytype(self) -> type:
        return {"int": int, "float": float, "str": str, "bool": bool}[self.type]


def _load() -> dict[str, Option]:
    raw = json.loads(DECLARATION.read_text(encoding="utf-8"))["options"]
    return {o["name"]: Option(**{**o, "choices": tuple(o["choices"]) if "choices" in o else None,
                                 "default": tuple(o["default"]) if o.get("multiple") else o["default"]}) for o in raw}


OPTIONS: dict[str, Option] = _load()
RUNTIME_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.runtime)            # decode_config keywords
PROFILE_KEYS = tuple(n for n, o in OPTIONS.items() if o.profile)                # keys of a profile's decode:
PROFILE_DEFAULT_KEYS = tuple(n for n, o in OPTIONS.items() if o.profile == "default")  # ... that default decoding

STRATEGIES = OPTIONS["strategy"].choices
SELECTS = OPTIONS["select"].choices
BASES = OPTIONS["base"].choices
PRESETS = OPTIONS["tree"].choices      # spd tree shapes (runtime/tree.py builds them)
CACHE_MODES = OPTIONS["cache"].choices
# rules between two options (decode_options.json "rules"; generated into C++ too)
RULES: list[dict] = json.loads(DECLARATION.read_text(encoding="utf-8"))["rules"]
# why a cache mode is refused (models/capabilities.py::resolve_cache; generated into C++ too)
CACHE_MESSAGES: dict[str, str] = json.loads(DECLARATION.read_text(encoding="utf-8"))["cache_messages"]


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def range_text(o: Option) -> str:
    """'in (0, 1]', '>= 1', ...: the declared range in words."""
    if o.min is not None and o.max is not None:
        return f"in {'(' if o.min_exclusive else '['}{_num(o.min)}, {_num(o.max)}{')' if o.max_exclusive else ']'}"
    if o.min is not None:
        return f"{'>' if o.min_exclusive else '>='} {_num(o.min)}"
    return f"{'<' if o.max_exclusive else '<='} {_num(o.max)}"


def _in_range(o: Option, v) -> bool:
    low = o.min is None or (v > o.min if o.min_exclusive else v >= o.min)
    return low and (o.max is None or (v < o.max if o.max_exclusive else v <= o.max))


def _bad_value(o: Option, v) -> str | None:
    """The declared type, choices and range of ``o`` against ``v`` (not None)."""
    if o.multiple:      # a list (a single value stands for a list of one): each value non-empty
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, o.pytype) and x != "" for x in items):
            return f"{o.called}s must be non-empty {'strings' if o.type == 'str' else o.type + 's'}, got {v!r}"
        return None
    if o.choices is not None:
        ok = isinstance(v, str) and v in o.choices
        return None if ok else f"unknown {o.called} {v!r} (expected one of {', '.join(o.choices)})"
    if o.type == "bool":
        return None if isinstance(v, bool) else f"{o.called} must be true or false, got {v!r}"
    if o.type == "str":
        return None if isinstance(v, str) else f"{o.called} must be a string, got {v!r}"
    number = Integral if o.type == "int" else Real
    if not isinstance(v, number) or isinstance(v, bool):
        return f"{o.called} must be {'an integer' if o.type == 'int' else 'a number'}, got {v!r}"
    if (o.min is not None or o.max is not None) and not _in_range(o, v):
        return f"{o.called} must be {range_text(o)}, got {v}"
    return None


def option_error(key: str, value, flag: str | None = None) -> OptionError | None:
    """The OptionError for ``value`` of decode option ``key`` (None: fine, or not given).
    A declared option that is not implemented yet accepts its default only (code "unsupported")."""
    o = OPTIONS.get(key)
    if o is None or value is None:
        return None
    msg = _bad_value(o, value)
    if msg:
        return OptionError("bad_option", key, msg, flag)
    if not o.implemented and value != o.default:
        return OptionError("unsupported", key, f"{o.called} is not implemented yet (only {_num(o.default)} is "
                                               f"accepted), got {value}", flag)
    return None


def given_options(decode: dict, reads, model: str, listing: str) -> dict:
    """The decode keywords ``decode`` sets (None or an empty list: unset), refusing in one line
    the first that a ``model`` model does not read: "FLAG does not apply to a MODEL model (it reads
    LISTING)" (a decoder of another paradigm than the masked families')."""
    given = {k: v for k, v in decode.items() if v is not None and not (isinstance(v, (list, tuple)) and not v)}
    other = [k for k in given if k not in reads]
    if other:
        flag = OPTIONS[other[0]].flag if other[0] in OPTIONS else other[0]
        raise UserError(f"{flag} does not apply to a {model} model (it reads {listing})")
    return given


def problem(key: str, value) -> str | None:
    """What is wrong with ``value`` for decode option ``key`` (None: nothing, or not given)."""
    err = option_error(key, value)
    return None if err is None else str(err)


def rule_error(values: dict) -> OptionError | None:
    """The first declared rule between two options that ``values`` (option name -> value; a name
    left out or None: unset) breaks, as an OptionError naming the option; None when all hold."""
    for r in RULES:
        x, y = values.get(r["option"]), values.get(r["than"])
        if x is None or y is None:
            continue
        if not (x <= y if r["op"] == "<=" else x >= y):
            return OptionError("bad_option", r["option"], r["message"].format(value=x, than=y), OPTIONS[r["option"]].flag)
    return None
