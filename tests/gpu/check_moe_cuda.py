"""Mixture-of-experts graphs on ONNX Runtime's CUDA provider (run where a GPU is lent; not collected
by pytest):

    python tests/gpu/check_moe_cuda.py

Writes random SDAR-MoE and LLaDA 2.x checkpoints (tests/conftest.py's layouts: 8 experts, 2 a
token), exports each with the routed experts in both forms (``contrib``: com.microsoft.MoE, int4
QMoE; ``gather``: standard operators), and runs every graph on the CUDA provider (TF32 off) and on
the CPU one with the same inputs: prefill logits within 1e-3 (fp32) or 2e-2 (int4) and the same
top-1 at every position. Then decodes two prompts with the threshold rule and lossless SPD W4 on
both providers: tokens compared (reported; random weights give near-ties, so a differing token is
reported, not failed, where the logits agree). Its last line, ``summary: ...``, is the row
tests/gpu/run_all.sh prints.

Exits 0 with a message where onnxruntime has no CUDA provider; 1 when logits differ.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CUDA = "CUDAExecutionProvider"
BOUND = {"fp32": 1e-3, "int4": 2e-2}


def feeds(manifest: dict, rng, b: int = 2, t: int = 16, p: int = 8) -> dict:
    cfg, names = manifest["model"], manifest["graphs"]["prefill"]["inputs"]
    out = {"input_ids": rng.integers(0, cfg["vocab_size"], (b, t)), "position_ids": np.tile(np.arange(p, p + t), (b, 1)),
           "attention_mask": np.ones((b, 1, t, p + t), bool)}
    past = [n for n in names if n.startswith("past_key_values")]
    shapes = [s for s in manifest["kv_shapes"] for _ in (0, 1)]
    out.update({n: rng.standard_normal((b, hkv, p, d)).astype(np.float32) for n, (hkv, d) in zip(past, shapes)})
    out.update(sample_u=rng.random((b, t)).astype(np.float32), temperature=np.zeros(b, np.float32),
               top_k=np.zeros(b, np.int64), top_p=np.ones(b, np.float32))
    return out


def main() -> int:
    import onnxruntime as ort
    if CUDA not in ort.get_available_providers():
        print(f"skipped: onnxruntime {ort.__version__} has no CUDA provider ({', '.join(ort.get_available_providers())})")
        return 0
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.export.exporter import export
    from dllm_deploy.runtime.api import Runtime
    from dllm_deploy.runtime.backends.ort import load_ort
    from tests.conftest import MOE_CONFIGS, write_random_checkpoint

    so = ort.SessionOptions()
    so.log_severity_level = 3
    ok, rows = True, []
    with tempfile.TemporaryDirectory() as d:
        for family in ("sdar_moe", "llada2"):
            ckpt = write_random_checkpoint(Path(d) / family, MOE_CONFIGS[family])
            for form in ("contrib", "gather"):
                art = Path(d) / f"{family}-{form}"
                export(ckpt, art, precisions=["fp32", "int4"], moe_form=form, max_beam_width=4, log=lambda m: None)
                manifest = read_manifest(art)
                for prec in ("fp32", "int4"):
                    path = str(art / manifest["precisions"][prec]["prefill"])
                    x = feeds(manifest, np.random.default_rng(0))
                    try:
                        gpu = ort.InferenceSession(path, so, providers=[CUDA], provider_options=[{"use_tf32": "0"}])
                        got = gpu.run(["logits"], x)[0]
                    except Exception as e:        # an operator the provider lacks: reported, then failed
                        print(f"{family} {form} {prec}: CUDA cannot run it: {type(e).__name__}: {str(e)[:200]}")
                        rows.append(f"{family}/{form}/{prec} FAILED to run")
                        ok = False
                        continue
                    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(["logits"], x)[0]
                    with np.errstate(invalid="ignore"):        # the excluded ids: -inf on both
                        diff = float(np.where(got == ref, 0.0, np.abs(got - ref)).max())
                    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
                    good = diff <= BOUND[prec] and top1 == 1.0
                    ok &= good
                    rows.append(f"{family}/{form}/{prec} {diff:.1e}{'' if good else ' FAILED'}")
                    print(f"{family:<9} {form:<8} {prec}: CUDA vs CPU logits max diff {diff:.2e}, top-1 agree {top1:.3f}"
                          f"{'' if good else '  FAILED'}", flush=True)
                parts = [load_ort(str(art), precision="fp32", providers=p, provider_options=o)
                         for p, o in (([CUDA, "CPUExecutionProvider"], {CUDA: {"use_tf32": "0"}}),
                                      (["CPUExecutionProvider"], None))]
                gpu_rt, cpu_rt = (Runtime(q.backend, q.tokenizer, q.backend.config, max_beam_width=q.max_beam_width)
                                  for q in parts)
                for label, kw in (("threshold", {"strategy": "threshold"}),
                                  ("spd W4", {"strategy": "spd", "base": "threshold", "beam_width": 4})):
                    prompts = ["abc", "hello"]
                    same = sum(g.token_ids == c.token_ids for g, c in zip(gpu_rt.generate(prompts, gen_length=16, **kw),
                                                                          cpu_rt.generate(prompts, gen_length=16, **kw)))
                    print(f"{family:<9} {form:<8} decode {label}: CUDA == CPU tokens {same}/{len(prompts)}", flush=True)
    print(f"summary: onnxruntime {ort.__version__} CUDA, MoE logits vs CPU: " + "; ".join(rows) + ("" if ok else " -- FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
