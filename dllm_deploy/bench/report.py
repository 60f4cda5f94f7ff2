"""Plots and ``docs/BENCHMARKS.md`` from a ``dllm-deploy bench --json`` result.

    dllm-deploy report lab/bench.json --out docs/BENCHMARKS.md --plots lab/plots

Every figure in the report is read from the JSON; nothing is typed in by hand. matplotlib is
needed for the plots only (the ``dev`` extra); the markdown is written without it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UserError, read_text

PLOTS = ("tpf_vs_beam_width", "pareto", "tokens_per_s", "memory_vs_beam_width", "forward_cost")


def load(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such bench result")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not a bench result ({e.msg}, line {e.lineno})") from None
    if not isinstance(d, dict) or "runs" not in d or "forward_cost" not in d:
        raise UserError(f"{p}: not a bench result (no runs / forward_cost; rerun `dllm-deploy bench --json`)")
    return d


def _family(r: dict) -> str:
    """The series a run belongs to in the plots (strategy + selection, no W)."""
    if r["strategy"] != "spd":
        return r["strategy"] + (" (no cache)" if r.get("cache") == "none" else "")
    return f"spd {r['select']}" + (f"/{r['base']}" if r["select"] == "lossless" else "") + \
        (f" tau{r['threshold']}" if r["select"] == "threshold" or r["base"] == "threshold" else "")


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or a one-line UserError naming the extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plots need matplotlib (pip install 'dllm-deploy[dev]')") from None
    return plt


def plots(res: dict, out_dir: str | Path, other: dict | None = None, other_label: str = "other run") -> list[Path]:
    """Write the five PNGs; returns their paths. ``other``: another run (``other_label``) whose
    Pareto front the Pareto plot shows too."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs, written = res["runs"], []
    backends = sorted({r["backend"] for r in runs})

    def finish(fig, ax, name, xlabel, ylabel, title):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        save(fig, name)

    def save(fig, name):
        path = out / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # 1. TPF vs beam width, one line per (backend, spd mode); baselines as horizontal lines
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    # TPF does not depend on the backend (same tokens): one backend, the one with every baseline
    for be in sorted(backends, key=lambda b: (b != "ort", b != "torch", b)):
        series: dict[str, list] = {}
        for r in runs:
            if r["backend"] == be:
                series.setdefault(_family(r), []).append(r)
        for name, rows in sorted(series.items()):
            if rows[0]["strategy"] == "spd":
                rows = sorted(rows, key=lambda r: r["beam_width"])
                ax.plot([r["beam_width"] for r in rows], [r["tpf"] for r in rows], marker="o", label=f"{be} {name}")
            else:
                ax.axhline(rows[0]["tpf"], linestyle="--", linewidth=1, label=f"{be} {name}", color="grey" if "no cache" in name else None)
        break
    finish(fig, ax, "tpf_vs_beam_width", "beam width W", "tokens per forward (measured)", "TPF vs beam width")

    # 2. accuracy vs tokens/s (Pareto front), with another run's front when given
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    be0 = "ort" if "ort" in backends else backends[0]
    for name, src, color, annotate in ((other_label, other, "tab:grey", False), ("this run", res, "tab:blue", True)):
        if src is None:
            continue
        pts = [r for r in src["runs"] if r["backend"] == be0 and not r.get("temperature")]
        ax.scatter([r["tokens_per_s"] for r in pts], [r["accuracy"] for r in pts], s=16, color=color,
                   label=f"{name} ({be0} configurations)")
        if annotate:
            for r in pts:
                ax.annotate(r["label"].split(":", 1)[1], (r["tokens_per_s"], r["accuracy"]), fontsize=5)
        front, best = [], -1.0
        for r in sorted(pts, key=lambda r: -r["tokens_per_s"]):
            if r["accuracy"] > best:
                front.append(r)
                best = r["accuracy"]
        ax.plot([r["tokens_per_s"] for r in front], [r["accuracy"] for r in front], color=color, linewidth=1,
                label=f"{name}: Pareto front")
    ax.set_xscale("log")
    finish(fig, ax, "pareto", "tokens/s (median, log scale)", "exact-match accuracy", f"accuracy vs tokens/s ({be0})")

    # 3. tokens/s per backend and strategy (median, with min-max whiskers)
    labels = sorted({r["label"].split(":", 1)[1] for r in runs})
    fig, ax = plt.subplots(figsize=(max(6.4, 0.5 * len(labels) * len(backends)), 4.4))
    width = 0.8 / max(len(backends), 1)
    for i, be in enumerate(backends):
        by = {r["label"].split(":", 1)[1]: r for r in runs if r["backend"] == be}
        xs = [j + i * width for j, lab in enumerate(labels) if lab in by]
        rows = [by[lab] for lab in labels if lab in by]
        ax.bar(xs, [r["tokens_per_s"] for r in rows], width, label=be,
               yerr=[[r["tokens_per_s"] - r["tokens_per_s_min"] for r in rows],
                     [r["tokens_per_s_max"] - r["tokens_per_s"] for r in rows]], capsize=2)
    ax.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("tokens/s (median of repeats)")
    ax.set_title("tokens/s per backend and strategy (measured)")
    ax.legend(fontsize=7)
    save(fig, "tokens_per_s")

    # 4. memory vs beam width (estimate; measured where the bench measured it)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    by_w: dict[int, dict] = {}
    for r in runs:
        by_w.setdefault(r["beam_width_used"], r)
    ws = sorted(by_w)
    ax.plot(ws, [by_w[w]["memory_estimate_mb"] for w in ws], marker="o", label="estimate (memory model)")
    peak = {r["beam_width_used"]: r["memory_peak_mb"] for r in runs if r.get("memory_peak_mb") is not None}
    meas = sorted(peak.items())      # one measured peak per W (every backend shares it)
    if meas:
        ax.plot([w for w, _ in meas], [m for _, m in meas], marker="s", label="measured peak (ORT CPU)")
    finish(fig, ax, "memory_vs_beam_width", "beam width W", "MB", "memory vs beam width")

    # 5. forward cost: ms per forward vs tokens per forward, per backend
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for be, rows in sorted(res["forward_cost"].items()):
        ax.plot([r["tokens"] for r in rows], [r["ms"] for r in rows], marker="o", label=f"{be} (measured)")
        one = rows[0]["ms"]
        ax.plot([r["tokens"] for r in rows], [one for _ in rows], linestyle=":", label=f"{be} memory-bound model (flat)")
    finish(fig, ax, "forward_cost", "tokens per forward (W x L)", "ms per verification forward", "forward cost vs tokens carried")
    return written


