"""The aarch64 build (cpp/scripts/build.sh aarch64) under qemu-user against the x86-64 build, on the
bundled artifact (lab run, not in `make test`; docs/cpp.md "Cross-building for a board"):

- graph parity: prefill and verify, fp32 and int8, the same .npy inputs through dllm-graph-run on
  both; max abs difference per output;
- tokens: strategies x cache modes x precisions x the first prompts of the evaluation tasks, one
  block each, through dllm-generate --trace on both; identical token ids counted, forwards compared,
  and where the decision traces part, the first differing decision with its margin on each machine
  (docs/cpp.md "What 'the same model' means": a difference at a margin over 1e-3 is a bug).

    PYTHONPATH=$PWD .venv/bin/python lab/arm64_parity.py --artifact ART --json lab/arm64_parity.json

Needs `make cpp`, `cpp/scripts/build.sh aarch64`, qemu-user and root (cpp/scripts/qemu-run.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_deploy.runtime.trace import first_difference, margin_drift  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
X86, ARM = REPO / "build" / "cpp", REPO / "build" / "cpp-aarch64"
STRATEGIES = {"vanilla-k4": ["--strategy", "vanilla", "--tokens-per-step", "4"], "threshold": ["--strategy", "threshold"],
              "spd-w2": ["--strategy", "spd", "--beam-width", "2"]}


def run(program: str, *args: str, emulated: bool, cpu: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(REPO / "cpp" / "scripts" / "qemu-run.sh"), str(ARM / program)] if emulated else [str(X86 / program)]
    r = subprocess.run([*cmd, *args], capture_output=True, text=True, env=dict(os.environ, QEMU_CPU=cpu))
    if r.returncode:
        sys.exit(f"{program} failed ({'arm' if emulated else 'x86'}): {r.stderr.strip()[-500:]}")
    return r


def graph_parity(art: Path, cpu: str) -> dict:
    import onnxruntime as ort
    sys.path.insert(0, str(REPO))
    from tests.integration.cpp.test_graph_run import _inputs
    m = json.loads((art / "manifest.json").read_text())
    out = {}
    for precision in ("fp32", "int8"):
        for role in ("prefill", "verify"):
            sess = ort.InferenceSession(str(art / m["precisions"][precision][role]))
            with tempfile.TemporaryDirectory() as d:
                d = Path(d)
                (d / "in").mkdir()
                for k, v in _inputs(sess, m["model"]["vocab_size"], 0, np.random.default_rng(1)).items():
                    np.save(d / "in" / f"{k}.npy", v)
                args = ["--artifact", str(art), "--role", role, "--precision", precision, "--inputs", str(d / "in")]
                names = json.loads(run("dllm-graph-run", *args, "--outputs", str(d / "x86"), emulated=False, cpu=cpu).stdout)
                run("dllm-graph-run", *args, "--outputs", str(d / "arm"), emulated=True, cpu=cpu)
                for name in names["outputs"]:
                    a, b = np.load(d / "x86" / f"{name}.npy"), np.load(d / "arm" / f"{name}.npy")
                    key = f"{precision} {role} {name}"
                    if a.dtype.kind == "f":
                        fin = np.isfinite(a) & np.isfinite(b)
                        out[key] = float(np.abs(a[fin] - b[fin]).max())
                    else:
                        out[key] = f"{int((a == b).sum())}/{a.size} equal"
    out["int8 export parity bound (x86 int8 vs fp32 torch)"] = m["parity"]["int8"]["max_abs_diff"]
    return out


CACHES = ("exact", "none", "delayed")      # the bundled (block-causal) model's; delayed runs one branch (not SPD)
NEAR_TIE = 1e-3                            # a differing decision with a wider margin is a bug


def _per_prompt(records: list[dict]) -> list[list[dict]]:
    """dllm-generate --trace over a prompts file (batches of one): a prompt's records start at its
    first forward."""
    out: list[list[dict]] = []
    for r in records:
        if r["forward"] == 1 and r["block"] == 0 and r["step"] == 0:
            out.append([])
        out[-1].append(r)
    return out


def tokens(art: Path, prompts: list[str], cpu: str, caches=CACHES) -> list[dict]:
    """Every strategy x cache mode x precision over the prompts, each prompt decoded alone, with
    decision traces on both machines: identical tokens and forwards counted; where a trace parts,
    the first differing decision and its margins."""
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        pfile = d / "prompts.jsonl"
        pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts))
        for precision in ("fp32", "int8"):
            for name, flags in STRATEGIES.items():
                for cache in caches:
                    if cache == "delayed" and name.startswith("spd"):
                        continue
                    args = ["--artifact", str(art), "--prompts-file", str(pfile), "--gen-length", "32",
                            "--precision", precision, "--cache", cache, "--json", *flags]
                    res, traces = {}, {}
                    for where, emulated in (("x86", False), ("arm", True)):
                        t0 = time.perf_counter()
                        r = run("dllm-generate", *args, "--trace", str(d / f"{where}.jsonl"), emulated=emulated, cpu=cpu)
                        res[where] = [json.loads(line) for line in r.stdout.splitlines()]
                        traces[where] = _per_prompt([json.loads(line) for line in (d / f"{where}.jsonl").read_text().splitlines()])
                        if emulated:
                            took = round(time.perf_counter() - t0, 1)
                    for i, p in enumerate(prompts):
                        x, a = res["x86"][i], res["arm"][i]
                        diff = first_difference(traces["x86"][i], traces["arm"][i])
                        if diff:
                            diff = {"record": diff["record"], "margin_x86": diff["margin_a"], "margin_arm": diff["margin_b"],
                                    "x86": diff["a"], "arm": diff["b"]}
                        rows.append({"precision": precision, "strategy": name, "cache": cache, "prompt": p,
                                     "identical": a["token_ids"] == x["token_ids"], "forwards_x86": x["forwards"],
                                     "forwards_arm": a["forwards"], "tokens": x["tokens"], "same_trace": diff is None,
                                     "margin_drift": margin_drift(traces["x86"][i], traces["arm"][i]),
                                     **({"first_difference": diff} if diff else {})})
                    print(json.dumps({"precision": precision, "strategy": name, "cache": cache, "emulated_s": took,
                                      "identical": sum(r["identical"] for r in rows[-len(prompts):]),
                                      "same_trace": sum(r["same_trace"] for r in rows[-len(prompts):])}), file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--prompts", type=int, default=6, help="the first prompt of this many evaluation tasks")
    ap.add_argument("--cpu", default="neoverse-n1")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from dllm_deploy.evals import tasks
    prompts = [e.prompt for e in tasks.eval_split(tuple(tasks.FAMILIES), 1)][:a.prompts]
    art = Path(a.artifact)
    res = {"cpu": a.cpu, "graphs": graph_parity(art, a.cpu), "tokens": tokens(art, prompts, a.cpu)}
    t = res["tokens"]
    res["identical"] = f"{sum(r['identical'] for r in t)}/{len(t)}"
    res["same_forwards"] = f"{sum(r['forwards_x86'] == r['forwards_arm'] for r in t)}/{len(t)}"
    res["same_trace"] = f"{sum(r['same_trace'] for r in t)}/{len(t)}"
    parted = [r["first_difference"] for r in t if not r["same_trace"]]
    # a trace that parts does so at a decision whose margin is below NEAR_TIE on both machines, or it is a bug
    widest = [max(p["margin_x86"], p["margin_arm"]) for p in parted]
    res["differences_at_near_ties"] = f"{sum(m < NEAR_TIE for m in widest)}/{len(parted)}"
    res["widest_margin_at_a_difference"] = max(widest, default=None)
    res["margin_drift"] = max(r["margin_drift"] for r in t)
    print(json.dumps({k: v for k, v in res.items() if k != "tokens"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
