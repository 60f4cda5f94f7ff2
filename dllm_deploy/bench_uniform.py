"""``dllm-deploy bench`` of a uniform-diffusion artifact (DiffusionGemma, runtime/uniform_diffusion.py):
the artifact's decode on ONNX Runtime over the evaluation prompts, and with ``reference`` (the
checkpoint it was exported from) transformers' ``generate()`` of the same checkpoint on the same
prompts, interleaved, medians over repeats, ratios from this run only.

transformers runs as a user runs it (fp32, its default attention and experts), its draws replaced
by the same counter-based noise (TransformersDraws), and ours numbers a padded batch's positions
as it does, so the two decode the same function: how many canvases come out identical is
reported (fp32 kernels round differently and self-conditioning amplifies that: on random weights
the two part after a few steps). Per runtime: wall time, tokens (not pad), decoder forwards per
row, tokens per decoder forward (transformers' count) and per forward (encoder forwards too),
tokens/s.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from .errors import UserError


def _ours(backend, prompts, opts, m: dict):
    from .runtime.uniform_diffusion import generate
    d = m["decoding"]
    t0 = time.perf_counter()
    res = generate(backend, prompts, opts, vocab_size=m["model"]["vocab_size"], canvas_length=m["model"]["canvas_length"],
                   eos_ids=d["eos_ids"], pad_id=d["pad_id"])
    return res.new_tokens, time.perf_counter() - t0, res.forwards, res.encoder_forwards


def _transformers(model, prompts, opts, m: dict):
    from .models.diffusion_gemma import transformers_generate
    from .runtime.uniform_diffusion import TransformersDraws
    d = m["decoding"]
    draws = TransformersDraws(max(len(x) for x in prompts), m["model"]["canvas_length"], opts.max_denoising_steps,
                              seed=opts.seed)
    t0 = time.perf_counter()
    new, forwards = transformers_generate(model, prompts, opts, d["eos_ids"], d["pad_id"], draws)
    return new, time.perf_counter() - t0, forwards, None


def run(artifact: str, reference: str | None = None, families=None, n: int = 1, repeats: int = 3,
        max_new_tokens: int = 128, steps: int | None = None, threads: int | None = None, progress=None) -> dict:
    from .bench import machine_facts, versions
    from .evals import tasks
    from .models.tokenizer import load_tokenizer
    from .runtime.backends.diffusion_gemma_ort import OrtDenoiser
    from .runtime.uniform_decoder import options as decode_options
    if n < 1 or repeats < 1 or max_new_tokens < 1:
        raise UserError("--n, --repeats and --gen-length must be >= 1")
    backend = OrtDenoiser(artifact, threads=threads)
    m = backend.manifest
    opts = decode_options(m["decoding"].get("options", {}), gen_length=max_new_tokens, steps=steps)
    tok = load_tokenizer(artifact, m["model"]["eos_token_id"])
    prompts = [tok.encode(e.prompt) for e in tasks.eval_split(tuple(families or tasks.FAMILIES), n)]
    runners = {"dllm-deploy": lambda: _ours(backend, prompts, opts, m)}
    if reference is not None:
        from .models.diffusion_gemma import load_transformers_reference
        model = load_transformers_reference(reference, threads)
        runners = {"transformers": lambda: _transformers(model, prompts, opts, m), **runners}
    _ours(backend, prompts[:1], opts, m)                  # warm-up: sessions, allocator
    runs: dict = {name: [] for name in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            runs[name].append(fn())
            if progress:
                progress(1)
    pad = m["decoding"]["pad_id"]
    rows = []
    for name, reps in runs.items():
        tokens, _, forwards, encoder = reps[0]
        valid = int((tokens != pad).sum())
        wall = statistics.median(r[1] for r in reps)
        encodes = encoder if encoder is not None else -(-tokens.shape[1] // m["model"]["canvas_length"])
        rows.append({"runtime": name, "wall_s": round(wall, 3), "tokens": valid, "tokens_per_s": round(valid / wall, 2),
                     "decoder_forwards": [int(f) for f in forwards],
                     "tokens_per_decoder_forward": round(valid / max(int(np.sum(forwards)), 1), 3),
                     "tokens_per_forward": round(valid / max(int(np.sum(forwards)) + encodes * len(prompts), 1), 3)})
    out = {"kind": "uniform_diffusion", "artifact": str(artifact), "reference": reference, "prompts": len(prompts),
           "n": n, "repeats": repeats, "max_new_tokens": opts.max_new_tokens, "steps": opts.max_denoising_steps,
           "threads": threads, "canvas_length": m["model"]["canvas_length"], "runs": rows,
           "machine": machine_facts(), "versions": versions()}
    if reference is not None:
        ref, ours = runs["transformers"][0][0], runs["dllm-deploy"][0][0]
        c = m["model"]["canvas_length"]
        same = [bool((ref[:, i:i + c] == ours[:, i:i + c]).all()) for i in range(0, min(ref.shape[1], ours.shape[1]), c)]
        out["canvases_identical"] = f"{sum(same)}/{len(same)}"
        out["speedup_vs_transformers"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    return out


def table(res: dict) -> str:
    lines = [f"{'runtime':<13} {'tok/s':>8} {'wall s':>8} {'tokens':>7} {'dec fwd/row':>11} {'TPF dec':>8} {'TPF':>6}"]
    for r in res["runs"]:
        lines.append(f"{r['runtime']:<13} {r['tokens_per_s']:>8.2f} {r['wall_s']:>8.3f} {r['tokens']:>7} "
                     f"{statistics.mean(r['decoder_forwards']):>11.1f} {r['tokens_per_decoder_forward']:>8.3f} "
                     f"{r['tokens_per_forward']:>6.3f}")
    if "speedup_vs_transformers" in res:
        lines.append(f"dllm-deploy / transformers: {res['speedup_vs_transformers']:.2f}x tokens/s; "
                     f"identical canvases {res['canvases_identical']}")
    return "\n".join(lines)
