"""dllm-graph-run (cpp/tools/graph_run.cpp): one graph of an artifact from .npy inputs to .npy
outputs, equal to Python's ONNX Runtime session on the same inputs (the masked artifact's prefill
and verify in fp32 and int8, DiffusionGemma's encode and denoise); its user errors are one line."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

DIMS = {"batch": 2, "tokens": 5}
PAST = 3


def _dim(d, name: str, window: int) -> int:
    if isinstance(d, int):
        return d
    if d in DIMS:
        return DIMS[d]
    if d.startswith("past") and name.startswith("past"):
        return PAST
    if d == "sliding_len":
        return min(PAST, window - 1) + DIMS["tokens"]
    return PAST + DIMS["tokens"]            # kv_len, full_len


def _inputs(session, vocab: int, window: int, rng) -> dict:
    feeds = {}
    for i in session.get_inputs():
        shape = [_dim(d, i.name, window) for d in i.shape]
        if i.type == "tensor(int64)":
            if i.name == "position_ids":
                x = np.broadcast_to(np.arange(PAST, PAST + shape[1]), shape).copy()
            elif i.name == "top_k":
                x = np.zeros(shape, np.int64)
            else:
                x = rng.integers(0, vocab, shape)
            feeds[i.name] = x.astype(np.int64)
        elif i.type == "tensor(bool)":
            feeds[i.name] = np.ones(shape, bool)
        elif i.name in ("temperature",):
            feeds[i.name] = np.zeros(shape, np.float32)
        elif i.name == "top_p":
            feeds[i.name] = np.ones(shape, np.float32)
        elif i.name == "sample_u":
            feeds[i.name] = rng.random(shape, dtype=np.float32)
        else:
            feeds[i.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return feeds


def _graph_run(build: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(build / "dllm-graph-run"), *args], capture_output=True, text=True, timeout=120)


def _check(build: Path, artifact: Path, role: str, precision: str, vocab: int, window: int, tmp_path: Path):
    import onnxruntime as ort
    m = json.loads((artifact / "manifest.json").read_text())
    sess = ort.InferenceSession(str(artifact / m["precisions"][precision][role]))
    feeds = _inputs(sess, vocab, window, np.random.default_rng(0))
    src, dst = tmp_path / f"{role}-{precision}-in", tmp_path / f"{role}-{precision}-out"
    src.mkdir()
    for k, v in feeds.items():
        np.save(src / f"{k}.npy", v)
    r = _graph_run(build, "--artifact", str(artifact), "--role", role, "--precision", precision, "--inputs", str(src),
                   "--outputs", str(dst))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert sorted(report["outputs"]) == sorted(want)
    for name, w in want.items():
        got = np.load(dst / f"{name}.npy")
        assert got.dtype == w.dtype and got.shape == w.shape == tuple(report["outputs"][name]), name
        if w.dtype.kind == "f":
            assert np.allclose(got, w, rtol=0, atol=1e-6, equal_nan=True), name     # -inf where a token is excluded
        else:
            assert (got == w).all(), name


@pytest.mark.parametrize("role,precision", [("prefill", "fp32"), ("verify", "fp32"), ("prefill", "int8")])
def test_masked_graphs_equal_python_onnxruntime(cpp_build, tiny_artifact, role, precision, tmp_path):
    m = json.loads((tiny_artifact[0] / "manifest.json").read_text())
    _check(cpp_build, tiny_artifact[0], role, precision, m["model"]["vocab_size"], 0, tmp_path)


@pytest.mark.parametrize("role", ["encode", "denoise"])
def test_diffusion_gemma_graphs_equal_python_onnxruntime(cpp_build, diffusion_gemma_export, role, tmp_path):
    art = diffusion_gemma_export[1]
    m = json.loads((art / "manifest.json").read_text())["model"]
    _check(cpp_build, art, role, "fp32", m["vocab_size"], m["sliding_window"], tmp_path)


def test_user_errors_are_one_line(cpp_build, tiny_artifact, tmp_path):
    art = str(tiny_artifact[0])
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "input_ids.npy", np.zeros((1, 2), np.int32))
    for args, msg in ((["--role", "decode"], "no graph of role 'decode' (the artifact's: prefill, verify)"),
                      (["--role", "prefill", "--precision", "fp16"], "precision 'fp16' is not in this artifact"),
                      (["--role", "prefill"], "input_ids.npy: dtype <i4, the graph takes <i8"),
                      (["--role", "prefill", "--bogus", "1"], "unrecognized argument: --bogus")):
        r = _graph_run(cpp_build, "--artifact", art, "--inputs", str(tmp_path / "in"), "--outputs",
                       str(tmp_path / "out"), *args)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    np.save(tmp_path / "in" / "input_ids.npy", np.zeros((1, 2), np.int64))
    r = _graph_run(cpp_build, "--artifact", art, "--role", "prefill", "--inputs", str(tmp_path / "in"), "--outputs",
                   str(tmp_path / "out"))
    assert r.returncode == 2 and "position_ids.npy: cannot read" in r.stderr and not (tmp_path / "out").exists()
