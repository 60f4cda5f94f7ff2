"""Bad input: a one-line message on stderr and exit code 2, never a crash; the same messages as
the Python runtime where both say something, and for a decode option the same error code and key
(the words are each runtime's own). The whole set runs once more under AddressSanitizer."""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

from dllm_deploy.options import OPTIONS
from dllm_deploy.models.capabilities import bidirectional
from dllm_deploy.errors import OptionError, UserError

from .conftest import run_generate

PROMPT = "upper: air\n"


@pytest.fixture(scope="module")
def bad_artifacts(tiny_artifact, tmp_path_factory):
    """Broken copies of the tiny artifact (symlinks to its big files; edited manifests)."""
    good = Path(tiny_artifact[0])
    root = tmp_path_factory.mktemp("bad")
    manifest = json.loads((good / "manifest.json").read_text())

    def clone(name: str, edit=None, text: str | None = None) -> Path:
        d = root / name
        d.mkdir()
        for f in good.rglob("*"):
            if f.is_file() and f.name != "manifest.json":
                (d / f.relative_to(good)).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(f, d / f.relative_to(good))
        m = json.loads(json.dumps(manifest))
        if edit:
            edit(m)
        (d / "manifest.json").write_text(text if text is not None else json.dumps(m))
        return d

    out = {"missing": root / "does-not-exist", "no-manifest": root / "empty"}
    out["no-manifest"].mkdir()
    out["corrupt"] = clone("corrupt", text=(good / "manifest.json").read_text()[:300])
    out["schema"] = clone("schema", edit=lambda m: m.update(schema_version=6))
    out["kv-io"] = clone("kv-io", edit=lambda m: m.update(schema_version=5))     # schema 5 is kv_io "new"
    out["no-graphs"] = clone("no-graphs", edit=lambda m: m.pop("graphs"))
    out["hash"] = clone("hash")
    tampered = out["hash"] / "verify.onnx"
    tampered.unlink()
    data = bytearray((good / "verify.onnx").read_bytes())
    data[-1] ^= 0xFF
    tampered.write_bytes(bytes(data))
    out["missing-file"] = clone("missing-file")
    (out["missing-file"] / "weights.bin").unlink()
    out["hf"] = clone("hf", edit=lambda m: m.update(tokenizer={"kind": "hf", "file": "tokenizer.json"}))
    out["bidi"] = clone("bidi", edit=lambda m: m.update(capabilities=bidirectional().to_dict()))
    out["huge-seq"] = clone("huge-seq", edit=lambda m: m["model"].update(max_seq=2**31 - 1))
    out["good"] = good
    out["manifest-file"] = good / "manifest.json"
    return out



# (artifact key, extra flags, expected text in the message, does Python say the same? "option": the
# same OptionError code and key, the message naming the option's flag)
CASES = {
    "missing artifact": ("missing", [], "no such artifact folder", True),
    "no manifest": ("no-manifest", [], "not an artifact (no manifest.json)", True),
    "corrupt manifest": ("corrupt", [], "manifest.json: corrupt manifest (not JSON at line ", False),
    "unknown schema": ("schema", [], "unknown schema_version 6", True),
    "schema 5 without kv_io new": ("kv-io", [], "corrupt manifest (schema_version 5 with kv_io 'append')", True),
    "manifest without graphs": ("no-graphs", [], "corrupt manifest (no 'graphs')", True),
    "hash mismatch": ("hash", [], "verify.onnx: sha256 mismatch", True),
    "missing file": ("missing-file", [], "weights.bin: missing (listed in the manifest)", True),
    "hf tokenizer without its config": ("hf", [], "no tokenizer_config.json for C++: re-export", False),
    "prompt over max_seq": ("good", ["--prompt", "x" * 480], "exceeds the model's max_seq 512", True),
    "empty prompt": ("good", ["--prompt", ""], "empty prompt", True),
    "unknown strategy": ("good", ["--strategy", "greedy"], "unknown strategy 'greedy'", "option"),
    "unknown tree": ("good", ["--strategy", "spd", "--tree", "bushy"], "unknown tree preset 'bushy'", "option"),
    "threshold out of range": ("good", ["--threshold", "1.5"], "threshold must be in (0, 1]", "option"),
    "far threshold below the threshold": ("good", ["--strategy", "threshold", "--threshold-far", "0.8"],
                                          "far threshold (0.8) is below the threshold (0.9)", "option"),
    "lead threshold above the threshold": ("good", ["--strategy", "threshold", "--threshold-lead", "0.95"],
                                           "lead threshold (0.95) is above the threshold (0.9)", "option"),
    "draft tau out of range": ("good", ["--strategy", "spd", "--draft-tau", "1.5"], "draft tau must be in (0, 1]", "option"),
    "absent precision": ("good", ["--precision", "fp16"], "has no 'fp16' variant (it has fp32, int4, int8)", True),
    "unknown cache mode": ("good", ["--cache", "full"], "unknown cache mode 'full'", "option"),
    "cache exact, bidirectional": ("bidi", ["--cache", "exact"], "cache mode 'exact' needs a block-causal model", True),
    "cache none, bidirectional, W 4": ("bidi", ["--cache", "none", "--strategy", "spd"],
                                       "verifies one branch per forward", True),
    "bad number": ("good", ["--gen-length", "many"], "gen length must be an integer, got 'many'", "option"),
    "steps 0": ("good", ["--steps", "0"], "--steps must be >= 1, got 0", "option"),
    "negative steps": ("good", ["--steps", "-2"], "--steps must be >= 1, got -2", "option"),
    "max beam width 0": ("good", ["--max-beam-width", "0"], "argument --max-beam-width: must be >= 1", False),
    "file as artifact": ("manifest-file", [], "manifest.json: not a folder (an artifact is the folder", False),
    "top k over the pool": ("good", ["--temperature", "0.7", "--top-k", "65"], "top k 65 is over the 64 tokens", True),
    "unknown flag": ("good", ["--sampling", "0"], "unrecognized argument", False),
}


