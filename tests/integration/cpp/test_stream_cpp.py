"""Sampling, stop conditions and streaming in the C++ runtime against the Python runtime on the
same artifact (docs/streaming.md, docs/algorithms.md "Sampling"): under the same seed the same
token ids, forwards and chunk boundaries (every chunk's delta, token ids, forwards, tokens and
finish reason); cancellation through the C callback and the C++ wrapper's std::function, the
runtime reusable after it; the sampling and budget errors in one line, as Python words them; a
schema-2 artifact (graphs without the sampling inputs) still decoding greedy; the
AddressSanitizer build on the streaming and sampling paths."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_deploy.runtime.api import decode_config, row_options

from .conftest import STRATEGIES, first_prompts, flags, run_generate
from .test_fuzz import ENV as ASAN_ENV

GEN = 64
PROMPTS = first_prompts(2)
SAMPLED = {"temperature": 0.7, "top_p": 0.9}
SHORT = {"gen_length": 32, "block_length": 16}   # two blocks: a block start serves step 0 again
SEEDS = (0, 1, 2)
BASES = {"vanilla": {"strategy": "vanilla"}, "threshold": {"strategy": "threshold"}}
LOSSLESS = {"vanilla": {"strategy": "spd", "beam_width": 4},
            "threshold": {"strategy": "spd", "base": "threshold", "beam_width": 4}}
KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished", "finish_reason", "beam_width_used")


@pytest.fixture(scope="module")
def py_rt(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]), precision="fp32")


def py_stream(rt, prompt: str, options: dict) -> tuple[list[dict], dict]:
    """Python's chunks and result for one prompt (batch 1, as the C++ runtime decodes)."""
    chunks: list[dict] = []
    result = rt.decoder.generate([prompt], decode_config(**options), [row_options(**options)], on_chunk=chunks.append)
    return chunks, result[0].to_dict()


def option_flags(options: dict) -> list[str]:
    """flags() with a list value repeated (stop=["a", "b"] -> --stop a --stop b)."""
    return sum((flags({k: x}) for k, v in options.items() for x in (v if isinstance(v, list) else [v])), [])


def cpp_stream(build: Path, artifact, prompts: list[str], options: dict, tmp_path: Path, env=None) -> list:
    """[(chunks, result)] per prompt from one `dllm-generate --stream --json` run."""
    pfile = tmp_path / "prompts.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    r = run_generate(build, "--artifact", str(artifact), "--prompts-file", str(pfile), "--json", "--stream",
                     *option_flags(options), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out, chunks = [], []
    for line in map(json.loads, r.stdout.splitlines()):
        if "delta" in line:
            chunks.append(line)
        else:
            out.append((chunks, line))
            chunks = []
    assert len(out) == len(prompts) and not chunks
    return out


def assert_same(got: tuple[list[dict], dict], want: tuple[list[dict], dict], where) -> None:
    (gc, gr), (wc, wr) = got, want
    assert gc == wc, where                                     # chunk boundaries, deltas, forwards, reasons
    assert {k: gr[k] for k in KEYS} == {k: wr[k] for k in KEYS}, where
    assert "".join(c["delta"] for c in gc) == gr["text"] and sum((c["token_ids"] for c in gc), []) == gr["token_ids"]


@pytest.mark.parametrize("name", ["vanilla", "threshold", "spd-lossless-vanilla", "spd-lossless-threshold"])
def test_sampled_tokens_and_chunks_match_python(name, cpp_build, tiny_artifact, py_rt, tmp_path):
    """temperature 0.7, top-p 0.9, seeds 0/1/2: C++ == Python, token for token and chunk for chunk."""
    for seed in SEEDS:
        options = {**STRATEGIES[name], **SAMPLED, "seed": seed, **SHORT}
        got = cpp_stream(cpp_build, tiny_artifact[0], PROMPTS, options, tmp_path)
        for prompt, g in zip(PROMPTS, got):
            assert_same(g, py_stream(py_rt, prompt, options), (name, seed, prompt))


