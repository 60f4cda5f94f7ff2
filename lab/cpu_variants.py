"""What ONNX Runtime's CPU provider makes of each precision variant of an artifact's verify graph
(docs/precision.md, docs/peers.md): the products' weight types in the optimized graph, the Casts
it added, ms per call (2 threads, 160 tokens, medians of interleaved rounds), where a call's time
goes by operator (ONNX Runtime's profiler), and the process's resident memory after loading the
session (one fresh process per load).

    PYTHONPATH=$PWD .venv/bin/python lab/cpu_variants.py --artifact build/peers/ckpt-30m-art-prec \\
        --json lab/cpu-variants.json

The artifact needs fp16, int8 and int4 variants (export --precision fp32,fp16,int8,int4).
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PRODUCTS = ("MatMul", "FusedMatMul", "Gemm")
TOKENS, THREADS = 160, 2


def graph(art: Path, prec: str) -> Path:
    return art / "verify.onnx" if prec == "fp32" else art / prec / "verify.onnx"


def session(path: Path, optimized: Path | None = None, profile: str | None = None):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized:
        so.optimized_model_filepath = str(optimized)
    if profile:
        so.enable_profiling, so.profile_file_prefix = True, profile
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def op_shares(path: Path, calls: int) -> dict:
    """Each operator type's share of the kernel time of ``calls`` calls (after one warm-up), top 5."""
    with tempfile.TemporaryDirectory() as d:
        s = session(path, profile=str(Path(d) / "p"))
        f = feeds(s)
        for _ in range(calls + 1):
            s.run(None, f)
        events = json.loads(Path(s.end_profiling()).read_text())
    by = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by[e["args"]["op_name"]] += e["dur"]
    total = sum(by.values())
    return {op: round(us / total, 3) for op, us in by.most_common(5)}


def feeds(s) -> dict:
    """One row of TOKENS random ids attending to each other, an empty cache, greedy sampling."""
    from dllm_deploy.evals.fidelity import prefill_feeds
    ids = np.random.default_rng(0).integers(0, 4000, (1, TOKENS))
    state = (ids, np.arange(TOKENS)[None], np.ones((1, 1, TOKENS, TOKENS), bool), 0)
    return prefill_feeds(s.get_inputs(), state)


def graph_facts(path: Path) -> dict:
    import onnx
    with tempfile.TemporaryDirectory() as d:
        session(path, Path(d) / "opt.onnx")
        opt = onnx.load(str(Path(d) / "opt.onnx"), load_external_data=False)
    inits = {t.name: onnx.TensorProto.DataType.Name(t.data_type) for t in opt.graph.initializer}
    weights = collections.Counter(inits.get(n.input[1], "activation") for n in opt.graph.node if n.op_type in PRODUCTS)
    return {"product_weights": dict(weights), "casts": sum(n.op_type == "Cast" for n in opt.graph.node)}


def resident_mb(path: Path) -> float:
    """Resident memory a fresh process gains by loading ``path``'s session."""
    code = ("import os, sys; sys.path.insert(0, %r); import cpu_variants as f; page = os.sysconf('SC_PAGE_SIZE')\n"
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * page\n"
            "import onnxruntime; r0 = rss(); s = f.session(f.Path(%r)); print((rss() - r0) / 2**20)"
            % (str(Path(__file__).parent), str(path)))
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    art, precs = Path(a.artifact), ("fp32", "fp16", "int8", "int4")
    sessions = {p: session(graph(art, p)) for p in precs}
    inputs = {p: feeds(s) for p, s in sessions.items()}
    for p, s in sessions.items():
        s.run(None, inputs[p])
    ms = {p: [] for p in precs}
    for _ in range(a.rounds):
        for p, s in sessions.items():
            t = time.perf_counter()
            for _ in range(a.calls):
                s.run(None, inputs[p])
            ms[p].append(1000 * (time.perf_counter() - t) / a.calls)
    rows = [{"precision": p, "ms_per_call": round(statistics.median(ms[p]), 2), "resident_mb": round(resident_mb(graph(art, p)), 1),
             **graph_facts(graph(art, p)), "op_shares": op_shares(graph(art, p), a.calls)} for p in precs]
    import onnxruntime
    out = {"artifact": str(art), "tokens": TOKENS, "threads": THREADS, "onnxruntime": onnxruntime.__version__,
           "machine": platform.machine(), "rows": rows}
    for r in rows:
        print(f"{r['precision']:<5} {r['ms_per_call']:7.2f} ms/call  {r['resident_mb']:6.1f} MB  products' weights "
              f"{r['product_weights']}  casts {r['casts']}  time by op {r['op_shares']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
