"""tests/gpu/run_all.sh, the one GPU check script, on this machine without a GPU: it refuses in
one line with exit status 3 before running anything. Its table rows come from the checks'
``summary:`` lines; the bench's is computed here from the committed H200 bench.json."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "run_all.sh"


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def _run(tmp_path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, **env_extra}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)


def test_no_gpu_is_one_line_and_exit_3(tmp_path):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    r = _run(tmp_path, {})
    assert r.returncode == 3
    assert r.stderr.startswith("run_all.sh: error: no GPU: nvidia-smi") and r.stderr.count("\n") == 1
    assert r.stdout == "" and not (tmp_path / "out").exists()          # nothing ran, nothing written


def test_a_gpu_driver_without_cuda_torch_is_refused_too(tmp_path):
    """nvidia-smi answering (a stand-in script: there is no GPU here) is not enough: torch must
    see a CUDA device."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    r = _run(tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr == f"run_all.sh: error: no GPU: torch.cuda.is_available() is not True in {sys.executable}; " \
                       "the GPU checks need an NVIDIA GPU with CUDA\n"


def test_script_parses_and_runs_each_check_under_a_limit():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    text = SCRIPT.read_text()
    for check in ("check_decode_cuda.py", "check_bench_gpu.py", "check_ort_cuda.py", "check_moe_cuda.py", "check_self_spec_cuda.py",
                  "check_trt.py"):
        assert (ROOT / "tests" / "gpu" / check).exists() and check in text
    limits = [int(line.split("|")[1]) for line in text.splitlines() if line.strip().startswith('"') and "|" in line
              and line.split("|")[1].isdigit()]
    assert len(limits) == 6 and sum(limits) + 6 * 10 <= 9 * 60        # timeout -k 10 each: under 9 minutes


def test_bench_summary_line_from_the_h200_bench_json():
    spec = importlib.util.spec_from_file_location("check_bench_gpu", ROOT / "tests" / "gpu" / "check_bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bench = json.loads((ROOT / "lab" / "gpu" / "h200" / "bench.json").read_text())
    line = mod.summary(bench)
    assert line == ("summary: torch: forward ms W1 8.1, W2 8.0, W4 8.0, W8 7.5, W16 8.1; "
                    "best 426 tok/s (torch:spd W4 lossless/threshold tau0.9)")
