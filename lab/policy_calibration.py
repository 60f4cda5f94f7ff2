"""How often the threshold rule commits a wrong token on held-out prompts, teacher-forced (the
states `dllm-deploy distill --policy-share` trains on, docs/distill.md): every eval prompt's
reference answer is decoded with the rule at tau, the reference token written wherever it commits.

    python lab/policy_calibration.py tiny build/tiny-distilled [--tau 0.9] [--n 50] [--split core]
"""
import argparse
import json

import torch

from dllm_deploy.training.distill import policy_states
from dllm_deploy.evals import tasks
from dllm_deploy.models.loading import load_model, resolve_model_dir
from dllm_deploy.models.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tau", type=float, default=0.9)
    ap.add_argument("--n", type=int, default=50, help="prompts per family")
    ap.add_argument("--split", default="core", choices=("core", "general"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    examples = tasks.eval_split(tasks.FAMILIES, a.n, a.split)
    for m in a.models:
        src = resolve_model_dir(m)
        model, cfg = load_model(src)
        model.eval().set_attention("sdpa")
        tok = load_tokenizer(src, cfg.eos_token_id)
        rows = [(tok.encode(e.prompt), tok.encode(e.answer)) for e in examples]
        _, c = policy_states(model, cfg, rows, a.tau)
        print(json.dumps({"model": m, "split": a.split, "tau": a.tau, **c}))


if __name__ == "__main__":
    main()
