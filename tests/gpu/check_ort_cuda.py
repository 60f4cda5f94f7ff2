"""ONNX Runtime's CUDA provider check (run by hand where a GPU is lent; not collected by pytest):

    python tests/gpu/check_ort_cuda.py [--n 2]

Exports the tiny model (fp32), loads it twice with ONNX Runtime, on the CUDA provider (TF32 off,
so fp32 means fp32) and on the CPU one, and decodes the held-out prompts with vanilla and SPD W4
lossless: the tokens must be identical; prints TPF and tokens/s of each. Its last line,
``summary: ...``, is the row tests/gpu/run_all.sh prints.

Exits 0 with a message where this environment's onnxruntime has no CUDA provider (the CPU build;
``onnxruntime-gpu`` replaces it: docs/gpu.md); 1 when tokens differ. About a minute.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

CUDA = "CUDAExecutionProvider"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2, help="held-out prompts per family")
    a = ap.parse_args()
    import onnxruntime as ort
    if CUDA not in ort.get_available_providers():
        print(f"skipped: onnxruntime {ort.__version__} has no CUDA provider ({', '.join(ort.get_available_providers())})")
        return 0
    from dllm_deploy.evals import tasks
    from dllm_deploy.export.exporter import export
    from dllm_deploy.runtime.api import Runtime
    from dllm_deploy.runtime.backends.ort import load_ort

    def load(art, **kw):
        parts = load_ort(str(art), precision="fp32", **kw)
        return Runtime(parts.backend, parts.tokenizer, parts.backend.config, max_beam_width=parts.max_beam_width)

    with tempfile.TemporaryDirectory() as d:
        art = Path(d) / "tiny"
        export("tiny", art, precisions=["fp32"], max_beam_width=8, log=lambda m: None)
        gpu = load(art, providers=[CUDA, "CPUExecutionProvider"], provider_options={CUDA: {"use_tf32": "0"}})
        cpu = load(art, providers=["CPUExecutionProvider"])
        if gpu.backend.providers[0] != CUDA:
            print(f"summary: FAILED: the session fell back to {gpu.backend.providers} (CUDA libraries missing?)")
            return 1
        print(f"onnxruntime {ort.__version__}, providers {gpu.backend.providers}", flush=True)
        prompts = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=a.n)]
        parts, ok = [], True
        for label, kw in (("vanilla", {"strategy": "vanilla"}),
                          ("spd W4 lossless", {"strategy": "spd", "beam_width": 4, "tree": "wide"})):
            gpu.generate(prompts[:1], **kw)                          # warm-up (CUDA kernels, arena)
            t0 = time.perf_counter()
            got = gpu.generate(prompts, **kw)
            wall = time.perf_counter() - t0
            ref = cpu.generate(prompts, **kw)
            same = sum(g.token_ids == r.token_ids for g, r in zip(got, ref))
            tokens, forwards = sum(g.tokens for g in got), sum(g.forwards for g in got)
            ok &= same == len(prompts)
            print(f"{label:<16} CUDA == CPU tokens {same}/{len(prompts)}  TPF {tokens / max(forwards, 1):5.2f}  "
                  f"{tokens / wall:8.1f} tok/s  {1000 * wall / max(forwards, 1):6.2f} ms/forward", flush=True)
            parts.append(f"{label} CUDA == CPU {same}/{len(prompts)}, {tokens / wall:.0f} tok/s")
    print(f"summary: onnxruntime {ort.__version__} CUDA provider: " + "; ".join(parts) + ("" if ok else " -- FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
