"""GPU check for `dllm-deploy bench` (run by hand where a GPU is lent; not collected by pytest):

    python tests/gpu/check_bench_gpu.py [--out benchmarks/gpu]

Exports the tiny model, then runs the bench's table with the torch backend on CUDA (and ONNX
Runtime, on whatever providers this environment's onnxruntime has): forward cost against W*L
for W = 1..16 (where a GPU forward is memory-bound, extra branches should be nearly free), TPF,
tokens/s and the targets; writes bench.json, BENCHMARKS.md and the plots under --out.
Exits 0 with a message where no GPU is present. Under 5 minutes on a datacenter GPU.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/gpu")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    from dllm_deploy.cli import main as cli
    from dllm_deploy.export.exporter import export
    out = Path(a.out)
    with tempfile.TemporaryDirectory() as d:
        art = Path(d) / "tiny"
        export("tiny", art, precisions=["fp32"], max_beam_width=16, log=print)
        rc = cli(["bench", "--artifact", str(art), "--backends", "torch,ort", "--device", "cuda",
                  "--strategies", "vanilla,threshold,spd", "--beam-widths", "1,2,4,8,16", "--n", "2", "--repeats", "2",
                  "--gen-length", "128", "--json", str(out / "bench.json"), "--plots", str(out / "plots")])
        if rc:
            return rc
    print(f"device {torch.cuda.get_device_name(0)}")
    return cli(["report", str(out / "bench.json"), "--out", str(out / "BENCHMARKS.md"), "--plots", str(out / "plots")])


if __name__ == "__main__":
    sys.exit(main())