def _fmt(v, spec=".2f", none="n/a"):
    return none if v is None else format(v, spec)


SERVERS = ("one-at-a-time", "static", "continuous")     # lab/load_ab.sh's three servers


def load_test(path: str | Path) -> dict:
    """A load-ab JSON (lab/load_table.py), or a one-line UserError naming the file."""
    p = Path(path)
    try:
        d = json.loads(read_text(p, "not a load-test result (not UTF-8)"))
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not a load-test result ({e.msg}, line {e.lineno})") from None
    if not isinstance(d, dict) or not isinstance(d.get("levels"), dict):
        raise UserError(f"{p}: not a load-test result (no levels; run lab/load_table.py)")
    return d


def load_rows(load: dict) -> list[str]:
    """The serving load table (markdown rows) of a load-ab JSON (lab/load_table.py writes it
    from lab/load_ab.sh's loadtest runs): tokens/s per server and the throughput ratios
    measured in the same interleaved run, p50 latency, lost and corrupted answers."""
    lines = ["| clients | one at a time tok/s | static x8 tok/s | continuous x8 tok/s | static / one | continuous / one "
             "| continuous / static | p50 ms: one / static / continuous | lost / corrupted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c, r in sorted(load["levels"].items(), key=lambda kv: int(kv[0])):
        if set(r) != set(SERVERS):
            continue
        t = {s: r[s]["tokens_per_s"] for s in SERVERS}
        lost = sum(r[s]["requests"] - r[s]["answered"] for s in SERVERS)
        bad = sum(r[s]["corrupted"] for s in SERVERS)
        p50 = " / ".join(f"{r[s]['latency_p50_s'] * 1000:.0f}" for s in SERVERS)
        lines.append(f"| {c} | {t['one-at-a-time']:.1f} | {t['static']:.1f} | {t['continuous']:.1f} "
                     f"| {t['static'] / t['one-at-a-time']:.2f}x | {t['continuous'] / t['one-at-a-time']:.2f}x "
                     f"| {t['continuous'] / t['static']:.2f}x | {p50} | {lost} / {bad} |")
    return lines


PEER_KEYS = ("engine", "forwards", "ms_per_forward", "tokens_per_s")


def load_peers(paths: list[str]) -> list[tuple[str, dict]]:
    """(source, result) of each peer run (lab/peers/run_llama_cpp.py writes them), or a
    one-line UserError naming the file."""
    out = []
    for path in paths:
        p = Path(path)
        try:
            d = json.loads(read_text(p, "not a peers result (not UTF-8)"))
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: not a peers result ({e.msg}, line {e.lineno})") from None
        rows = d.get("rows") if isinstance(d, dict) else None
        if not rows or not isinstance(rows, list) or not all(isinstance(r, dict) and set(PEER_KEYS) <= r.keys() for r in rows):
            raise UserError(f"{p}: not a peers result (rows of {', '.join(PEER_KEYS)}; run lab/peers/llama_cpp.sh)")
        out.append((str(path), d))
    return out


def _identity(ident: dict) -> str:
    """A peer run's token identity check in words (run_llama_cpp.py's ``identity``)."""
    head = f"{ident.get('schedule', 'same schedule')}: "
    if ident.get("identical_text"):
        return head + "the same text from both engines"
    where = ident.get("first_difference_token")
    m = ident.get("our_margin_there") or {}
    return head + (f"the texts part at generated token {where}" if where is not None else "the texts differ") + (
        f", where our top-1 leads the top-2 by {m['margin']:.2g} (top-1 {m['top1']:.4f})" if "margin" in m else "")


def _peers_setup(d: dict) -> str:
    keys = (("layout", "{} layout"), ("prompt_tokens", "prompt {} tokens"), ("gen_length", "{} generated"),
            ("block_length", "blocks of {}"), ("threads", "{} threads"))
    return ", ".join(f.format(d[k]) for k, f in keys if k in d)


def peers_plot(peers: list[tuple[str, dict]], out_dir: str | Path) -> Path:
    """tokens/s of each engine in each peer run, log scale: one PNG."""
    plt = _pyplot()
    labels, values = [], []
    for source, d in peers:
        for r in d["rows"]:
            labels.append(f"{Path(source).stem}: {r['engine']}")
            values.append(r["tokens_per_s"])
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    lo, hi = min(values) / 2, max(values) * 2
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(labels) + 1.4))
    ax.barh(range(len(labels)), [v - lo for v in values], left=lo,
            color=["#2a6" if "dllm-deploy" in lab else "#888" for lab in labels])
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens/s (log scale)")
    ax.set_title("Peers: one checkpoint through each engine", fontsize=10)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "peers.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _peers_section(peers: list[tuple[str, dict]], plot: Path | None, doc_path) -> list[str]:
    """Each peer run's engines side by side; ratios against the run's first engine."""
    lines = ["## Peers", "",
             ("The same checkpoint through the engines a user would run instead, each run interleaved on one machine "
              "(medians; how each peer is built, converted and run, and why its tokens differ: [peers](peers.md))."), "",
             "| run | setup | engine | forwards | ms / forward | tokens/s | per forward vs first | tokens/s vs first |",
             "|---|---|---|---|---|---|---|---|"]
    for source, d in peers:
        first = d["rows"][0]
        for r in d["rows"]:
            lines.append(f"| `{source}` | {_peers_setup(d)} | {r['engine']} | {r['forwards']} | {r['ms_per_forward']:.1f} "
                         f"| {r['tokens_per_s']:.2f} | {first['ms_per_forward'] / r['ms_per_forward']:.2f}x "
                         f"| {r['tokens_per_s'] / first['tokens_per_s']:.2f}x |")
    lines.append("")
    notes = [f"- `{source}`, {_identity(d['identity'])}" for source, d in peers if isinstance(d.get("identity"), dict)]
    notes += [f"- `{source}`: {engine} did not run ({why})" for source, d in peers
              if isinstance(d.get("failed"), dict) for engine, why in d["failed"].items()]
    lines += notes + ([""] if notes else [])
    if plot:
        lines += [f"![peers]({os.path.relpath(plot, Path(doc_path).parent if doc_path else Path('.'))})", ""]
    return lines