def _python_error(artifact: Path, extra: list[str]) -> UserError:
    """The Python runtime's UserError for the same input (flag values typed by the declaration)."""
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.api import decode_config, row_options
    opts = dict(zip(extra[::2], extra[1::2]))
    prompt = opts.pop("--prompt", PROMPT)
    precision = opts.pop("--precision", "fp32")
    kw = {"gen_length": 64}
    for flag, text in opts.items():
        name = flag[2:].replace("-", "_")
        try:
            kw[name] = OPTIONS[name].pytype(text)
        except ValueError:
            kw[name] = text
    try:
        rt = Runtime.load(artifact=str(artifact), precision=precision)
        rt.decoder.generate([prompt], decode_config(**kw), [row_options(**kw)])
    except UserError as e:
        return e
    raise AssertionError("the Python runtime accepted it")


def _check(build, bad_artifacts, case, env=None):
    key, extra, expected, same_as_python = CASES[case]
    args = ["--artifact", str(bad_artifacts[key]), "--gen-length", "64"]
    if "--prompt" not in extra:
        args += ["--prompt", PROMPT]
    r = run_generate(build, *args, *extra, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dllm-generate: error: "), r.stderr
    assert expected in lines[0]
    return lines[0].removeprefix("dllm-generate: error: "), same_as_python, key, extra


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, cpp_build, bad_artifacts):
    message, same_as_python, key, extra = _check(cpp_build, bad_artifacts, case)
    if same_as_python == "option":
        err = _python_error(bad_artifacts[key], extra)
        assert isinstance(err, OptionError) and OPTIONS[err.key].flag == extra[-2]
        assert err.flag in message      # dllm-generate names the flag; the code: test_options_cpp.py
    elif same_as_python:
        assert message == str(_python_error(bad_artifacts[key], extra))


ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99"}


def test_under_address_sanitizer(cpp_asan_build, cpp_build, bad_artifacts, tmp_path):
    """Every bad input and one SPD generation (wide tree: every node kind) under ASan."""
    for case in CASES:
        _check(cpp_asan_build, bad_artifacts, case, env=ASAN_ENV)
    args = ["--artifact", str(bad_artifacts["good"]), "--prompt", PROMPT, "--json", "--gen-length", "64",
            "--strategy", "spd", "--tree", "wide", "--select", "threshold", "--beam-width", "4"]
    asan = run_generate(cpp_asan_build, *args, env=ASAN_ENV)
    assert asan.returncode == 0 and "Sanitizer" not in asan.stderr, asan.stderr[-3000:]
    plain = run_generate(cpp_build, *args)
    keys = ("token_ids", "forwards", "accepted_hist")
    assert {k: json.loads(asan.stdout)[k] for k in keys} == {k: json.loads(plain.stdout)[k] for k in keys}


