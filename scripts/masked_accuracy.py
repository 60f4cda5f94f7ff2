"""Masked-token accuracy of a tiny-family checkpoint on the held-out split (teacher-forced).

    python scripts/masked_accuracy.py dllm_deploy/models/tiny [N_PER_FAMILY]

For each family, the answer's blocks are masked at random at ratios 0.15, 0.5 and 1.0 (answer
bytes only, not the EOS padding) and the model, with the prompt and earlier clean blocks in
view as at decode time, predicts them in one forward. Prints {family: {ratio: accuracy}} as JSON:
how much of an answer the model can fill from its context, before any decoding order matters.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from dllm_deploy.evals import tasks
from dllm_deploy.models import train as T
from dllm_deploy.models.tokenizer import ByteTokenizer
from dllm_deploy.models.transformer import DLLM


def main(folder: Path, n: int = 20) -> dict:
    raw = json.loads((folder / "config.json").read_text())
    cfg = T.tiny_config(raw["hidden_size"], raw["num_hidden_layers"], raw["num_attention_heads"],
                        raw["num_key_value_heads"], raw["intermediate_size"])
    model = DLLM(cfg)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    model.eval()
    tok, L = ByteTokenizer(), T.BLOCK
    out = {}
    for fam in tasks.FAMILIES:
        out[fam] = {}
        for ratio in (0.15, 0.5, 1.0):
            rng, ok, total = random.Random(0), 0, 0
            for e in tasks.eval_split(families=(fam,), n=n):
                p, ans = tok.encode(e.prompt), tok.encode(e.answer)
                a = ans + [tok.EOS] * (L - len(ans) % L)
                noisy = [tok.MASK if rng.random() < ratio and i < len(ans) else x for i, x in enumerate(a)]
                c = len(a) - L
                ids = p + a[:c] + noisy
                pos = list(range(len(p) + c)) + list(range(len(p), len(p) + len(a)))
                kind = [T.KIND_PROMPT] * len(p) + [T.KIND_CLEAN] * c + [T.KIND_NOISY] * len(a)
                blk = [-1] * len(p) + [i // L for i in range(c)] + [i // L for i in range(len(a))]
                mask = T.training_mask(torch.tensor([kind]), torch.tensor([blk]))
                with torch.no_grad():
                    logits, _ = model(torch.tensor([ids]), torch.tensor([pos]), mask)
                pred = logits[0, len(p) + c:].argmax(-1).tolist()
                hit = [i for i, x in enumerate(noisy) if x == tok.MASK]
                ok += sum(pred[i] == a[i] for i in hit)
                total += len(hit)
            out[fam][str(ratio)] = round(ok / max(total, 1), 3)
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20)))
