"""The import-linter contract ([tool.importlinter] in pyproject.toml) passes on the package and
catches each kind of forbidden import when one is added to a copy of it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=os.path.dirname(sys.executable))

pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[dev]')")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "dllm_deploy", tmp_path / "dllm_deploy", ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_its_layers():
    p = _lint(ROOT)
    assert p.returncode == 0, p.stdout[-3000:]


INJECTED = [
    ("runtime/api.py", "from ..export import engines", "the runtime never imports the exporter"),
    ("runtime/loop.py", "from ..training import train", "training is on no deploy path"),
    ("profiles/__init__.py", "from .. import cli", "nothing imports the CLI"),
    ("runtime/backends/ort.py", "import torch", "torch only in models/"),
    ("artifact/__init__.py", "from ..models import config", "module layers"),
]


def test_each_forbidden_import_breaks_its_contract(tmp_path):
    """Every kind injected into one copy, one lint run: each contract reports itself broken, and
    names the injected import (each import breaks only its own contract: the layers contract sees
    the runtime and profiles lines as upward imports too, so it is checked by its own line)."""
    root = _copy(tmp_path)
    for module, line, _ in INJECTED:
        path = root / "dllm_deploy" / module
        path.write_text(path.read_text() + f"\n{line}  # injected\n")
    p = _lint(root)
    assert p.returncode == 1, p.stdout[-3000:]
    broken = [ln for ln in p.stdout.splitlines() if " BROKEN" in ln]
    for module, line, contract in INJECTED:
        assert any(contract in ln for ln in broken), (contract, p.stdout[-3000:])
        importer = "dllm_deploy." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        assert importer in p.stdout, (importer, p.stdout[-3000:])


def test_nothing_imports_the_lab():
    """lab/ (experiments, table generators, results) is cited by the docs and imported by no module
    of the package or the tests: a user's install and the suite never depend on it."""
    import ast
    found = []
    for path in sorted([*(ROOT / "dllm_deploy").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("lab", "benchmarks")]
    assert found == [], found
