"""decode_options.json is the one declaration of the decode options: the rules, DecodeConfig, the
CLI flags, the profile keys and bench's overlay all follow it."""
from __future__ import annotations

import dataclasses
import json

import pytest

from dllm_deploy import cli
from dllm_deploy.bench import run as bench
from dllm_deploy.cli.common import decode_kwargs
from dllm_deploy.options import (DECLARATION, OPTIONS, PROFILE_DEFAULT_KEYS, PROFILE_KEYS, RUNTIME_OPTIONS,
                                      Option, option_error, problem)
from dllm_deploy.errors import OptionError
from dllm_deploy.profiles import _DECODE, parse_profile
from dllm_deploy.runtime.api import decode_config
from dllm_deploy.runtime.strategies import DecodeConfig


def bad_values(o: Option) -> list[tuple[str, str]]:
    """(flag text, expected code) of values the declaration refuses for ``o``."""
    if o.choices:
        return [("bogus", "bad_option")]
    out = [] if o.type == "str" else [("many", "bad_option")]
    if o.min is not None:
        out.append((str(o.min if o.min_exclusive else o.min - 1), "bad_option"))
    if o.max is not None:
        out.append((str(o.max + 1), "bad_option"))
    if not o.implemented:
        out.append((str(o.default + 1 if o.max is None else o.default / 2), "unsupported"))
    return out


def typed(o: Option, text: str):
    try:
        return o.pytype(text)
    except ValueError:
        return text


def test_rules_by_type_range_choice_and_null():
    assert problem("beam_width", 0) == "beam width must be >= 1, got 0"
    assert problem("beam_width", "4") == "beam width must be an integer, got '4'"
    assert problem("beam_width", True) is not None and problem("beam_width", 4) is None
    assert problem("threshold", 0) == "threshold must be in (0, 1], got 0"           # exclusive minimum
    assert problem("threshold", 1) is None and problem("threshold", 1.0000001) is not None
    assert problem("threshold", "high") == "threshold must be a number, got 'high'"
    assert problem("tree", "bushy") == "unknown tree preset 'bushy' (expected one of chain, binary, wide, fork)"
    assert problem("steps", None) is None and problem("draft_tau", None) is None    # nullable: unset
    assert problem("candidates", 0) is None and problem("candidates", -1) == "candidates must be >= 0, got -1"
    flag = Option(name="verbose", type="bool", default=False, help="")
    from dllm_deploy.options import _bad_value
    assert _bad_value(flag, True) is None and "true or false" in _bad_value(flag, 1)


def test_sampling_options_are_row_options():
    """temperature, top_k, top_p, seed: implemented, checked against the declaration, and the
    rows' options (RowOptions), not the batch's DecodeConfig."""
    from dllm_deploy.runtime.api import ROW_KEYWORDS, row_options
    for name, default, other in [("temperature", 0, 0.7), ("top_k", 0, 5), ("top_p", 1, 0.9), ("seed", 0, 3)]:
        o = OPTIONS[name]
        assert o.implemented and o.cpp and o.default == default and name in ROW_KEYWORDS
        assert option_error(name, other) is None and option_error(name, default) is None
    assert option_error("temperature", -1).code == "bad_option" and option_error("top_p", 0).code == "bad_option"
    assert option_error("seed", 2**64 - 1) is None and option_error("seed", 2**64).code == "bad_option"
    assert "seed" not in {f.name for f in dataclasses.fields(decode_config(seed=3, temperature=0.5))}
    row = row_options(seed=3, temperature=0.5, top_k=None, beam_width=4)
    assert (row.seed, row.temperature, row.top_k, row.top_p) == (3, 0.5, 0, 1.0)


def test_a_declared_option_not_implemented_takes_its_default_only(monkeypatch):
    monkeypatch.setitem(OPTIONS, "seed", dataclasses.replace(OPTIONS["seed"], implemented=False))
    assert option_error("seed", 0) is None
    err = option_error("seed", 3)
    assert err.code == "unsupported" and err.key == "seed" and "not implemented yet" in str(err)
    with pytest.raises(OptionError) as e:
        decode_config(seed=3)
    assert (e.value.code, e.value.key, e.value.flag) == ("unsupported", "seed", "--seed")


def test_unknown_option_has_its_code_and_key():
    with pytest.raises(OptionError) as e:
        decode_config(beam=4)
    assert (e.value.code, e.value.key) == ("unknown_option", "beam")


def test_decode_config_is_the_declaration():
    from dllm_deploy.runtime.api import ROW_KEYWORDS      # per-row options: RowOptions, not DecodeConfig
    assert {"max_tokens", "stop"} <= set(ROW_KEYWORDS)
    declared = [n for n in RUNTIME_OPTIONS if OPTIONS[n].implemented and n not in ROW_KEYWORDS]
    fields = [f for f in dataclasses.fields(DecodeConfig) if f.name != "schedule"]   # schedule: a structure
    assert [f.name for f in fields] == declared
    for f in fields:
        assert f.default == OPTIONS[f.name].default, f.name
        assert OPTIONS[f.name].pytype.__name__ in str(f.type), f.name


