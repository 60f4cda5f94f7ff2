"""``dllm-deploy bench`` of a self-speculative artifact (runtime/self_spec.py): ``ar``,
``linear-spec`` and ``tree-spec`` at each W over the same prompts, through the same backend, in one
interleaved run (medians over repeats; ratios against ``ar`` from this run only).

Per configuration: tokens, forwards (the prompt's, drafts and verifications), tokens per forward,
tokens per round (emitted per draft+verify round), verified tokens per round (the tree's cost),
tokens/s, exact match against the task answers, and whether every row's tokens equal ``ar``'s
(ar, linear-spec and tree-spec are lossless: a difference is reported as a failure of the run,
except under int8, whose activation scales depend on the whole call, and for the lossy
fastdiffuser: there the count of identical rows is reported).
"""
from __future__ import annotations

import statistics
import time

from ..errors import UserError
from ..runtime.self_spec import CALL_DEPENDENT, LOSSY, STRATEGIES, SelfSpecOptions, generate, mean_round

DEFAULT_STRATEGIES = ("ar", "linear-spec", "tree-spec", "fastdiffuser")


AHEAD = "+ahead"     # a strategy name's suffix: linear-spec / tree-spec with draft_ahead (SelfSpecOptions)


def configurations(strategies, widths) -> list[tuple[str, int]]:
    """(strategy, W) pairs: ar and linear-spec once, tree-spec at each W (W 1 is linear-spec);
    ``linear-spec+ahead`` / ``tree-spec+ahead``: the same, drafting ahead in the verify forward."""
    base = [s.removesuffix(AHEAD) if s.removesuffix(AHEAD) in ("linear-spec", "tree-spec") else s for s in strategies]
    bad = [s for s, b in zip(strategies, base) if b not in STRATEGIES]
    if bad:
        raise UserError(f"unknown strategy {bad[0]!r} for a self-speculative artifact (some of {', '.join(STRATEGIES)}; "
                        f"linear-spec{AHEAD}, tree-spec{AHEAD})")
    if "tree-spec" in base and (not widths or min(widths) < 1):
        raise UserError("tree-spec needs --beam-widths >= 1")
    out = []
    for s, b in dict.fromkeys(zip(strategies, base)):
        out += [(s, w) for w in widths if w > 1] if b == "tree-spec" else [(s, {"ar": 0}.get(s, 1))]
    return out


def label(strategy: str, width: int) -> str:
    return f"{strategy} W{width}" if strategy.startswith("tree-spec") else strategy




