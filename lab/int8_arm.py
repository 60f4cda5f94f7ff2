"""int8 recipes on Arm's integer kernels (no 16-bit saturation), emulated: the same fidelity to fp32
as lab/int8_fidelity.py, with each int8 prefill graph run by the aarch64 C++ build under qemu-user
(cpp/scripts/qemu-run.sh, neoverse-n1) and by the x86 build on this host, against this host's fp32.

    PYTHONPATH=$PWD .venv/bin/python lab/int8_arm.py --artifacts build/int8-fidelity-rr/v4 \\
        build/int8-fidelity-rr/v6 --json lab/int8-arm.json

Each artifact: an export with fp32 and int8 (lab/int8_fidelity.py's build/int8-fidelity-rr/vN:
v4 the default recipe, v6 the default with --int8-reduce-range). Needs build/cpp and
build/cpp-aarch64 (`make test` builds both) and qemu-user. ~2 s per emulated forward.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_graph(command: list[str], art: Path, precision: str, inputs: Path, outputs: Path) -> np.ndarray:
    p = subprocess.run([*command, "--artifact", str(art), "--role", "prefill", "--precision", precision,
                        "--inputs", str(inputs), "--outputs", str(outputs)], capture_output=True, text=True,
                       timeout=600)
    if p.returncode:
        raise SystemExit(f"{command[-1]} failed: {p.stderr[-2000:]}")
    return np.load(outputs / "logits.npy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", nargs="+", type=Path, required=True)
    ap.add_argument("--states", type=int, default=3, help="held-out decode states per family")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import onnxruntime as ort

    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.evals.fidelity import compare_logits, decode_states, prefill_feeds
    from dllm_deploy.models.tokenizer import load_tokenizer
    from int8_saturation import machine
    engines = {"x86": [str(ROOT / "build/cpp/dllm-graph-run")],
               "arm (qemu neoverse-n1)": ["bash", str(ROOT / "cpp/scripts/qemu-run.sh"),
                                          str(ROOT / "build/cpp-aarch64/dllm-graph-run")]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for art in a.artifacts:
            m = read_manifest(art, verify=False)
            cfg = m["model"]
            states = decode_states(load_tokenizer(art, cfg["eos_token_id"]), cfg["mask_token_id"], m["block_length"],
                                   n=a.states)
            fp32 = ort.InferenceSession(str(art / m["precisions"]["fp32"]["prefill"]),
                                        providers=["CPUExecutionProvider"])
            got: dict = {e: [] for e in engines}
            ref = []
            for k, st in enumerate(states):
                src = Path(tmp) / f"{art.name}-{k}"
                src.mkdir()
                feeds = prefill_feeds(fp32.get_inputs(), st)
                for name, x in feeds.items():
                    np.save(src / f"{name}.npy", x)
                ref.append(fp32.run(["logits"], feeds)[0][0, st[3]:])
                for e, cmd in engines.items():
                    out = Path(tmp) / f"{art.name}-{k}-{e.split()[0]}"
                    got[e].append(run_graph(cmd, art, "int8", src, out)[0, st[3]:])
            for e in engines:
                rows.append({"artifact": str(art), "reduce_range": m["quantization"]["int8"].get("reduce_range", False),
                             "engine": e, **compare_logits(ref, got[e])})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    print("| int8 weights | engine | logit error | top-1 agreement | top-1 prob error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {'7-bit' if r['reduce_range'] else '8-bit'} | {r['engine']} | {r['logit_error']:.3f} | "
              f"{r['top1_agreement']:.3f} | {r['top1_prob_error']:.4f} |")


if __name__ == "__main__":
    main()
