"""``dllm-deploy demo``: the main job on the bundled tiny model, end to end.

export (fp32 + int8, parity checked) -> load the artifact in ONNX Runtime -> decode a small
eval subset with each strategy -> print accuracy, TPF, forwards and tokens/s.
"""
from __future__ import annotations
import json
import sys
from pathlib import Path

STRATEGIES = [
    ("vanilla", {"strategy": "vanilla"}),
    ("threshold 0.9", {"strategy": "threshold", "threshold": 0.9}),
    ("spd lossless W4", {"strategy": "spd", "beam_width": 4}),
    ("spd lossless/thr W4", {"strategy": "spd", "beam_width": 4, "base": "threshold"}),
    ("spd threshold W4", {"strategy": "spd", "beam_width": 4, "select": "threshold"}),
    # the tau at which the threshold rule keeps vanilla's accuracy on this model, and SPD over it
    ("threshold 0.99", {"strategy": "threshold", "threshold": 0.99}),
    ("spd lossless/thr.99 W8", {"strategy": "spd", "beam_width": 8, "base": "threshold", "threshold": 0.99}),
]


def run_demo(json_out: bool = False, out_dir: str = "build/demo", n_per_family: int = 5) -> int:
    from ..evals import tasks
    from ..evals.harness import run_eval
    from ..export.exporter import export
    from ..runtime.api import Runtime, decode_config

    say = (lambda m: None) if json_out else (lambda m: print(m, file=sys.stderr, flush=True))
    art = Path(out_dir) / "tiny-artifact"
    say(f"[1/3] export the bundled tiny dLLM -> {art}")
    rep = export("tiny", art, precisions=["fp32", "int8"], force=True, log=lambda m: say("      " + m))
    say(f"      parity fp32: max |logits diff| {rep['parity']['fp32']['max_abs_diff']['prefill_logits']:.2e}")
    say("[2/3] pick the device profile and load the artifact with ONNX Runtime")
    rt = Runtime.load(artifact=str(art), profile="auto")
    say(f"      profile {rt.profile.name}: {'; '.join(rt.profile_reasons)}")
    say(f"      providers: {', '.join(rt.backend.providers)}; beam width cap {rt.max_beam_width}")
    say(f"[3/3] decode {n_per_family} held-out prompts per family with each strategy")
    rows = []
    for label, kw in STRATEGIES:
        res = run_eval(rt, decode_config(**kw), families=tasks.FAMILIES, n=n_per_family)
        o = res["overall"]
        rows.append({"strategy": label, **{k: o[k] for k in ("accuracy", "tpf", "forwards", "tokens", "tokens_per_s")}})
        say(f"      {label:<22} acc {o['accuracy']:.3f}  TPF {o['tpf']:5.2f}  forwards {o['forwards']:5d}  {o['tokens_per_s']:7.1f} tok/s")
    sample = rt.generate("upper: diffusion models fill many tokens per forward\n", strategy="spd", beam_width=4)[0]
    result = {"artifact": str(art), "profile": rt.profile.name, "profile_reasons": rt.profile_reasons, "sizes_bytes": rep["sizes_bytes"], "parity": rep["parity"], "runs": rows,
              "sample": {"text": sample.text, "tpf": sample.tpf}}
    if json_out:
        print(json.dumps(result))
    else:
        print(f"sample (spd W4): {sample.text!r}  TPF {sample.tpf:.2f}")
        print(f"{'strategy':<22}{'acc':>7}{'TPF':>8}{'forwards':>10}{'tok/s':>9}")
        for r in rows:
            print(f"{r['strategy']:<22}{r['accuracy']:>7.3f}{r['tpf']:>8.2f}{r['forwards']:>10}{r['tokens_per_s']:>9.1f}")
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="the main job on the bundled tiny model, printing the figures")
    d.add_argument("--out", default="build/demo", help="where the demo writes its artifact")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=run)


def run(a) -> int:
    return run_demo(json_out=a.json, out_dir=a.out)
