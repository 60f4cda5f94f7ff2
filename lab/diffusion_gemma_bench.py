"""DiffusionGemma: transformers' generate() against this SDK's exported graphs on ONNX Runtime, on
one random checkpoint, in one run (docs/diffusion_gemma.md):

    PYTHONPATH=$PWD .venv/bin/python lab/diffusion_gemma_bench.py --json lab/diffusion_gemma.json

Writes a random DiffusionGemma checkpoint with transformers (--size: hidden 512, 12 layers, 16
experts of width 256, 4 a token, vocabulary 32768, canvas 64, window 128: about 0.5 GB fp32),
exports it (fp32), then decodes the same prompts with both, interleaved, --repeats times:
transformers 5.23 as a user runs it (fp32, its default attention and experts) with its draws
replaced by the same counter-based noise (runtime/uniform_diffusion.py's TransformersDraws),
and ours (runtime/uniform_diffusion.py over OrtDenoiser). Both on --threads threads. Reports
medians of the wall time, tokens/s, decoder forwards and tokens per forward of each, their
ratio, and how many canvases' tokens are identical (fp32 kernels round differently and the
self-conditioning loop amplifies that, so on random weights the two part after a few steps).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXT = dict(vocab_size=32768, hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, global_head_dim=128, num_global_key_value_heads=2, sliding_window=128,
            num_experts=16, top_k_experts=4, moe_intermediate_size=256, max_position_embeddings=4096,
            use_bidirectional_attention="vision", pad_token_id=0, eos_token_id=1, bos_token_id=2)
VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, head_dim=16)
CANVAS = 64


def write_checkpoint(folder: Path) -> int:
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=TEXT, vision_config=VISION,
                                                                 canvas_length=CANVAS)).eval()
    model.save_pretrained(folder)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def run_transformers(model, prompts, options: dict):
    import torch

    from dllm_deploy.models.diffusion_gemma_decode import inverse_cdf
    from dllm_deploy.runtime.uniform_diffusion import TransformersDraws
    p = max(len(x) for x in prompts)
    ids = torch.tensor([[TEXT["pad_token_id"]] * (p - len(x)) + x for x in prompts])
    keep = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    draws = TransformersDraws(p, CANVAS, options["max_denoising_steps"])
    saved = torch.randint, torch.multinomial
    torch.randint = lambda low, high, size, **kw: torch.from_numpy(draws.randint(high, size[0]))
    torch.multinomial = lambda probs, num_samples=1, **kw: inverse_cdf(
        probs, torch.from_numpy(draws.uniforms(probs.shape[0])))[:, None]
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=keep, eos_token_id=TEXT["eos_token_id"],
                                 pad_token_id=TEXT["pad_token_id"], **options)
        wall = time.perf_counter() - t0
    finally:
        torch.randint, torch.multinomial = saved
    new = out.sequences[:, p:].numpy()
    forwards = (((new != TEXT["pad_token_id"]).sum(-1)) / out.tokens_per_forward.numpy()).round()
    return new, wall, forwards


def run_ours(backend, prompts, options: dict):
    from dllm_deploy.runtime.uniform_diffusion import UniformDiffusionOptions, generate
    t0 = time.perf_counter()
    res = generate(backend, prompts, UniformDiffusionOptions(**options), vocab_size=TEXT["vocab_size"],
                   canvas_length=CANVAS, eos_ids=[TEXT["eos_token_id"]], pad_id=TEXT["pad_token_id"])
    return res.new_tokens, time.perf_counter() - t0, res.forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dllm-dg-bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48, help="max_denoising_steps (transformers' default 48)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    import numpy as np
    import onnxruntime
    import torch
    import transformers
    from transformers import DiffusionGemmaForBlockDiffusion

    from dllm_deploy.export.diffusion_gemma import export_diffusion_gemma
    from dllm_deploy.runtime.backends.diffusion_gemma_ort import OrtDenoiser
    torch.set_num_threads(a.threads)
    shutil.rmtree(a.work, ignore_errors=True)
    ckpt, art = a.work / "ckpt", a.work / "art"
    size = write_checkpoint(ckpt)
    t0 = time.perf_counter()
    export_diffusion_gemma(ckpt, art, log=lambda m: None)
    export_s = time.perf_counter() - t0
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(ckpt, dtype=torch.float32).eval()
    backend = OrtDenoiser(art, threads=a.threads)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, TEXT["vocab_size"], n).tolist() for n in (40, 32)]
    options = {"max_new_tokens": a.max_new_tokens, "max_denoising_steps": a.steps}
    runs = {"transformers": [], "ours": []}
    for _ in range(a.repeats):
        runs["transformers"].append(run_transformers(model, prompts, options))
        runs["ours"].append(run_ours(backend, prompts, options))
    rows = {}
    for name, rs in runs.items():
        tokens, _, forwards = rs[0]
        valid = int((tokens != TEXT["pad_token_id"]).sum())
        wall = statistics.median(r[1] for r in rs)
        rows[name] = {"wall_s": round(wall, 3), "tokens": valid, "tokens_per_s": round(valid / wall, 2),
                      "decoder_forwards": [int(f) for f in forwards],
                      "tokens_per_forward": round(valid / max(float(np.sum(forwards)), 1.0), 3)}
    ref, ours = runs["transformers"][0][0], runs["ours"][0][0]
    same = [bool((ref[:, c:c + CANVAS] == ours[:, c:c + CANVAS]).all()) for c in range(0, ref.shape[1], CANVAS)]
    first = int(np.argmax((ref != ours).any(0))) if (ref != ours).any() else None
    res = {"config": {"text": TEXT, "canvas_length": CANVAS}, "checkpoint_bytes": size, "export_s": round(export_s, 1),
           "options": options, "threads": a.threads, "repeats": a.repeats, "runs": rows,
           "speedup_tokens_per_s": round(rows["ours"]["tokens_per_s"] / rows["transformers"]["tokens_per_s"], 2),
           "canvases_identical": same, "first_differing_token": first,
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
           "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                        "onnxruntime": onnxruntime.__version__}}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
