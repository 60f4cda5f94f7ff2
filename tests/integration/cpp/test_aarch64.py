"""The C++ runtime cross-built for aarch64 (cpp/scripts/build.sh aarch64) and run under qemu-user
with a board's CPU model (cpp/scripts/qemu-run.sh, neoverse-n1), against the x86-64 build on the
same machine: graph by graph on the same .npy inputs (dllm-graph-run: prefill and verify of the
bundled artifact; fp32 within 1e-4 of x86's, int8 no further from x86's fp32 outputs than twice
x86's int8 is), then one
short generate per strategy, token for token. Skipped, with the reason, where the cross compiler,
qemu-user or a private mount namespace is missing (`make test` installs the first two from Debian
where it runs as root: cpp/scripts/get_cross_tools.sh)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from .conftest import REPO, _build
from .test_graph_run import _inputs
from .test_tokenizer_cpp import hf_artifact  # noqa: F401  (the fixture: a trained BPE beside a random checkpoint)

QEMU_RUN = REPO / "cpp" / "scripts" / "qemu-run.sh"
PROMPTS = ["upper: air war\n"]


def _missing() -> str | None:
    for tool, package in (("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu"), ("qemu-aarch64", "qemu-user")):
        if shutil.which(tool) is None:
            return f"no {tool} (Debian: apt-get install {package})"
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        return "no private mount namespace (unshare -m needs root): qemu-run.sh cannot give ONNX Runtime an aarch64 /proc/cpuinfo"
    return None


@pytest.fixture(scope="module")
def arm_build(cpp_build):
    if (why := _missing()):
        pytest.skip(why)
    return _build("aarch64")


def _emulated(build, program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(QEMU_RUN), str(build / program), *args], capture_output=True, text=True,
                          timeout=300)


def test_the_binaries_are_aarch64(arm_build):
    for name in ("libdllm_deploy.so", "dllm-generate", "dllm-graph-run"):
        head = (arm_build / name).read_bytes()[:20]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183, name    # EM_AARCH64


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_graphs_match_x86_on_the_same_inputs(arm_build, cpp_build, tiny_artifact, precision, tmp_path):
    import onnxruntime as ort
    art = tiny_artifact[0]
    m = json.loads((art / "manifest.json").read_text())
    for role in ("prefill", "verify"):
        sess = ort.InferenceSession(str(art / m["precisions"][precision][role]))
        src = tmp_path / f"{role}-in"
        src.mkdir()
        for k, v in _inputs(sess, m["model"]["vocab_size"], 0, np.random.default_rng(1)).items():
            np.save(src / f"{k}.npy", v)

        def x86_run(prec: str, out: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(cpp_build / "dllm-graph-run"), "--artifact", str(art), "--role", role,
                                   "--precision", prec, "--inputs", str(src), "--outputs", str(tmp_path / out)],
                                  capture_output=True, text=True, timeout=120)
        x86 = x86_run(precision, f"{role}-x86")
        arm = _emulated(arm_build, "dllm-graph-run", "--artifact", str(art), "--role", role, "--precision", precision,
                        "--inputs", str(src), "--outputs", str(tmp_path / f"{role}-arm"))
        assert x86.returncode == 0 and arm.returncode == 0, x86.stderr + arm.stderr
        # int8: the two machines' integer kernels differ (x86 without VNNI sums u8 x s8 pairs in
        # saturating 16-bit lanes; Arm's dot products do not), so the check is that Arm's int8 is no
        # further from the fp32 graph's outputs than twice x86's int8 is, on these inputs
        ref = x86_run("fp32", f"{role}-x86-fp32") if precision == "int8" else None
        assert ref is None or ref.returncode == 0, ref.stderr
        for name in json.loads(x86.stdout)["outputs"]:
            a, b = (np.load(tmp_path / f"{role}-{where}" / f"{name}.npy") for where in ("x86", "arm"))
            assert a.dtype == b.dtype and a.shape == b.shape, (role, name)
            if a.dtype.kind != "f":
                continue
            finite = np.isfinite(a)
            assert (finite == np.isfinite(b)).all(), (role, name)
            if ref is None:
                assert np.abs(a[finite] - b[finite]).max() <= 1e-4, (role, name)
            else:
                fp32 = np.load(tmp_path / f"{role}-x86-fp32" / f"{name}.npy")[finite]
                x86_err, arm_err = np.abs(a[finite] - fp32).max(), np.abs(b[finite] - fp32).max()
                assert arm_err <= 2 * x86_err, (role, name, float(arm_err), float(x86_err))


@pytest.mark.parametrize("options", [["--gen-length", "32", "--strategy", "threshold"],
                                     ["--gen-length", "32", "--strategy", "vanilla", "--tokens-per-step", "4"],
                                     # two blocks of 8: a draft accepted, a block committed (5 forwards)
                                     ["--gen-length", "16", "--block-length", "8", "--strategy", "spd", "--beam-width", "2"]],
                         ids=["threshold", "vanilla-k4", "spd"])
def test_generate_matches_x86_token_for_token(arm_build, cpp_build, tiny_artifact, options, tmp_path):
    """One short decode of one prompt (a forward takes ~1 s emulated), with decision traces on both
    machines: the same tokens, and every decision the same, or the first that differs sits on a
    near-tie (margin under 1e-3 on both machines: kernels that sum in another order can tip it; a
    wider margin would be a bug). SPD's acceptance depth can tip so (seen: one forward more emulated
    than here, the same tokens); the base rule's decisions are held to the same forwards."""
    from dllm_deploy.runtime.trace import first_difference
    args = ["--artifact", str(tiny_artifact[0]), "--prompt", PROMPTS[0], "--json", *options]
    x86 = subprocess.run([str(cpp_build / "dllm-generate"), *args, "--trace", str(tmp_path / "x86.jsonl")],
                         capture_output=True, text=True, timeout=120)
    arm = _emulated(arm_build, "dllm-generate", *args, "--trace", str(tmp_path / "arm.jsonl"))
    assert x86.returncode == 0 and arm.returncode == 0, x86.stderr + arm.stderr
    want, got = json.loads(x86.stdout), json.loads(arm.stdout)
    assert got["token_ids"] == want["token_ids"] and want["tokens"] > 4 and got["text"] == want["text"]
    traces = [[json.loads(line) for line in (tmp_path / f"{w}.jsonl").read_text().splitlines()] for w in ("x86", "arm")]
    assert traces[0] and traces[1]
    diff = first_difference(*traces)
    if diff is not None:
        assert max(diff["margin_a"], diff["margin_b"]) < 1e-3, diff
    if "spd" not in options:
        assert got["forwards"] == want["forwards"]