def test_cli_flags_are_the_declaration():
    parser = cli.build_parser()
    for sub in ("generate", "eval"):
        sp = parser._subparsers._group_actions[0].choices[sub]
        flags = {a.option_strings[0]: a for a in sp._actions if a.option_strings}
        for o in OPTIONS.values():
            if o.runtime and o.flag:
                assert flags[o.flag].dest == o.name and flags[o.flag].default is None
                assert flags[o.flag].help == o.help_text(profiles=True)
    a = parser.parse_args(["generate", "--prompt", "x", "--beam-width", "8", "--draft-tau", "0.5"])
    kw = decode_kwargs(a)
    assert set(kw) == {o.name for o in OPTIONS.values() if o.runtime and o.flag}
    assert kw["beam_width"] == 8 and kw["draft_tau"] == 0.5 and kw["strategy"] is None


def test_profile_keys_are_the_declaration():
    assert list(_DECODE) == list(PROFILE_KEYS)
    assert set(PROFILE_DEFAULT_KEYS) == {"strategy", "beam_width", "threshold", "threshold_floor", "threshold_far", "threshold_lead",
                                      "select", "base", "tree", "cache"}
    assert set(PROFILE_KEYS) - set(PROFILE_DEFAULT_KEYS) == {"block_length", "max_beam_width", "max_seq", "batch"}
    base = {"name": "p", "match": {"kind": "cpu"}, "backends": ["CPUExecutionProvider"]}
    with pytest.raises(OptionError) as e:
        parse_profile({**base, "decode": {"beam_width": 0}}, "p.yaml")
    assert (e.value.code, e.value.key, e.value.flag) == ("bad_option", "beam_width", None)
    with pytest.raises(Exception, match="unknown key 'temperature'"):
        parse_profile({**base, "decode": {"temperature": 0.5}}, "p.yaml")


def test_bench_overlay_writes_profile_default_keys_only():
    from dllm_deploy.profiles import get_profile
    prof, _, _ = get_profile("generic-cpu")
    run = {"label": "x", "backend": "ort", "strategy": "spd", "beam_width": 8, "beam_width_used": 4, "threshold": 0.8,
           "select": "lossless", "base": "threshold", "cache": "auto", "tree": "wide", "tokens_per_s": 1.0}
    for strategy, width, floor, far, lead, written in [
            ("spd", 4, None, None, None, set(PROFILE_DEFAULT_KEYS) - {"threshold_floor", "threshold_far", "threshold_lead", "cache"}),
            ("threshold", 1, None, None, None, {"strategy", "threshold", "beam_width"}),
            ("threshold", 1, 0.7, None, None, {"strategy", "threshold", "threshold_floor", "beam_width"}),
            ("threshold", 1, None, 0.9999, None, {"strategy", "threshold", "threshold_far", "beam_width"}),
            ("threshold", 1, None, 0.9999, 0.0, {"strategy", "threshold", "threshold_far", "threshold_lead", "beam_width"})]:
        pick = {**run, "strategy": strategy, "beam_width_used": width, "threshold_floor": floor, "threshold_far": far,
                "threshold_lead": lead}
        over = bench.overlay_profile({"pick": pick, "baseline": pick, "speedup_vs_threshold": 1.0,
                                      "quality_budget": 0.0}, prof, None)
        assert set(over["decode"]) == set(prof.decode) | written
        assert over["decode"]["beam_width"] == width and over["decode"]["strategy"] == strategy
        parse_profile(over, "overlay.yaml")


@pytest.mark.parametrize("name", [n for n in RUNTIME_OPTIONS if OPTIONS[n].flag])
def test_cli_bad_value_exits_2_naming_the_flag(name, capsys):
    o = OPTIONS[name]
    for text, code in bad_values(o):
        try:
            rc = cli.main(["generate", "--prompt", "x", o.flag, text])
        except SystemExit as e:     # argparse: not a number
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and o.flag in err.splitlines()[-1], err
        if typed(o, text) != text or o.type == "str":     # typed: decode_config's check, by code and key
            assert err.count("\n") == 1, err
            with pytest.raises(OptionError) as e:
                decode_config(**{name: typed(o, text)})
            assert (e.value.code, e.value.key) == (code, name)


def test_declaration_is_package_data():
    import tomllib
    from pathlib import Path
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert DECLARATION.name in pyproject["tool"]["setuptools"]["package-data"]["dllm_deploy"]
    names = [o["name"] for o in json.loads(DECLARATION.read_text())["options"]]
    assert len(names) == len(set(names)) == len(OPTIONS)


def test_every_declared_rule_between_options_is_enforced_by_decode_config():
    """decode_options.json "rules": each one, broken, fails decode_config with its message and key;
    held, passes (the C++ runtime checks the same table: tests/integration/cpp/test_errors.py)."""
    from dllm_deploy.options import RULES
    from dllm_deploy.errors import OptionError
    from dllm_deploy.runtime.api import decode_config
    broken = {"max_tokens": {"max_tokens": 40, "gen_length": 32}, "threshold_floor": {"threshold_floor": 0.95},
              "threshold_far": {"threshold_far": 0.5}, "threshold_lead": {"threshold_lead": 0.95}}
    assert [r["option"] for r in RULES] == list(broken)
    for r in RULES:
        with pytest.raises(OptionError) as e:
            decode_config(threshold=0.9, **broken[r["option"]])
        assert e.value.key == r["option"] and str(e.value).startswith(r["message"].split("(")[0]), str(e.value)
    assert decode_config(max_tokens=32, gen_length=32, threshold=0.9, threshold_floor=0.8, threshold_far=0.99,
                         threshold_lead=0.7).gen_length == 32