def test_the_seed_decides_the_tokens(cpp_build, tiny_artifact, tmp_path):
    """At temperature 5 the seeds draw different tokens; the same seed draws the same ones again."""
    runs = [cpp_stream(cpp_build, tiny_artifact[0], PROMPTS[:1], {"strategy": "threshold", **SHORT,
                                                                   "temperature": 5.0, "seed": s}, tmp_path)[0][1]
            for s in (0, 1, 2, 0)]
    assert len({r["text"] for r in runs}) > 1 and runs[0]["token_ids"] == runs[3]["token_ids"]


@pytest.mark.parametrize("base", list(BASES))
def test_lossless_spd_under_sampling_returns_the_base_rule_tokens(base, cpp_build, tiny_artifact, tmp_path):
    for seed in SEEDS:
        options = {**SAMPLED, "seed": seed, **SHORT}
        want = cpp_stream(cpp_build, tiny_artifact[0], PROMPTS, {**BASES[base], **options}, tmp_path)
        got = cpp_stream(cpp_build, tiny_artifact[0], PROMPTS, {**LOSSLESS[base], **options}, tmp_path)
        assert [g[1]["token_ids"] for g in got] == [w[1]["token_ids"] for w in want], (base, seed)
        assert sum(g[1]["forwards"] for g in got) <= sum(w[1]["forwards"] for w in want)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_greedy_chunks_match_python(name, cpp_build, tiny_artifact, py_rt, tmp_path):
    options = {**STRATEGIES[name], **SHORT}
    for prompt, g in zip(PROMPTS, cpp_stream(cpp_build, tiny_artifact[0], PROMPTS, options, tmp_path)):
        assert_same(g, py_stream(py_rt, prompt, options), (name, prompt))
        assert g[1]["finish_reason"] in ("eos", "length") and g[1]["time_to_first_token_s"] <= g[1]["wall_s"]


def test_stop_strings_and_max_tokens_match_python(cpp_build, tiny_artifact, py_rt, tmp_path):
    """A stop string taken from the greedy text cuts it there (and a second one that never occurs
    changes nothing); max_tokens alone sets the canvas; both under sampling too."""
    greedy = py_stream(py_rt, PROMPTS[0], {"gen_length": GEN})[1]["text"]
    stop = greedy[6:8]
    cases = [{"stop": [stop, "\u00e9\u00e9"]}, {"max_tokens": 20}, {"max_tokens": 12, "stop": ["zz"], "gen_length": 40},
             {**SAMPLED, "seed": 1, "stop": [stop]}, {"strategy": "spd", "beam_width": 4, **SAMPLED, "seed": 2,
                                                      "max_tokens": 24}]
    reasons = set()
    for options in cases:
        options = {"gen_length": GEN, **options} if "max_tokens" not in options else options
        got = cpp_stream(cpp_build, tiny_artifact[0], PROMPTS[:1], options, tmp_path)[0]
        assert_same(got, py_stream(py_rt, PROMPTS[0], options), options)
        reasons.add(got[1]["finish_reason"])
        if "max_tokens" in options:
            assert got[1]["tokens"] <= options["max_tokens"]
    assert reasons >= {"stop", "length"}
    first = cpp_stream(cpp_build, tiny_artifact[0], PROMPTS[:1], cases[0] | {"gen_length": GEN}, tmp_path)[0][1]
    assert first["text"] == greedy[:greedy.index(stop)] and first["finished"]


def test_text_stream_prints_the_deltas_like_python(cpp_build, tiny_artifact, tmp_path):
    """`dllm-generate --stream` prints the text as it comes, then a newline: what `dllm-deploy
    generate --stream` prints."""
    args = ["--prompt", PROMPTS[0], "--gen-length", "32", "--strategy", "threshold", "--stream", "--stop", "7 o"]
    cpp = run_generate(cpp_build, "--artifact", str(tiny_artifact[0]), *args)
    py = subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "generate", "--artifact", str(tiny_artifact[0]),
                         "--precision", "fp32", *args], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert cpp.returncode == py.returncode == 0, (cpp.stderr, py.stderr)
    assert cpp.stdout == py.stdout
    assert cpp.stderr.strip().endswith(py.stderr.strip().rsplit(", ", 1)[1])   # the finish reason


# ---- cancellation ----------------------------------------------------------------------------

