"""One interleaved run: llama.cpp's llama-diffusion-cli and dllm-deploy (ONNX Runtime, fp32) on
the same checkpoint, prompt and schedule (lab/peers/llama_cpp.sh runs it).

The same schedule on both: one token per step, blocks of 32, no cache, 2 threads, a 32-token
prompt (BOS included) and 128 generated tokens; ours is LLaDA's low-confidence remasking (vanilla,
greedy). llama.cpp's CLI has no exact equivalent: its confidence (algorithm 4) is the probability
its sampler chain gives the drawn token, and with `--temp 0` that chain still draws at temperature
1 from the top 40 (the temperature stage is skipped, not made greedy) with a random seed. Here it
runs `--top-k 1 --seed 0`: greedy tokens, deterministic, but every confidence is 1, so the order
in which positions are committed is not by confidence and the texts differ. The forward itself is
the same computation, so ms per forward is the like-for-like figure. llama.cpp's block schedule counts blocks over the
whole sequence (prompt + answer: 160 / 32 = 5) and starts them after the prompt, so its last block
is empty and its steps run forwards on a finished canvas: 160 forwards for 128 tokens. Both are
reported: ms per forward (like for like) and tokens/s (what a user waits). On this bidirectional
layout no faster configuration of ours returns the same tokens as this one: the prefix and dual
caches approximate the attention, and SPD's tree verification needs one of them here.

Then the token identity check (``identity``): each block filled in one step on both engines, where
the commit order cannot differ; the texts compared, and where they part, our top-1 / top-2
margin at the first differing token (a near-tie of two f32 engines, or not).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab.peers.checkpoint import NAMES  # noqa: E402

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return'
BOS = "<|startoftext|>"
GEN, BLOCK, THREADS = 128, 32, 2


def llama_prompt(layout: str) -> str:
    """The prompt text llama-diffusion-cli gets for the same ids as ours (BOS + PROMPT): its LLaDA
    converter marks the vocabulary add-BOS, its Dream converter keeps the tokenizer's setting
    (this checkpoint's: no BOS), so there BOS comes as text (the CLI parses special tokens)."""
    return PROMPT if layout == "llada" else BOS + PROMPT


def llama_once(binary: str, gguf: str, n_prompt: int, per_block: int = BLOCK, prompt: str = PROMPT) -> dict:
    """One run; ``per_block``: steps per block (BLOCK: one token a step; 1: a block in one step)."""
    total = n_prompt + GEN
    steps = (total // BLOCK) * per_block
    cmd = [binary, "-m", gguf, "-p", prompt, "-ub", str(total), "-c", str(total), "-b", str(total),
           "--diffusion-block-length", str(BLOCK), "--diffusion-steps", str(steps), "--diffusion-algorithm", "4",
           "--temp", "0", "--top-k", "1", "--seed", "0", "-t", str(THREADS)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=1800)
    wall = time.perf_counter() - t0
    out = p.stdout + p.stderr
    m = re.search(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms", out)
    if p.returncode or not m:
        raise SystemExit(f"llama-diffusion-cli failed (rc {p.returncode}):\n{out[-2000:]}")
    text = out[m.end():].split("\n", 2)[-1] if "\n" in out[m.end():] else ""
    return {"decode_s": float(m.group(1)) / 1000, "ms_per_forward": float(m.group(2)), "forwards": steps,
            "process_s": wall, "text": text.rstrip("\n")}


def ours_once(rt, **decode) -> dict:
    t0 = time.perf_counter()
    r = rt.generate([BOS + PROMPT], gen_length=GEN, block_length=BLOCK, cache="none", **decode)[0]
    wall = time.perf_counter() - t0
    return {"decode_s": wall, "ms_per_forward": 1000 * wall / r.forwards, "forwards": r.forwards,
            "tokens": r.tokens, "text": r.text, "ids": list(r.token_ids)}


def margin_at(rt, prompt_ids: list[int], gen_ids: list[int], i: int) -> dict:
    """Our top-1 minus top-2 probability at generated position ``i`` in the forward that filled its
    block in one step: the prompt and the blocks before i's, masks from its block on (no cache)."""
    c = rt.backend.config
    start = i // BLOCK * BLOCK
    ids = np.array([prompt_ids + gen_ids[:start] + [c.mask_token_id] * (GEN - start)], dtype=np.int64)
    n = ids.shape[1]
    logits = rt.backend.logits(rt.backend.new_cache(1, 0), ids, np.arange(n)[None], np.ones((1, 1, n, n), dtype=bool))
    z = logits[0, len(prompt_ids) + i].astype(np.float64)
    prob = np.exp(z - z.max())
    prob /= prob.sum()
    top = np.sort(prob)[::-1]
    return {"position": i, "top1": float(top[0]), "top2": float(top[1]), "margin": float(top[0] - top[1])}


def llama_clean(text: str) -> str:
    """llama.cpp's detokenizer cleanup for this tokenizer (src/llama-vocab.cpp, token_to_piece's
    clean_spaces, on for the GPT-2 pre-tokenizer the checkpoint declares): a space before ? ! . ,
    goes, a lone apostrophe between spaces loses both, a space before 's 'm 're 've goes. The same
    tokens read as the same text only after it."""
    out = text[:1]
    for i in range(1, len(text)):                         # pass 1
        if text[i - 1] == " " and text[i] in "?!.,":
            out = out[:-1]
        out += text[i]
    text, out, i = out, out[:1], 1
    while i < len(text):                                  # pass 2
        if text[i] == "'" and i + 1 < len(text) and text[i - 1] == " " and text[i + 1] == " ":
            out, i = out[:-1] + "'", i + 2
            continue
        out += text[i]
        i += 1
    text, out = out, out[:1]
    for i in range(1, len(text)):                         # pass 3
        nxt = text[i + 1:i + 3]
        if text[i - 1] == " " and text[i] == "'" and (nxt[:1] in ("s", "m") and nxt or nxt in ("re", "ve")):
            out = out[:-1]
        out += text[i]
    return out


def identity(rt, a, n_prompt: int, prompt: str) -> dict:
    """The same algorithm on both: each block filled in one step (k = L), so the commit order cannot
    differ; the texts compared (ours read as llama.cpp's detokenizer writes it), and where they
    part our margin at the first differing token."""
    mine = ours_once(rt, strategy="vanilla", tokens_per_step=BLOCK)
    theirs = llama_once(a.llama, a.gguf, n_prompt, per_block=1, prompt=prompt)
    ours = llama_clean(mine["text"])
    out = {"schedule": "one step per block (vanilla k = block length), greedy, no cache",
           "dllm_deploy_text": mine["text"], "llama_cpp_text": theirs["text"],
           "identical_text": ours == theirs["text"],
           "first_difference_character": first_difference(ours, theirs["text"])}
    if not out["identical_text"]:     # our token holding that character (re-encoding their text need not give their ids)
        ids, at = mine["ids"], out["first_difference_character"]
        i = next((j for j in range(len(ids)) if len(llama_clean(rt.tokenizer.decode(ids[:j + 1]))) > at), len(ids))
        out["first_difference_token"] = i
        if i < len(ids):
            out["our_margin_there"] = margin_at(rt, rt.tokenizer.encode(BOS + PROMPT), ids, i)
    return out


def first_difference(a: str, b: str) -> int | None:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), None if len(a) == len(b) else n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", required=True)
    ap.add_argument("--also-gguf", action="append", default=[], metavar="TYPE=FILE",
                    help="another llama.cpp precision of the checkpoint (f16=ckpt-f16.gguf), run in the same interleave")
    ap.add_argument("--precisions", default="", help="our other precisions of the artifact in the same interleave (fp16,int8,int4)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    from dllm_deploy.runtime.api import Runtime
    rt = Runtime.load(artifact=a.artifact, threads=THREADS)
    n_prompt = len(rt.tokenizer.encode(BOS + PROMPT))
    if n_prompt % BLOCK:
        raise SystemExit(f"the prompt is {n_prompt} tokens; llama.cpp's schedule needs a multiple of {BLOCK}")
    prompt = llama_prompt(rt.backend.config.layout)
    configs = {"llama.cpp f32": lambda: llama_once(a.llama, a.gguf, n_prompt, prompt=prompt)}
    for item in a.also_gguf:
        kind, path = item.split("=", 1)
        configs[f"llama.cpp {kind}"] = lambda path=path: llama_once(a.llama, path, n_prompt, prompt=prompt)
    configs["dllm-deploy ORT fp32 vanilla"] = lambda: ours_once(rt, strategy="vanilla")
    for prec in filter(None, a.precisions.split(",")):
        other = Runtime.load(artifact=a.artifact, threads=THREADS, precision=prec)
        ours_once(other, strategy="vanilla")                         # warm-up
        configs[f"dllm-deploy ORT {prec} vanilla"] = lambda other=other: ours_once(other, strategy="vanilla")
    runs: dict[str, list] = {k: [] for k in configs}
    failed: dict[str, str] = {}
    ours_once(rt, strategy="vanilla")                               # warm-up (ORT's first run)
    for _ in range(a.repeats):                                      # interleaved: load changes hit all alike
        for name, fn in configs.items():
            if name in failed:
                continue
            try:
                runs[name].append(fn())
            except SystemExit as e:                                 # a peer that crashes: recorded, not fatal
                failed[name] = str(e).splitlines()[0]
    runs = {k: v for k, v in runs.items() if k not in failed}
    rows = []
    ref = runs["llama.cpp f32"][0]["text"]
    for name, rs in runs.items():
        decode = statistics.median(r["decode_s"] for r in rs)
        rows.append({"engine": name, "forwards": rs[0]["forwards"], "decode_s": decode,
                     "ms_per_forward": statistics.median(r["ms_per_forward"] for r in rs),
                     "tokens_per_s": GEN / decode, "text": rs[0]["text"],
                     "first_difference_vs_llama_cpp": first_difference(rs[0]["text"], ref),
                     "repeats": [r["decode_s"] for r in rs]})
    out = {"layout": NAMES.get(rt.backend.config.layout, rt.backend.config.layout), "prompt_tokens": n_prompt, "gen_length": GEN, "block_length": BLOCK, "threads": THREADS, "rows": rows,
           "failed": failed, "identity": identity(rt, a, n_prompt, prompt)}
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print("| engine | forwards | ms / forward | decode s | tokens/s | text equal to llama.cpp's |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        d = r["first_difference_vs_llama_cpp"]
        same = "yes" if d is None else f"no (first difference at character {d})"
        print(f"| {r['engine']} | {r['forwards']} | {r['ms_per_forward']:.1f} | {r['decode_s']:.2f} | "
              f"{r['tokens_per_s']:.1f} | {same} |")
    for name, why in failed.items():
        print(f"{name}: failed ({why})")
    ident = out["identity"]
    print(f"one step per block: texts {'identical' if ident['identical_text'] else 'differ'}"
          + ("" if ident["identical_text"] else f" from token {ident['first_difference_token']} "
             f"(our margin there {ident.get('our_margin_there', {}).get('margin')})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
