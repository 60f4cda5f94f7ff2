#!/usr/bin/env python3
"""Regenerate the memory-model table of docs/profiles.md: estimate vs measured peak memory of the
ONNX Runtime CPU backend, W in {1, 2, 4, 8, 16} at two prefix lengths, each in a fresh process.

    python lab/memory_table.py --artifact build/art_mem [--widths 1,2,4,8,16] [--prefixes 64,448]
                                   [--json lab/memory_table.json]

The artifact needs max_beam_width >= the largest W (export it with --max-beam-width 16):
    dllm-deploy export --model tiny --out build/art_mem --max-beam-width 16
Memory does not depend on timing: run it under `nice` on a busy machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--prefixes", default="64,448")
    ap.add_argument("--block-length", type=int, default=None, help="default: the artifact's")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--runs", type=int, default=3, help="verification forwards per configuration")
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    import onnxruntime

    from dllm_deploy.bench.memory import format_table, memory_table
    widths = [int(x) for x in a.widths.split(",")]
    prefixes = [int(x) for x in a.prefixes.split(",")]

    def say(r: dict) -> None:
        print(f"W={r['beam_width']:>2} P={r['prefix_len']:>3}: peak {r['peak_bytes'] / 2**20:6.1f} MiB, "
              f"estimate {r['estimate']['total'] / 2**20:6.1f} MiB, ratio {r['ratio']:.2f}", file=sys.stderr, flush=True)

    rows = memory_table(a.artifact, widths, prefixes, a.block_length, a.precision, a.runs, progress=say)
    print(format_table(rows))
    print(f"\nonnxruntime {onnxruntime.__version__}, {platform.machine()}, {platform.python_version()}; "
          f"ratios {min(r['ratio'] for r in rows):.2f} .. {max(r['ratio'] for r in rows):.2f}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"onnxruntime": onnxruntime.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
