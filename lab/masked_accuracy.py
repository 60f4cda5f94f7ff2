"""Masked-token accuracy of a tiny-family checkpoint on the held-out split (teacher-forced).

    python lab/masked_accuracy.py dllm_deploy/models/tiny [N_PER_FAMILY]

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

from dllm_deploy.evals import tasks
from dllm_deploy.training import train as T
from dllm_deploy.models.loading import load_model
from dllm_deploy.models.tokenizer import ByteTokenizer


def main(folder: Path, n: int = 20) -> dict:
    model, _ = load_model(folder)
    model.eval()
    tok = ByteTokenizer()
    out = {}
    for fam in tasks.FAMILIES:
        out[fam] = {}
        for ratio in (0.15, 0.5, 1.0):
            def hide(a, tok_, rng, ratio=ratio):   # answer bytes only, never the EOS padding
                n = a.index(tok_.EOS)
                flags = [int(rng.random() < ratio and i < n) for i in range(len(a))]
                return [tok_.MASK if f else x for f, x in zip(flags, a)], flags
            rng, ok, total = random.Random(0), 0, 0
            for e in tasks.eval_split(families=(fam,), n=n):
                row = T.build_row(e, tok, rng, noise=hide)
                ids, pos, mask, tgt, lf = T.make_batch(rng, 1, tok, set(), rows=[row])
                with torch.no_grad():
                    logits, _ = model(ids, pos, mask)
                ok += int((logits[lf].argmax(-1) == tgt[lf]).sum())
                total += int(lf.sum())
            out[fam][str(ratio)] = round(ok / max(total, 1), 3)
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20)))
