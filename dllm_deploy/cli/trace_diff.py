"""``dllm-deploy trace-diff``: where two decision traces first decide differently."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def add_parser(sub) -> None:
    td = sub.add_parser("trace-diff", help="where two decision traces (generate --trace) first decide differently, "
                                           "and how near a tie that was")
    td.add_argument("a", metavar="A", help="a trace file (generate --trace, dllm-generate --trace)")
    td.add_argument("b", metavar="B", help="the same decode's trace from another machine, provider or build")
    td.add_argument("--near-tie", type=float, default=1e-3, metavar="MARGIN",
                    help="margins under this count as a near-tie (default 0.001)")
    td.add_argument("--json", action="store_true", help="one JSON object")
    td.set_defaults(func=run)


def _read_trace(path: str) -> list[dict]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UserError(f"{path}: {e.strerror.lower()}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a trace (not UTF-8 text)") from None
    out = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{n}: not a trace record (not JSON)") from None
        if not isinstance(rec, dict) or not {"row", "block", "step", "forward", "commit", "margin"} <= rec.keys():
            raise UserError(f"{path}:{n}: not a trace record (generate --trace writes them)")
        out.append(rec)
    return out


def run(a) -> int:
    """Two traces of one decode (two machines, providers or precisions): where they first decide
    differently and how near a tie that decision was on each side. Exit 0: the same decisions."""
    from ..runtime.trace import first_difference, margin_drift
    x, y = _read_trace(a.a), _read_trace(a.b)
    try:
        diff = first_difference(x, y)
    except ValueError as e:
        raise UserError(f"{a.a}, {a.b}: {e}") from None
    fmt = lambda m: "none" if m == float("inf") else f"{m:.3g}"          # noqa: E731
    if diff is None:
        out = {"same": True, "records": len(x), "margin_drift": margin_drift(x, y)}
        text = f"the same decisions in all {len(x)} records (margins differ by at most {fmt(out['margin_drift'])})"
    else:
        r, wide = diff["a"], max(diff["margin_a"], diff["margin_b"])
        out = {"same": False, **diff, "near_tie": wide < a.near_tie}
        text = "\n".join([
            f"first different decision: record {diff['record']} (row {r['row']}, block {r['block']}, step {r['step']}, "
            f"forward {r['forward']})",
            *(f"  {name}: commit {rec['commit']}, accepted {rec.get('accepted', '-')}, narrowest margin {fmt(m)}"
              for name, rec, m in (("A", diff["a"], diff["margin_a"]), ("B", diff["b"], diff["margin_b"]))),
            f"  a near-tie: both margins under {a.near_tie:g}" if out["near_tie"] else
            f"  not a near-tie: a margin of {fmt(wide)} (over {a.near_tie:g}) differs more than kernels' rounding "
            "explains in fp32 (int8's activation rounding can: docs/cpp.md)"])
    print(json.dumps(out) if a.json else text)
    return 0 if diff is None else 1
