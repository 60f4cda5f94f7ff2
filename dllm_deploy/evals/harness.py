"""Evaluation harness: exact-match accuracy per task family, with the decoding counters.

``text`` (open Python-standard-library text) is scored by likelihood, not exact match, and is
not counted in ``overall``: see ``masked_nll``.
"""
from __future__ import annotations

import time

import numpy as np

from . import tasks


def run_eval(runtime, dcfg, families=tasks.FAMILIES, n: int = tasks.EVAL_PER_FAMILY, batch_size: int = 8,
             progress=None, row=None, split: str = "core") -> dict:
    """``runtime``: a Runtime (``generate``, ``backend``); ``row``: the RowOptions (sampling) of every prompt (None: greedy); ``split``: ``core`` (in
    distribution) or ``general`` (held-out words and lengths), see ``tasks.eval_split``."""
    examples = tasks.eval_split(families=tuple(families), n=n, split=split)
    per: dict[str, dict] = {f: {"correct": 0, "n": 0, "forwards": 0, "tokens": 0, "wall_s": 0.0, "hist": {}}
                            for f in families}
    outputs = []
    t0 = time.perf_counter()
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        t1 = time.perf_counter()
        results = runtime.generate([e.prompt for e in chunk], None if row is None else [row] * len(chunk), config=dcfg)
        dt = time.perf_counter() - t1
        for e, r in zip(chunk, results):
            s = per[e.family]
            ok = tasks.score(e, r.text)
            s["correct"] += int(ok)
            s["n"] += 1
            s["forwards"] += r.forwards
            s["tokens"] += r.tokens
            s["wall_s"] += dt / len(chunk)
            for k, v in r.accepted_hist.items():
                s["hist"][k] = s["hist"].get(k, 0) + v
            outputs.append({"family": e.family, "prompt": e.prompt, "answer": e.answer, "output": r.text,
                            "correct": ok, "token_ids": r.token_ids, "forwards": r.forwards})
        if progress:
            progress(len(chunk))
    wall = time.perf_counter() - t0

    def summary(rows):
        n_ = sum(r["n"] for r in rows)
        fw = sum(r["forwards"] for r in rows)
        tk = sum(r["tokens"] for r in rows)
        ws = sum(r["wall_s"] for r in rows)
        hist: dict = {}
        for r in rows:
            for k, v in r["hist"].items():
                hist[k] = hist.get(k, 0) + v
        return {"accuracy": sum(r["correct"] for r in rows) / max(n_, 1), "n": n_, "tpf": tk / max(fw, 1),
                "forwards": fw, "tokens": tk, "tokens_per_s": tk / ws if ws > 0 else 0.0,
                "accepted_hist": {str(k): v for k, v in sorted(hist.items())}}

    return {"strategy": dcfg.strategy, "backend": runtime.backend.name, "split": split,
            "decode": {k: v for k, v in dcfg.__dict__.items() if k != "schedule"},
            "overall": summary(list(per.values())),
            "tasks": {f: summary([per[f]]) for f in families},
            "wall_s": wall, "outputs": outputs}


def masked_nll(backend, tokenizer, config, n: int = tasks.EVAL_PER_FAMILY, ratios=(0.25, 0.5, 0.75, 1.0),
               seed: int = 0) -> dict:
    """Open-text family: mean negative log-likelihood (nats/token) of the masked tokens of the
    answer's first block at fixed mask ratios, given the prompt (the terms of the diffusion ELBO
    at those ratios). Lower is better; a uniform guess over bytes scores ln 256 = 5.55."""
    rng = np.random.default_rng(seed)
    L = config.block_size
    nll, count = 0.0, 0
    for e in tasks.eval_split(families=("text",), n=n):
        p = tokenizer.encode(e.prompt)
        a = np.array((tokenizer.encode(e.answer) + [config.eos_token_id] * L)[:L])
        for ratio in ratios:
            hide = rng.random(L) < ratio
            if not hide.any():
                hide[rng.integers(L)] = True
            ids = np.concatenate([p, np.where(hide, config.mask_token_id, a)])[None].astype(np.int64)
            t = ids.shape[1]
            blocks = np.array([0] * len(p) + [1] * L)
            mask = (blocks[None, :] <= blocks[:, None])[None, None]
            logits = backend.logits(backend.new_cache(1, t), ids, np.arange(t)[None], mask)[0, len(p):]
            logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            lp = logits[np.arange(L), a] - logz
            nll -= float(lp[hide].sum())
            count += int(hide.sum())
    return {"masked_nll": nll / max(count, 1), "n": n, "tokens": count, "ratios": list(ratios)}