CHUNK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class Chunk(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("index", ctypes.c_int32), ("delta", ctypes.c_char_p),
                ("delta_size", ctypes.c_size_t), ("token_ids", ctypes.POINTER(ctypes.c_int64)),
                ("token_count", ctypes.c_size_t), ("forwards", ctypes.c_int64), ("tokens", ctypes.c_int64),
                ("finish_reason", ctypes.c_char_p), ("json", ctypes.c_char_p)]


def _lib(build: Path):
    lib = ctypes.CDLL(str(build / "libdllm_deploy.so"))
    P, S = ctypes.c_void_p, ctypes.c_char_p
    for f, res, args in [("dllm_runtime_create", P, [S, P, P]), ("dllm_runtime_destroy", None, [P]),
                         ("dllm_options_create", P, []), ("dllm_options_destroy", None, [P]),
                         ("dllm_options_set", P, [P, S, S]), ("dllm_generate_stream", P, [P, S, P, CHUNK_FN, P, P]),
                         ("dllm_runtime_generate_options", P, [P, S, P, P]), ("dllm_result_json", S, [P]),
                         ("dllm_result_finish_reason", S, [P]), ("dllm_result_destroy", None, [P]),
                         ("dllm_error_message", S, [P])]:
        getattr(lib, f).restype, getattr(lib, f).argtypes = res, args
    return lib


def test_callback_cancels_and_the_runtime_stays_usable(cpp_build, tiny_artifact, py_rt):
    lib = _lib(cpp_build)
    rt, res = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.dllm_runtime_create(str(tiny_artifact[0]).encode(), None, ctypes.byref(rt)) is None
    opts = lib.dllm_options_create()
    # the first prompt's answer takes 96 bytes: four blocks give the stream more than two chunks
    options = {"strategy": "spd", "beam_width": 4, "gen_length": 2 * GEN, **SAMPLED, "seed": 1}
    for k, v in options.items():
        assert lib.dllm_options_set(opts, k.encode(), str(v).encode()) is None
    seen: list[dict] = []

    @CHUNK_FN
    def on_chunk(chunk, user_data):
        c = ctypes.cast(chunk, ctypes.POINTER(Chunk)).contents
        assert c.struct_size == ctypes.sizeof(Chunk) and user_data == 7
        seen.append(json.loads(c.json))
        assert c.delta[:c.delta_size].decode() == seen[-1]["delta"]
        assert [c.token_ids[i] for i in range(c.token_count)] == seen[-1]["token_ids"]
        return 1 if len(seen) == 2 else 0                      # cancel at the second chunk

    try:
        want_chunks, want = py_stream(py_rt, PROMPTS[0], options)
        assert len(want_chunks) > 2
        assert lib.dllm_generate_stream(rt, PROMPTS[0].encode(), opts, on_chunk, 7, ctypes.byref(res)) is None
        cancelled = json.loads(lib.dllm_result_json(res))
        assert lib.dllm_result_finish_reason(res) == b"cancelled" and not cancelled["finished"]
        lib.dllm_result_destroy(res)
        assert seen == want_chunks[:2]
        assert cancelled["token_ids"] == seen[0]["token_ids"] + seen[1]["token_ids"]
        assert cancelled["forwards"] == seen[1]["forwards"] < want["forwards"]
        seen.clear()                                           # the same runtime decodes the whole prompt
        assert lib.dllm_generate_stream(rt, PROMPTS[0].encode(), opts, CHUNK_FN(lambda c, u: 0), None,
                                        ctypes.byref(res)) is None
        again = json.loads(lib.dllm_result_json(res))
        lib.dllm_result_destroy(res)
        assert {k: again[k] for k in KEYS} == {k: want[k] for k in KEYS}
    finally:
        lib.dllm_options_destroy(opts)
        lib.dllm_runtime_destroy(rt)


