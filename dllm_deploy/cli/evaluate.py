"""``dllm-deploy eval``: exact-match accuracy and decoding counters on the held-out split."""
from __future__ import annotations

import json
import sys

from ..errors import UserError
from .common import add_decode_flags, decode_kwargs, progress, runtime


def add_parser(sub) -> None:
    e = sub.add_parser("eval", help="exact-match accuracy and decoding counters on the held-out split")
    add_decode_flags(e)
    e.add_argument("--tasks", default=None, help="comma-separated families (default: all)")
    e.add_argument("--n", type=int, default=50, help="prompts per family (max 50)")
    e.add_argument("--split", choices=["core", "general"], default="core",
                   help="core: in distribution; general: held-out words and lengths (docs/model_card.md)")
    e.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    e.add_argument("--outputs", action="store_true", help="include every prompt's output in the JSON")
    e.set_defaults(func=run)


def run(a) -> int:
    from ..evals import tasks
    from ..evals.harness import run_eval
    from ..runtime.api import decode_config, row_options
    dcfg = decode_config(**decode_kwargs(a))
    wanted = tuple(a.tasks.split(",")) if a.tasks else tasks.FAMILIES + tasks.OPEN_FAMILIES
    bad = [f for f in wanted if f not in tasks.FAMILIES + tasks.OPEN_FAMILIES]
    if bad:
        raise UserError(f"unknown task {bad[0]!r} (expected some of {', '.join(tasks.FAMILIES + tasks.OPEN_FAMILIES)})")
    families = tuple(f for f in wanted if f in tasks.FAMILIES)
    if a.n < 1 or a.n > tasks.EVAL_PER_FAMILY:
        raise UserError(f"--n must be between 1 and {tasks.EVAL_PER_FAMILY}")
    rt = runtime(a)
    dcfg = rt.decode_config(**decode_kwargs(a))
    bar = progress(len(families) * a.n, f"eval {dcfg.strategy}", not a.json and sys.stderr.isatty())
    res = run_eval(rt, dcfg, families=families, n=a.n, batch_size=a.batch_size, progress=bar,
                   row=row_options(**decode_kwargs(a)), split=a.split)
    if "text" in wanted:
        from ..evals.harness import masked_nll
        res["open_text"] = masked_nll(rt.backend, rt.tokenizer, rt.config, n=a.n)
    if not a.outputs:
        res.pop("outputs")
    if a.json:
        print(json.dumps(res))
    else:
        print(f"strategy {res['strategy']}  backend {res['backend']}  split {res['split']} ({tasks.SPLITS[res['split']]})")
        print(f"{'task':<10}{'acc':>7}{'n':>5}{'TPF':>8}{'forwards':>10}{'tokens':>8}{'tok/s':>9}")
        for name, s in list(res["tasks"].items()) + [("overall", res["overall"])]:
            print(f"{name:<10}{s['accuracy']:>7.3f}{s['n']:>5}{s['tpf']:>8.2f}{s['forwards']:>10}{s['tokens']:>8}{s['tokens_per_s']:>9.1f}")
        if "open_text" in res:
            print(f"text (open, not in overall): masked NLL {res['open_text']['masked_nll']:.3f} nats/token")
    return 0
