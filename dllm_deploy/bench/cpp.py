"""The C++ runtime as a bench backend: ``dllm-generate --json`` over a prompts file, one process a
configuration (``bench --backends cpp``; DiffusionGemma's ``bench --backends cpp`` too)."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import UserError


def cpp_binary() -> Path:
    """The C++ example binary (``make cpp``); DLLM_DEPLOY_CPP overrides the path."""
    p = Path(os.environ.get("DLLM_DEPLOY_CPP") or Path(__file__).resolve().parents[2] / "build" / "cpp" / "dllm-generate")
    if not p.exists():
        raise UserError(f"backend 'cpp' needs the C++ build ({p} is missing): run `make cpp`")
    return p


def cpp_generate(binary, artifact: str, prompts: list[str], flags: list[str]) -> list[dict]:
    """``dllm-generate --json`` of ``prompts`` in one process (--prompts-file) with ``flags``: its
    result objects, one per prompt (a failure: UserError with the binary's last stderr line)."""
    with tempfile.TemporaryDirectory() as d:
        pf = f"{d}/prompts.jsonl"
        with open(pf, "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in prompts)
        r = subprocess.run([str(binary), "--artifact", str(artifact), "--prompts-file", pf, "--json", *flags],
                           capture_output=True, text=True, check=False)
    if r.returncode:
        raise UserError(f"C++ runtime failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()]


def run_cpp(binary, artifact: str, examples, kwargs: dict, max_beam_width: int | None) -> dict:
    """Decode ``examples`` with the C++ runtime in one process (--prompts-file); returns the same
    summary keys as the Python path. Wall time is the sum of the per-prompt decode times the
    binary reports (session load and process start excluded, as the Python side excludes load)."""
    from ..evals import tasks
    flags = []
    for k, v in kwargs.items():
        if v is not None:
            flags += [f"--{k.replace('_', '-')}", str(v)]
    if max_beam_width:
        flags += ["--max-beam-width", str(max_beam_width)]
    rows = cpp_generate(binary, artifact, [e.prompt for e in examples], flags)
    ok = sum(tasks.score(e, row["text"]) for e, row in zip(examples, rows))
    return {"accuracy": ok / len(rows), "tokens": sum(x["tokens"] for x in rows), "forwards": sum(x["forwards"] for x in rows),
            "wall_s": sum(x["wall_s"] for x in rows), "backend_s": sum(x["backend_s"] for x in rows)}
