"""``dllm-deploy bench``: strategies x widths x thresholds x backends in one interleaved run (masked
artifacts), or a self-speculative / uniform-diffusion artifact's own bench."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from ..runtime.tree import DEFAULT_TREE, PRESETS
from .common import (add_json_flags, artifact_kind, check_overlay_target, csv_list, json_outputs, progress, write_file,
                     write_yaml)

BENCH_STRATEGIES = "vanilla,threshold,spd"   # --strategies default (the masked families)


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="measure strategies x widths x thresholds x backends in one interleaved run")
    b.add_argument("--artifact", required=True)
    b.add_argument("--backends", default="torch,ort",
                   help="comma-separated: torch, ort, cpp; NAME:S1+S2 runs only those strategies on it "
                        "(e.g. torch:vanilla, the LLaDA baseline alone)")
    b.add_argument("--strategies", default=BENCH_STRATEGIES,
                   help="comma-separated (a self-speculative artifact: ar, linear-spec, tree-spec; all three by default)")
    b.add_argument("--beam-widths", default="1,2,4,8")
    b.add_argument("--thresholds", default="0.9")
    b.add_argument("--threshold-floors", default=None,
                   help="also the threshold rule with a dynamic tau from each threshold down to each of these floors, e.g. 0.7")
    b.add_argument("--threshold-fars", default=None,
                   help="also the threshold rule with each of these far thresholds (at or above the threshold), e.g. 0.9999")
    b.add_argument("--threshold-leads", default=None,
                   help="also the threshold rule with each of these lead thresholds (below the threshold; with each "
                        "far threshold if any), e.g. 0.7")
    b.add_argument("--precisions", default="fp32",
                   help="artifact variants the ONNX Runtime configurations (ort, cpp) run in, e.g. fp32,int8 (fp32 "
                        "always): each quantized one is a configuration of its own, so the equal-quality pick and "
                        "--tune choose the precision too")
    b.add_argument("--caches", default="auto",
                   help="cache modes of the threshold configurations, e.g. auto,delayed (auto: the model's exact "
                        "or prefix cache; delayed: block-causal models' approximate in-block cache)")
    b.add_argument("--tasks", default=None, help="comma-separated families (default: all six)")
    b.add_argument("--n", type=int, default=5, help="prompts per family")
    b.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians reported)")
    b.add_argument("--gen-length", type=int, default=256, help="token budget per prompt")
    b.add_argument("--tree", default=DEFAULT_TREE, help=f"spd tree preset ({' | '.join(PRESETS)})")
    b.add_argument("--device", default="cpu", help="device of the torch backend (cpu, cuda)")
    b.add_argument("--seeds", default=None, help="also sample (temperature 0.7, top-p 0.9) with each of these seeds, e.g. 1,2,3")
    b.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (1: per-request latency)")
    b.add_argument("--memory", action="store_true", help="also measure ORT peak memory per beam width (subprocesses)")
    b.add_argument("--compare", default=None, metavar="LABEL=DIR,...",
                   help="also time the ONNX Runtime forwards of these artifacts in the same run, interleaved with "
                        "--artifact's, with tokens/s per active parameter (a mixture of experts against a dense "
                        "model of its active size: docs/moe.md)")
    b.add_argument("--reference", default=None, metavar="CHECKPOINT",
                   help="a DiffusionGemma artifact: also run transformers' generate() of this checkpoint (the one "
                        "exported) on the same prompts and noise, interleaved")
    b.add_argument("--steps", type=int, default=None, help="a DiffusionGemma artifact: denoising steps per canvas "
                                                           "(default the artifact's, transformers' 48)")
    b.add_argument("--threads", type=int, default=None, help="a DiffusionGemma artifact: intra-op threads of "
                                                             "ONNX Runtime and torch")
    b.add_argument("--quick", action="store_true", help="2 tasks x 1 prompt, 2 repeats, W=4, gen length 64: a smoke run")
    b.add_argument("--tune", action="store_true",
                   help="pick the fastest configuration within the quality budget; write a profile overlay")
    b.add_argument("--quality-budget", type=float, default=0.01,
                   help="accuracy the equal-quality headline and --tune may lose vs vanilla (0.01: one point)")
    b.add_argument("--tune-out", default=None, help="--tune: overlay file (default: the user profile folder)")
    b.add_argument("--plots", default=None, metavar="DIR", help="write the PNG plots here")
    b.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    add_json_flags(b, "the results")
    b.set_defaults(func=run)


def run(a) -> int:
    from ..bench import report
    from ..bench.run import configurations, overlay_profile, run_bench, split_backend
    from ..bench.targets import tune
    from ..profiles import PRECISIONS, get_profile, user_profile_dir
    json_outputs(a)
    kind = artifact_kind(a.artifact)
    if kind == "self_spec":
        return run_self_spec(a)
    if kind == "uniform":
        return run_uniform(a)
    if a.quick:
        a.n, a.repeats, a.beam_widths, a.gen_length = 1, 2, "4", min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    backends, strategies = csv_list(a.backends), csv_list(a.strategies)
    widths, taus = csv_list(a.beam_widths, int), csv_list(a.thresholds, float)
    families = csv_list(a.tasks) if a.tasks else None
    if a.n < 1 or a.repeats < 1:
        raise UserError("--n and --repeats must be >= 1")
    if a.tune and a.tune_out:
        check_overlay_target(Path(a.tune_out))     # before the run, not after minutes of measuring
    seeds = csv_list(a.seeds, int) if a.seeds else []
    floors = csv_list(a.threshold_floors, float) if a.threshold_floors else []
    fars = csv_list(a.threshold_fars, float) if a.threshold_fars else []
    leads = csv_list(a.threshold_leads, float) if a.threshold_leads else []
    precisions = list(dict.fromkeys(["fp32", *csv_list(a.precisions)]))
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise UserError(f"unknown precision {bad[0]!r} (expected some of {', '.join(PRECISIONS)})")
    if not 0 <= a.quality_budget < 1:
        raise UserError("--quality-budget is an accuracy difference in [0, 1) (0.01: one point)")
    caches = list(dict.fromkeys(csv_list(a.caches)))
    from ..options import CACHE_MODES
    bad = [m for m in caches if m not in CACHE_MODES]
    if bad:
        raise UserError(f"unknown cache mode {bad[0]!r} (expected some of {', '.join(CACHE_MODES)})")
    total = (len(configurations(backends, strategies, widths, taus, a.tree, seeds, floors, fars, leads, precisions, caches))
             * a.repeats
             + len(backends) + len(precisions) - 1)
    bar = progress(total, "bench", sys.stderr.isatty() and not (a.quiet or a.json))
    res = run_bench(a.artifact, backends, strategies, widths, taus, families, n=a.n, repeats=a.repeats,
                    gen_length=a.gen_length, tree=a.tree, batch_size=a.batch_size, memory=a.memory,
                    cost_repeats=3 if a.quick else 5, device=a.device, progress=bar, seeds=seeds,
                    threshold_floors=floors, threshold_fars=fars,
                    threshold_leads=leads, precisions=precisions, quality_budget=a.quality_budget, caches=caches,
                    compare=_compare_artifacts(a.compare))
    if a.tune:
        names = [split_backend(b)[0] for b in backends]
        t = tune(res, backend="ort" if "ort" in names else names[0], quality_budget=a.quality_budget)
        prof, _, _ = get_profile("auto")
        overlay = overlay_profile(t, prof, a.json_out)
        path = Path(a.tune_out) if a.tune_out else user_profile_dir() / f"{overlay['name']}.yaml"
        write_yaml(path, overlay)
        res["tune"] = {"pick": t["pick"]["label"], "baseline": t["baseline"]["label"], "reference": t["reference"]["label"],
                       "speedup_vs_threshold": t["speedup_vs_threshold"], "quality_budget": a.quality_budget,
                       "overlay": str(path)}
    if a.json_out:
        write_file(Path(a.json_out), json.dumps(res, indent=1) + "\n")
    if a.plots:
        for p in report.plots(res, a.plots):
            print(f"plot {p}", file=sys.stderr)
    if a.json:
        print(json.dumps(res))
        return 0
    if a.quiet:
        return 0
    print(f"{'configuration':<44}{'acc':>6}{'TPF':>7}{'tok/s':>9}{'ms/fwd':>8}{'overhead':>9}{'W':>3}{'est MB':>8}"
          f"{'TTFT ms':>9}{'gap p99':>9}")
    ms = lambda v: "n/a" if v is None else f"{v:.1f}"   # noqa: E731 -- the C++ runs stream nothing to time
    for r in res["runs"]:
        print(f"{r['label']:<44}{r['accuracy']:>6.2f}{r['tpf']:>7.2f}{r['tokens_per_s']:>9.1f}"
              f"{r['time_per_forward_ms']:>8.1f}{r['loop_overhead']:>9.1%}{r['beam_width_used']:>3}{r['memory_estimate_mb']:>8.0f}"
              f"{ms(r['ttft_ms_p50']):>9}{ms(r['chunk_gap_ms_p99']):>9}")
    for be, rows in res["forward_cost"].items():
        print(f"forward cost {be}: " + ", ".join(f"W{r['beam_width']} {r['ms']:.1f} ms" for r in rows))
    for k, v in res["ratios"].items():
        print(f"ratio {k}: {v:.2f}x")
    for label, c in (res.get("compare") or {}).items():
        for p, rows in c["forward_cost"].items():
            print(f"compare {label} {p} ({c['active_params'] / 1e6:.1f}M active of {c['params'] / 1e6:.1f}M): "
                  + ", ".join(f"W{r['beam_width']} {r['ms']:.1f} ms ({r['us_per_token_per_m_active']:.2f} us/token/M active)"
                              for r in rows))
    eq = res.get("equal_quality")
    if eq:
        print(f"equal quality: accuracy >= {eq['reference_accuracy']:.3f} - {eq['budget']} ({eq['reference']})")
        for be, e in eq["backends"].items():
            vs = "" if e["vs_llada"] is None else f", {e['vs_llada']:.1f}x LLaDA vanilla no-cache (any quality: {e['any_quality_vs_llada']:.1f}x, {e['any_quality_pick']})"
            print(f"  {be}: {e['pick']} accuracy {e['accuracy']:.3f}, {e['tokens_per_s']:.1f} tok/s{vs}")
    for t in res["targets"]:
        met = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        val = "n/a" if t["measured"] is None else f"{t['measured']:.3g}"
        print(f"target {t['target']} ({t['goal']}): {val} {met}")
    if a.tune:
        print(f"tuned: {res['tune']['pick']} (fastest within {a.quality_budget} of {res['tune']['reference']}; "
              f"{res['tune']['speedup_vs_threshold']:.2f}x {res['tune']['baseline']}) -> {res['tune']['overlay']}")
    return 0


def run_self_spec(a) -> int:
    """bench of a self-speculative artifact: ar, linear-spec, tree-spec at each W (bench/self_spec.py)."""
    from ..bench import self_spec as bss
    strategies = bss.DEFAULT_STRATEGIES if a.strategies == BENCH_STRATEGIES else csv_list(a.strategies)
    widths = csv_list(a.beam_widths, int)
    if a.quick:
        a.n, a.repeats, widths, a.gen_length = 1, 2, [4], min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    configs = bss.configurations(strategies, widths)
    precisions = list(dict.fromkeys(["fp32", *csv_list(a.precisions)]))
    bar = progress(len(configs) * len(precisions) * a.repeats, "bench", sys.stderr.isatty() and not (a.quiet or a.json))
    res = bss.run(a.artifact, strategies, widths, csv_list(a.tasks) if a.tasks else None, n=a.n, repeats=a.repeats,
                  max_new_tokens=a.gen_length, batch_size=a.batch_size, progress=bar, precisions=precisions)
    _bench_out(a, res, bss.table, f"[{res['prompts']} prompts, {res['repeats']} repeats (medians), batch "
                                  f"{res['batch_size']}, L {res['block_size']}, onnxruntime CPU]")
    if not res["lossless"]:
        bad = [r["label"] for r in res["runs"] if r["identical_to_ar"] is False and r["strategy"] not in bss.LOSSY
               and r["precision"] not in bss.CALL_DEPENDENT]
        raise UserError(f"{', '.join(bad)} gave tokens other than ar's: a lossless strategy must not")
    return 0


def run_uniform(a) -> int:
    """bench of a uniform-diffusion artifact, against transformers with --reference (bench/uniform.py)."""
    from ..bench import uniform as bu
    if a.quick:
        a.n, a.repeats, a.gen_length = 1, 2, min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    backends = set(csv_list(a.backends)) - {"torch"}          # the default's torch: the masked families' reference
    if backends - {"ort", "cpp"}:
        raise UserError(f"a DiffusionGemma artifact runs on ort and cpp (backends {a.backends!r})")
    bar = progress(a.repeats * (1 + bool(a.reference) + ("cpp" in backends)), "bench",
                    sys.stderr.isatty() and not (a.quiet or a.json))
    res = bu.run(a.artifact, a.reference, csv_list(a.tasks) if a.tasks else None, n=a.n, repeats=a.repeats,
                 max_new_tokens=a.gen_length, steps=a.steps, threads=a.threads, progress=bar, cpp="cpp" in backends)
    _bench_out(a, res, bu.table, f"[{res['prompts']} prompts in one batch, {res['repeats']} repeats (medians), "
                                 f"{res['steps']} steps, canvas {res['canvas_length']}, onnxruntime CPU]")
    return 0


def _bench_out(a, res: dict, table, footer: str) -> None:
    """A bench of another paradigm's artifact: its JSON to --json-out, on stdout with --json, else its
    table and footer unless --quiet."""
    if a.json_out:
        write_file(Path(a.json_out), json.dumps(res, indent=1) + "\n")
    if a.json:
        print(json.dumps(res))
    elif not a.quiet:
        print(table(res))
        print(footer, file=sys.stderr)


def _compare_artifacts(text: str | None) -> dict:
    """--compare LABEL=DIR,... (or DIR: labelled by its folder name) -> {label: folder}."""
    out: dict[str, str] = {}
    for item in csv_list(text) if text else []:
        label, _, folder = item.rpartition("=")
        folder = folder or label
        label = label or Path(folder).name
        if not (Path(folder) / "manifest.json").is_file():
            raise UserError(f"--compare: {folder} is not an exported artifact (no manifest.json)")
        if label in out:
            raise UserError(f"--compare: label {label!r} given twice")
        out[label] = folder
    return out
