"""Each class of user mistake ends in one line on stderr and exit 2 (or a correct result), as a
user runs the CLI: unreadable files (as a non-root user: root ignores chmod), a file given as an
artifact folder, prompts that are not UTF-8, bad escapes, broken user profiles, --steps < 1."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from dllm_deploy.errors import UserError
from dllm_deploy.models.loading import TINY_DIR
from dllm_deploy.models.tokenizer import ByteTokenizer
from dllm_deploy.text import decode_escapes
from dllm_deploy.runtime.api import decode_config

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def cli(*args, env: dict | None = None, as_nobody: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dllm_deploy.cli ARGS`` in a subprocess (PYTHONPATH inherited); ``as_nobody``
    drops root's privileges first, so that chmod 000 files really are unreadable."""
    cmd = [sys.executable, "-m", "dllm_deploy.cli", *args]
    if as_nobody and os.geteuid() == 0:
        cmd = NOBODY + cmd
    return subprocess.run(cmd, capture_output=True, env={**os.environ, **(env or {})}, timeout=timeout, check=False)


def one_error(p: subprocess.CompletedProcess, *names: str) -> str:
    """Assert exit 2 and exactly one `dllm-deploy: error:` line on stderr naming each of ``names``."""
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("dllm-deploy: error: "), err
    for name in names:
        assert name in err, (name, err)
    return err


@pytest.fixture(scope="module")
def shared_tmp():
    """A folder a non-root user can enter (pytest's tmp_path is private to root), with a writable
    HOME for that user (ONNX Runtime writes there, and warns on stderr when it cannot)."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot drop privileges to test unreadable files")
        probe = subprocess.run(NOBODY + [sys.executable, "-c", "import dllm_deploy"], capture_output=True, check=False)
        if probe.returncode != 0:
            pytest.skip(f"user 65534 cannot import dllm_deploy here: {probe.stderr.decode()[-200:]}")
    d = Path(tempfile.mkdtemp(prefix="dllm-user-errors-"))
    d.chmod(0o755)
    (d / "home").mkdir(mode=0o777)
    (d / "home").chmod(0o777)
    yield d
    for root, dirs, _ in os.walk(d):     # top-down: a chmod 000 folder is opened before it is entered
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(d)


def _unreadable_copy(src: Path, dst: Path, target: str | None) -> Path:
    """A world-readable copy of ``src`` whose ``target`` (or the folder itself, when None) is chmod 000."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (dst / target if target else dst).chmod(0)
    return dst


# -- artifacts: unreadable files, a file given as the folder ---------------------------------------

@pytest.mark.parametrize("target", [None, "manifest.json", "verify.onnx"])
def test_unreadable_artifact_is_one_line(tiny_artifact, shared_tmp, target):
    art = _unreadable_copy(tiny_artifact[0], shared_tmp / f"art-{target or 'folder'}", target)
    p = cli("generate", "--artifact", str(art), "--profile", "generic-cpu", "--prompt", "x", "--gen-length", "8",
            env={"HOME": str(shared_tmp / "home")}, as_nobody=True)
    one_error(p, str(art / target if target else art), "permission denied")


def test_a_file_as_artifact_says_not_a_folder(tmp_path):
    f = tmp_path / "model.onnx"
    f.write_text("not a folder")
    one_error(cli("generate", "--artifact", str(f), "--prompt", "x"), str(f), "not a folder", "manifest.json")


def test_unreadable_safetensors_is_permission_denied(shared_tmp):
    model = _unreadable_copy(TINY_DIR, shared_tmp / "model", "model.safetensors")
    err = one_error(cli("generate", "--model", str(model), "--prompt", "x", "--gen-length", "8", as_nobody=True),
                    str(model / "model.safetensors"), "permission denied")
    assert "no such file" not in err.lower()


# -- prompts ------------------------------------------------------------------------------------------

def test_prompt_that_is_not_utf8_is_decoded_with_replacement_characters():
    p = subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "generate", "--prompt", b"upper: ab\xffcd\n",
                        "--gen-length", "8", "--json"], capture_output=True, check=False, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["tokens"] > 0
    # what the model saw: one U+FFFD for the bad byte, the rest as typed
    assert ByteTokenizer().encode("ab\udcffcd") == list("ab\ufffdcd".encode())


