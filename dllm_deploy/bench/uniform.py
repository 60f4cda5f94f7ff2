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

With ``cpp`` the C++ runtime (``dllm-generate``, ``make cpp``) decodes the same prompts in one batch
too, interleaved with the others: its wall time is the decode loop's (the binary's ``wall_s``;
process start, session load and tokenization excluded, as for the Python row). It numbers each
row's positions from the row's own first token (as ``Runtime.generate`` and ``serve`` do, not as
transformers numbers a padded batch), so its tokens are checked against ``Runtime.generate`` of the
same prompts (``cpp_rows_identical_to_python``), not against the rows above.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..errors import UserError


def _ours(backend, prompts, opts, m: dict):
    from ..runtime.uniform_diffusion import generate
    d = m["decoding"]
    t0 = time.perf_counter()
    res = generate(backend, prompts, opts, vocab_size=m["model"]["vocab_size"], canvas_length=m["model"]["canvas_length"],
                   eos_ids=d["eos_ids"], pad_id=d["pad_id"])
    return res.new_tokens, time.perf_counter() - t0, res.forwards, res.encoder_forwards


def _transformers(model, prompts, opts, m: dict):
    from ..models.diffusion_gemma_decode import transformers_generate
    from ..runtime.uniform_diffusion import TransformersDraws
    d = m["decoding"]
    draws = TransformersDraws(max(len(x) for x in prompts), m["model"]["canvas_length"], opts.max_denoising_steps,
                              seed=opts.seed)
    t0 = time.perf_counter()
    new, forwards = transformers_generate(model, prompts, opts, d["eos_ids"], d["pad_id"], draws)
    return new, time.perf_counter() - t0, forwards, None


def _cpp(binary, artifact: str, texts: list[str], opts, threads: int | None, pad: int):
    """The C++ runtime's decode of ``texts`` in one batch: (token ids per row, loop wall, forwards per row)."""
    from .cpp import cpp_generate
    rows = cpp_generate(binary, artifact, texts, ["--batch-size", str(len(texts)), "--gen-length", str(opts.max_new_tokens),
                                                  "--steps", str(opts.max_denoising_steps), "--seed", str(opts.seed),
                                                  *(["--threads", str(threads)] if threads else [])])
    ids = [[t for t in row["token_ids"] if t != pad] for row in rows]
    return ids, max(row["wall_s"] for row in rows), [row["forwards"] for row in rows]


def run(artifact: str, reference: str | None = None, families=None, n: int = 1, repeats: int = 3,
        max_new_tokens: int = 128, steps: int | None = None, threads: int | None = None, progress=None,
        cpp: bool = False) -> dict:
    from .run import machine_facts, versions
    from ..evals import tasks
    from ..models.tokenizer import load_tokenizer
    from ..runtime.backends.diffusion_gemma_ort import OrtDenoiser
    from ..runtime.uniform_decoder import options as decode_options
    if n < 1 or repeats < 1 or max_new_tokens < 1:
        raise UserError("--n, --repeats and --gen-length must be >= 1")
    backend = OrtDenoiser(artifact, threads=threads)
    m = backend.manifest
    opts = decode_options(m["decoding"].get("options", {}), gen_length=max_new_tokens, steps=steps)
    tok = load_tokenizer(artifact, m["model"]["eos_token_id"])
    texts = [e.prompt for e in tasks.eval_split(tuple(families or tasks.FAMILIES), n)]
    prompts = [tok.encode(t) for t in texts]
    runners = {"dllm-deploy": lambda: _ours(backend, prompts, opts, m)}
    if cpp:
        from .cpp import cpp_binary
        binary = cpp_binary()
        runners["dllm-deploy C++"] = lambda: _cpp(binary, artifact, texts, opts, threads, m["decoding"]["pad_id"])
    if reference is not None:
        from ..models.diffusion_gemma_decode import load_transformers_reference
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
        if name == "dllm-deploy C++":     # token ids per row; forwards count the encoder's too
            ids, wall, fwd = reps[0][0], statistics.median(r[1] for r in reps), reps[0][2]
            valid = sum(len(x) for x in ids)
            rows.append({"runtime": name, "wall_s": round(wall, 3), "tokens": valid,
                         "tokens_per_s": round(valid / wall, 2), "forwards": fwd,
                         "tokens_per_forward": round(valid / max(sum(fwd), 1), 3)})
            continue
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
    if cpp:                               # the C++ rows against Python's Runtime (own positions), untimed
        from ..runtime.uniform_decoder import UniformDecoder
        from ..runtime.rows import RowOptions
        from ..models.diffusion_gemma import DiffusionGemmaConfig
        cfg = DiffusionGemmaConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in m["model"].items()})
        py = UniformDecoder(backend, tok, cfg, m["decoding"]).generate(texts, opts, [RowOptions(seed=opts.seed)] * len(texts))
        got = runs["dllm-deploy C++"][0][0]
        out["cpp_rows_identical_to_python"] = f"{sum(r.token_ids == g for r, g in zip(py, got))}/{len(texts)}"
        out["cpp_vs_python"] = round(rows[-1]["tokens_per_s"] / next(r for r in rows if r["runtime"] == "dllm-deploy")
                                     ["tokens_per_s"], 3)
    if reference is not None:
        ref, ours = runs["transformers"][0][0], runs["dllm-deploy"][0][0]
        c = m["model"]["canvas_length"]
        same = [bool((ref[:, i:i + c] == ours[:, i:i + c]).all()) for i in range(0, min(ref.shape[1], ours.shape[1]), c)]
        out["canvases_identical"] = f"{sum(same)}/{len(same)}"
        out["speedup_vs_transformers"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
        if cpp:
            out["cpp_speedup_vs_transformers"] = round(rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    return out


def table(res: dict) -> str:
    lines = [f"{'runtime':<15} {'tok/s':>8} {'wall s':>8} {'tokens':>7} {'dec fwd/row':>11} {'TPF dec':>8} {'TPF':>6}"]
    for r in res["runs"]:
        if "decoder_forwards" not in r:    # the C++ row reports all forwards only
            lines.append(f"{r['runtime']:<15} {r['tokens_per_s']:>8.2f} {r['wall_s']:>8.3f} {r['tokens']:>7} "
                         f"{'':>11} {'':>8} {r['tokens_per_forward']:>6.3f}")
            continue
        lines.append(f"{r['runtime']:<15} {r['tokens_per_s']:>8.2f} {r['wall_s']:>8.3f} {r['tokens']:>7} "
                     f"{statistics.mean(r['decoder_forwards']):>11.1f} {r['tokens_per_decoder_forward']:>8.3f} "
                     f"{r['tokens_per_forward']:>6.3f}")
    if "speedup_vs_transformers" in res:
        lines.append(f"dllm-deploy / transformers: {res['speedup_vs_transformers']:.2f}x tokens/s; "
                     f"identical canvases {res['canvases_identical']}")
    if "cpp_vs_python" in res:
        lines.append(f"C++ / Python: {res['cpp_vs_python']:.2f}x tokens/s; C++ rows identical to Runtime.generate "
                     f"{res['cpp_rows_identical_to_python']}")
    return "\n".join(lines)
