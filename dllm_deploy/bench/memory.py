"""Peak memory of the ONNX Runtime CPU backend, measured: one decode configuration per fresh
process, compared with the memory model's estimate (profiles/memory.py). ``dllm-deploy bench``
and lab/memory_table.py (the docs/profiles.md table) run it; the estimate itself needs no
measurement and stays with the profiles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..profiles.memory import estimate_bytes



def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _warm_ort() -> None:
    """Run a one-node-pair session so ONNX Runtime's one-time costs (library pages, thread
    pools, allocator set-up) land in the baseline rather than in the model's figure."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"]), helper.make_node("Softmax", ["y"], ["z"])],
                          "warm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 4])])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.ones((4, 4), np.float32)})


def _measure_here(artifact: str, beam_width: int, prefix_len: int, block_length: int, batch: int, precision: str,
                  runs: int, threads: int | None) -> dict:
    """The measurement itself (run in a fresh process by measure_peak_bytes)."""
    import numpy as np

    from ..artifact import read_manifest
    from ..models.masks import block_causal_mask, tree_mask
    from ..runtime.backends.ort import OrtBackend
    _warm_ort()
    base = _status()["VmRSS"]
    m = read_manifest(artifact, verify=False, precision=precision)
    be = OrtBackend(artifact, m, precision=precision, threads=threads)            # both sessions, as the runtime
    loaded = _status()["VmRSS"]
    rng = np.random.default_rng(0)
    cache = be.new_cache(batch, prefix_len + beam_width * block_length)
    if prefix_len:                                                                  # the prefix, as the loop builds it
        ids = rng.integers(0, 256, (batch, prefix_len))                             # (B,P)
        pos = np.tile(np.arange(prefix_len), (batch, 1))                            # (B,P)
        causal = block_causal_mask(np.arange(prefix_len))                          # (P,P) one token a block
        be.prefill(cache, ids, pos, np.broadcast_to(causal, (batch, 1, prefix_len, prefix_len)), keep=prefix_len)
        del ids, pos, causal
    after_prefill = _status()["VmHWM"]
    n = beam_width * block_length
    ids = rng.integers(0, 256, (batch, n))                                          # (B,N)
    pos = np.tile(prefix_len + np.arange(block_length), (batch, beam_width))        # (B,N)
    mask = np.broadcast_to(tree_mask(prefix_len, block_length, beam_width), (batch, 1, n, prefix_len + n))  # (B,1,N,P+N)
    for _ in range(runs):
        be.verify(cache, ids, pos, mask)
    peak = _status()["VmHWM"]
    return {"baseline_bytes": base, "loaded_bytes": loaded - base, "prefill_peak_bytes": after_prefill - base,
            "peak_bytes": peak - base, "model": {**m["model"], "kv_shapes": m["kv_shapes"]}}


def measure_peak_bytes(artifact: str | Path, beam_width: int = 1, prefix_len: int = 64, block_length: int | None = None,
                       batch: int = 1, precision: str = "fp32", runs: int = 3, threads: int | None = None,
                       timeout_s: float = 600) -> dict:
    """Peak memory of the ONNX Runtime CPU backend verifying ``beam_width`` branches of
    ``block_length`` tokens over a ``prefix_len``-token cached prefix, and the model's estimate.

    Runs in a fresh Python process (Linux: /proc/self/status): import onnxruntime and run a tiny
    session (baseline = VmRSS then), load the artifact's two sessions as the runtime does,
    prefill the prefix, run ``runs`` verification forwards of W*L tokens under the tree mask;
    peak = VmHWM - baseline. Returns a dict of bytes:

        peak_bytes           the figure to compare (VmHWM - baseline)
        loaded_bytes         after loading both sessions (weights and graphs)
        prefill_peak_bytes   peak after the prefill, before any verification
        baseline_bytes       VmRSS of the process before the artifact was loaded
        estimate             estimate_bytes() for the same configuration (a dict)
        ratio                estimate["total"] / peak_bytes
    plus the configuration (beam_width, prefix_len, block_length, batch, precision, runs)."""
    from ..artifact import read_manifest
    from ..errors import UserError
    if not Path("/proc/self/status").exists():
        raise UserError("memory measurement needs Linux (/proc/self/status)")
    m = read_manifest(artifact, verify=False, precision=precision)
    L = int(block_length or m["block_length"])
    args = {"artifact": str(artifact), "beam_width": int(beam_width), "prefix_len": int(prefix_len), "block_length": L,
            "batch": int(batch), "precision": precision, "runs": int(runs), "threads": threads}
    code = ("import json, sys; from dllm_deploy.bench.memory import _measure_here; "
            "print(json.dumps(_measure_here(**json.loads(sys.argv[1]))))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout_s, env=env, check=False)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"memory measurement failed (W={beam_width}, P={prefix_len}): {last[:300]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    est = estimate_bytes(out.pop("model"), precision, batch, beam_width, L, prefix_len=prefix_len, backend="ort")
    return {**args, **out, "estimate": est, "ratio": est["total"] / max(out["peak_bytes"], 1)}


def memory_table(artifact: str | Path, widths=(1, 2, 4, 8, 16), prefixes=(64, 448), block_length: int | None = None,
                 precision: str = "fp32", runs: int = 3, progress=None) -> list[dict]:
    """measure_peak_bytes over W x P (each in its own process): the docs/profiles.md table."""
    rows = []
    for p in prefixes:
        for w in widths:
            rows.append(measure_peak_bytes(artifact, w, p, block_length, precision=precision, runs=runs))
            if progress:
                progress(rows[-1])
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown: W, P, estimate (with its terms), measured peak, ratio."""
    mb = 2**20
    out = ["| W | P | N = W·L | estimate MiB (weights + KV + prefill + verify) | measured peak MiB | loaded MiB | estimate / measured |",
           "|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        e = r["estimate"]
        out.append(f"| {r['beam_width']} | {r['prefix_len']} | {r['beam_width'] * r['block_length']} "
                   f"| {e['total'] / mb:.1f} = {e['weights'] / mb:.1f} + {e['kv'] / mb:.1f} + {e['prefill'] / mb:.1f}"
                   f" + {e['activations'] / mb:.1f} | {r['peak_bytes'] / mb:.1f} | {r['loaded_bytes'] / mb:.1f} "
                   f"| {r['ratio']:.2f} |")
    return "\n".join(out)
