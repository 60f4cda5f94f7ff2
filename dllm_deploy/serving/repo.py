"""``dllm-deploy triton-repo``: a Triton model repository for a stock tritonserver.

    REPO/dllm/config.pbtxt          Python backend, dynamic batching (max_batch_size from the
    REPO/dllm/1/model.py            profile's decode.batch or --max-batch-size), one instance
    REPO/dllm_stream/config.pbtxt   the same, decoupled (streaming), no Triton batching: the
    REPO/dllm_stream/1/model.py     model batches the requests it holds itself
    REPO/.dllm-deploy-triton-repo   marks the folder as written here (a rewrite may replace it)

model.py is serving/triton_model.py; the config's parameters carry the artifact's absolute path
(the repository refers to the artifact, it does not copy it), the profile, the decode defaults and
the limits. Written in a scratch folder beside REPO and renamed into place (artifact/fsio.py):
an existing folder is replaced only when it carries the marker, and only with --force.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..artifact.fsio import atomic_write, clean_stale, lock_target, remove_temp_dir, replace_dir, temp_dir
from ..errors import UserError
from .contract import INPUTS, OUTPUTS, Limits
from .server import PLAIN, STREAM

MARKER = ".dllm-deploy-triton-repo"
_TYPES = {bytes: "TYPE_STRING", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "uint64": "TYPE_UINT64",
          "bool": "TYPE_BOOL"}


def _type(dtype) -> str:
    return _TYPES[bytes] if dtype is bytes else _TYPES[np.dtype(dtype).name]


def _tensor(name: str, dtype, shape, optional: bool = False) -> str:
    dims = ", ".join(str(d) for d in shape)
    return (f'  {{ name: "{name}" data_type: {_type(dtype)} dims: [ {dims} ]'
            f'{" optional: true" if optional else ""} }}')


def config_pbtxt(name: str, decoupled: bool, max_batch: int, kind: str, params: dict) -> str:
    """One model's config: the tensors of contract.py, one instance of ``kind`` (KIND_CPU or
    KIND_GPU), dynamic batching (plain model) or the decoupled transaction policy."""
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {0 if decoupled else max_batch}",
             "input [", ",\n".join(_tensor(*t) for t in INPUTS), "]",
             "output [", ",\n".join(_tensor(*t) for t in OUTPUTS), "]",
             f"instance_group [ {{ count: 1 kind: {kind} }} ]"]
    lines += ["model_transaction_policy { decoupled: true }"] if decoupled else ["dynamic_batching { }"]
    for key, value in params.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: {json.dumps(value)} }} }}')
    return "\n".join(lines) + "\n"


def _check_target(out: Path, force: bool) -> None:
    """A user's folder is never replaced: only an empty one or one this command wrote (--force)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise UserError(f"--out {out}: a folder that dllm-deploy triton-repo did not write; pick another path")
        if not force:
            raise UserError(f"--out {out}: a model repository is already there; --force replaces it")


def write_repo(out: str | Path, artifact: str | Path, profile, defaults: dict, limits: Limits, max_batch: int,
               force: bool = False) -> Path:
    """Write the repository at ``out`` atomically; returns its path."""
    out, artifact = Path(out).absolute(), Path(artifact).resolve()
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: its parent folder does not exist")
    kind = "KIND_CPU" if profile.match.get("kind", "cpu") == "cpu" else "KIND_GPU"
    params = {"artifact": str(artifact), "profile": profile.name, "defaults": json.dumps(defaults),
              "limits": json.dumps(limits.__dict__), "max_batch": str(max_batch)}
    model_py = (Path(__file__).parent / "triton_model.py").read_text()
    _check_target(out, force)                 # a refused folder gets no lock file beside it either
    with lock_target(out):
        clean_stale(out)
        _check_target(out, force)
        scratch = temp_dir(out)
        try:
            new = scratch / "new"
            for name, decoupled in ((PLAIN, False), (STREAM, True)):
                (new / name / "1").mkdir(parents=True)
                atomic_write(new / name / "config.pbtxt", config_pbtxt(name, decoupled, max_batch, kind, params))
                atomic_write(new / name / "1" / "model.py", model_py)
            atomic_write(new / MARKER, f"written by dllm-deploy triton-repo from {artifact}\n")
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()
            replace_dir(new, out, scratch)
        finally:
            remove_temp_dir(scratch)
    return out