def test_c_abi_errors_through_ctypes(cpp_build, bad_artifacts):
    """The C ABI hands back error objects (code + message), NULL on success; NULL is safe."""
    lib = ctypes.CDLL(str(cpp_build / "libdllm_deploy.so"))
    lib.dllm_runtime_create.restype = ctypes.c_void_p
    lib.dllm_runtime_create.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.dllm_error_code.argtypes = [ctypes.c_void_p]
    lib.dllm_error_message.restype = ctypes.c_char_p
    lib.dllm_error_message.argtypes = [ctypes.c_void_p]
    lib.dllm_error_free.argtypes = [ctypes.c_void_p]
    lib.dllm_version.restype = ctypes.c_char_p
    lib.dllm_onnxruntime_version.restype = ctypes.c_char_p
    out = ctypes.c_void_p(1)
    err = lib.dllm_runtime_create(str(bad_artifacts["hash"]).encode(), None, ctypes.byref(out))
    assert err and lib.dllm_error_code(err) == 2                      # DLLM_ERROR_ARTIFACT
    assert b"sha256 mismatch" in lib.dllm_error_message(err)
    assert out.value is None                                           # *out cleared on failure
    lib.dllm_error_free(err)
    err = lib.dllm_runtime_create(None, None, ctypes.byref(out))
    assert lib.dllm_error_code(err) == 1                               # DLLM_ERROR_INVALID_ARGUMENT
    lib.dllm_error_free(err)
    assert lib.dllm_error_code(None) == 0 and lib.dllm_error_message(None) == b""
    lib.dllm_error_free(None)
    import onnxruntime
    assert lib.dllm_version() == b"0.1.0"
    assert lib.dllm_onnxruntime_version().decode() == onnxruntime.__version__


def _one_line_error(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dllm-generate: error: "), r.stderr
    return lines[0]


def test_prompts_file_nul_byte_is_refused_with_its_line(cpp_build, bad_artifacts, tmp_path):
    """A prompt crosses the C ABI NUL-terminated: a NUL (raw or as a JSON escape) is refused, never cut."""
    for i, line in enumerate([b"upper: a\x00b", b'"upper: a\\u0000b"']):
        f = tmp_path / f"nul{i}.txt"
        f.write_bytes(b"upper: air\n\n" + line + b"\n")
        r = run_generate(cpp_build, "--artifact", str(bad_artifacts["good"]), "--prompts-file", str(f), "--json",
                         "--gen-length", "8")
        assert _one_line_error(r).endswith(f"{f}:3: the prompt holds a NUL byte")


def test_prompts_file_bad_utf8_reads_as_replacement_characters(cpp_build, bad_artifacts, tmp_path):
    """Invalid UTF-8 is accepted, each maximal invalid subsequence read as U+FFFD (3 bytes), as
    Python's bytes.decode("utf-8", errors="replace"); the prompt length in the max_seq message shows it."""
    art = str(bad_artifacts["good"])
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"upper: \xffair\xc3\r\n")
    assert run_generate(cpp_build, "--artifact", art, "--prompts-file", str(ok), "--json", "--gen-length", "8").returncode == 0
    raw = b"\xed\xa0\x80\xc3(\xf0\x9f\x98" * 40 + b"\xe2\x82\xac"
    long = tmp_path / "long.txt"
    long.write_bytes(raw + b"\n")
    r = run_generate(cpp_build, "--artifact", art, "--prompts-file", str(long), "--gen-length", "64")
    n = len(raw.decode("utf-8", errors="replace").encode("utf-8"))
    assert f"prompt of {n} tokens + 64 generated exceeds" in _one_line_error(r)


def test_out_of_memory_names_the_beam_width_and_the_flag(cpp_build, bad_artifacts):
    """An allocation that fails during decoding (address space capped at 3 GiB; a manifest whose
    max_seq lets a 16M-token budget through) exits 2 with the beam width and --max-beam-width."""
    import resource

    def cap_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    import subprocess
    r = subprocess.run([str(cpp_build / "dllm-generate"), "--artifact", str(bad_artifacts["huge-seq"]), "--prompt",
                        PROMPT, "--gen-length", "16000000"], capture_output=True, text=True, timeout=120,
                       preexec_fn=cap_address_space, check=False)
    line = _one_line_error(r)
    assert "out of memory decoding at beam width 1 (prompt of 11 tokens + 16000000 generated)" in line
    assert line.endswith("lower --max-beam-width (or --gen-length)")


