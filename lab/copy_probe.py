"""Has the copy circuit formed, and does it copy words it never saw? A teacher-forced probe.

    python lab/copy_probe.py FOLDER [N_PER_FAMILY]

For N held-out prompts per family of both splits (``core``: in distribution; ``general``: held-out
words and lengths), the checkpoint predicts every answer byte from the prompt and the answer
bytes before it (the warm-up's causal mask, ``training/train.py``). Prints, per split and family,
next-byte accuracy and the share of answers predicted whole, as JSON. During the autoregressive
warm-up this is the signal that the copy circuit has formed: ``general`` / ``upper`` (upper-casing
random letters) stays near chance until then, however well ``core`` does on memorised words.
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


def probe(folder: Path, n: int = 8) -> dict:
    model, _ = load_model(folder)
    model.eval()
    tok = ByteTokenizer()
    out: dict = {}
    for split in tasks.SPLITS:
        examples = tasks.eval_split(families=tasks.FAMILIES, n=n, split=split)
        out[split] = {}
        for fam in tasks.FAMILIES:
            rows = [T.build_row(e, tok, random.Random(0)) for e in examples if e.family == fam]
            ids, pos, mask, tgt, lf = T.make_ar_batch(rows, tok)
            with torch.no_grad():
                logits, _ = model(ids, pos, mask)
            hit = logits.argmax(-1) == tgt
            out[split][fam] = {"byte_accuracy": round(hit[lf].float().mean().item(), 3),
                               "whole": round((hit | ~lf).all(1).float().mean().item(), 3)}
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(probe(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8), indent=1))
