"""One verification forward of two (or more) artifacts' graphs, interleaved in one process.

Runs each artifact's fp32 verify graph in ONNX Runtime on the same random feeds, alternating the
sessions in rounds of 10 calls, and prints the median milliseconds per call and the ratio to the
first artifact. Interleaving is what makes a few percent visible: separate runs on a shared
machine drift by more than that. Shapes: B,T,P = rows, tokens per row (W * L), cached prefix.

    PYTHONPATH=$PWD .venv/bin/python lab/forward_ab.py build/art-old build/art-new [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

SHAPES = [(1, 32, 128), (1, 128, 128), (8, 32, 128), (1, 32, 32)]


def session(art: str, threads: int):
    import onnxruntime as ort
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.runtime.backends.ort import session_threads
    m = read_manifest(art, verify=False)
    so = ort.SessionOptions()
    session_threads(so, threads)
    return ort.InferenceSession(f"{art}/{m['precisions']['fp32']['verify']}", so, providers=["CPUExecutionProvider"])


def feeds(sess, b: int, t: int, p: int, rng) -> dict:
    out = {}
    for i in sess.get_inputs():
        n = i.name
        if n == "input_ids":
            out[n] = rng.integers(0, 200, (b, t)).astype(np.int64)
        elif n == "position_ids":
            out[n] = np.tile(np.arange(t) + p, (b, 1)).astype(np.int64)
        elif n == "attention_mask":
            out[n] = np.ones((b, 1, t, p + t), bool)
        elif n.startswith("past_key_values."):
            out[n] = rng.standard_normal((b, i.shape[1], p, i.shape[3])).astype(np.float32)
        elif n == "sample_u":
            out[n] = rng.random((b, t)).astype(np.float32)
        elif n == "top_k":
            out[n] = np.zeros(b, np.int64)
        elif n == "top_p":
            out[n] = np.ones(b, np.float32)
        else:                                   # temperature: 0, greedy
            out[n] = np.zeros(b, np.float32)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    sessions = [session(x, a.threads) for x in a.artifacts]
    rng = np.random.default_rng(0)
    rows = []
    for b, t, p in SHAPES:
        f = feeds(sessions[0], b, t, p, rng)
        times = [[] for _ in sessions]
        for s in sessions:
            for _ in range(10):
                s.run(None, f)
        for _ in range(a.rounds):
            for j, s in enumerate(sessions):
                for _ in range(10):
                    t0 = time.perf_counter()
                    s.run(None, f)
                    times[j].append(time.perf_counter() - t0)
        ms = [1000 * float(np.median(x)) for x in times]
        rows.append({"B": b, "T": t, "P": p, "ms": dict(zip(a.artifacts, ms)),
                     "ratio_to_first": [ms[0] / x for x in ms]})
        print(f"B={b} T={t:3d} P={p:3d}  " + "  ".join(f"{x:7.3f} ms" for x in ms)
              + "  first/each " + " ".join(f"{r:.3f}" for r in rows[-1]["ratio_to_first"][1:]))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"artifacts": a.artifacts, "threads": a.threads, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
