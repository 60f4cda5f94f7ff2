"""The C++ uniform-diffusion loop (cpp/src/uniform_diffusion.cpp) against Python's Runtime on a
DiffusionGemma artifact (runtime/uniform_diffusion.py, uniform_decoder.py): the same tokens, text,
forwards, finish reasons and chunks, row by row, for a left-padded batch over several canvases,
rows that stop early at different steps, an EOS, a stop string, seeds and the stability window;
through the C ABI (ctypes: every rule option) and dllm-generate (its flags)."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from .conftest import run_generate
from .test_stream_cpp import CHUNK_FN

PROMPTS = ["hello there", "abc", "the quick brown fox", "z"]
# sharp temperatures and a high confidence bar: rows stop early at different steps
EARLY = {"max_denoising_steps": 3, "t_min": 0.05, "t_max": 0.3, "entropy_bound": 1.0, "confidence_threshold": 2.0,
         "stability_threshold": 0}
CASES = {"three-steps": {"gen_length": 24, "max_denoising_steps": 3},
         "early-stop": {"gen_length": 24, **EARLY},
         "stable-2": {"gen_length": 16, **EARLY, "max_denoising_steps": 6, "stability_threshold": 2, "seed": 4},  # never stable here
         "seeded": {"gen_length": 20, "max_denoising_steps": 4, "seed": 11, "entropy_bound": 0.5},
         "one-canvas": {"gen_length": 5, "max_denoising_steps": 2}}
KEYS = ("text", "token_ids", "forwards", "tokens", "finished", "finish_reason", "accepted_hist")
RULE = ("max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold")


class UniformConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("max_new_tokens", ctypes.c_int32),
                ("max_denoising_steps", ctypes.c_int32), ("entropy_bound", ctypes.c_double), ("t_min", ctypes.c_double),
                ("t_max", ctypes.c_double), ("stability_threshold", ctypes.c_int32),
                ("confidence_threshold", ctypes.c_double), ("seed", ctypes.c_uint64),
                ("stop", ctypes.POINTER(ctypes.c_char_p)), ("stop_count", ctypes.c_size_t)]


class CppUniform:
    """libdllm_deploy.so through ctypes: one runtime on the artifact."""

    def __init__(self, build: Path, artifact):
        lib = self.lib = ctypes.CDLL(str(build / "libdllm_deploy.so"))
        P, S = ctypes.c_void_p, ctypes.c_char_p
        for f, res, args in [("dllm_runtime_create", P, [S, P, P]), ("dllm_runtime_destroy", None, [P]),
                             ("dllm_uniform_config_init", None, [P, P]), ("dllm_runtime_uniform_diffusion", ctypes.c_int32, [P]),
                             ("dllm_uniform_generate", P, [P, P, ctypes.c_size_t, P, CHUNK_FN, P, P]),
                             ("dllm_generate_batch", P, [P, P, ctypes.c_size_t, P, CHUNK_FN, P, P]),
                             ("dllm_result_json", S, [P]), ("dllm_result_destroy", None, [P]),
                             ("dllm_error_message", S, [P]), ("dllm_error_free", None, [P]),
                             ("dllm_runtime_max_beam_width", ctypes.c_int32, [P])]:
            getattr(lib, f).restype, getattr(lib, f).argtypes = res, args
        self.rt = ctypes.c_void_p()
        err = lib.dllm_runtime_create(str(artifact).encode(), None, ctypes.byref(self.rt))
        assert err is None, lib.dllm_error_message(err)

    def config(self, options: dict, stop=()) -> UniformConfig:
        c = UniformConfig()
        self.lib.dllm_uniform_config_init(self.rt, ctypes.byref(c))
        for k, v in options.items():
            setattr(c, "max_new_tokens" if k == "gen_length" else k, v)
        self._stop = (ctypes.c_char_p * max(len(stop), 1))(*[s.encode() for s in stop])
        c.stop, c.stop_count = self._stop, len(stop)
        return c

    def generate(self, prompts: list[str], options: dict, stop=(), cancel_at: int | None = None):
        """(results, chunks): the result JSON per prompt and every chunk's JSON in order."""
        cfg = self.config(options, stop)
        chunks: list[dict] = []

        @CHUNK_FN
        def on_chunk(chunk, user_data):
            from .test_stream_cpp import Chunk
            chunks.append(json.loads(ctypes.cast(chunk, ctypes.POINTER(Chunk)).contents.json))
            return 1 if cancel_at is not None and len(chunks) == cancel_at else 0
        texts = (ctypes.c_char_p * len(prompts))(*[p.encode() for p in prompts])
        out = (ctypes.c_void_p * len(prompts))()
        err = self.lib.dllm_uniform_generate(self.rt, ctypes.cast(texts, ctypes.c_void_p), len(prompts), ctypes.byref(cfg),
                                             on_chunk, None, ctypes.cast(out, ctypes.c_void_p))
        if err is not None:
            message = self.lib.dllm_error_message(err).decode()
            self.lib.dllm_error_free(err)
            raise ValueError(message)
        results = [json.loads(self.lib.dllm_result_json(r)) for r in out]
        for r in out:
            self.lib.dllm_result_destroy(r)
        return results, chunks

    def close(self):
        self.lib.dllm_runtime_destroy(self.rt)


