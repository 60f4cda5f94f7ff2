"""Fixtures for the C++ embedding: the release and AddressSanitizer builds, run helpers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STRATEGIES, locked  # noqa: F401  (STRATEGIES: re-exported for the C++ tests)

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "cpp" / "scripts" / "build.sh"



BUILD_DIRS = {"release": "cpp", "asan": "cpp-asan", "aarch64": "cpp-aarch64"}


def _build(kind: str, *targets: str) -> Path:
    """cpp/scripts/build.sh (idempotent: a no-op when up to date, as after `make cpp`), one build at a
    time across the test processes (pytest-xdist workers share build/)."""
    env = dict(os.environ, PYTHON=sys.executable)
    (REPO / "build").mkdir(exist_ok=True)
    with locked(REPO / "build" / f".{BUILD_DIRS[kind]}.lock"):
        r = subprocess.run(["bash", str(BUILD_SCRIPT), kind, *targets], check=False, capture_output=True, text=True,
                           env=env, cwd=REPO)
    if r.returncode:
        pytest.fail(f"C++ build ({kind}) failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return REPO / "build" / BUILD_DIRS[kind]


@pytest.fixture(scope="session")
def cpp_build() -> Path:
    return _build("release")


@pytest.fixture(scope="session")
def cpp_asan_build() -> Path:
    """The sanitizer build of the library and the two programs its tests run (the golden tests and
    the other tools are checked in the release build)."""
    return _build("asan", "dllm-generate", "dllm-stream-check")


def run_generate(build: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(build / "dllm-generate"), *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def flags(options: dict) -> list[str]:
    """decode options -> dllm-generate flags (beam_width=4 -> --beam-width 4)."""
    out: list[str] = []
    for k, v in options.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def generate_many(build: Path, artifact, prompts: list[str], options: dict, tmp_path: Path, extra=(),
                  env: dict | None = None) -> list[dict]:
    """All prompts in one dllm-generate process (--prompts-file, JSON lines)."""
    pfile = tmp_path / "prompts.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    r = run_generate(build, "--artifact", str(artifact), "--prompts-file", str(pfile), "--json",
                     *flags(options), *extra, env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def first_prompts(n: int) -> list[str]:
    """The first eval prompt of n families: different lengths and answer shapes."""
    from dllm_deploy.evals import tasks
    return [ex.prompt for ex in tasks.eval_split(n=1)][:n]