@pytest.mark.parametrize("prompt", ["abc\\x", "abc\\", "abc\\q", "\\u12"])
def test_bad_escape_is_one_line_naming_the_flag(prompt):
    one_error(cli("generate", "--escapes", "--prompt", prompt), "--escapes")


def test_escapes_keep_non_ascii_text():
    assert decode_escapes("é\\n日本\\t\\u00e9\\x41\\\\") == "é\n日本\téA\\"


# -- --steps ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", ["0", "-3"])
def test_steps_below_one_is_refused(steps):
    one_error(cli("generate", "--prompt", "x", "--steps", steps), "--steps", f"got {steps}")
    with pytest.raises(UserError, match="--steps must be >= 1"):
        decode_config(steps=int(steps))


# -- user profiles ------------------------------------------------------------------------------------------

_GOOD = {"match": {"kind": "cpu"}, "backends": ["CPUExecutionProvider"]}
BROKEN = {   # file name -> (contents, what the message names besides the file)
    "not-utf8": (b"name: not-utf8\n\xff\xfe: x\n", "not UTF-8"),
    "backends": ({**_GOOD, "backends": [1, 2]}, "backends"),
    "beam": ({**_GOOD, "decode": {"beam_width": 0}}, "decode.beam_width"),
    "strategy": ({**_GOOD, "decode": {"strategy": "greedy"}}, "decode.strategy"),
    "threshold": ({**_GOOD, "decode": {"threshold": 7.5}}, "decode.threshold"),
    "block": ({**_GOOD, "decode": {"block_length": 0}}, "decode.block_length"),
    "maxseq": ({**_GOOD, "decode": {"max_seq": -5}}, "decode.max_seq"),
    "threads": ({**_GOOD, "ort": {"intra_op_threads": -4}}, "ort.intra_op_threads"),
    "reserve": ({**_GOOD, "memory": {"reserve_mb": -100000}}, "memory.reserve_mb"),
}


def _write_profile(folder: Path, name: str, body) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{name}.yaml"
    f.write_bytes(body if isinstance(body, bytes) else yaml.safe_dump({"name": name, **body}).encode())
    return f


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_user_profile(tmp_path, name):
    body, key = BROKEN[name]
    f = _write_profile(tmp_path / "profiles", name, body)
    env = {"DLLM_DEPLOY_PROFILES": str(f.parent)}
    one_error(cli("profiles", "show", name, env=env), str(f), key)          # naming it: the error
    other = cli("profiles", "show", "generic-cpu", "--json", env=env)      # naming another: a warning
    err = other.stderr.decode()
    assert other.returncode == 0, err
    assert err.startswith("dllm-deploy: warning: ") and len(err.splitlines()) == 1 and str(f) in err
    assert json.loads(other.stdout)["name"] == "generic-cpu"


def test_folder_named_yaml_is_skipped(tmp_path):
    (tmp_path / "x.yaml").mkdir()
    p = cli("profiles", "show", "x", env={"DLLM_DEPLOY_PROFILES": str(tmp_path)})
    one_error(p, str(tmp_path / "x.yaml"), "is a folder")


def test_unreadable_user_profile(shared_tmp):
    f = _write_profile(shared_tmp / "profiles", "mine", _GOOD)
    f.chmod(0)
    env = {"DLLM_DEPLOY_PROFILES": str(f.parent)}
    one_error(cli("profiles", "show", "mine", env=env, as_nobody=True), str(f), "permission denied")
    other = cli("profiles", "show", "generic-cpu", env=env, as_nobody=True)
    assert other.returncode == 0 and "warning" in other.stderr.decode() and str(f) in other.stderr.decode()


def test_a_broken_profile_does_not_block_a_run_naming_another(tiny_artifact, tmp_path):
    f = _write_profile(tmp_path, "broken", BROKEN["threshold"][0])
    p = cli("generate", "--artifact", str(tiny_artifact[0]), "--profile", "generic-cpu", "--prompt", "upper: ab\n",
            "--gen-length", "8", "--json", env={"DLLM_DEPLOY_PROFILES": str(tmp_path)})
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["tokens"] > 0
    warnings = [ln for ln in p.stderr.decode().splitlines() if ln.startswith("dllm-deploy: warning: ")]
    assert len(warnings) == 1 and str(f) in warnings[0] and "decode.threshold" in warnings[0]