@pytest.fixture(scope="module")
def artifact(diffusion_gemma_export):
    return diffusion_gemma_export[1]


@pytest.fixture(scope="module")
def py_rt(artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(artifact))


@pytest.fixture(scope="module")
def cpp(cpp_build, artifact):
    c = CppUniform(cpp_build, artifact)
    yield c
    c.close()


def _python(rt, prompts, options: dict, stop=()):
    from dllm_deploy.runtime.rows import RowOptions
    rows = [RowOptions(seed=options.get("seed", 0), stop=tuple(stop))] * len(prompts)
    decode = {k: v for k, v in options.items() if k != "seed"}
    chunks = list(rt.stream(prompts, rows=rows, **decode))
    return rt.generate(prompts, rows=rows, **decode), chunks


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_decodes_as_python_row_by_row_and_chunk_by_chunk(cpp, py_rt, case):
    want, want_chunks = _python(py_rt, PROMPTS, CASES[case])
    got, chunks = cpp.generate(PROMPTS, CASES[case])
    for r, (w, g) in enumerate(zip(want, got)):
        assert {k: g[k] for k in KEYS} == {k: getattr(w, k) for k in KEYS}, (case, r)
    assert chunks == want_chunks
    steps, canvases = CASES[case]["max_denoising_steps"], -(-CASES[case]["gen_length"] // 8)
    if case == "three-steps":        # an EOS ends a row a canvas early
        assert [g["finish_reason"] for g in got].count("eos") == 1
    if case == "early-stop":         # rows stop before the last step, at different steps
        assert len({g["forwards"] for g in got}) > 1 and all(g["forwards"] < canvases * (steps + 1) for g in got)


def test_a_row_decodes_alone_what_it_decodes_in_the_batch(cpp):
    batch, _ = cpp.generate(PROMPTS, CASES["early-stop"])
    for i, p in enumerate(PROMPTS):
        alone, _ = cpp.generate([p], CASES["early-stop"])
        assert alone[0]["token_ids"] == batch[i]["token_ids"] and alone[0]["forwards"] == batch[i]["forwards"]


def test_stop_strings_and_cancel(cpp, py_rt):
    full, _ = cpp.generate(PROMPTS[:2], CASES["three-steps"])
    stop = full[0]["text"][9:11]
    want, want_chunks = _python(py_rt, PROMPTS[:2], CASES["three-steps"], stop=(stop,))
    got, chunks = cpp.generate(PROMPTS[:2], CASES["three-steps"], stop=(stop,))
    assert got[0]["finish_reason"] == "stop" and got[0]["text"] == full[0]["text"][:full[0]["text"].index(stop)]
    assert [g["token_ids"] for g in got] == [w.token_ids for w in want] and chunks == want_chunks
    cancelled, chunks = cpp.generate(PROMPTS[:2], CASES["three-steps"], cancel_at=1)
    assert len(chunks) == 1 and cancelled[0]["token_ids"] == chunks[0]["token_ids"]
    assert [c["finish_reason"] for c in cancelled] == ["cancelled", "cancelled"] and cancelled[1]["token_ids"] == []
    again, _ = cpp.generate(PROMPTS[:2], CASES["three-steps"])             # the runtime stays usable
    assert again[0]["token_ids"] == full[0]["token_ids"]


def test_the_c_abi_refuses_what_does_not_apply(cpp, tiny_artifact, cpp_build):
    assert cpp.lib.dllm_runtime_uniform_diffusion(cpp.rt) == 1 and cpp.lib.dllm_runtime_max_beam_width(cpp.rt) == 1
    for bad, msg in (({"max_denoising_steps": 0}, "max_denoising_steps must be >= 1, got 0"),
                     ({"t_min": 0.9}, "t_min must be in (0, t_max], got 0.9"),
                     ({"gen_length": 1000}, "exceeds the model's max_seq")):
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            cpp.generate(PROMPTS[:1], bad)
    texts = (ctypes.c_char_p * 1)(b"abc")
    out = (ctypes.c_void_p * 1)()
    err = cpp.lib.dllm_generate_batch(cpp.rt, ctypes.cast(texts, ctypes.c_void_p), 1, None, CHUNK_FN(0), None,
                                      ctypes.cast(out, ctypes.c_void_p))
    assert "decodes by uniform-noise diffusion (dllm_uniform_generate" in cpp.lib.dllm_error_message(err).decode()
    cpp.lib.dllm_error_free(err)
    masked = CppUniform(cpp_build, tiny_artifact[0])
    try:
        with pytest.raises(ValueError, match="this model does not decode by uniform-noise diffusion"):
            masked.generate(["abc"], {})
    finally:
        masked.close()


def test_dllm_generate_streams_a_batch_as_python(cpp_build, artifact, py_rt, tmp_path):
    """dllm-generate on the artifact: its flags (--gen-length, --steps, --seed, --stop), --stream
    --json chunk lines as Python's, the results as the C ABI's; flags that do not apply are refused."""
    options = {"gen_length": 24, "max_denoising_steps": 3, "seed": 2}
    want, want_chunks = _python(py_rt, PROMPTS, options)
    pfile = tmp_path / "prompts.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompts-file", str(pfile), "--batch-size", "4",
                     "--gen-length", "24", "--steps", "3", "--seed", "2", "--stream", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[:len(want_chunks)] == want_chunks
    assert [{k: g[k] for k in KEYS} for g in lines[len(want_chunks):]] == [{k: getattr(w, k) for k in KEYS} for w in want]
    r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "abc", "--gen-length", "8", "--steps", "2")
    assert r.returncode == 0 and "uniform-diffusion 2 steps" in r.stderr and r.stdout.strip() == py_rt.generate(
        ["abc"], gen_length=8, steps=2)[0].text.strip()
    for flag, value, msg in (("--temperature", "0.5", "--temperature does not apply to a uniform-diffusion model"),
                             ("--beam-width", "4", "--beam-width does not apply")):
        r = run_generate(cpp_build, "--artifact", str(artifact), "--prompt", "abc", flag, value)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1


def test_bench_adds_the_cpp_row_with_its_tokens_checked(cpp_build, artifact, tmp_path, capsys):
    """dllm-deploy bench --backends ort,cpp on the artifact: a C++ row timed in the same run, its
    rows checked against Runtime.generate of the same prompts."""
    from dllm_deploy import cli
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--artifact", str(artifact), "--backends", "ort,cpp", "--quick", "--gen-length", "16",
                     "--steps", "3", "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["runtime"] for r in res["runs"]] == ["dllm-deploy", "dllm-deploy C++"]
    assert res["cpp_rows_identical_to_python"] == f"{res['prompts']}/{res['prompts']}" and res["cpp_vs_python"] > 0
    assert "C++ / Python:" in capsys.readouterr().out
    assert cli.main(["bench", "--artifact", str(artifact), "--backends", "trt", "--quick"]) == 2
    assert "runs on ort and cpp" in capsys.readouterr().err