def _load_section(load: dict, source: str) -> list[str]:
    return ["## Serving load test", "",
            (f"From `{source}` (`lab/load_ab.sh`, then `python lab/load_table.py`): "
             f"{load.get('note', '')}. Method, commands, streamed figures and faults: docs/serving.md."), "",
            *load_rows(load), ""]


def _equal_quality_section(res: dict, other: dict | None, other_source: str | None, other_label: str) -> list[str]:
    eq = res.get("equal_quality")
    if not eq:
        return []
    lines = ["## Speed at equal quality", "",
             (f"The fastest configuration per backend whose accuracy is within {eq['budget']:.2f} "
              f"({eq['budget'] * 100:.0f} point) of the vanilla reference `{eq['reference']}` "
              f"({eq['reference_accuracy']:.3f}) on the same prompts, against `{eq['llada']}` in the same run; the "
              "fastest configuration at any quality beside it."), "",
             "| run | backend | equal quality: configuration | acc | TPF | tok/s | vs LLaDA | any quality: configuration | acc | vs LLaDA |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, src in (("this run", res), (other_label, other)):
        if not src or not src.get("equal_quality"):
            continue
        for be, e in src["equal_quality"]["backends"].items():
            lines.append(f"| {name} | {be} | {e['pick']} | {e['accuracy']:.3f} | {e['tpf']:.2f} | {e['tokens_per_s']:.1f} "
                         f"| {_fmt(e['vs_llada'], '.1f')}x | {e['any_quality_pick']} | {e['any_quality_accuracy']:.3f} "
                         f"| {_fmt(e['any_quality_vs_llada'], '.1f')}x |")
    if other:
        lines += ["", f"{other_label}: `{other_source}` (its own vanilla reference: accuracy "
                      f"{other['equal_quality']['reference_accuracy']:.3f})."]
    return lines + [""]


def _precisions_note(runs: list[dict]) -> str:
    """The artifact variants the run measured, when more than fp32 (bench --precisions)."""
    quantized = sorted({r.get("precision", "fp32") for r in runs} - {"fp32"})
    if not quantized:
        return ""
    return (f"; ONNX Runtime configurations in fp32 and {', '.join(quantized)} (a label ending in "
            f"{' or '.join(quantized)} is that variant, [precision](precision.md))")


def _caches_note(runs: list[dict]) -> str:
    """The cache modes the threshold configurations ran under besides the model's own (bench --caches)."""
    other = sorted({r.get("cache", "auto") for r in runs} - {"auto", "none"})
    if not other:
        return ""
    return (f"; threshold configurations under the model's own cache and under {', '.join(other)} (a label "
            f"naming {' or '.join(other)} ran under it, [cache modes](algorithms.md#cache-modes))")


def markdown(res: dict, plot_paths: list[Path] | None = None, doc_path: str | Path | None = None,
             source: str | None = None, load: dict | None = None, load_source: str | None = None,
             other: dict | None = None, other_source: str | None = None, other_label: str = "other run",
             peers: list[tuple[str, dict]] | None = None, peers_plot_path: Path | None = None) -> str:
    m, v = res["machine"], res["versions"]
    lines = ["# Benchmarks", "",
             "Generated by `dllm-deploy report` from the JSON of one `dllm-deploy bench` run; do not edit by hand.",
             "", f"- source: `{source or 'bench JSON'}`",
             f"- machine: {m.get('processor', '?')}, {m['cpus']} CPUs, {m['platform']}, Python {m['python']}",
             "- packages: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
             f"- profile: `{res['profile']['name']}` ({'; '.join(res['profile']['reasons'])})",
             (f"- workload: {len(res['families'])} task families x {res['prompts_per_family']} held-out prompts, "
             f"gen length {res['gen_length']}, block length {res['block_length']}, batch {res['batch_size']}, "
             f"tree `{res['tree']}`, {res['repeats']} interleaved repeats (medians; min-max in brackets)"
             + _precisions_note(res["runs"]) + _caches_note(res["runs"])), "",
             "## Targets", "", "| target | goal | measured | met | note |", "|---|---|---|---|---|"]
    for t in res["targets"]:
        val = t["measured"]
        shown = "n/a" if val is None else (f"{val:.1%}" if "overhead" in t["target"].lower() else f"{val:.2f}x")
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['goal']} | {shown} | {met} | {t['note']} |")
    if res.get("tune"):
        tu = res["tune"]
        ref = f" of `{tu['reference']}`" if tu.get("reference") else ""
        lines += ["", (f"`--tune` picked **{tu['pick']}**, the fastest within {tu['quality_budget']} of the accuracy{ref} "
                      f"({tu['speedup_vs_threshold']:.2f}x `{tu['baseline']}`); overlay written to `{tu.get('overlay', '-')}`.")]
    lines += [""] + _equal_quality_section(res, other, other_source, other_label)
    lines += ["## Runs", "",
              ("| configuration | acc | TPF | forwards | tok/s | [min, max] | ms/fwd | loop overhead | W used "
              "| memory est. MB | peak MB | modelled tok/s (memory-bound) |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['label']} | {r['accuracy']:.2f} | {r['tpf']:.2f} | {r['forwards']:.0f} | {r['tokens_per_s']:.1f} "
                     f"| [{r['tokens_per_s_min']:.1f}, {r['tokens_per_s_max']:.1f}] | {r['time_per_forward_ms']:.1f} "
                     f"| {r['loop_overhead']:.1%} | {r['beam_width_used']} | {r['memory_estimate_mb']:.0f} "
                     f"| {_fmt(r.get('memory_peak_mb'), '.0f')} | {_fmt(r['modelled_tokens_per_s_memory_bound'], '.1f')} |")
    lines += ["", (f"`memory est.` is the memory model at the model's max_seq (what the beam-width cap uses); `peak` is "
                   f"the measured ONNX Runtime CPU peak (fresh process per W, `--memory`) at a {next(iter(res['forward_cost'].values()))[0]['prefix']}-token prefix. "
                   "Loop overhead is the share of wall time outside backend calls (for `cpp`, outside ONNX Runtime's Run)."),
              "", "## Forward cost (measured)", "",
              ("One verification forward of W branches (W x L tokens) after a prefix of "
              f"{next(iter(res['forward_cost'].values()))[0]['prefix']} cached tokens, median ms:"), "",
              "| backend | " + " | ".join(f"W={r['beam_width']} ({r['tokens']} tok)" for r in next(iter(res["forward_cost"].values()))) + " |",
              "|---|" + "---|" * len(next(iter(res["forward_cost"].values())))]
    for be, rows in sorted(res["forward_cost"].items()):
        one = rows[0]["ms"]
        lines.append(f"| {be} | " + " | ".join(f"{r['ms']:.1f} ({r['ms'] / one:.1f}x)" for r in rows) + " |")
    lines += ["", ("The *modelled* tokens/s column assumes every forward costs as much as a one-branch forward — the "
              "memory-bound regime of a GPU at small token counts — and is not a measurement. On this CPU a forward is "
              "compute-bound (the table above), so measured SPD speed-ups are smaller than modelled ones."), ""]
    if res.get("ratios"):
        lines += ["## ONNX Runtime vs torch eager (same configuration, same run)", "", "| configuration | ratio |", "|---|---|"]
        lines += [f"| {k.replace(' / torch', '')} | {val:.2f}x |" for k, val in res["ratios"].items()]
        lines.append("")
    if plot_paths:
        base = Path(doc_path).parent if doc_path else Path(".")
        lines += ["## Plots", ""]
        for p in plot_paths:
            rel = os.path.relpath(p, base)
            lines.append(f"![{p.stem}]({rel})")
            lines.append("")
    if load:
        lines += _load_section(load, load_source or "load-test JSON")
    if peers:
        lines += _peers_section(peers, peers_plot_path, doc_path)
    return "\n".join(lines) + "\n"
