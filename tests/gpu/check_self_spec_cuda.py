"""GPU check (run by hand where a GPU is lent; not collected by pytest):

    python tests/gpu/check_self_spec_cuda.py [--n 6] [--gen-length 64] [--device cuda]

Self-speculative decoding of the committed tri-mode model (checkpoints/tiny-selfspec) with the
torch backend on CUDA: ar, linear-spec and tree-spec at W 2 / 4 / 8 (and drafting ahead) over held-out prompts (batch
of all prompts), each strategy's tokens against ar's on the same device (lossless: must be equal),
ar's against the CPU's, and per strategy tokens per round, forwards and tok/s (median of 3), so
the question the CPU cannot answer is measured: where a verification of W·(L-1)+1 nodes costs
about what one of L costs, does the tree's extra acceptance turn into tok/s? Its last line,
``summary: ...``, is the row tests/gpu/run_all.sh prints. Exits 0 with a message where no GPU is
present; 1 when a lossless strategy's tokens differ from ar's. Under 1 minute.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

CKPT = str(Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-selfspec")
CONFIGS = [("ar", {"strategy": "ar"}), ("linear-spec", {"strategy": "linear-spec"})] + \
    [(f"tree-spec W{w}", {"strategy": "tree-spec", "beam_width": w}) for w in (2, 4, 8)] + \
    [("linear-spec ahead", {"strategy": "linear-spec", "draft_ahead": True}),
     ("tree-spec W4 ahead", {"strategy": "tree-spec", "beam_width": 4, "draft_ahead": True})]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6, help="prompts (the first of each task family, then the next)")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu (to try the script itself)")
    a = ap.parse_args()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    from dllm_deploy import Runtime
    from dllm_deploy.evals import tasks
    rt = Runtime.load(model=CKPT, device=a.device)
    prompts = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=-(-a.n // len(tasks.FAMILIES)))][:a.n]

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    rows, tokens = [], {}
    for label, kw in CONFIGS:
        walls = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            res = rt.self_spec(prompts, max_new_tokens=a.gen_length, **kw)     # draft_ahead: no decode flag
            sync()
            walls.append(time.perf_counter() - t0)
        tokens[label] = [r["token_ids"] for r in res]
        n_tok = sum(len(t) for t in tokens[label])
        rounds = sum(r["rounds"] for r in res)
        rows.append({"config": label, "tokens": n_tok, "forwards": res[0]["forwards"],
                     "tokens_per_round": sum(r["tokens_per_round"] * r["rounds"] for r in res) / rounds if rounds else 0.0,
                     "tokens_per_s": n_tok / statistics.median(walls),
                     "identical_to_ar": tokens[label] == tokens["ar"]})
        r = rows[-1]
        print(f"{label:<14} {r['tokens_per_round']:6.2f} tokens/round  {r['forwards']:4d} forwards  "
              f"{r['tokens_per_s']:9.1f} tok/s  {r['tokens_per_s'] / rows[0]['tokens_per_s']:5.2f}x ar  "
              f"= ar: {r['identical_to_ar']}")
    cpu_same = "n/a"
    if a.device != "cpu":
        cpu = Runtime.load(model=CKPT, device="cpu").self_spec(prompts, strategy="ar", max_new_tokens=a.gen_length)
        same = [c["token_ids"] == g for c, g in zip(cpu, tokens["ar"])]
        cpu_same = f"{sum(same)}/{len(same)}"
    name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(json.dumps({"device": name, "prompts": len(prompts), "gen_length": a.gen_length, "rows": rows,
                      "ar_equals_cpu": cpu_same}))
    lossless = all(r["identical_to_ar"] for r in rows)
    best = max(rows[1:], key=lambda r: r["tokens_per_s"])
    linear = rows[1]
    print(f"summary: spec = ar {'yes' if lossless else 'NO'}; ar = CPU {cpu_same}; linear-spec "
          f"{linear['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x ar, best {best['config']} "
          f"{best['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x ar ({best['tokens_per_round']:.2f} tokens/round)")
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