def run(artifact: str, strategies=DEFAULT_STRATEGIES, widths=(2, 4, 8), families=None, n: int = 5, repeats: int = 3,
        max_new_tokens: int = 128, batch_size: int = 1, block_size: int = 0, threads: int | None = None,
        progress=None, precisions=("fp32",)) -> dict:
    from .run import machine_facts, versions
    from ..evals import tasks
    from ..runtime.backends.ort import load_ort
    if n < 1 or repeats < 1 or batch_size < 1 or max_new_tokens < 1:
        raise UserError("--n, --repeats, --batch-size and --gen-length must be >= 1")
    configs = [(s, w, p) for p in precisions for s, w in configurations(strategies, widths)]
    loaded = {p: load_ort(artifact, precision=p, threads=threads) for p in precisions}
    tok, cfg = loaded[precisions[0]].tokenizer, loaded[precisions[0]].backend.config
    examples = tasks.eval_split(tuple(families or tasks.FAMILIES), n)
    prompts = [tok.encode(e.prompt) for e in examples]
    batches = [list(range(i, min(i + batch_size, len(prompts)))) for i in range(0, len(prompts), batch_size)]

    def once(strategy, width, precision):
        be = loaded[precision].backend
        opts = SelfSpecOptions(strategy=strategy.removesuffix(AHEAD), beam_width=max(width, 1),
                               max_new_tokens=max_new_tokens, block_size=block_size, draft_ahead=strategy.endswith(AHEAD))
        rows, seconds, forwards, verified, rounds = [None] * len(prompts), 0.0, 0, 0, []
        for idx in batches:
            t0 = time.perf_counter()
            res = generate(be, [prompts[i] for i in idx], opts, cfg.mask_token_id, cfg.eos_token_id, cfg.block_size,
                           requests=idx, max_seq=cfg.max_seq)
            seconds += time.perf_counter() - t0
            forwards, verified = forwards + res.forwards, verified + res.verify_tokens
            for j, i in enumerate(idx):
                rows[i] = res.tokens[j]
            rounds += [a for row in res.accepted for a in row]
        return rows, seconds, forwards, verified, rounds

    for p in precisions:                                 # warm-up: sessions, allocator, caches
        once(*next(c for c in configs if c[2] == p))
    runs = {c: [] for c in configs}
    for _ in range(repeats):
        for c in configs:
            runs[c].append(once(*c))
            if progress:
                progress(1)
    ar_rows = {p: runs[("ar", 0, p)][0][0] for p in precisions if ("ar", 0, p) in runs}
    out = []
    for (strategy, width, precision), reps in runs.items():
        rows, _, forwards, verified, rounds = reps[0]
        tokens = sum(len(r) for r in rows)
        seconds = statistics.median(r[1] for r in reps)
        outputs = [tok.decode(r) for r in rows]
        out.append({
            "label": label(strategy, width) + ("" if precision == "fp32" else f" {precision}"),
            "strategy": strategy, "beam_width": width, "precision": precision,
            "tokens": tokens, "forwards": forwards, "tpf": round(tokens / forwards, 3),
            "rounds": len(rounds), "tokens_per_round": round(mean_round(rounds), 3),
            "verified_per_round": round(verified / len(rounds), 2) if rounds else 0.0,
            "seconds_median": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1),
            "exact_match": round(sum(tasks.score(e, o) for e, o in zip(examples, outputs)) / len(examples), 3),
            "identical_to_ar": None if precision not in ar_rows else rows == ar_rows[precision],
            "rows_identical_to_ar": None if precision not in ar_rows else sum(
                a == b for a, b in zip(rows, ar_rows[precision])),
        })
    for r in out:
        ar = next((x for x in out if x["strategy"] == "ar" and x["precision"] == r["precision"]), None)
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / ar["tokens_per_s"], 3) if ar else None
        lin = next((x for x in out if x["strategy"] == "linear-spec" and x["precision"] == r["precision"]), None)
        r["rounds_vs_linear"] = (round(r["tokens_per_round"] / lin["tokens_per_round"], 3)
                                 if lin and r["strategy"] == "tree-spec" else None)
    return {"kind": "self_spec", "artifact": str(artifact), "family": cfg.layout, "prompts": len(prompts),
            "tasks": list(families or tasks.FAMILIES), "n": n, "repeats": repeats, "max_new_tokens": max_new_tokens,
            "batch_size": batch_size, "block_size": block_size or cfg.block_size, "threads": threads,
            "precisions": list(precisions), "machine": machine_facts(), "versions": versions(), "runs": out,
            "lossless": all(r["identical_to_ar"] is not False for r in out
                            if r["precision"] not in CALL_DEPENDENT and r["strategy"] not in LOSSY)}


def table(res: dict) -> str:
    head = f"{'configuration':<19} {'tok/round':>9} {'verified':>8} {'TPF':>6} {'tok/s':>8} {'vs ar':>6} {'EM':>6}  rows as ar"
    lines = [head]
    for r in res["runs"]:
        same = "-" if r["rows_identical_to_ar"] is None else f"{r['rows_identical_to_ar']}/{res['prompts']}"
        lines.append(f"{r['label']:<19} {r['tokens_per_round']:>9.2f} {r['verified_per_round']:>8.1f} {r['tpf']:>6.2f} "
                     f"{r['tokens_per_s']:>8.1f} {r['speedup_vs_ar'] or 0:>6.2f} {r['exact_match']:>6.3f}  {same}")
    return "\n".join(lines)
