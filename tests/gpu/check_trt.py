"""TensorRT check (run by hand where a GPU with TensorRT is lent; not collected by pytest):

    python tests/gpu/check_trt.py [--profile auto] [--n 2] [--out build/gpu_trt]

1. exports the bundled tiny model (fp32, max_beam_width 8) and builds its engines with
   `dllm-deploy build-engines` for the profile (auto: the detected GPU's);
2. runs build-engines again: the recorded key must say "up to date";
3. loads the artifact twice, `Runtime.load(artifact, backend="trt")` and ONNX Runtime, and decodes
   the held-out prompts with vanilla, threshold 0.9, threshold 0.99 under the delayed in-block
   cache (its prefill engine at every step, the held keys cut from the cache), SPD W4 lossless and
   SPD W4 threshold selection, checking the TensorRT tokens equal ONNX Runtime's for all but the
   last (float-noise draft swaps allowed there) and printing TPF and tokens/s;
4. fakes a stale engine record (another TensorRT version): loading must fail with a one-line
   "rebuild" error, not a crash inside TensorRT.

Its last line, ``summary: ...``, is the row tests/gpu/run_all.sh prints.
Exits 0 with a message where there is no CUDA device, no TensorRT or no Polygraphy (the engine
builder's loaders); 1 when a check fails.
Short: the tiny model's engines build in about a minute; the whole check in under 5 minutes.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="auto")
    ap.add_argument("--n", type=int, default=2, help="held-out prompts per family")
    ap.add_argument("--out", default=None, help="artifact folder (default: a temporary one)")
    ap.add_argument("--opt-level", type=int, default=3)
    a = ap.parse_args()
    try:
        import tensorrt
        import torch

        import polygraphy  # noqa: F401 -- build-engines builds through its loaders
    except ImportError as e:
        print(f"skipped: {e.name} is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    from dllm_deploy import Runtime
    from dllm_deploy.cli import main as cli
    from dllm_deploy.errors import UserError
    from dllm_deploy.evals import tasks
    from dllm_deploy.export.exporter import export
    from dllm_deploy.profiles import get_profile

    ok = True
    art = Path(a.out or tempfile.mkdtemp(prefix="dllm-trt-")) / "tiny"
    prof, reasons, _ = get_profile(a.profile)
    print(f"device {torch.cuda.get_device_name(0)} (CC {'.'.join(map(str, torch.cuda.get_device_capability()))}), "
          f"TensorRT {tensorrt.__version__}, profile {prof.name}: {'; '.join(reasons)}", flush=True)

    t0 = time.perf_counter()
    export("tiny", art, precisions=["fp32"], max_beam_width=8, force=True, log=lambda m: None)
    print(f"export: {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    rc = cli(["build-engines", "--artifact", str(art), "--profile", prof.name, "--opt-level", str(a.opt_level)])
    print(f"build-engines: rc {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
    if rc != 0:
        return 1
    t0 = time.perf_counter()
    rc = cli(["build-engines", "--artifact", str(art), "--profile", prof.name, "--json"])
    print(f"build-engines again (expect up to date): rc {rc}, {time.perf_counter() - t0:.1f} s", flush=True)

    trt_rt = Runtime.load(artifact=str(art), backend="trt", profile=prof.name)
    ort_rt = Runtime.load(artifact=str(art), profile=prof.name)
    print(f"TensorRT backend: providers {trt_rt.backend.providers}, W cap {trt_rt.max_beam_width}; "
          f"ONNX Runtime providers {ort_rt.backend.providers}", flush=True)
    prompts = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=a.n)]
    configs = [("vanilla", {"strategy": "vanilla"}, True),
               ("threshold 0.9", {"strategy": "threshold", "threshold": 0.9}, True),
               ("threshold delayed", {"strategy": "threshold", "threshold": 0.99, "cache": "delayed"}, True),
               ("spd W4 lossless", {"strategy": "spd", "beam_width": 4, "tree": "wide"}, True),
               ("spd W4 threshold", {"strategy": "spd", "beam_width": 4, "select": "threshold"}, False)]
    rows = []
    for label, kw, must_match in configs:
        trt_rt.generate(prompts[:1], **kw)                      # warm-up (buffers grow to their shapes)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = trt_rt.generate(prompts, **kw)
        wall = time.perf_counter() - t0
        ref = ort_rt.generate(prompts, **kw)
        same = sum(g.token_ids == r.token_ids for g, r in zip(got, ref))
        tokens, forwards = sum(g.tokens for g in got), sum(g.forwards for g in got)
        rows.append({"config": label, "identical": same, "prompts": len(prompts), "tpf": tokens / max(forwards, 1),
                     "tokens_per_s": tokens / wall, "ms_per_forward": 1000 * wall / max(forwards, 1)})
        flag = "" if same == len(prompts) else ("  MISMATCH" if must_match else "  (differs: float-noise draft swaps allowed)")
        print(f"{label:<18} TRT == ORT tokens {same}/{len(prompts)}  TPF {rows[-1]['tpf']:5.2f}  "
              f"{rows[-1]['tokens_per_s']:8.1f} tok/s  {rows[-1]['ms_per_forward']:6.2f} ms/forward{flag}", flush=True)
        if must_match and same != len(prompts):
            ok = False
            g, r = next((g, r) for g, r in zip(got, ref) if g.token_ids != r.token_ids)
            i = next((i for i, (x, y) in enumerate(zip(g.token_ids, r.token_ids)) if x != y), min(len(g.token_ids), len(r.token_ids)))
            print(f"  first difference at token {i}: TRT {g.token_ids[i:i + 5]} vs ORT {r.token_ids[i:i + 5]}")

    manifest = art / "manifest.json"
    saved = manifest.read_text()
    m = json.loads(saved)
    m["engines"][prof.name]["trt_version"] = "0.0.0"
    manifest.write_text(json.dumps(m))
    try:
        Runtime.load(artifact=str(art), backend="trt", profile=prof.name)
        print("stale engines: NOT detected")
        ok = False
    except UserError as e:
        print(f"stale engines detected: {e}")
        ok &= "rebuild" in str(e) and "\n" not in str(e)
    finally:
        manifest.write_text(saved)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "tensorrt": tensorrt.__version__, "profile": prof.name,
                      "rows": rows, "ok": ok}))
    print(f"summary: TensorRT {tensorrt.__version__}, profile {prof.name}: "
          + "; ".join(f"{r['config']} TRT == ORT {r['identical']}/{r['prompts']}, {r['tokens_per_s']:.0f} tok/s" for r in rows)
          + ("" if ok else " -- FAILED (see the log)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
