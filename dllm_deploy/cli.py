"""``dllm-deploy``: export, generate, eval, bench, profiles, build-engines, demo.

Every command takes ``--json``. A user mistake prints one line on stderr and exits with 2.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from .decode_rules import OPTIONS
from .errors import UserError
from .runtime.tree import DEFAULT_TREE, PRESETS
from .models.config import KV_IO, MOE_FORMS
from .profiles.memory import INT8_FP32_DEFAULT


def _progress(total: int, label: str, enabled: bool):
    """A small stderr progress bar (no dependency); returns an advance(n) callable."""
    state = {"done": 0}

    def advance(n: int = 1) -> None:
        if not enabled:
            return
        state["done"] += n
        frac = state["done"] / max(total, 1)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{label} [{bar:<30}] {state['done']}/{total}")
        if state["done"] >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return advance


def _bool_flag(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1")


BENCH_STRATEGIES = "vanilla,threshold,spd"   # bench --strategies default (the masked families)

_FLAG_TYPES = {"int": int, "float": float, "str": str, "bool": _bool_flag}
_FLAG_OPTIONS = [o for o in OPTIONS.values() if o.runtime and o.flag]    # decode_options.json


def _add_decode_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="'tiny' (bundled) or a Hugging Face folder; runs on torch")
    src.add_argument("--artifact", default=None, help="an exported artifact folder; runs on ONNX Runtime")
    p.add_argument("--precision", default=None, help="artifact precision variant (fp32, fp16, int8, int4; default fp32)")
    p.add_argument("--profile", default="auto", help="device profile name, or 'auto' (detect)")
    for o in _FLAG_OPTIONS:
        p.add_argument(o.flag, dest=o.name, type=_FLAG_TYPES[o.type], default=None, help=o.help_text(profiles=True),
                       action="append" if o.multiple else "store")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def _decode_kwargs(a) -> dict:
    return {o.name: getattr(a, o.name) for o in _FLAG_OPTIONS}


def _runtime(a):
    from .runtime.api import Runtime
    if a.artifact:
        return Runtime.load(artifact=a.artifact, precision=a.precision, profile=a.profile)
    return Runtime.load(model=a.model or "tiny")


def _print_chunk(as_json: bool):
    """--stream: each chunk as it comes (a JSON line, or its text), flushed."""
    def show(chunk: dict) -> None:
        sys.stdout.write(json.dumps(chunk) + "\n" if as_json else chunk["delta"])
        sys.stdout.flush()
    return show


def cmd_generate(a) -> int:
    from .prompts import decode_escapes
    from .runtime.api import decode_config, row_options
    if (a.chat is None) == (not a.prompt):
        raise UserError("give --prompt (one or more) or --chat, not both and not neither")
    messages = None
    if a.chat is not None:
        from .chat import check_messages
        try:
            messages = check_messages(json.loads(a.chat))
        except ValueError as e:
            raise UserError(f"--chat: not valid JSON ({e})") from None
    prompts = [decode_escapes(p) if a.escapes else p for p in a.prompt or []]
    if a.stop and a.escapes:
        a.stop = [decode_escapes(s) for s in a.stop]
    if a.stream and not a.json and len(prompts) > 1:
        raise UserError("--stream prints one prompt's text as it comes: give one --prompt, or add --json "
                        "(each chunk line names its row)")
    if _artifact_kind(a.artifact) != "masked":
        if a.trace:
            raise UserError(f"--trace records the decisions of masked-diffusion models; {a.artifact} is a "
                            f"{_artifact_kind(a.artifact)} one")
        return _generate_other(a, prompts, messages)
    decode_config(**_decode_kwargs(a))            # bad options fail before a model is loaded
    rt = _runtime(a)
    if messages is not None:
        prompts = [rt.chat_prompt(messages)]
    dcfg = rt.decode_config(**_decode_kwargs(a))
    records: list[dict] = []
    results = rt.generate(prompts, [row_options(**_decode_kwargs(a))] * len(prompts), config=dcfg,
                          on_chunk=_print_chunk(a.json) if a.stream else None,
                          trace=records.append if a.trace else None)
    if a.trace:
        _write_file(Path(a.trace), "".join(json.dumps(r) + "\n" for r in records))
        print(f"trace: {len(records)} decision records in {a.trace}", file=sys.stderr)
    if a.json:
        payload = results[0].to_dict() if len(results) == 1 else {"results": [r.to_dict() for r in results]}
        print(json.dumps(payload))
    else:
        for r in results:
            print("" if a.stream else r.text)
            print(f"[{r.tokens} tokens, {r.forwards} forwards, TPF {r.tpf:.2f}, {r.tokens_per_s:.1f} tok/s, "
                  f"beam_width {r.beam_width_used}, backend {rt.backend.name}, {r.finish_reason}]", file=sys.stderr)
    return 0


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


def cmd_trace_diff(a) -> int:
    """Two traces of one decode (two machines, providers or precisions): where they first decide
    differently and how near a tie that decision was on each side. Exit 0: the same decisions."""
    from .runtime.trace import first_difference, margin_drift
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


def _generate_other(a, prompts: list[str], messages) -> int:
    """generate on a self-speculative artifact (runtime/self_spec_decoder.py) or a uniform-diffusion
    one (runtime/uniform_decoder.py): prompts, chat, stop strings, streaming and JSON as for the
    masked families; their own options and summary line."""
    from .runtime.api import row_options
    decode = _decode_kwargs(a)
    _check_decode_flags(a, _artifact_kind(a.artifact))      # bad options fail before the model is loaded
    rt = _runtime(a)
    if messages is not None:
        prompts = [rt.chat_prompt(messages)]
    opts = rt.decode_config(**decode)
    results = rt.generate(prompts, [row_options(**decode)] * len(prompts), config=opts,
                          on_chunk=_print_chunk(a.json) if a.stream else None)
    spec = rt.kind == "self_spec"
    extra = [{"strategy": opts.strategy, "rounds": sum(r.accepted_hist.values()),
              "tokens_per_round": round(_per_round(r.accepted_hist), 3)} if spec else
             {"strategy": rt.strategies[0], "steps": opts.max_denoising_steps} for r in results]
    if a.json:
        rows = [{**r.to_dict(), **e, "backend": rt.backend.name} for r, e in zip(results, extra)]
        print(json.dumps(rows[0] if len(rows) == 1 else {"results": rows}))
        return 0
    for r, e in zip(results, extra):
        print("" if a.stream else r.text)
        how = (f"{e['tokens_per_round']:.2f} tokens per round, " if spec else "") + f"{r.tokens_per_s:.1f} tok/s, " + \
            (f"{opts.strategy} W {opts.width()}" if spec else f"{e['strategy']} {e['steps']} steps")
        print(f"[{r.tokens} tokens, {r.forwards} forwards, TPF {r.tpf:.2f}, {how}, backend {rt.backend.name}, "
              f"{r.finish_reason}]", file=sys.stderr)
    return 0


def _per_round(hist: dict) -> float:
    """Tokens per round of an accepted-tokens histogram {tokens: rounds}."""
    rounds = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / rounds if rounds else 0.0


def cmd_eval(a) -> int:
    from .evals import tasks
    from .evals.harness import run_eval
    from .runtime.api import decode_config, row_options
    dcfg = decode_config(**_decode_kwargs(a))
    wanted = tuple(a.tasks.split(",")) if a.tasks else tasks.FAMILIES + tasks.OPEN_FAMILIES
    bad = [f for f in wanted if f not in tasks.FAMILIES + tasks.OPEN_FAMILIES]
    if bad:
        raise UserError(f"unknown task {bad[0]!r} (expected some of {', '.join(tasks.FAMILIES + tasks.OPEN_FAMILIES)})")
    families = tuple(f for f in wanted if f in tasks.FAMILIES)
    if a.n < 1 or a.n > tasks.EVAL_PER_FAMILY:
        raise UserError(f"--n must be between 1 and {tasks.EVAL_PER_FAMILY}")
    rt = _runtime(a)
    dcfg = rt.decode_config(**_decode_kwargs(a))
    bar = _progress(len(families) * a.n, f"eval {dcfg.strategy}", not a.json and sys.stderr.isatty())
    res = run_eval(rt, dcfg, families=families, n=a.n, batch_size=a.batch_size, progress=bar,
                   row=row_options(**_decode_kwargs(a)), split=a.split)
    if "text" in wanted:
        from .evals.harness import masked_nll
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


def cmd_export(a) -> int:
    from .export.exporter import export
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    res = export(model=a.model, out=a.out, precisions=[p.strip() for p in a.precision.split(",") if p.strip()],
                 block_length=a.block_length, max_beam_width=a.max_beam_width, opset=a.opset, force=a.force, log=log,
                 int4_block_size=a.int4_block_size, int4_symmetric=a.int4_symmetric, sample_pool=a.sample_pool,
                 int8_smooth=a.int8_smooth, int8_calibration=a.int8_calibration, moe_form=a.moe_form,
                 chat_template=a.chat_template, kv_io=a.kv_io,
                 int8_fp32=[] if a.int8_fp32.strip() == "none" else [x.strip() for x in a.int8_fp32.split(",") if x.strip()])
    if a.json:
        print(json.dumps(res))
    else:
        print(f"artifact {res['artifact']}  ({res['seconds']} s)")
        for prec, size in res["sizes_bytes"].items():
            par = res["parity"][prec]
            if "graphs" in par:                  # a family with graphs of other roles (DiffusionGemma)
                print(f"  {prec:<5} {size / 1e6:7.2f} MB   parity vs torch: "
                      + "  ".join(f"{g} {d:.2e}" for g, d in par["graphs"].items()))
                continue
            diff = par.get("max_abs_diff", {})
            print(f"  {prec:<5} {size / 1e6:7.2f} MB   parity vs torch: logits {diff.get('prefill_logits', float('nan')):.2e}"
                  f"  kv {diff.get('prefill_kv', float('nan')):.2e}  verify probs {diff.get('verify_probs', float('nan')):.2e}"
                  f"  top-1 identical {par.get('top1_ids_identical')}" + (f" ({par['note']})" if "note" in par else ""))
    return 0


def _csv(text: str, cast=str) -> list:
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad list {text!r}") from None


def _artifact_kind(folder: str | None) -> str:
    """How the artifact decodes (Runtime.kind): "uniform" (a DiffusionGemma artifact), "self_spec"
    (its capabilities' attention is causal) or "masked"; "masked" too when its manifest cannot be
    read (the command's own checks then report why, in their order)."""
    from .artifact import artifact_format, read_manifest
    from .runtime.api import UNIFORM_FORMAT
    if not folder:
        return "masked"
    if artifact_format(folder) == UNIFORM_FORMAT:
        return "uniform"
    try:
        causal = read_manifest(folder, verify=False).get("capabilities", {}).get("attention") == "causal"
    except UserError:
        return "masked"
    return "self_spec" if causal else "masked"


def _check_decode_flags(a, kind: str) -> None:
    """The decode flags checked for the artifact's kind, before a model loads."""
    if kind == "self_spec":
        from .runtime.self_spec_decoder import options
        options(0, **_decode_kwargs(a))
    elif kind == "uniform":
        from .runtime.uniform_decoder import options
        options({}, **_decode_kwargs(a))
    else:
        from .runtime.api import decode_config
        decode_config(**{k: v for k, v in _decode_kwargs(a).items() if v is not None})


def cmd_bench_self_spec(a) -> int:
    """bench of a self-speculative artifact: ar, linear-spec, tree-spec at each W (bench_self_spec.py)."""
    from . import bench_self_spec as bss
    strategies = bss.DEFAULT_STRATEGIES if a.strategies == BENCH_STRATEGIES else _csv(a.strategies)
    widths = _csv(a.beam_widths, int)
    if a.quick:
        a.n, a.repeats, widths, a.gen_length = 1, 2, [4], min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    configs = bss.configurations(strategies, widths)
    precisions = list(dict.fromkeys(["fp32", *_csv(a.precisions)]))
    bar = _progress(len(configs) * len(precisions) * a.repeats, "bench", sys.stderr.isatty() and not a.quiet)
    res = bss.run(a.artifact, strategies, widths, _csv(a.tasks) if a.tasks else None, n=a.n, repeats=a.repeats,
                  max_new_tokens=a.gen_length, batch_size=a.batch_size, progress=bar, precisions=precisions)
    _bench_out(a, res, bss.table, f"[{res['prompts']} prompts, {res['repeats']} repeats (medians), batch "
                                  f"{res['batch_size']}, L {res['block_size']}, onnxruntime CPU]")
    if not res["lossless"]:
        bad = [r["label"] for r in res["runs"] if r["identical_to_ar"] is False and r["strategy"] not in bss.LOSSY
               and r["precision"] not in bss.CALL_DEPENDENT]
        raise UserError(f"{', '.join(bad)} gave tokens other than ar's: a lossless strategy must not")
    return 0


def cmd_bench_uniform(a) -> int:
    """bench of a uniform-diffusion artifact, against transformers with --reference (bench_uniform.py)."""
    from . import bench_uniform as bu
    if a.quick:
        a.n, a.repeats, a.gen_length = 1, 2, min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    backends = set(_csv(a.backends)) - {"torch"}          # the default's torch: the masked families' reference
    if backends - {"ort", "cpp"}:
        raise UserError(f"a DiffusionGemma artifact runs on ort and cpp (backends {a.backends!r})")
    bar = _progress(a.repeats * (1 + bool(a.reference) + ("cpp" in backends)), "bench",
                    sys.stderr.isatty() and not a.quiet)
    res = bu.run(a.artifact, a.reference, _csv(a.tasks) if a.tasks else None, n=a.n, repeats=a.repeats,
                 max_new_tokens=a.gen_length, steps=a.steps, threads=a.threads, progress=bar, cpp="cpp" in backends)
    _bench_out(a, res, bu.table, f"[{res['prompts']} prompts in one batch, {res['repeats']} repeats (medians), "
                                 f"{res['steps']} steps, canvas {res['canvas_length']}, onnxruntime CPU]")
    return 0


def _bench_out(a, res: dict, table, footer: str) -> None:
    """A bench of another paradigm's artifact: its JSON to --json, its table and footer unless --quiet."""
    if a.json:
        _write_file(Path(a.json), json.dumps(res, indent=1) + "\n")
    if not a.quiet:
        print(table(res))
        print(footer, file=sys.stderr)


def cmd_bench(a) -> int:
    from . import report
    from .bench import configurations, overlay_profile, run_bench, targets, tune
    kind = _artifact_kind(a.artifact)
    if kind == "self_spec":
        return cmd_bench_self_spec(a)
    if kind == "uniform":
        return cmd_bench_uniform(a)
    if a.quick:
        a.n, a.repeats, a.beam_widths, a.gen_length = 1, 2, "4", min(a.gen_length, 64)
        a.tasks = a.tasks or "upper,count"
    backends, strategies = _csv(a.backends), _csv(a.strategies)
    widths, taus = _csv(a.beam_widths, int), _csv(a.thresholds, float)
    families = _csv(a.tasks) if a.tasks else None
    if a.n < 1 or a.repeats < 1:
        raise UserError("--n and --repeats must be >= 1")
    if a.tune and a.tune_out:
        _check_overlay_target(Path(a.tune_out))     # before the run, not after minutes of measuring
    seeds = _csv(a.seeds, int) if a.seeds else []
    floors = _csv(a.threshold_floors, float) if a.threshold_floors else []
    fars = _csv(a.threshold_fars, float) if a.threshold_fars else []
    leads = _csv(a.threshold_leads, float) if a.threshold_leads else []
    precisions = list(dict.fromkeys(["fp32", *_csv(a.precisions)]))
    from .profiles import PRECISIONS
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise UserError(f"unknown precision {bad[0]!r} (expected some of {', '.join(PRECISIONS)})")
    if not 0 <= a.quality_budget < 1:
        raise UserError("--quality-budget is an accuracy difference in [0, 1) (0.01: one point)")
    caches = list(dict.fromkeys(_csv(a.caches)))
    from .decode_rules import CACHE_MODES
    bad = [m for m in caches if m not in CACHE_MODES]
    if bad:
        raise UserError(f"unknown cache mode {bad[0]!r} (expected some of {', '.join(CACHE_MODES)})")
    total = (len(configurations(backends, strategies, widths, taus, a.tree, seeds, floors, fars, leads, precisions, caches))
             * a.repeats
             + len(backends) + len(precisions) - 1)
    bar = _progress(total, "bench", sys.stderr.isatty() and not a.quiet)
    res = run_bench(a.artifact, backends, strategies, widths, taus, families, n=a.n, repeats=a.repeats,
                    gen_length=a.gen_length, tree=a.tree, batch_size=a.batch_size, memory=a.memory,
                    cost_repeats=3 if a.quick else 5, device=a.device, progress=bar, seeds=seeds,
                    threshold_floors=floors, threshold_fars=fars,
                    threshold_leads=leads, precisions=precisions, quality_budget=a.quality_budget, caches=caches,
                    compare=_compare_artifacts(a.compare))
    if a.tune:
        from .profiles import get_profile
        from .bench import split_backend
        names = [split_backend(b)[0] for b in backends]
        t = tune(res, backend="ort" if "ort" in names else names[0], quality_budget=a.quality_budget)
        prof, _, _ = get_profile("auto")
        overlay = overlay_profile(t, prof, a.json)
        from .profiles import user_profile_dir
        path = Path(a.tune_out) if a.tune_out else user_profile_dir() / f"{overlay['name']}.yaml"
        _write_yaml(path, overlay)
        res["tune"] = {"pick": t["pick"]["label"], "baseline": t["baseline"]["label"], "reference": t["reference"]["label"],
                       "speedup_vs_threshold": t["speedup_vs_threshold"], "quality_budget": a.quality_budget,
                       "overlay": str(path)}
    if a.json:
        _write_file(Path(a.json), json.dumps(res, indent=1) + "\n")
    if a.plots:
        for p in report.plots(res, a.plots):
            print(f"plot {p}", file=sys.stderr)
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


def _compare_artifacts(text: str | None) -> dict:
    """--compare LABEL=DIR,... (or DIR: labelled by its folder name) -> {label: folder}."""
    out: dict[str, str] = {}
    for item in _csv(text) if text else []:
        label, _, folder = item.rpartition("=")
        folder = folder or label
        label = label or Path(folder).name
        if not (Path(folder) / "manifest.json").is_file():
            raise UserError(f"--compare: {folder} is not an exported artifact (no manifest.json)")
        if label in out:
            raise UserError(f"--compare: label {label!r} given twice")
        out[label] = folder
    return out


def _write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (never a half-written file in place); one-line error
    naming the path when the folder cannot be created or written."""
    from .artifact.fsio import atomic_write
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror})") from None


def _check_overlay_target(path: Path) -> None:
    """``bench --tune`` replaces only a profile overlay it wrote (a YAML mapping with a ``tuned``
    section); any other file at that path is the user's and is refused."""
    import yaml
    if not os.path.lexists(path):
        return
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("tuned"), dict)):
        raise UserError(f"{path}: exists and is not a profile overlay written by bench --tune; "
                        "refusing to replace it (choose another --tune-out)")


