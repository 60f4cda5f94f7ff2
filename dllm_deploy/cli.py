"""``dllm-deploy``: export, generate, eval, bench, profiles, build-engines, demo.

Every command takes ``--json``. A user mistake prints one line on stderr and exits with 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import UserError


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


def _add_decode_flags(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="'tiny' (bundled) or a Hugging Face folder; runs on torch")
    src.add_argument("--artifact", default=None, help="an exported artifact folder; runs on ONNX Runtime")
    p.add_argument("--precision", default=None, help="artifact precision variant (fp32, fp16, int8; default fp32)")
    p.add_argument("--profile", default="auto", help="device profile name, or 'auto' (detect)")
    p.add_argument("--strategy", default="vanilla", help="vanilla | threshold | spd")
    p.add_argument("--gen-length", type=int, default=None, help="token budget per prompt (default 256)")
    p.add_argument("--block-length", type=int, default=None, help="block length L (default 32)")
    p.add_argument("--tokens-per-step", type=int, default=None, help="vanilla: tokens committed per step (k)")
    p.add_argument("--steps", type=int, default=None, help="vanilla: LLaDA steps over the whole generation")
    p.add_argument("--beam-width", type=int, default=None, help="spd: branches verified per forward (W)")
    p.add_argument("--tree", default=None, help="spd: tree preset (chain | binary | wide)")
    p.add_argument("--threshold", type=float, default=None, help="threshold tau (default 0.9)")
    p.add_argument("--select", default=None, help="spd: lossless | threshold")
    p.add_argument("--base", default=None, help="spd lossless: vanilla | threshold")
    p.add_argument("--cache", default=None, help="none | prefix | dual | exact | auto")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _decode_kwargs(a) -> dict:
    return dict(strategy=a.strategy, gen_length=a.gen_length, block_length=a.block_length,
                tokens_per_step=a.tokens_per_step, steps=a.steps, beam_width=a.beam_width, tree=a.tree,
                threshold=a.threshold, select=a.select, base=a.base, cache=a.cache)


def _runtime(a):
    from .runtime.api import Runtime
    if a.artifact:
        return Runtime.load(artifact=a.artifact, precision=a.precision, profile=a.profile)
    return Runtime.load(model=a.model or "tiny")


def cmd_generate(a) -> int:
    from .runtime.api import decode_config
    prompts = [p.encode().decode("unicode_escape") if a.escapes else p for p in a.prompt]
    dcfg = decode_config(**_decode_kwargs(a))
    rt = _runtime(a)
    results = rt.decoder.generate(prompts, dcfg)
    if a.json:
        payload = results[0].to_dict() if len(results) == 1 else {"results": [r.to_dict() for r in results]}
        print(json.dumps(payload))
    else:
        for r in results:
            print(r.text)
            print(f"[{r.tokens} tokens, {r.forwards} forwards, TPF {r.tpf:.2f}, {r.tokens_per_s:.1f} tok/s, "
                  f"beam_width {r.beam_width_used}, backend {rt.backend.name}]", file=sys.stderr)
    return 0


def cmd_eval(a) -> int:
    from .evals import tasks
    from .evals.harness import run_eval
    from .runtime.api import decode_config
    dcfg = decode_config(**_decode_kwargs(a))
    wanted = tuple(a.tasks.split(",")) if a.tasks else tasks.FAMILIES + tasks.OPEN_FAMILIES
    bad = [f for f in wanted if f not in tasks.FAMILIES + tasks.OPEN_FAMILIES]
    if bad:
        raise UserError(f"unknown task {bad[0]!r} (expected some of {', '.join(tasks.FAMILIES + tasks.OPEN_FAMILIES)})")
    families = tuple(f for f in wanted if f in tasks.FAMILIES)
    if a.n < 1 or a.n > tasks.EVAL_PER_FAMILY:
        raise UserError(f"--n must be between 1 and {tasks.EVAL_PER_FAMILY}")
    rt = _runtime(a)
    bar = _progress(len(families) * a.n, f"eval {dcfg.strategy}", not a.json and sys.stderr.isatty())
    res = run_eval(rt.decoder, dcfg, families=families, n=a.n, batch_size=a.batch_size, progress=bar)
    if "text" in wanted:
        from .evals.harness import masked_nll
        res["open_text"] = masked_nll(rt.backend, rt.tokenizer, rt.config, n=a.n)
    if not a.outputs:
        res.pop("outputs")
    if a.json:
        print(json.dumps(res))
    else:
        print(f"strategy {res['strategy']}  backend {res['backend']}")
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
                 block_length=a.block_length, max_beam_width=a.max_beam_width, opset=a.opset, force=a.force, log=log)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"artifact {res['artifact']}  ({res['seconds']} s)")
        for prec, size in res["sizes_bytes"].items():
            par = res["parity"][prec]
            diff = par.get("max_abs_diff", {})
            print(f"  {prec:<5} {size / 1e6:7.2f} MB   parity vs torch: logits {diff.get('prefill_logits', float('nan')):.2e}"
                  f"  kv {diff.get('prefill_kv', float('nan')):.2e}  verify probs {diff.get('verify_probs', float('nan')):.2e}"
                  f"  top-1 identical {par.get('top1_ids_identical')}")
    return 0


def _csv(text: str, cast=str) -> list:
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad list {text!r}") from None


def cmd_bench(a) -> int:
    from .bench import configurations, run_bench
    if a.quick:
        a.n, a.repeats, a.beam_widths = 1, 2, "4"
    backends, strategies = _csv(a.backends), _csv(a.strategies)
    widths, taus = _csv(a.beam_widths, int), _csv(a.thresholds, float)
    families = _csv(a.tasks) if a.tasks else None
    total = len(configurations(backends, strategies, widths, taus)) * a.repeats
    bar = _progress(total, "bench", sys.stderr.isatty())
    res = run_bench(a.artifact, backends, strategies, widths, taus, families, n=a.n, repeats=a.repeats,
                    gen_length=a.gen_length, progress=bar)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{'configuration':<44}{'acc':>6}{'TPF':>7}{'tok/s':>9}{'ms/fwd':>8}{'overhead':>9}")
    for r in res["runs"]:
        print(f"{r['label']:<44}{r['accuracy']:>6.2f}{r['tpf']:>7.2f}{r['tokens_per_s']:>9.1f}"
              f"{r['time_per_forward_ms']:>8.1f}{r['loop_overhead']:>9.1%}")
    for k, v in res["ratios"].items():
        print(f"ratio {k}: {v:.2f}x")
    return 0


def cmd_profiles(a) -> int:
    import dataclasses

    from .profiles import detect, get_profile, load_profiles
    profiles = load_profiles()
    if a.action == "list":
        rows = [{"name": p.name, "description": p.description} for p in profiles.values()]
        print(json.dumps(rows) if a.json else "\n".join(f"{r['name']:<14} {r['description']}" for r in rows))
        return 0
    if not a.name:
        raise UserError(f"profiles {a.action} needs a profile name (or 'auto')")
    prof, reasons, facts = get_profile(a.name, profiles)
    if a.action == "show":
        d = dataclasses.asdict(prof)
        print(json.dumps(d) if a.json else yaml_dump(d))
        return 0
    facts = facts or detect()
    out = {"profile": prof.name, "source": prof.source, "facts": facts, "reasons": reasons,
           "backends": prof.backends, "precision": prof.precision, "decode": prof.decode}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"profile {prof.name} ({prof.source})")
        print("device: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in facts.items()))
        for r in reasons:
            print(f"  matched: {r}")
        print(f"backends: {' > '.join(prof.backends)}; precision {prof.precision}; decode {prof.decode}")
    return 0


def yaml_dump(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d, sort_keys=False).rstrip()


def cmd_build_engines(a) -> int:
    from .artifact import read_manifest
    from .export.engines import build_engine, engine_shapes, trtexec_command
    from .profiles import get_profile
    m = read_manifest(a.artifact, verify=not a.dry_run)
    prof, reasons, _ = get_profile(a.profile)
    files = m["precisions"].get(prof.precision) or m["precisions"]["fp32"]
    shapes = engine_shapes(m, prof.decode)
    out_dir = Path(a.artifact) / "engines" / prof.name
    plan = []
    for graph in ("prefill", "verify"):
        cmd = trtexec_command(str(Path(a.artifact) / files[graph]), str(out_dir / f"{graph}.plan"), shapes[graph],
                              workspace_mb=a.workspace_mb, opt_level=a.opt_level, timing_cache=str(out_dir / "timing.cache"))
        plan.append({"graph": graph, "shapes": {k: {"min": v.min, "opt": v.opt, "max": v.max} for k, v in shapes[graph].items()},
                     "trtexec": cmd})
    if a.dry_run:
        if a.json:
            print(json.dumps({"profile": prof.name, "reasons": reasons, "engines": plan}))
        else:
            print(f"profile {prof.name}: {'; '.join(reasons)}")
            for p in plan:
                print(f"[{p['graph']}]")
                for name in ("input_ids", "attention_mask", "past_key_values.0.key"):
                    s_ = p["shapes"][name]
                    print(f"  {name:<24} min {s_['min']}  opt {s_['opt']}  max {s_['max']}")
                print("  " + " ".join(p["trtexec"]))
        return 0
    for graph in ("prefill", "verify"):
        build_engine(Path(a.artifact) / files[graph], out_dir / f"{graph}.plan", shapes[graph], a.workspace_mb,
                     a.opt_level, out_dir / "timing.cache")
    print(json.dumps({"profile": prof.name, "engines": str(out_dir)}) if a.json else f"engines written to {out_dir}")
    return 0


def cmd_demo(a) -> int:
    from .demo import run_demo
    return run_demo(json_out=a.json, out_dir=a.out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dllm-deploy", description="Deploy diffusion LLMs with ONNX Runtime / TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode one or more prompts")
    g.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    g.add_argument("--escapes", action="store_true", help="interpret backslash escapes (\\n) in prompts")
    _add_decode_flags(g)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("eval", help="exact-match accuracy and decoding counters on the held-out split")
    _add_decode_flags(e)
    e.add_argument("--tasks", default=None, help="comma-separated families (default: all)")
    e.add_argument("--n", type=int, default=50, help="prompts per family (max 50)")
    e.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    e.add_argument("--outputs", action="store_true", help="include every prompt's output in the JSON")
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export", help="export a model to an ONNX artifact (prefill + verify graphs)")
    x.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face folder")
    x.add_argument("--out", required=True, help="artifact folder to write")
    x.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8 (fp32 always)")
    x.add_argument("--block-length", type=int, default=None, help="block length L (default: the model's)")
    x.add_argument("--max-beam-width", type=int, default=8, help="largest W the artifact is checked for")
    x.add_argument("--opset", type=int, default=17)
    x.add_argument("--force", action="store_true", help="replace an existing folder")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=cmd_export)

    b = sub.add_parser("bench", help="measure strategies x widths x thresholds x backends in one interleaved run")
    b.add_argument("--artifact", required=True)
    b.add_argument("--backends", default="torch,ort")
    b.add_argument("--strategies", default="vanilla,threshold,spd")
    b.add_argument("--beam-widths", default="1,2,4,8")
    b.add_argument("--thresholds", default="0.9")
    b.add_argument("--tasks", default=None, help="comma-separated families (default: all six)")
    b.add_argument("--n", type=int, default=5, help="prompts per family")
    b.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians reported)")
    b.add_argument("--gen-length", type=int, default=256, help="token budget per prompt")
    b.add_argument("--quick", action="store_true", help="n=1, 2 repeats, W=4: a smoke run")
    b.add_argument("--json", default=None, metavar="OUT", help="write the results JSON here")
    b.set_defaults(func=cmd_bench)

    pr = sub.add_parser("profiles", help="list, show or explain device profiles")
    pr.add_argument("action", choices=["list", "show", "explain"])
    pr.add_argument("name", nargs="?", default=None, help="profile name or 'auto'")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_profiles)

    be = sub.add_parser("build-engines", help="build TensorRT engines for a profile (needs TensorRT + a GPU)")
    be.add_argument("--artifact", required=True)
    be.add_argument("--profile", default="auto")
    be.add_argument("--workspace-mb", type=int, default=4096)
    be.add_argument("--opt-level", type=int, default=3, help="TensorRT builder optimization level (0-5)")
    be.add_argument("--dry-run", action="store_true", help="print the shapes and the trtexec command; build nothing")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=cmd_build_engines)

    d = sub.add_parser("demo", help="the main job on the bundled tiny model, printing the figures")
    d.add_argument("--out", default="build/demo", help="where the demo writes its artifact")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_demo)
    return ap


def main(argv=None) -> int:
    import warnings
    warnings.showwarning = lambda msg, *a, **k: print(f"dllm-deploy: warning: {msg}", file=sys.stderr)
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except UserError as e:
        print(f"dllm-deploy: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dllm-deploy ... | head`
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("dllm-deploy: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
