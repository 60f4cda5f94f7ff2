"""Lossless SPD under sampling: TPF against the base rule alone, and the prompts where SPD returns
the base rule's exact tokens (all of them, by construction: docs/algorithms.md, "Sampling").

    PYTHONPATH=$PWD .venv/bin/python -m dllm_deploy.cli export --model tiny --out build/tiny
    PYTHONPATH=$PWD .venv/bin/python lab/sampling_spd.py --artifact build/tiny --n 10 --json out.json

The held-out eval prompts (``--n`` per family), temperature 0.7, top-p 0.9, seeds 0 1 2, SPD W = 4
(the default tree) over vanilla and over threshold, ONNX Runtime CPU, the same batches for both.
"""
from __future__ import annotations

import argparse
import json

from dllm_deploy import Runtime
from dllm_deploy.evals import tasks
from dllm_deploy.runtime.rows import RowOptions


def totals(results) -> dict:
    tokens, forwards = sum(r.tokens for r in results), sum(r.forwards for r in results)
    return {"tokens": tokens, "forwards": forwards, "tpf": tokens / max(forwards, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--n", type=int, default=10, help="prompts per family")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rt = Runtime.load(artifact=a.artifact, profile="generic-cpu")
    examples = tasks.eval_split(families=tasks.FAMILIES, n=a.n)
    prompts = [e.prompt for e in examples]
    rows = []
    for base in ("vanilla", "threshold"):
        for seed in a.seeds:
            row = RowOptions(temperature=0.7, top_p=0.9, seed=seed)
            out = {"base": base, "seed": seed, "prompts": len(prompts)}
            got = {}
            for name, kw in (("base", {"strategy": base}),
                             ("spd", {"strategy": "spd", "base": base, "beam_width": a.beam_width})):
                got[name] = [r for i in range(0, len(prompts), a.batch_size)
                             for r in rt.generate(prompts[i:i + a.batch_size], rows=[row] * len(prompts[i:i + a.batch_size]), **kw)]
                out[name] = totals(got[name])
                out[name]["accuracy"] = sum(tasks.score(e, r.text) for e, r in zip(examples, got[name])) / len(examples)
            out["identical"] = sum(x.token_ids == y.token_ids for x, y in zip(got["base"], got["spd"]))
            rows.append(out)
            print(f"{base:<10} seed {seed}: base TPF {out['base']['tpf']:.2f}  spd W{a.beam_width} TPF "
                  f"{out['spd']['tpf']:.2f}  identical {out['identical']}/{len(prompts)}  "
                  f"accuracy {out['base']['accuracy']:.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
