"""Where threshold decoding goes wrong: each commit's confidence against the vanilla decode.

For every held-out prompt that vanilla (one token per step) answers correctly, the prompt is decoded
again with the threshold rule; each position the rule commits is compared with vanilla's final
token there. Reported per confidence bucket: commits, and commits that disagree with vanilla
(the first disagreement of a prompt separately: later ones are often its consequences), and the
first disagreement's step within its block.

Usage: python lab/commit_calibration.py ARTIFACT [--tau 0.9] [--n 20] [--split core] [--json]
"""
from __future__ import annotations

import argparse
import collections
import json

import numpy as np

from dllm_deploy.evals import tasks
from dllm_deploy.runtime import rules
from dllm_deploy.runtime.api import Runtime

BUCKETS = (0.999, 0.99, 0.97, 0.9, 0.0)


def bucket(p: float) -> str:
    return next(f">={b}" for b in BUCKETS if p >= b)


def record(log):
    """Wrap the rules so every call appends (state before, state after, probs, step) to ``log``."""
    for cls in (rules.Vanilla, rules.Threshold):
        orig = cls.__call__

        def call(self, state, ids, probs, step, mask_id, _orig=orig):
            out = _orig(self, state, ids, probs, step, mask_id)
            log.append((state.copy(), out.copy(), probs.copy(), step))
            return out
        cls.__call__ = call


def blocks(log):
    """Final state of every block, in decode order (a block starts at step 0)."""
    out = []
    for _, after, _, step in log:
        if step == 0:
            out.append(None)
        out[-1] = after
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--tau", type=float, default=0.9)
    ap.add_argument("--n", type=int, default=20, help="prompts per family")
    ap.add_argument("--split", default="core")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rt = Runtime.load(artifact=a.artifact)
    mask = rt.config.mask_token_id
    log: list = []
    record(log)
    all_commits = collections.Counter()
    wrong = collections.Counter()
    first = collections.Counter()
    first_step = collections.Counter()
    prompts = kept = 0
    for ex in tasks.eval_split(families=tasks.FAMILIES, n=a.n, split=a.split):
        prompts += 1
        log.clear()
        if not tasks.score(ex, rt.generate([ex.prompt], strategy="vanilla")[0].text):
            continue
        kept += 1
        ref = blocks(log)
        log.clear()
        rt.generate([ex.prompt], strategy="threshold", threshold=a.tau)
        b, seen = -1, False
        for before, after, probs, step in log:
            b += step == 0
            for i in np.flatnonzero((before == mask) & (after != mask)):
                k = bucket(float(probs[i]))
                all_commits[k] += 1
                if after[i] != ref[b][i]:
                    wrong[k] += 1
                    if not seen:
                        first[k] += 1
                        first_step[min(step, 5)] += 1
                        seen = True
    rows = {k: {"commits": all_commits[k], "disagree": wrong[k], "first_disagreements": first[k]}
            for k in (f">={b}" for b in BUCKETS)}
    res = {"artifact": a.artifact, "tau": a.tau, "split": a.split, "prompts": prompts, "vanilla_correct": kept,
           "prompts_with_a_disagreement": sum(first.values()), "buckets": rows,
           "first_disagreement_step": {("5+" if s == 5 else str(s)): c for s, c in sorted(first_step.items())}}
    if a.json:
        print(json.dumps(res))
        return
    print(f"{kept} of {prompts} prompts right with vanilla; threshold tau {a.tau} disagrees on "
          f"{res['prompts_with_a_disagreement']} of them")
    print(f"{'confidence':>11} {'commits':>8} {'disagree':>9} {'first':>6}")
    for k, r in rows.items():
        print(f"{k:>11} {r['commits']:>8} {r['disagree']:>9} {r['first_disagreements']:>6}")
    print("first disagreement at block step:", res["first_disagreement_step"])


if __name__ == "__main__":
    main()