def _write_yaml(path: Path, data: dict) -> None:
    import yaml
    _check_overlay_target(path)
    _write_file(path, yaml.safe_dump(data, sort_keys=False))


def cmd_report(a) -> int:
    from . import report
    from .bench import targets
    from .bench import equal_quality
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
        _write_file(Path(a.out), text)
        print(f"wrote {a.out}" + (f" and {n_plots} plots in {a.plots}" if n_plots else ""), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_profiles(a) -> int:
    import dataclasses

    from .profiles import detect, explain, get_profile, load_profiles
    from .profiles.memory import free_bytes_for
    profiles = load_profiles()
    if a.action == "list":
        profiles.warn_broken()
        rows = [{"name": p.name, "description": p.description} for p in profiles.values()]
        print(json.dumps(rows) if a.json else "\n".join(f"{r['name']:<18} {r['description']}" for r in rows))
        return 0
    if not a.name:
        raise UserError(f"profiles {a.action} needs a profile name (or 'auto')")
    prof, reasons, facts = get_profile(a.name, profiles)
    if a.action == "show":
        d = dataclasses.asdict(prof)
        print(json.dumps(d) if a.json else yaml_dump(d))
        return 0
    facts = facts or detect()
    others = explain(profiles, facts)["candidates"] if a.name == "auto" else []
    free, where = free_bytes_for(prof, facts, on_gpu=prof.match["kind"] != "cpu" and facts.get("kind") != "cpu")
    budget = prof.memory.get("fraction", 0.5) * free - prof.memory.get("reserve_mb", 512) * 2**20
    out = {"profile": prof.name, "source": prof.source, "facts": facts, "reasons": reasons,
           "backends": prof.backends, "precision": prof.precision, "decode": prof.decode, "device": prof.device,
           "memory": {"free_gb": free / 2**30, "free_from": where, "budget_gb": budget / 2**30, **prof.memory},
           "candidates": others, "tuned": prof.tuned}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"profile {prof.name} ({prof.source})")
        print("device: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in facts.items()))
        for r in reasons:
            print(f"  matched: {r}")
        for c in (c for c in others if c["score"] is not None):
            print(f"  also matched: {c['name']} (score {c['score']}, priority {c['priority']}): {'; '.join(c['reasons'])}")
        if others:
            print(f"  did not match: {sum(c['score'] is None for c in others)} other profiles")
        print(f"backends: {' > '.join(prof.backends)}; precision {prof.precision}; decode {prof.decode}")
        if prof.tuned:
            t = prof.tuned
            print(f"decode defaults from `bench --tune` ({t.get('date', '?')}, on top of {t.get('base_profile', '?')}): "
                  f"{t.get('pick', '?')}, {t.get('speedup_vs_threshold', '?')}x the threshold baseline; "
                  f"measurements in {t.get('from', '?')}")
        print(f"memory budget: {prof.memory.get('fraction', 0.5)} x {free / 2**30:.1f} GB free ({where}) "
              f"- {prof.memory.get('reserve_mb', 512)} MB = {budget / 2**30:.1f} GB")
    return 0


def yaml_dump(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d, sort_keys=False).rstrip()


def cmd_build_engines(a) -> int:
    from .artifact import read_manifest
    from .export.engines import build_engines, plan_engines
    from .profiles import get_profile
    m = read_manifest(a.artifact, verify=not a.dry_run)
    prof, reasons, _ = get_profile(a.profile)
    plan = plan_engines(a.artifact, m, prof, workspace_mb=a.workspace_mb, opt_level=a.opt_level)
    public = {k: v for k, v in plan.items() if not k.startswith("_")}
    if a.dry_run:
        if a.json:
            print(json.dumps({**public, "reasons": reasons}))
        else:
            st = plan["settings"]
            print(f"profile {prof.name}: {'; '.join(reasons)}")
            print(f"precision {plan['precision']}; workspace {st['workspace_mb']} MB; builder opt level {st['opt_level']}; "
                  f"hardware compatibility {st['hardware_compatibility']}")
            for p in plan["engines"]:
                print(f"[{p['graph']}]")
                for name in ("input_ids", "attention_mask", "past_key_values.0.key"):
                    s_ = p["shapes"][name]
                    print(f"  {name:<24} min {s_['min']}  opt {s_['opt']}  max {s_['max']}")
                print("  " + " ".join(p["trtexec"]))
        return 0
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    res = build_engines(a.artifact, m, plan, force=a.force, log=log)
    if a.json:
        print(json.dumps({"profile": prof.name, "engines": plan["out_dir"], "built": res["built"], "reasons": res["reasons"],
                          "key": {g: e["key"] for g, e in res["record"]["graphs"].items()}}))
    else:
        print(f"engines {'written to' if res['built'] else 'up to date in'} {plan['out_dir']}"
              + (f" ({'; '.join(res['reasons'])})" if res["reasons"] else ""))
    return 0


def _serve_defaults(a, rt) -> tuple[dict, object]:
    """The decode options every request starts from (the flags set; gen_length fixed: every batch
    decodes the same canvas, whatever its rows' max_tokens) and their DecodeConfig. serve and
    loadtest (for its offline references) both read them from the same flags."""
    defaults = {k: v for k, v in _decode_kwargs(a).items() if v is not None}
    cfg = rt.decode_config(**defaults)
    if rt.kind == "self_spec":
        return {**defaults, "strategy": cfg.strategy, "gen_length": cfg.max_new_tokens}, cfg
    if rt.kind == "uniform":
        return {**defaults, "strategy": rt.strategies[0], "gen_length": cfg.max_new_tokens}, cfg
    return {**defaults, "gen_length": cfg.gen_length}, cfg


def cmd_loadtest(a) -> int:
    from .artifact.fsio import atomic_write
    from .serving import loadtest as lt
    host, port = lt.check_url(a.url)
    levels = _csv(a.concurrency, int)
    if not levels or not all(1 <= c <= 256 for c in levels):
        raise UserError(f"--concurrency {a.concurrency}: expected numbers in 1..256")
    if not 1 <= a.requests <= lt.MAX_REQUESTS:
        raise UserError(f"--requests {a.requests}: expected 1..{lt.MAX_REQUESTS}")
    if not a.artifact:
        raise UserError("--artifact: the artifact the server serves (the offline references come from it)")
    lt.wait_ready(host, port, timeout=a.timeout)
    rt = _runtime(a)
    defaults, _ = _serve_defaults(a, rt)
    progress = _progress(a.requests, "offline references", enabled=sys.stderr.isatty())
    requests = lt.specs(a.requests, defaults, sampling=rt.backend.sample_pool is not None)
    refs = lt.references(rt, requests, defaults, log=lambda msg: progress())
    levels_out = lt.loadtest(host, port, requests, refs, levels, a.stream, a.timeout, a.time_limit,
                             log=lambda msg: print(f"dllm-deploy: {msg}", file=sys.stderr, flush=True))
    print(lt.table(levels_out))
    ok = all(lt.passed(lv) for lv in levels_out)
    if a.json:
        atomic_write(a.json, json.dumps({"url": a.url, "stream": a.stream, "decode": defaults, "passed": ok,
                                         "levels": levels_out}, indent=2) + "\n")
    if not ok:
        print("dllm-deploy: loadtest failed: lost or corrupted responses (see the table; corrupted answers differ from "
              "offline generate: give loadtest the decode flags serve runs with)", file=sys.stderr)
    return 0 if ok else 1


def cmd_serve(a) -> int:
    from .serving.server import check_environment, check_ports, serve
    _check_serve_flags(a)
    ports = {"--http-port": a.http_port, "--grpc-port": a.grpc_port, "--metrics-port": a.metrics_port}
    if a.openai_port is not None:
        ports["--openai-port"] = a.openai_port
    if not 0 <= a.drain_timeout <= 3600:
        raise UserError(f"--drain-timeout {a.drain_timeout:g}: expected seconds in 0..3600")
    check_environment()
    check_ports(a.host, ports)
    rt = _runtime(a)
    if a.chat_template:
        from .chat import check_template, load_chat_template
        rt.chat_template = check_template(load_chat_template(".", override=a.chat_template))
    defaults, limits = _serve_limits(a, rt)
    serve(rt, a.host, ports, limits, defaults, instances=a.max_batch_size, continuous=not a.static_batches,
          model_name=a.served_model_name or Path(a.artifact or a.model or "tiny").resolve().name,
          drain_timeout=a.drain_timeout)
    return 0


def cmd_openai(a) -> int:
    from .serving.openai_api import Frontend, Server
    from .serving.server import check_ports
    host, sep, port = a.triton_url.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--triton-url {a.triton_url}: expected HOST:GRPC_PORT, e.g. 127.0.0.1:8001")
    check_ports(a.host, {"--port": a.port})
    print(f"dllm-deploy: OpenAI API for model {a.served_model_name} at http://{a.host}:{a.port}/v1 "
          f"(Triton gRPC {a.triton_url})", file=sys.stderr, flush=True)
    Server(Frontend(a.triton_url, a.served_model_name), a.host, a.port).run()
    return 0


def _check_serve_flags(a) -> None:
    """serve's and triton-repo's limit flags and decode flags, checked before a model loads."""
    for flag, value in (("--max-batch-size", a.max_batch_size), ("--max-queue", a.max_queue),
                        ("--max-prompt-tokens", a.max_prompt_tokens or 1)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1 (got {value})")
    if not 0 <= a.request_timeout <= 86400:
        raise UserError(f"--request-timeout {a.request_timeout:g}: expected seconds in 0..86400 (0: no deadline)")
    _check_decode_flags(a, _artifact_kind(a.artifact))


def _serve_limits(a, rt):
    """The request defaults and the Limits a server (serve, or a triton-repo model) enforces."""
    from .serving.contract import Limits
    defaults, cfg = _serve_defaults(a, rt)
    gen = defaults["gen_length"]
    if rt.kind == "self_spec":       # the tokens and the last round's draft block
        canvas = gen + (cfg.block_size or rt.config.block_size)
    elif rt.kind == "uniform":       # whole canvases
        canvas = -(-gen // rt.config.canvas_length) * rt.config.canvas_length
    else:
        canvas = -(-gen // cfg.block_length) * cfg.block_length
    if not a.max_prompt_tokens and rt.config.max_seq - canvas < 1:
        raise UserError(f"a canvas of {canvas} tokens (--gen-length {gen}) leaves no room for a prompt in the "
                        f"model's {rt.config.max_seq} positions: pass a smaller --gen-length")
    return defaults, Limits(max_prompt_tokens=a.max_prompt_tokens or rt.config.max_seq - canvas,
                            max_tokens=gen, max_beam_width=rt.max_beam_width or getattr(cfg, "beam_width", 1),
                            max_queue=a.max_queue, timeout=a.request_timeout)


def cmd_triton_repo(a) -> int:
    from .serving.repo import write_repo
    _check_serve_flags(a)
    if not a.artifact:
        raise UserError("--artifact: the artifact the repository's models serve")
    rt = _runtime(a)
    defaults, limits = _serve_limits(a, rt)
    out = write_repo(a.out, a.artifact, rt.profile, defaults, limits, a.max_batch_size, force=a.force)
    print(f"Triton model repository written to {out} (models dllm, dllm_stream; profile {rt.profile.name}): "
          f"tritonserver --model-repository {out}")
    return 0


def cmd_distill(a) -> int:
    from .distill import DistillConfig, distill
    mix = dict(DistillConfig().mix)
    for item in filter(None, (a.mix or "").split(",")):
        fam, _, w = item.partition("=")
        try:
            mix[fam] = float(w)
        except ValueError:
            raise UserError(f"--mix: expected FAMILY=WEIGHT, got {item!r}") from None
    c = DistillConfig(steps=a.steps, batch=a.batch, lr=a.lr, seed=a.seed, entropy_weight=a.entropy_weight,
                      entropy_temperature=a.entropy_temperature, teacher_prompts=a.teacher_prompts,
                      reference_share=a.reference_share, gen_length=a.gen_length, threads=a.threads,
                      time_limit=a.time_limit, mix=mix, dist=a.dist, policy_share=a.policy_share,
                      policy_tau=a.policy_tau, policy_every=a.policy_every, policy_pool=a.policy_pool)
    tty = sys.stderr.isatty() and not a.json
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    rec = distill(a.model, a.out, teacher=a.teacher, prompts=a.prompts, dcfg=c, force=a.force, log=log,
                  progress=(lambda label, total: _progress(total, label, True)) if tty else None)
    d = rec["distill"]
    if a.json:
        print(json.dumps(rec))
    else:
        print(f"distilled {a.model} into {a.out}: {d['steps_done']} steps in {d['wall_s']:.0f} s "
              f"(CPU {d['cpu_s']:.0f} s), cross-entropy {d['final_ce_ema']:.3f}, certainty entropy {d['final_entropy_ema']:.3f}; "
              f"teacher answers kept {d.get('teacher_kept', 0)}/{d['teacher_decoded']}")
    return 0


def cmd_demo(a) -> int:
    from .demo import run_demo
    return run_demo(json_out=a.json, out_dir=a.out)


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded together (and dllm's instances)")
    p.add_argument("--max-queue", type=int, default=64, help="requests queued or decoding; more are refused")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt (default: the model's max_seq less the generated canvas)")
    p.add_argument("--request-timeout", type=float, default=0.0, metavar="S",
                   help="a request that sets no timeout of its own is cancelled S seconds after it arrives "
                        "(0: never)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dllm-deploy", description="Deploy diffusion LLMs with ONNX Runtime / TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode one or more prompts")
    g.add_argument("--chat", default=None, metavar="JSON",
                   help="chat messages, e.g. '[{\"role\": \"user\", \"content\": \"upper: dog\"}]', rendered with "
                        "the model's chat template into the prompt (instead of --prompt)")
    g.add_argument("--prompt", action="append", required=False,
                   help="prompt text (repeat for a batch); bytes that are not UTF-8 become U+FFFD")
    g.add_argument("--escapes", action="store_true",
                   help="interpret \\n \\t \\r \\0 \\\\ \\\" \\' \\xHH \\uHHHH \\UHHHHHHHH in prompts and stop strings "
                        "(others are refused)")
    g.add_argument("--stream", action="store_true",
                   help="print text as it becomes final (--json: one JSON object per chunk, then the result; "
                        "docs/streaming.md)")
    g.add_argument("--trace", default=None, metavar="FILE",
                   help="write each decode step's decisions and their margins to FILE, one JSON object a line "
                        "(masked-diffusion models; docs/cpp.md \"What 'the same model' means\")")
    _add_decode_flags(g)
    g.set_defaults(func=cmd_generate)

    td = sub.add_parser("trace-diff", help="where two decision traces (generate --trace) first decide differently, "
                                           "and how near a tie that was")
    td.add_argument("a", metavar="A", help="a trace file (generate --trace, dllm-generate --trace)")
    td.add_argument("b", metavar="B", help="the same decode's trace from another machine, provider or build")
    td.add_argument("--near-tie", type=float, default=1e-3, metavar="MARGIN",
                    help="margins under this count as a near-tie (default 0.001)")
    td.add_argument("--json", action="store_true", help="one JSON object")
    td.set_defaults(func=cmd_trace_diff)

    e = sub.add_parser("eval", help="exact-match accuracy and decoding counters on the held-out split")
    _add_decode_flags(e)
    e.add_argument("--tasks", default=None, help="comma-separated families (default: all)")
    e.add_argument("--n", type=int, default=50, help="prompts per family (max 50)")
    e.add_argument("--split", choices=["core", "general"], default="core",
                   help="core: in distribution; general: held-out words and lengths (docs/model_card.md)")
    e.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    e.add_argument("--outputs", action="store_true", help="include every prompt's output in the JSON")
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export", help="export a model to an ONNX artifact (prefill + verify graphs)")
    x.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face folder")
    x.add_argument("--out", required=True, help="artifact folder to write")
    x.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8,int4 (fp32 always)")
    x.add_argument("--int4-block-size", type=int, default=32,
                   help="int4: weights per quantization block along the input dimension (power of two >= 16)")
    x.add_argument("--int4-asymmetric", dest="int4_symmetric", action="store_false",
                   help="int4: a zero point per block (default symmetric: scales only)")
    x.add_argument("--int8-smooth", type=float, default=0.5, metavar="ALPHA",
                   help="int8: SmoothQuant strength in [0, 1], moving activation outliers into the weights before "
                        "quantization (0: none; default 0.5; docs/precision.md)")
    x.add_argument("--int8-fp32", default=",".join(INT8_FP32_DEFAULT), metavar="PRODUCTS",
                   help="int8: weight products kept in fp32, comma-separated from qkv, o_proj, gate_up, down_proj, "
                        "lm_head, or 'none' (default down_proj: the widest activations; docs/precision.md)")
    x.add_argument("--int8-calibration", default=None, metavar="FILE",
                   help="int8: texts (one per line) the smoothing is calibrated on (default: 32 task prompts with "
                        "their answers; use your own for a real model)")
    x.add_argument("--chat-template", default=None, metavar="FILE",
                   help="the chat template the artifact carries (default: the model folder's chat_template.jinja or "
                        "tokenizer_config.json's chat_template)")
    x.add_argument("--moe-form", choices=MOE_FORMS, default="contrib",
                   help="mixture-of-experts models: the routed experts as ONNX Runtime's com.microsoft.MoE operator "
                        "(contrib, default) or in standard operators, tokens gathered per expert (gather: TensorRT and "
                        "other providers); docs/moe.md")
    x.add_argument("--kv-io", choices=KV_IO, default="append",
                   help="what the prefill graph returns of the KV cache: the whole cache with the new tokens (append, "
                        "default; every runtime) or the new tokens' keys and values only, the cache kept in a buffer "
                        "written in place (new: ONNX Runtime in Python and C++, schema 5; docs/export.md)")
    x.add_argument("--block-length", type=int, default=None, help="block length L (default: the model's)")
    x.add_argument("--max-beam-width", type=int, default=8, help="largest W the artifact is checked for")
    x.add_argument("--sample-pool", type=int, default=None,
                   help="sampling: the N most probable tokens the graphs sample from (default min(vocabulary, 64))")
    x.add_argument("--opset", type=int, default=17)
    x.add_argument("--force", action="store_true",
                   help="replace an existing artifact written by dllm-deploy export (atomically: the old one stays "
                        "whole until the new one is complete). Any other existing folder, a file, the source model's "
                        "folder, the current folder or a parent is refused; an existing empty folder needs no --force")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=cmd_export)

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
    b.add_argument("--json", default=None, metavar="OUT", help="write the results JSON here")
    b.set_defaults(func=cmd_bench)

    rp = sub.add_parser("report", help="docs/BENCHMARKS.md and plots from a bench JSON")
    rp.add_argument("bench_json", help="the JSON written by `dllm-deploy bench --json`")
    rp.add_argument("--out", default=None, help="markdown file to write (default: stdout)")
    rp.add_argument("--plots", default=None, metavar="DIR", help="write the PNG plots here and link them")
    rp.add_argument("--compare", default=None, metavar="JSON",
                    help="another bench run (e.g. of a distilled model): its Pareto front and equal-quality figures beside these")
    rp.add_argument("--compare-label", default="other run", help="what to call the --compare run in the doc and plot")
    rp.add_argument("--peers", nargs="+", default=None, metavar="JSON",
                    help="peer runs (benchmarks/peers/*.json): a Peers table, and with --plots a tokens/s plot")
    rp.add_argument("--load-test", default=None, metavar="JSON",
                    help="add the serving load table from benchmarks/load_table.py's JSON (benchmarks/load-ab.json)")
    rp.set_defaults(func=cmd_report)

    pr = sub.add_parser("profiles", help="list, show or explain device profiles")
    pr.add_argument("action", choices=["list", "show", "explain"])
    pr.add_argument("name", nargs="?", default=None, help="profile name or 'auto'")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_profiles)

    be = sub.add_parser("build-engines", help="build TensorRT engines for a profile (needs TensorRT + a GPU)")
    be.add_argument("--artifact", required=True)
    be.add_argument("--profile", default="auto")
    be.add_argument("--workspace-mb", type=int, default=None, help="TensorRT workspace (default: the profile's trt.workspace_mb)")
    be.add_argument("--opt-level", type=int, default=None, help="TensorRT builder optimization level 0-5 (default: the profile's)")
    be.add_argument("--dry-run", action="store_true", help="print the shapes and the trtexec command; build nothing")
    be.add_argument("--force", action="store_true", help="rebuild even when the recorded engines are up to date")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=cmd_build_engines)

    sv = sub.add_parser("serve", help="serve the model with Triton Inference Server (docs/serving.md)")
    _add_decode_flags(sv, json_flag=False)
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; 0.0.0.0 for every interface)")
    sv.add_argument("--http-port", type=int, default=8000)
    sv.add_argument("--grpc-port", type=int, default=8001)
    sv.add_argument("--metrics-port", type=int, default=8002)
    _add_limit_flags(sv)
    sv.add_argument("--static-batches", action="store_true",
                    help="requests wait for the next batch instead of joining a running one at a block boundary")
    sv.add_argument("--openai-port", type=int, default=None,
                    help="also serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) on this port")
    sv.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                    help="on SIGTERM / SIGINT: refuse new requests and let those in flight finish for up to S "
                         "seconds, then end the rest with an error and exit 0")
    sv.add_argument("--chat-template", default=None, metavar="FILE",
                    help="render chat requests with this template instead of the artifact's")
    sv.add_argument("--served-model-name", default=None,
                    help="the model id OpenAI clients send (default: the artifact folder's name)")
    sv.set_defaults(func=cmd_serve)

    oa = sub.add_parser("openai", help="an OpenAI API frontend over a running serve's gRPC port (docs/serving.md)")
    oa.add_argument("--triton-url", required=True, help="the server's gRPC endpoint, HOST:PORT (serve --grpc-port)")
    oa.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    oa.add_argument("--port", type=int, default=8080)
    oa.add_argument("--served-model-name", default="dllm", help="the model id OpenAI clients send")
    oa.set_defaults(func=cmd_openai)

    tr = sub.add_parser("triton-repo", help="write a Triton model repository for a stock tritonserver (docs/serving.md)")
    _add_decode_flags(tr, json_flag=False)
    tr.add_argument("--out", required=True, help="the repository folder to write (refused if it holds anything else)")
    tr.add_argument("--force", action="store_true", help="replace a repository this command wrote before")
    _add_limit_flags(tr)
    tr.set_defaults(func=cmd_triton_repo)

    lt = sub.add_parser("loadtest", help="load a running serve (loopback) and check every answer against offline generate")
    _add_decode_flags(lt, json_flag=False)
    lt.add_argument("--url", required=True, help="the server's HTTP endpoint, http://127.0.0.1:PORT (loopback only)")
    lt.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated client counts, one level each")
    lt.add_argument("--requests", type=int, default=32, help="requests per level (the same ones at every level)")
    lt.add_argument("--stream", action="store_true", help="stream (dllm_stream /generate_stream) and time the first token")
    lt.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    lt.add_argument("--time-limit", type=float, default=600.0, help="no request starts after this many seconds")
    lt.add_argument("--json", default=None, help="write the levels as JSON to this file")
    lt.set_defaults(func=cmd_loadtest)

    ds = sub.add_parser("distill", help="certainty-forcing self-distillation into a new checkpoint (docs/distill.md)")
    ds.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face folder: the student's start")
    ds.add_argument("--out", required=True, help="checkpoint folder to write")
    ds.add_argument("--teacher", default=None, help="teacher checkpoint (default: the model itself)")
    ds.add_argument("--prompts", default=None,
                    help="JSON lines of {\"prompt\", optional \"answer\"} (default: the bundled task families' training distribution)")
    ds.add_argument("--steps", type=int, default=6000)
    ds.add_argument("--batch", type=int, default=8)
    ds.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (60 warm-up steps, cosine to a tenth)")
    ds.add_argument("--seed", type=int, default=0)
    ds.add_argument("--entropy-weight", type=float, default=0.5, help="weight of the certainty (entropy) term")
    ds.add_argument("--entropy-temperature", type=float, default=1.0, help="the certainty term's softmax temperature")
    ds.add_argument("--teacher-prompts", type=int, default=256, help="prompts the teacher decodes")
    ds.add_argument("--reference-share", type=float, default=0.5,
                    help="share of each batch drawn fresh with reference answers (when the prompts have them)")
    ds.add_argument("--gen-length", type=int, default=128, help="the teacher's canvas (tokens)")
    ds.add_argument("--mix", default="", help="task family weights, e.g. count=2,text=0.3 (bundled tasks only)")
    ds.add_argument("--dist", default="train", choices=("train", "core"),
                    help="bundled tasks' distribution: train (original + broad inputs) or core (the original only)")
    ds.add_argument("--policy-share", type=float, default=0.0,
                    help="share of teacher-answer blocks noised as the threshold rule's own states "
                         "(block-causal models; 0: none)")
    ds.add_argument("--policy-tau", type=float, default=0.9, help="the threshold rule whose states those are")
    ds.add_argument("--policy-every", type=int, default=250, help="steps between recomputing them with the current student")
    ds.add_argument("--policy-pool", type=int, default=0,
                    help="record the states of this many fresh reference answers, redrawn every --policy-every steps, "
                         "and draw the batch's reference rows from them (0: the teacher's answers)")
    ds.add_argument("--threads", type=int, default=2)
    ds.add_argument("--time-limit", type=float, default=0, help="stop and write after this many seconds of training; the learning rate anneals by then (0: none)")
    ds.add_argument("--force", action="store_true", help="replace a checkpoint this command wrote")
    ds.add_argument("--json", action="store_true", help="print the training record as JSON")
    ds.set_defaults(func=cmd_distill)

    d = sub.add_parser("demo", help="the main job on the bundled tiny model, printing the figures")
    d.add_argument("--out", default="build/demo", help="where the demo writes its artifact")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_demo)
    return ap


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C: every ``finally`` and
    ``except BaseException`` on the way (the exporter's scratch-folder removal) runs."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # a second SIGTERM must not cut the cleanup short
    raise Terminated()


def main(argv=None) -> int:
    import warnings
    warnings.showwarning = lambda msg, *a, **k: print(f"dllm-deploy: warning: {msg}", file=sys.stderr)
    ap = build_parser()
    a = ap.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return a.func(a)
    except UserError as e:
        flag = getattr(e, "flag", None)      # an OptionError from a flag names it
        print(f"dllm-deploy: error: {e}{f' ({flag})' if flag and flag not in str(e) else ''}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dllm-deploy ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("dllm-deploy: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("dllm-deploy: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The console script: ``main`` of the command line, then its exit status. After SIGTERM the
    process leaves at once (streams flushed, the cleanup done): the interpreter's ordinary shutdown
    can crash (SIGSEGV) under native threads that a cut-short export or quantization still runs."""
    rc = main()
    if rc == 128 + signal.SIGTERM:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
