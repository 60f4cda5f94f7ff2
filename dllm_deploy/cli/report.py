"""``dllm-deploy report``: docs/BENCHMARKS.md and plots from a bench JSON."""
from __future__ import annotations

import sys
from pathlib import Path

from .common import write_file


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="docs/BENCHMARKS.md and plots from a bench JSON")
    rp.add_argument("bench_json", help="the JSON written by `dllm-deploy bench --json`")
    rp.add_argument("--out", default=None, help="markdown file to write (default: stdout)")
    rp.add_argument("--plots", default=None, metavar="DIR", help="write the PNG plots here and link them")
    rp.add_argument("--compare", default=None, metavar="JSON",
                    help="another bench run (e.g. of a distilled model): its Pareto front and equal-quality figures beside these")
    rp.add_argument("--compare-label", default="other run", help="what to call the --compare run in the doc and plot")
    rp.add_argument("--peers", nargs="+", default=None, metavar="JSON",
                    help="peer runs (lab/peers/*.json): a Peers table, and with --plots a tokens/s plot")
    rp.add_argument("--load-test", default=None, metavar="JSON",
                    help="add the serving load table from lab/load_table.py's JSON (lab/load-ab.json)")
    rp.set_defaults(func=run)


def run(a) -> int:
    from ..bench import report
    from ..bench.targets import equal_quality, targets
    res = report.load(a.bench_json)
    other = report.load(a.compare) if a.compare else None
    for r in (res, other):
        if r is not None:       # recomputed: the doc follows the current rules
            r["equal_quality"] = equal_quality(r["runs"], (r.get("equal_quality") or {}).get("budget", 0.01))
    res["targets"] = targets(res)
    paths = report.plots(res, a.plots, other=other, other_label=a.compare_label) if a.plots else []
    load = report.load_test(a.load_test) if a.load_test else None
    peers = report.load_peers(a.peers) if a.peers else None
    peers_plot = report.peers_plot(peers, a.plots) if peers and a.plots else None
    text = report.markdown(res, paths, a.out, source=a.bench_json, load=load, load_source=a.load_test,
                           other=other, other_source=a.compare, other_label=a.compare_label,
                           peers=peers, peers_plot_path=peers_plot)
    n_plots = len(paths) + (peers_plot is not None)
    if a.out:
        write_file(Path(a.out), text)
        print(f"wrote {a.out}" + (f" and {n_plots} plots in {a.plots}" if n_plots else ""), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