class Config(ctypes.Structure):  # dllm_decode_config (dllm.h)
    _fields_ = [("struct_size", ctypes.c_uint32), ("strategy", ctypes.c_char_p), ("gen_length", ctypes.c_int32),
                ("block_length", ctypes.c_int32), ("tokens_per_step", ctypes.c_int32), ("steps", ctypes.c_int32),
                ("threshold", ctypes.c_double), ("beam_width", ctypes.c_int32), ("tree", ctypes.c_char_p),
                ("select", ctypes.c_char_p), ("base", ctypes.c_char_p), ("draft_tau", ctypes.c_double),
                ("schedule_init", ctypes.c_double), ("schedule_decay", ctypes.c_double),
                ("schedule_floor", ctypes.c_double), ("schedule_end_tokens", ctypes.c_int32),
                ("cache", ctypes.c_char_p)]


def _decode_config_struct(lib, **fields) -> Config:
    """A dllm_decode_config at its defaults (dllm_decode_config_init), then ``fields``."""
    cfg = Config()
    lib.dllm_decode_config_init(ctypes.byref(cfg))
    for k, v in fields.items():
        setattr(cfg, k, v)
    return cfg


def test_c_abi_steps_rule(cpp_build, bad_artifacts):
    """dllm_decode_config.steps: DLLM_STEPS_UNSET (the default) decodes; 0 or negative is a
    DLLM_ERROR_BAD_OPTION result whose key is steps (the rule of dllm-generate --steps and of Python's
    DecodeConfig)."""
    lib = ctypes.CDLL(str(cpp_build / "libdllm_deploy.so"))

    for f, res, args in [("dllm_runtime_create", ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]),
                         ("dllm_runtime_generate", ctypes.c_void_p,
                          [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]),
                         ("dllm_error_code", ctypes.c_int, [ctypes.c_void_p]),
                         ("dllm_error_message", ctypes.c_char_p, [ctypes.c_void_p]),
                         ("dllm_error_key", ctypes.c_char_p, [ctypes.c_void_p]),
                         ("dllm_error_free", None, [ctypes.c_void_p]), ("dllm_result_destroy", None, [ctypes.c_void_p]),
                         ("dllm_runtime_destroy", None, [ctypes.c_void_p])]:
        getattr(lib, f).restype, getattr(lib, f).argtypes = res, args
    rt, res = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.dllm_runtime_create(str(bad_artifacts["good"]).encode(), None, ctypes.byref(rt)) is None
    cfg = _decode_config_struct(lib)
    assert cfg.struct_size == ctypes.sizeof(Config) and cfg.steps == -(2**31)      # DLLM_STEPS_UNSET
    cfg.gen_length = 8
    try:
        assert lib.dllm_runtime_generate(rt, PROMPT.encode(), ctypes.byref(cfg), ctypes.byref(res)) is None
        lib.dllm_result_destroy(res)
        for steps in (0, -1):
            cfg.steps = steps
            err = lib.dllm_runtime_generate(rt, PROMPT.encode(), ctypes.byref(cfg), ctypes.byref(res))
            assert lib.dllm_error_code(err) == 8                                   # DLLM_ERROR_BAD_OPTION
            assert lib.dllm_error_key(err) == b"steps" and b"must be >= 1" in lib.dllm_error_message(err)
            lib.dllm_error_free(err)
    finally:
        lib.dllm_runtime_destroy(rt)


def _as_nobody(cmd: list[str]) -> list[str]:
    """cmd run as an unprivileged user (root ignores file modes); skip where that is impossible."""
    import shutil
    if os.geteuid() != 0:
        return cmd
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot drop privileges to test file modes")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]


def test_unreadable_artifact_says_permission_denied(cpp_build, bad_artifacts):
    """An artifact folder without read/search permission, or an unreadable manifest.json:
    "permission denied" naming the path, not "no manifest.json" or "no such folder"."""
    import shutil
    import subprocess
    import tempfile
    good = bad_artifacts["good"]
    top = Path(tempfile.mkdtemp(prefix="dllm-perm-"))   # outside pytest's 0700 folders
    try:
        top.chmod(0o755)
        closed, hidden = top / "closed", top / "hidden"
        for d in (closed, hidden):
            shutil.copytree(good, d)
            d.chmod(0o755)
        closed.chmod(0o000)
        (hidden / "manifest.json").chmod(0o600)
        for folder, named in [(closed, closed), (hidden, hidden / "manifest.json")]:
            r = subprocess.run(_as_nobody([str(cpp_build / "dllm-generate"), "--artifact", str(folder),
                                           "--prompt", PROMPT]), capture_output=True, text=True, timeout=60,
                               check=False)
            if "error while loading shared libraries" in r.stderr:
                pytest.skip("the unprivileged user cannot load the build's libraries: " + r.stderr.strip())
            assert _one_line_error(r) == f"dllm-generate: error: {named}: permission denied"
    finally:
        (top / "closed").chmod(0o755)
        shutil.rmtree(top)
