"""Bad input: a one-line message on stderr and exit code 2, never a crash; the same messages as
the Python runtime where both say something. The whole set runs once more under AddressSanitizer."""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

from dllm_deploy.errors import UserError

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
    out["schema"] = clone("schema", edit=lambda m: m.update(schema_version=3))
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
    out["bidi"] = clone("bidi", edit=lambda m: m["model"].update(attention="bidirectional"))
    out["good"] = good
    return out



# (artifact key, extra flags, expected text in the message, does Python say the same?)
CASES = {
    "missing artifact": ("missing", [], "no such artifact folder", True),
    "no manifest": ("no-manifest", [], "not an artifact (no manifest.json)", True),
    "corrupt manifest": ("corrupt", [], "corrupt manifest (", True),
    "unknown schema": ("schema", [], "unknown schema_version 3", True),
    "manifest without graphs": ("no-graphs", [], "corrupt manifest (no 'graphs')", True),
    "hash mismatch": ("hash", [], "verify.onnx: sha256 mismatch", True),
    "missing file": ("missing-file", [], "weights.bin: missing (listed in the manifest)", True),
    "hf tokenizer": ("hf", [], "not supported in C++ yet", False),
    "prompt over max_seq": ("good", ["--prompt", "x" * 480], "exceeds the model's max_seq 512", True),
    "empty prompt": ("good", ["--prompt", ""], "empty prompt", True),
    "unknown strategy": ("good", ["--strategy", "greedy"], "unknown strategy 'greedy'", True),
    "unknown tree": ("good", ["--strategy", "spd", "--tree", "bushy"], "unknown tree preset 'bushy'", True),
    "threshold out of range": ("good", ["--threshold", "1.5"], "threshold must be in (0, 1]", True),
    "draft tau out of range": ("good", ["--strategy", "spd", "--draft-tau", "1.5"], "draft tau must be in (0, 1]", True),
    "absent precision": ("good", ["--precision", "fp16"], "has no 'fp16' variant (it has fp32, int8)", True),
    "unknown cache mode": ("good", ["--cache", "full"], "unknown cache mode 'full'", True),
    "cache exact, bidirectional": ("bidi", ["--cache", "exact"], "cache mode 'exact' needs a block-causal model", True),
    "cache none, bidirectional, W 4": ("bidi", ["--cache", "none", "--strategy", "spd"],
                                       "verifies one branch per forward", True),
    "bad number": ("good", ["--gen-length", "many"], "invalid int value", False),
    "unknown flag": ("good", ["--temperature", "0"], "unrecognized argument", False),
}


def _python_message(artifact: Path, extra: list[str]) -> str:
    """The Python runtime's UserError message for the same input."""
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.api import decode_config
    opts = dict(zip(extra[::2], extra[1::2]))
    prompt = opts.pop("--prompt", PROMPT)
    precision = opts.pop("--precision", "fp32")
    kw = {k[2:].replace("-", "_"): (float(v) if k in ("--threshold", "--draft-tau") else v) for k, v in opts.items()}
    try:
        rt = Runtime.load(artifact=str(artifact), precision=precision)
        rt.decoder.generate([prompt], decode_config(gen_length=64, **kw))
    except UserError as e:
        return str(e)
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
    if same_as_python:
        assert message == _python_message(bad_artifacts[key], extra)


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
