"""The C++ decode options come from the declaration (dllm_deploy/decode_options.json) through a
header generated at build time: the same options, defaults, flags and checks, and the same error
codes and keys as Python; the C ABI sets them by name (dllm_options_set)."""
from __future__ import annotations

import ctypes
import json
import subprocess

import pytest

from dllm_deploy.options import OPTIONS
from dllm_deploy.errors import OptionError
from dllm_deploy.runtime.api import decode_config

from tests.unit.test_options import bad_values, typed
from .conftest import REPO, run_generate

CPP = [o for o in OPTIONS.values() if o.cpp]
P, S = ctypes.c_void_p, ctypes.c_char_p


def _lib(build):
    lib = ctypes.CDLL(str(build / "libdllm_deploy.so"))
    for f, res, args in [("dllm_options_create", P, []), ("dllm_options_destroy", None, [P]),
                         ("dllm_options_set", P, [P, S, S]), ("dllm_option_count", ctypes.c_size_t, []),
                         ("dllm_option_info", S, [ctypes.c_size_t, S]), ("dllm_error_code", ctypes.c_int, [P]),
                         ("dllm_error_key", S, [P]), ("dllm_error_message", S, [P]), ("dllm_error_free", None, [P]),
                         ("dllm_code_name", S, [ctypes.c_int]), ("dllm_runtime_create", P, [S, P, P]),
                         ("dllm_runtime_destroy", None, [P]), ("dllm_runtime_generate", P, [P, S, P, P]),
                         ("dllm_runtime_generate_options", P, [P, S, P, P]), ("dllm_result_json", S, [P]),
                         ("dllm_result_destroy", None, [P])]:
        getattr(lib, f).restype, getattr(lib, f).argtypes = res, args
    return lib


def _code_and_key(lib, err) -> tuple[str, str]:
    assert err, "expected an error"
    out = lib.dllm_code_name(lib.dllm_error_code(err)).decode(), lib.dllm_error_key(err).decode()
    lib.dllm_error_free(err)
    return out


def test_generated_header_is_built_not_committed(cpp_build):
    assert (cpp_build / "generated" / "decode_options.gen.hpp").is_file()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "decode_options.gen.hpp" not in tracked


def test_option_table_is_the_declaration(cpp_build):
    lib = _lib(cpp_build)
    n = lib.dllm_option_count()
    rows = [{f: lib.dllm_option_info(i, f.encode()).decode() for f in ("name", "flag", "type", "default", "choices", "help")}
            for i in range(n)]
    assert [r["name"] for r in rows] == [o.name for o in CPP]
    for r, o in zip(rows, CPP):
        assert (r["flag"], r["type"], r["help"]) == (o.flag or "", o.type, o.help)
        default = "null" if o.default is None else "" if o.multiple else str(o.default)   # "": a list's (set "" clears)
        assert r["choices"] == "|".join(o.choices or ()) and r["default"] == default
    assert lib.dllm_option_info(n, b"name") is None and lib.dllm_option_info(0, b"colour") is None


def test_help_lists_every_cpp_option(cpp_build):
    r = run_generate(cpp_build, "--help")
    assert r.returncode == 0
    for o in CPP:
        assert f"  {o.flag} {o.type}  {o.help}" in r.stdout, o.name


def test_bad_value_has_the_code_and_key_of_python(cpp_build):
    """Every declared C++ option: each refused value gives the same code and key through
    dllm_options_set as Python's decode_config, and dllm-generate exits 2 with one line naming the flag."""
    lib = _lib(cpp_build)
    opts = lib.dllm_options_create()
    try:
        for o in CPP:
            for text, code in bad_values(o):
                got = _code_and_key(lib, lib.dllm_options_set(opts, o.name.encode(), text.encode()))
                with pytest.raises(OptionError) as e:
                    decode_config(**{o.name: typed(o, text)})
                assert got == (e.value.code, e.value.key) == (code, o.name), (o.name, text)
                r = run_generate(cpp_build, "--artifact", "unused", "--prompt", "x", o.flag, text)
                lines = r.stderr.strip().splitlines()
                assert r.returncode == 2 and len(lines) == 1 and o.flag in lines[0], (o.name, text, r.stderr)
            default = "null" if o.default is None else "" if o.multiple else str(o.default)
            assert lib.dllm_options_set(opts, o.name.encode(), default.encode()) is None, o.name
        assert _code_and_key(lib, lib.dllm_options_set(opts, b"temprature", b"0")) == ("unknown_option", "temprature")
        assert _code_and_key(lib, lib.dllm_options_set(None, b"seed", b"0"))[0] == "invalid_argument"
    finally:
        lib.dllm_options_destroy(opts)


def test_options_by_name_decode_like_the_struct(cpp_build, tiny_artifact):
    """dllm_runtime_generate_options with options set by name = dllm_runtime_generate with the
    struct of ABI 2 set the same way (tokens and forwards)."""
    lib = _lib(cpp_build)
    rt, res = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.dllm_runtime_create(str(tiny_artifact[0]).encode(), None, ctypes.byref(rt)) is None
    opts = lib.dllm_options_create()
    try:
        for name, value in [("strategy", "spd"), ("beam_width", "4"), ("gen_length", "32"), ("draft_tau", "0.8"),
                            ("tree", "wide"), ("temperature", "0")]:
            assert lib.dllm_options_set(opts, name.encode(), value.encode()) is None
        assert lib.dllm_runtime_generate_options(rt, b"upper: air\n", opts, ctypes.byref(res)) is None
        by_name = json.loads(lib.dllm_result_json(res))
        lib.dllm_result_destroy(res)
        from .test_errors import _decode_config_struct
        cfg = _decode_config_struct(lib, strategy=b"spd", beam_width=4, gen_length=32, draft_tau=0.8, tree=b"wide")
        assert lib.dllm_runtime_generate(rt, b"upper: air\n", ctypes.byref(cfg), ctypes.byref(res)) is None
        by_struct = json.loads(lib.dllm_result_json(res))
        lib.dllm_result_destroy(res)
        keys = ("token_ids", "forwards", "accepted_hist")
        assert {k: by_name[k] for k in keys} == {k: by_struct[k] for k in keys}
    finally:
        lib.dllm_options_destroy(opts)
        lib.dllm_runtime_destroy(rt)