def test_hf_tokenizer_matches_x86(arm_build, cpp_build, hf_artifact):
    """A Hugging Face tokenizer on arm64: the aarch64 onnxruntime-extensions library of its wheel
    (beside the cross-built library) gives the x86-64 build's ids and text on every eval prompt and
    a fuzzed set, and a short generate the same tokens. It is a Python extension module: it needs
    the arm64 libpython of the venv's Python (Debian multiarch; get_cross_tools.sh installs it)."""
    import random
    from tests.fuzz_corpus import fuzz_texts
    from dllm_deploy.evals.tasks import eval_split
    libpython = f"/usr/lib/aarch64-linux-gnu/libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    if not (arm_build / "libortextensions.so").exists() or not os.path.exists(libpython):
        pytest.skip(f"no aarch64 tokenizer library or no {libpython} (Debian: dpkg --add-architecture arm64; "
                    f"apt-get install libpython{sys.version_info[0]}.{sys.version_info[1]}:arm64)")
    folder, _ = hf_artifact
    texts = [ex.prompt for ex in eval_split()] + fuzz_texts(random.Random(0), 100)
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    x86 = subprocess.run([str(cpp_build / "dllm-tokenize"), str(folder)], input=lines, capture_output=True, text=True,
                         timeout=120)
    arm = subprocess.run(["bash", str(QEMU_RUN), str(arm_build / "dllm-tokenize"), str(folder)], input=lines,
                         capture_output=True, text=True, timeout=300)
    assert x86.returncode == 0 and arm.returncode == 0, x86.stderr + arm.stderr
    assert len(x86.stdout.splitlines()) == len(texts) and arm.stdout == x86.stdout
    args = ["--artifact", str(folder), "--prompt", "upper: hello world", "--gen-length", "8", "--json"]
    x86 = subprocess.run([str(cpp_build / "dllm-generate"), *args], capture_output=True, text=True, timeout=120)
    arm = _emulated(arm_build, "dllm-generate", *args)
    assert x86.returncode == 0 and arm.returncode == 0, x86.stderr + arm.stderr
    assert json.loads(arm.stdout)["token_ids"] == json.loads(x86.stdout)["token_ids"]