def _stream_check(build: Path, artifact, options: dict, env=None) -> list:
    args = [f"{k}={v}" for k, v in options.items()]
    r = subprocess.run([str(build / "dllm-stream-check"), str(artifact), PROMPTS[0], "1", *args], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for report in ("Sanitizer", "runtime error:", "LeakSanitizer"):
        assert report not in r.stderr, r.stderr[-3000:]
    return [json.loads(x) for x in r.stdout.splitlines()]


CHECK_OPTIONS = {"strategy": "spd", "beam_width": 4, **SHORT, **SAMPLED, "seed": 2}


def _check_wrapper_lines(lines: list, want_chunks: list, want: dict) -> None:
    chunks, cancelled, thrown, full = lines
    assert len(want_chunks) > 1 and chunks == want_chunks[:1] and cancelled["finish_reason"] == "cancelled"
    assert cancelled["token_ids"] == chunks[0]["token_ids"]
    assert thrown == "from the callback"                       # rethrown by generate_stream
    assert {k: full[k] for k in KEYS} == {k: want[k] for k in KEYS}


def test_cpp_wrapper_cancels_rethrows_and_reuses(cpp_build, tiny_artifact, py_rt):
    want_chunks, want = py_stream(py_rt, PROMPTS[0], CHECK_OPTIONS)
    _check_wrapper_lines(_stream_check(cpp_build, tiny_artifact[0], CHECK_OPTIONS), want_chunks, want)


# ---- errors ----------------------------------------------------------------------------------

def _python_error(artifact, options: dict) -> str:
    from dllm_deploy import Runtime
    from dllm_deploy.errors import UserError
    rt = Runtime.load(artifact=str(artifact), precision="fp32")
    with pytest.raises(UserError) as e:
        rt.decoder.generate([PROMPTS[0]], decode_config(**options), [row_options(**options)])
    return str(e.value)


def _one_line(r) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("dllm-generate: error: "), r.stderr
    return lines[0][len("dllm-generate: error: "):]


def test_sampling_and_budget_errors_are_one_line_like_python(cpp_build, tiny_artifact):
    from dllm_deploy.errors import OptionError
    art = tiny_artifact[0]
    r = run_generate(cpp_build, "--artifact", str(art), "--prompt", "x", "--temperature", "0.7", "--top-k", "65")
    assert _one_line(r) == _python_error(art, {"temperature": 0.7, "top_k": 65})
    r = run_generate(cpp_build, "--artifact", str(art), "--prompt", "x", "--max-tokens", "40", "--gen-length", "32")
    with pytest.raises(OptionError) as e:
        decode_config(max_tokens=40, gen_length=32)
    assert _one_line(r) == str(e.value) and "--max-tokens" in str(e.value)
    for bad in (["--temperature", "-1"], ["--top-p", "0"], ["--seed", "-1"], ["--seed", str(2**64)],
                ["--max-tokens", "0"], ["--top-k", "x"]):
        assert bad[0] in _one_line(run_generate(cpp_build, "--artifact", str(art), "--prompt", "x", *bad)), bad
    r = run_generate(cpp_build, "--artifact", str(art), "--prompt", "x", "--seed", str(2**64 - 1), "--temperature",
                     "0.5", "--gen-length", "8", "--block-length", "8", "--json")
    assert r.returncode == 0, r.stderr                         # the whole 64-bit seed range


# ---- AddressSanitizer --------------------------------------------------------------------------

def test_streaming_and_sampling_under_sanitizers(cpp_asan_build, cpp_build, tiny_artifact, py_rt, tmp_path):
    """The sampled, stopped, streamed decode and the wrapper's cancel / throw / reuse paths under
    ASan + UBSan: no report, and the same lines as the release build."""
    env = {**os.environ, **ASAN_ENV}
    options = {"strategy": "spd", "beam_width": 4, **SHORT, **SAMPLED, "seed": 1, "stop": ["AR ", "\u00e9"],
               "max_tokens": 30}
    r = run_generate(cpp_asan_build, "--artifact", str(tiny_artifact[0]), "--prompt", PROMPTS[0], "--json", "--stream",
                     *option_flags(options), env=ASAN_ENV)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    want_chunks, want = py_stream(py_rt, PROMPTS[0], options)
    assert lines[:-1] == want_chunks and {k: lines[-1][k] for k in KEYS} == {k: want[k] for k in KEYS}
    want_chunks, want = py_stream(py_rt, PROMPTS[0], CHECK_OPTIONS)
    _check_wrapper_lines(_stream_check(cpp_asan_build, tiny_artifact[0], CHECK_OPTIONS, env=env), want_chunks, want)
