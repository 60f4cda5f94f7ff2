"""Nothing but dllm-deploy's own output is ever deleted or left half-written: what `export --force`
refuses, the atomic folder swap and file write under injected failures, the target lock between two
processes, SIGTERM / SIGKILL during an export, unwritable targets, and the bench overlay and engine
files that only replace what this tool wrote. Real files, real subprocesses, real signals."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from dllm_deploy.artifact import fsio, read_manifest
from dllm_deploy.cli import main
from dllm_deploy.cli.common import write_yaml
from dllm_deploy.errors import UserError
from dllm_deploy.export.engines import check_engine_targets
from dllm_deploy.export.exporter import export
from tests.conftest import write_checkpoint

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
QUIET = {"log": lambda m: None}


def cli(*args, cwd=None, prefix=()):
    """Run ``dllm-deploy`` in a subprocess (``prefix`` e.g. a setpriv command line)."""
    return subprocess.run([*prefix, sys.executable, "-m", "dllm_deploy.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dllm-deploy: error: "), stderr
    return lines[0]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones too), byte for byte."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def scratch_folders(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


@pytest.fixture
def model(tmp_path):
    return write_checkpoint(tmp_path / "m", "llada")


@pytest.fixture
def artifact(model, tmp_path):
    out = tmp_path / "art"
    export(str(model), out, **QUIET)
    return out


# --- what --force may replace -------------------------------------------------------------------

@pytest.mark.parametrize("what", ["user folder", "source model", "folder holding the model", "regular file"])
def test_force_refuses_what_is_not_its_artifact(what, model, tmp_path, capsys):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    (tmp_path / "file.bin").write_bytes(b"\0data")
    out = {"user folder": user, "source model": model, "folder holding the model": tmp_path,
           "regular file": tmp_path / "file.bin"}[what]
    before = snapshot(tmp_path)
    assert main(["export", "--model", str(model), "--out", str(out), "--force"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(out) in line
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin", "m", "user"]   # not even a lock file


@pytest.mark.parametrize("out", [".", "..", "/"])
def test_force_refuses_the_current_folder_its_parents_and_root(out, tmp_path):
    work = tmp_path / "work" / "sub"
    write_checkpoint(tmp_path / "work" / "m", "llada")
    work.mkdir()
    (work / "keep.txt").write_text("keep")
    before = snapshot(tmp_path)
    p = cli("export", "--model", "../m", "--out", out, "--force", cwd=work)
    assert p.returncode == 2
    assert "refusing to replace" in one_error_line(p.stderr)
    assert snapshot(tmp_path) == before


def test_existing_target_needs_force_and_empty_folder_does_not(model, artifact, tmp_path, capsys):
    before = snapshot(artifact)
    assert main(["export", "--model", str(model), "--out", str(artifact)]) == 2
    assert "already exists" in one_error_line(capsys.readouterr().err)
    assert snapshot(artifact) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", "--model", str(model), "--out", str(empty), "--json"]) == 0
    read_manifest(empty, verify=True)


def test_force_replaces_its_own_artifact(artifact, tmp_path):
    other = write_checkpoint(tmp_path / "m2", "llada", seed=1)
    old_weights = (artifact / "weights.bin").read_bytes()
    assert main(["export", "--model", str(other), "--out", str(artifact), "--force", "--json"]) == 0
    m = read_manifest(artifact, verify=True)
    assert m["source"] == str(other.resolve())
    assert (artifact / "weights.bin").read_bytes() != old_weights
    assert scratch_folders(artifact) == []


# --- atomic replace and atomic write under injected failures ------------------------------------

def test_failed_rename_in_leaves_the_whole_old_artifact(artifact, tmp_path, monkeypatch):
    other = write_checkpoint(tmp_path / "m2", "llada", seed=1)
    before = snapshot(artifact)
    real = os.rename

    def rename(src, dst):
        if Path(src).name == "artifact":        # the new folder going in
            raise OSError(5, "Input/output error", str(src))
        return real(src, dst)
    monkeypatch.setattr(fsio.os, "rename", rename)
    with pytest.raises(UserError, match="cannot write the artifact"):
        export(str(other), artifact, force=True, **QUIET)
    monkeypatch.undo()
    assert snapshot(artifact) == before
    read_manifest(artifact, verify=True)
    assert scratch_folders(artifact) == []


def test_failed_delete_of_the_old_copy_leaves_the_whole_new_artifact(artifact, tmp_path, monkeypatch):
    other = write_checkpoint(tmp_path / "m2", "llada", seed=1)
    real = shutil.rmtree

    def rmtree(path, *a, **k):
        if Path(path).name == "old":            # the old artifact, renamed aside: delete half, then fail
            os.unlink(Path(path) / "verify.onnx")
            raise OSError(5, "Input/output error", str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(fsio.shutil, "rmtree", rmtree)
    export(str(other), artifact, force=True, **QUIET)
    monkeypatch.undo()
    assert read_manifest(artifact, verify=True)["source"] == str(other.resolve())
    # the half-deleted old copy stays in a marked scratch folder, which the next export removes
    assert len(scratch_folders(artifact)) == 1
    with fsio.lock_target(artifact):
        fsio.clean_stale(artifact)
    assert scratch_folders(artifact) == []
    read_manifest(artifact, verify=True)


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "bench.json"
    path.write_text("old contents\n")

    def fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fsio.os, "fsync", fsync)
    with pytest.raises(OSError):
        fsio.atomic_write(path, "new contents that never fully reach the disk\n")
    monkeypatch.undo()
    assert path.read_text() == "old contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]      # no temp file left
    fsio.atomic_write(path, "new\n")
    assert path.read_text() == "new\n"


# --- two writers, signals, stale scratch folders -------------------------------------------------

def test_a_second_writer_fails_in_one_line_while_the_lock_is_held(model, tmp_path, capsys):
    out = tmp_path / "art"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from dllm_deploy.artifact.fsio import lock_target\n"
         f"with lock_target(Path({str(out)!r})):\n    print('locked', flush=True); time.sleep(60)"],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["export", "--model", str(model), "--out", str(out)]) == 2
        captured = capsys.readouterr()
        line = one_error_line(captured.err)
        assert f"another dllm-deploy process is writing it (pid {holder.pid})" in line
        assert captured.out == "" and not out.exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["export", "--model", str(model), "--out", str(out), "--json"]) == 0   # the kernel dropped the lock


def _start_export(model: Path, out: Path) -> subprocess.Popen:
    """A CLI export in a subprocess, returned once its scratch folder exists. Three precision
    variants keep it writing for several seconds after that (fp32 alone ends about 2 s later, and a
    signal sent from a busy test machine could arrive after the export had ended)."""
    p = subprocess.Popen([sys.executable, "-m", "dllm_deploy.cli", "export", "--model", str(model), "--out", str(out),
                          "--precision", "fp32,int8,int4", "--json"], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not any((s / fsio.MARKER).exists() for s in scratch_folders(out)):
        assert p.poll() is None and time.time() < deadline, "export ended before writing its scratch folder"
        time.sleep(0.05)
    return p


def test_sigterm_cleans_up_and_exits_143(model, tmp_path):
    out = tmp_path / "art"
    p = _start_export(model, out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines() == ["dllm-deploy: terminated (SIGTERM)"]
    assert scratch_folders(out) == [] and not out.exists()


def test_stale_scratch_folder_of_a_killed_export_is_removed_by_the_next(model, tmp_path):
    out = tmp_path / "art"
    p = _start_export(model, out)
    p.kill()
    p.wait()
    stale = scratch_folders(out)
    assert len(stale) == 1
    look_alike = tmp_path / ".art.tmp-abcd1234"          # our name pattern, no marker: a user's folder
    look_alike.mkdir()
    (look_alike / "data.txt").write_text("user data")
    wrong_marker = tmp_path / ".art.tmp-wxyz5678"        # a marker naming another target
    wrong_marker.mkdir()
    (wrong_marker / fsio.MARKER).write_text("dllm-deploy scratch folder for other\n")
    assert main(["export", "--model", str(model), "--out", str(out), "--json"]) == 0
    assert not stale[0].exists()
    assert (look_alike / "data.txt").read_text() == "user data"
    assert (wrong_marker / fsio.MARKER).exists()
    read_manifest(out, verify=True)


# --- places that cannot be written ---------------------------------------------------------------

@pytest.mark.parametrize("where", ["under a regular file", "/proc"])
def test_unwritable_out_is_one_line(where, model, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    out = str(tmp_path / "f" / "x" / "art") if where == "under a regular file" else "/proc/dllm-deploy-test/art"
    assert main(["export", "--model", str(model), "--out", out]) == 2
    assert out in one_error_line(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "x"


def test_read_only_parent_is_one_line_as_a_non_root_user():
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed: cannot drop root privileges to test permissions")
    base = Path(tempfile.mkdtemp(prefix="dllm-ro-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir(mode=0o755)                             # owned by root: nobody may not write here
        probe = subprocess.run([*setpriv, "touch", str(ro / "probe")], capture_output=True)
        if probe.returncode == 0 or subprocess.run([*setpriv, "true"]).returncode != 0:
            pytest.skip("cannot run as a non-root user without write access here")
        for out in (ro / "art", ro / "new" / "art"):
            p = cli("export", "--model", "tiny", "--out", str(out), prefix=setpriv, cwd=base)
            assert p.returncode == 2, p.stderr
            line = one_error_line(p.stderr)
            assert str(out) in line and "Permission denied" in line
        assert list(ro.iterdir()) == []
    finally:
        shutil.rmtree(base)


# --- bench --tune overlay and build-engines replace only their own files -------------------------

def test_tune_overlay_replaces_only_an_overlay_it_wrote(tmp_path, capsys):
    foreign = tmp_path / "mine.yaml"
    foreign.write_text("name: mine\nbackends: [ort]\n")
    with pytest.raises(UserError, match="not a profile overlay written by bench --tune"):
        write_yaml(foreign, {"name": "x-tuned", "tuned": {"pick": "a"}})
    assert foreign.read_text() == "name: mine\nbackends: [ort]\n"
    # refused before any measuring (the artifact is not even looked at)
    assert main(["bench", "--artifact", str(tmp_path / "nowhere"), "--tune", "--tune-out", str(foreign)]) == 2
    assert str(foreign) in one_error_line(capsys.readouterr().err)
    ours = tmp_path / "x-tuned.yaml"
    write_yaml(ours, {"name": "x-tuned", "tuned": {"pick": "a"}})
    write_yaml(ours, {"name": "x-tuned", "tuned": {"pick": "b"}})
    assert yaml.safe_load(ours.read_text())["tuned"]["pick"] == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml", "x-tuned.yaml"]


def test_engine_build_replaces_only_recorded_engine_files(tmp_path):
    wanted = {"profile": "h100", "graphs": {g: {"plan": f"engines/h100/{g}.plan"} for g in ("prefill", "verify")}}
    cache = tmp_path / "engines" / "h100" / "timing.cache"
    check_engine_targets(tmp_path, None, wanted, cache)                  # nothing there yet
    cache.parent.mkdir(parents=True)
    (cache.parent / "verify.plan").write_bytes(b"user file")
    with pytest.raises(UserError, match="verify.plan: exists but manifest.json records no engine there"):
        check_engine_targets(tmp_path, None, wanted, cache)
    check_engine_targets(tmp_path, wanted, wanted, cache)                # recorded by us: replaceable
    (cache.parent / "verify.plan").unlink()
    cache.write_bytes(b"user file")
    with pytest.raises(UserError, match="timing.cache: exists but manifest.json records no engines"):
        check_engine_targets(tmp_path, None, wanted, cache)
