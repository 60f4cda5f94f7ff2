"""Dynamic int8 on x86 hosts without VNNI: the bundled model's prefill graph as the artifact's int8
variant, and its fp32 graph quantized three ways by ``quantize_dynamic`` (every MatMul, weights
per channel): u8s8 (uint8 activations, int8 weights: what the exporter asks for), u8s8 with
``reduce_range`` (7-bit weights) and u8u8, against the fp32 graph on the same random inputs
(max / mean |logits difference|, top-1 agreement); ms per run, 2 threads.

    dllm-deploy export --model tiny --out build/tiny-q --precision fp32,int8
    .venv/bin/python lab/int8_saturation.py --artifact build/tiny-q --json lab/int8-saturation.json

ONNX Runtime's x86 u8s8 kernels without VNNI multiply-add byte pairs into saturating 16-bit lanes
(vpmaddubsw); its quantization docs name reduce_range and u8u8 as the ways around that. The host's
CPU flags are recorded with the result.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS = {"u8s8": {"weight_type": "QInt8"},
            "u8s8, reduce_range": {"weight_type": "QInt8", "reduce_range": True},
            "u8u8": {"weight_type": "QUInt8"}}


def feeds(session, vocab: int, tokens: int, batch: int, rng) -> dict:
    """A prefill of ``tokens`` random ids per row, no past, full attention, greedy sampler inputs."""
    out = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            out[i.name] = rng.integers(0, vocab - 3, (batch, tokens)).astype(np.int64)
        elif i.name == "position_ids":
            out[i.name] = np.broadcast_to(np.arange(tokens), (batch, tokens)).astype(np.int64).copy()
        elif i.name == "attention_mask":
            out[i.name] = np.ones((batch, 1, tokens, tokens), bool)
        elif i.name.startswith("past_key_values"):
            out[i.name] = np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
        elif i.name == "sample_u":
            out[i.name] = np.zeros((batch, tokens), np.float32)
        elif i.name == "temperature":
            out[i.name] = np.zeros((batch,), np.float32)
        elif i.name == "top_k":
            out[i.name] = np.zeros((batch,), np.int64)
        elif i.name == "top_p":
            out[i.name] = np.ones((batch,), np.float32)
        else:
            raise SystemExit(f"unexpected prefill input {i.name}")
    return out


def ms_per_run(session, inputs: dict, repeats: int = 30) -> float:
    session.run(None, inputs)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, inputs)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def machine() -> dict:
    """The CPU features the int8 kernels depend on (VNNI: no 16-bit saturation), and ORT's version."""
    import onnxruntime as ort
    info = Path("/proc/cpuinfo")
    flags = info.read_text().split("flags", 1)[-1].split("\n", 1)[0].split() if info.exists() else []
    return {"cpu": platform.machine(), "vnni": sorted(f for f in flags if "vnni" in f), "avx512f": "avx512f" in flags,
            "avx2": "avx2" in flags, "onnxruntime": ort.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", required=True, type=Path, help="an fp32 artifact (its prefill.onnx is quantized)")
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    manifest = json.loads((a.artifact / "manifest.json").read_text())
    src = a.artifact / manifest["precisions"]["fp32"]["prefill"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    fp32 = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    inputs = feeds(fp32, manifest["model"]["vocab_size"], a.tokens, a.batch, np.random.default_rng(0))
    ref = fp32.run(["logits"], inputs)[0]
    finite = np.isfinite(ref)
    rows = [{"variant": "fp32", "ms_per_run": ms_per_run(fp32, inputs)}]

    def compare(name: str, path: Path) -> None:
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        got = sess.run(["logits"], inputs)[0]
        diff = np.abs(got[finite] - ref[finite])
        rows.append({"variant": name, "max_abs_logits_diff": float(diff.max()), "mean_abs_logits_diff": float(diff.mean()),
                     "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
                     "ms_per_run": ms_per_run(sess, inputs)})
    if "int8" in manifest["precisions"]:
        compare("the artifact's int8", a.artifact / manifest["precisions"]["int8"]["prefill"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in VARIANTS.items():
            dst = Path(tmp) / "q.onnx"
            quantize_dynamic(str(src), str(dst), per_channel=True, op_types_to_quantize=["MatMul"],
                             extra_options={"MatMulConstBOnly": True},
                             **{**kw, "weight_type": getattr(QuantType, kw["weight_type"])})
            compare(name, dst)
    out = {"artifact": str(a.artifact), "batch": a.batch, "tokens": a.tokens, "threads": 2,
           "machine": machine(),
           "rows": rows}
    a.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"host: avx2 {out['machine']['avx2']}, avx512f {out['machine']['avx512f']}, vnni {out['machine']['vnni'] or 'none'}")
    print("| variant | max abs logits diff | mean | top-1 agreement | ms per run |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r["variant"] == "fp32":
            print(f"| fp32 | | | | {r['ms_per_run']:.2f} |")
        else:
            print(f"| {r['variant']} | {r['max_abs_logits_diff']:.3f} | {r['mean_abs_logits_diff']:.4f} | "
                  f"{r['top1_agreement']:.3f} | {r['ms_per_run']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
