"""GPU check for `dllm-deploy bench` (run by hand where a GPU is lent; not collected by pytest):

    python tests/gpu/check_bench_gpu.py [--out lab/gpu] [--backends torch,ort] [--no-plots]

Exports the tiny model, then runs the bench's table with the torch backend on CUDA (and ONNX
Runtime, on whatever providers this environment's onnxruntime has): forward cost against W*L
for W = 1..16 (where a GPU forward is memory-bound, extra branches should be nearly free), TPF,
tokens/s and the targets; writes bench.json, BENCHMARKS.md and the plots under --out. Its last
line, ``summary: ...``, is the row tests/gpu/run_all.sh prints.
Exits 0 with a message where no GPU is present. Under 5 minutes on a datacenter GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="lab/gpu")
    ap.add_argument("--backends", default="torch,ort")
    ap.add_argument("--no-plots", action="store_true", help="bench.json and BENCHMARKS.md only")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    from dllm_deploy.cli import main as cli
    from dllm_deploy.export.exporter import export
    out = Path(a.out)
    plots = [] if a.no_plots else ["--plots", str(out / "plots")]
    with tempfile.TemporaryDirectory() as d:
        art = Path(d) / "tiny"
        export("tiny", art, precisions=["fp32"], max_beam_width=16, log=print)
        rc = cli(["bench", "--artifact", str(art), "--backends", a.backends, "--device", "cuda",
                  "--strategies", "vanilla,threshold,spd", "--beam-widths", "1,2,4,8,16", "--n", "2", "--repeats", "2",
                  "--gen-length", "128", "--json-out", str(out / "bench.json")] + plots)
        if rc:
            return rc
    print(f"device {torch.cuda.get_device_name(0)}")
    rc = cli(["report", str(out / "bench.json"), "--out", str(out / "BENCHMARKS.md")] + plots)
    print(summary(json.loads((out / "bench.json").read_text())))
    return rc


def summary(bench: dict) -> str:
    """One line: the forward cost per W of each backend, and each backend's best tokens/s."""
    parts = []
    for be, curve in bench["forward_cost"].items():
        cost = ", ".join(f"W{c['beam_width']} {c['ms']:.1f}" for c in curve if c)
        best = max((r for r in bench["runs"] if r["backend"] == be), key=lambda r: r["tokens_per_s"], default=None)
        parts.append(f"{be}: forward ms {cost}" + (f"; best {best['tokens_per_s']:.0f} tok/s ({best['label']})" if best else ""))
    return "summary: " + " | ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
