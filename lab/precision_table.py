"""Accuracy, TPF, artifact size and tokens/s of each precision variant of one artifact, in one run.

    PYTHONPATH=$PWD .venv/bin/python -m dllm_deploy.cli export --model tiny --out build/prec --precision fp32,int8,int4
    PYTHONPATH=$PWD .venv/bin/python lab/precision_table.py --artifact build/prec --n 50 --json out.json

Each precision is evaluated by ``dllm-deploy eval --artifact A --precision P --json`` in its own
process, one after the other (the held-out split, default decode options, ONNX Runtime CPU), so the
variants share nothing but the machine. Size = the variant's files (graphs + weights.bin).
Prints a markdown table (docs/precision.md) and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def variant_bytes(artifact: Path, files: dict) -> int:
    return sum((artifact / rel).stat().st_size for rel in files.values())


def eval_precision(artifact: Path, precision: str, n: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "dllm_deploy.cli", "eval", "--artifact", str(artifact), "--precision", precision,
           "--n", str(n), "--json", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if p.returncode:
        raise SystemExit(f"eval {precision} failed: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--precisions", default="fp32,int8,int4")
    ap.add_argument("--n", type=int, default=50, help="prompts per task family (6 families)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("eval_flags", nargs=argparse.REMAINDER, help="after --: more `dllm-deploy eval` flags")
    a = ap.parse_args()
    manifest = json.loads((a.artifact / "manifest.json").read_text())
    extra = [f for f in a.eval_flags if f != "--"]
    rows = []
    for prec in [p.strip() for p in a.precisions.split(",") if p.strip()]:
        res = eval_precision(a.artifact, prec, a.n, extra)
        o = res["overall"]
        rows.append({"precision": prec, "accuracy": o["accuracy"], "n": o["n"], "tpf": o["tpf"],
                     "tokens_per_s": o["tokens_per_s"], "strategy": res["strategy"],
                     "size_mb": variant_bytes(a.artifact, manifest["precisions"][prec]) / 1e6,
                     "quantization": manifest.get("quantization", {}).get(prec),
                     "tasks": {k: v["accuracy"] for k, v in res["tasks"].items()}})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    print("| precision | accuracy | prompts | TPF | tokens/s | artifact MB (graphs + weights) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['precision']} | {r['accuracy']:.3f} | {r['n']} | {r['tpf']:.2f} | {r['tokens_per_s']:.0f} "
              f"| {r['size_mb']:.2f} |")


if __name__ == "__main__":
    main()
