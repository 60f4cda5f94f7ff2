"""The README's commands run as shown and print what the README says they print.

Every ``dllm-deploy`` line of the README's bash blocks runs (paths under build/, lab/ and
docs/ that a command writes are redirected into a temporary folder; a ``--tune`` overlay goes to a temporary profile
folder); where a line ends with ``# -> TEXT``, TEXT must be printed. The commands run in this
process through ``cli.main`` (an interpreter and its imports per command cost more than most of
them), one of them through the installed ``dllm-deploy`` console script as a user runs it; the
Python block runs in its own interpreter.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()
BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(README) if kind == lang]


def readme_commands() -> list[tuple[str, str | None]]:
    """(command, expected output or None) for every dllm-deploy line, in README order."""
    out = []
    for body in _blocks("bash"):
        for line in body.splitlines():
            if not line.startswith("dllm-deploy "):
                continue
            cmd, _, expect = line.partition("# ->")
            out.append((cmd.split("  #")[0].strip(), expect.strip() or None))
    return out


def _relocate(cmd: str, tmp: Path) -> list[str]:
    """The command's arguments after ``dllm-deploy``, with the paths it writes under ``tmp``."""
    args = shlex.split(cmd)
    for i, arg in enumerate(args):
        writes = args[i - 1] in ("--out", "--json-out", "--plots", "--tune-out")
        if arg.startswith("build/") or (writes and arg.startswith(("lab/", "docs/"))):
            args[i] = str(tmp / arg)
    return args[1:]


CONSOLE_SCRIPT = "profiles explain"   # the command that runs through the installed console script


def _run(argv: list[str], env: dict, capsys, monkeypatch) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``dllm-deploy ARGV`` run in this process, from the
    repository root, with ``env`` set; torch's thread count is put back (a command may set it)."""
    from dllm_deploy.cli import main
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    capsys.readouterr()
    try:
        rc = main(argv)
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    for sub in ("build", "lab", "docs", "profiles"):
        (tmp / sub).mkdir()
    return tmp


def test_readme_shows_commands():
    cmds = [c for c, _ in readme_commands()]
    assert cmds[0].startswith("dllm-deploy export") and len(cmds) >= 8
    assert any(e for _, e in readme_commands())


@pytest.mark.parametrize("index", range(len(readme_commands())))
def test_readme_command(index, workdir, capsys, monkeypatch):
    cmd, expect = readme_commands()[index]
    if index > 0 and not (workdir / "build" / "tiny").exists():
        pytest.skip("the README's export command did not run")
    env = {"DLLM_DEPLOY_PROFILES": str(workdir / "profiles")}
    argv = _relocate(cmd, workdir)
    if cmd.startswith(f"dllm-deploy {CONSOLE_SCRIPT}"):
        script = Path(sys.executable).with_name("dllm-deploy")
        r = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **env}, cwd=REPO)
        rc, out, err = r.returncode, r.stdout, r.stderr
    else:
        rc, out, err = _run(argv, env, capsys, monkeypatch)
    assert rc == 0, f"{cmd}\n{err[-2000:]}"
    if expect is not None:
        assert expect in out, f"{cmd} printed {out!r}"
    if re.search(r"--json(\s|$)", cmd):
        json.loads(out)


def test_one_command_runs_through_the_console_script():
    assert sum(c.startswith(f"dllm-deploy {CONSOLE_SCRIPT}") for c, _ in readme_commands()) == 1
    assert Path(sys.executable).with_name("dllm-deploy").exists()


def test_readme_python_block(workdir):
    if not (workdir / "build" / "tiny").exists():
        pytest.skip("the README's export command did not run")
    (code,) = _blocks("python")
    expect = code.split("# ->")[1].strip()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(expect), r.stdout


def _layout() -> dict[str, str]:
    """The README's Layout block: folder -> the text beside it (continuation lines joined)."""
    block = README.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    out: dict[str, str] = {}
    for line in block.splitlines():
        if line[:1].strip():
            folder, _, text = line.partition(" ")
            out[folder], last = text.strip(), folder
        else:
            out[last] += " " + line.strip()
    return out


def test_the_layout_section_names_the_tree():
    """Every folder the Layout names exists; for the package and cpp/, the names listed are its
    Python modules and folders, no more and no fewer (data files listed must exist)."""
    layout = _layout()
    for folder, text in layout.items():
        path = REPO / folder
        assert path.is_dir(), folder
        if not folder.startswith(("dllm_deploy/", "cpp/")):
            continue
        names = {n.strip() for n in text.split(": ", 1)[-1].split(",")}
        missing = sorted(n for n in names if not ((path / n.rstrip("/")).exists() or (path / f"{n}.py").exists()))
        assert missing == [], (folder, missing)
        have = {p.name + "/" for p in path.iterdir()                # a folder with its own entry counts as named
                if p.is_dir() and p.name != "__pycache__" and f"{folder}{p.name}/" not in layout}
        if folder.startswith("dllm_deploy/"):
            have |= {p.stem for p in path.glob("*.py") if not p.name.startswith("__")}
        assert have <= names, (folder, sorted(have - names))
    package = {str(p.relative_to(REPO)) + "/" for p in (REPO / "dllm_deploy").rglob("*")
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    assert package <= set(layout), sorted(package - set(layout))
