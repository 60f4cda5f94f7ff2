"""int8 variants of one model side by side: fidelity to fp32, forward time and (optionally) accuracy.

Exports the model once per int8 recipe (one scale per weight tensor; one per output channel;
with SmoothQuant; with the down-projections kept fp32; both: the exporter's default; 7-bit
weights, `--int8-reduce-range`, alone and on the default; --recipes picks some by number), then
- fidelity: dllm_deploy/evals/fidelity.py on held-out decode states (logit error, top-1 agreement,
  top-1 probability error against fp32);
- forward time: each variant's verify graph on the same feeds (1 row, 32 tokens after a 64-token
  cache), interleaved in rounds with fp32's in one process, median ms;
- with --eval-n N: `dllm-deploy eval --precision int8` of each variant on N held-out prompts per
  family, with the eval flags given after `--` (fp32 too).

    PYTHONPATH=$PWD .venv/bin/python lab/int8_fidelity.py --json lab/int8-fidelity.json \\
        --eval-n 50 -- --gen-length 128 --strategy threshold --threshold 0.98 --threshold-far 0.999 --threshold-lead 0.7
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPES = {      # name: export keywords
    "per-tensor": {"int8_per_channel": False, "int8_smooth": 0, "int8_fp32": []},
    "per-channel": {"int8_smooth": 0, "int8_fp32": []},
    "per-channel + smooth 0.5": {"int8_fp32": []},
    "per-channel + fp32 down_proj": {"int8_smooth": 0},
    "per-channel + smooth 0.5 + fp32 down_proj (default)": {},
    "per-channel + reduce_range": {"int8_smooth": 0, "int8_fp32": [], "int8_reduce_range": True},
    "default + reduce_range": {"int8_reduce_range": True},
}


def forward_ms(variants: dict, rounds: int = 30) -> dict:
    """Median ms of one verify call per variant (name -> graph path), interleaved."""
    import onnxruntime as ort

    from forward_ab import feeds
    from dllm_deploy.runtime.backends.ort import session_threads
    sessions = {}
    for name, path in variants.items():
        so = ort.SessionOptions()
        session_threads(so, 2)
        sessions[name] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    f = feeds(next(iter(sessions.values())), 1, 32, 64, np.random.default_rng(0))
    times = {n: [] for n in sessions}
    for s in sessions.values():
        for _ in range(10):
            s.run(None, f)
    for _ in range(rounds):
        for n, s in sessions.items():
            for _ in range(10):
                t0 = time.perf_counter()
                s.run(None, f)
                times[n].append(time.perf_counter() - t0)
    return {n: 1000 * float(np.median(t)) for n, t in times.items()}


def accuracy(artifact: Path, precision: str, n: int, flags: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "dllm_deploy.cli", "eval", "--artifact", str(artifact), "--precision",
                        precision, "--n", str(n), "--json", *flags], capture_output=True, text=True, env=env, check=False)
    if p.returncode:
        raise SystemExit(f"eval failed: {p.stderr.strip()[-2000:]}")
    o = json.loads(p.stdout.strip().splitlines()[-1])
    return {"accuracy": o["overall"]["accuracy"], "tpf": o["overall"]["tpf"],
            "tasks": {k: v["accuracy"] for k, v in o["tasks"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "int8-fidelity", help="where the variants are exported")
    ap.add_argument("--states", type=int, default=10, help="held-out decode states per family")
    ap.add_argument("--eval-n", type=int, default=0, help="also eval each variant on N prompts per family (0: no)")
    ap.add_argument("--recipes", default="", help="comma-separated numbers of RECIPES to run (default: all; the "
                    "first one given also exports fp32)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("eval_flags", nargs=argparse.REMAINDER, help="after --: `dllm-deploy eval` flags")
    a = ap.parse_args()
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.evals.fidelity import compare, decode_states
    from dllm_deploy.export.exporter import export
    from dllm_deploy.models.tokenizer import load_tokenizer
    flags = [f for f in a.eval_flags if f != "--"]
    rows, graphs = [], {}
    chosen = [int(x) for x in a.recipes.split(",") if x.strip()] or range(len(RECIPES))
    for i, (name, kw) in enumerate(RECIPES.items()):
        if i not in chosen:
            continue
        out = a.work / f"v{i}"
        export(a.model, out, precisions=["fp32", "int8"], force=out.exists(), log=lambda m: None, **kw)
        m = read_manifest(out, verify=False)
        if "fp32" not in graphs:
            cfg = m["model"]
            states = decode_states(load_tokenizer(out, cfg["eos_token_id"]), cfg["mask_token_id"], m["block_length"],
                                   n=a.states)
            graphs["fp32"] = out / m["precisions"]["fp32"]["verify"]
            fp32_dir = out
        graphs[name] = out / m["precisions"]["int8"]["verify"]
        size = sum((out / f).stat().st_size for f in m["precisions"]["int8"].values())
        rows.append({"recipe": name, "quantization": m["quantization"]["int8"], "size_mb": size / 1e6,
                     **compare(out, "int8", states)})
        if a.eval_n:
            rows[-1]["eval"] = accuracy(out, "int8", a.eval_n, flags)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ms = forward_ms(graphs)
    for r in rows:
        r["forward_ms"], r["speedup_vs_fp32"] = ms[r["recipe"]], ms["fp32"] / ms[r["recipe"]]
    from int8_saturation import machine
    res = {"model": a.model, "machine": machine(), "fp32_forward_ms": ms["fp32"], "shape": {"B": 1, "T": 32, "P": 64}, "rows": rows,
           "eval_flags": flags if a.eval_n else None}
    if a.eval_n:
        res["fp32_eval"] = accuracy(fp32_dir, "fp32", a.eval_n, flags)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    acc = a.eval_n > 0
    print("| int8 recipe | logit error | top-1 agreement | top-1 prob error | forward ms (fp32 "
          f"{ms['fp32']:.2f}) | MB |" + (" accuracy | TPF |" if acc else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if acc else ""))
    for r in rows:
        line = (f"| {r['recipe']} | {r['logit_error']:.3f} | {r['top1_agreement']:.3f} | {r['top1_prob_error']:.4f} | "
                f"{r['forward_ms']:.2f} ({r['speedup_vs_fp32']:.2f}x) | {r['size_mb']:.2f} |")
        if acc:
            line += f" {r['eval']['accuracy']:.3f} | {r['eval']['tpf']:.2f} |"
        print(line)
    if acc:
        print(f"| fp32 | | | | {ms['fp32']:.2f} | | {res['fp32_eval']['accuracy']:.3f} | {res['fp32_eval']['tpf']:.2f} |")


if __name__ == "__main__":
    main()
