"""GPU check (run by hand where a GPU is lent; not collected by pytest):

    python tests/gpu/check_decode_cuda.py [--n 10]

Decodes the held-out prompts with the torch backend on CUDA for vanilla, threshold and SPD at
W = 1, 2, 4, 8 and prints accuracy, TPF, forwards, tokens/s and time per forward: the GPU side of
"fewer forwards -> more tokens/s" (DESIGN §6). Also checks that CUDA and CPU decode the same
tokens for lossless SPD (12 held-out prompts, the committed weights). Its last line,
``summary: ...``, is the row tests/gpu/run_all.sh prints. Exits 0 with a message where no GPU is
present; 1 when CUDA and CPU tokens differ. Under 5 minutes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    from dllm_deploy import Runtime
    from dllm_deploy.evals import tasks
    from dllm_deploy.evals.harness import run_eval
    from dllm_deploy.runtime.api import decode_config
    gpu = Runtime.load(model="tiny", device="cuda")
    cpu = Runtime.load(model="tiny", device="cpu")
    prompts = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=2)]
    same = [g.token_ids == c.token_ids for g, c in zip(gpu.generate(prompts, strategy="spd", beam_width=4),
                                                       cpu.generate(prompts, strategy="spd", beam_width=4))]
    print(f"device {torch.cuda.get_device_name(0)}; CUDA == CPU tokens (spd W4 lossless): {sum(same)}/{len(same)}")
    configs = [("vanilla", {}), ("threshold 0.9", {"strategy": "threshold"})]
    for w in (1, 2, 4, 8):
        configs.append((f"spd W{w} lossless", {"strategy": "spd", "beam_width": w, "tree": "wide" if w >= 4 else "chain"}))
        configs.append((f"spd W{w} threshold", {"strategy": "spd", "beam_width": w, "select": "threshold"}))
    rows = []
    for label, kw in configs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = run_eval(gpu, decode_config(**{"strategy": "vanilla", **kw}), n=a.n)
        wall = time.perf_counter() - t0
        o = res["overall"]
        rows.append({"config": label, "accuracy": o["accuracy"], "tpf": o["tpf"], "forwards": o["forwards"],
                     "tokens_per_s": o["tokens"] / wall, "ms_per_forward": 1000 * wall / max(o["forwards"], 1)})
        print(f"{label:<22} acc {o['accuracy']:.3f}  TPF {o['tpf']:5.2f}  {rows[-1]['tokens_per_s']:8.1f} tok/s  "
              f"{rows[-1]['ms_per_forward']:6.2f} ms/forward (wall / forwards)")
    print(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}))
    best = max(rows, key=lambda r: r["tokens_per_s"])
    print(f"summary: CUDA == CPU tokens {sum(same)}/{len(same)} (spd W4 lossless); vanilla {rows[0]['tokens_per_s']:.0f} "
          f"tok/s, best {best['tokens_per_s']:.0f} tok/s ({best['config']}, TPF {best['tpf']:.2f})")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
