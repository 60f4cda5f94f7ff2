"""A mixture of experts against a dense model of its active size, on one machine in one run
(docs/moe.md): random-weight checkpoints, their exports (wall time, peak RSS against the checkpoint's
size), then ``dllm-deploy bench --compare``: the ONNX Runtime forward cost of the MoE artifact in
both expert forms and of the dense one, interleaved, with microseconds per token per million
active parameters.

    PYTHONPATH=$PWD .venv/bin/python lab/moe_bench.py --work /tmp/moe-bench --json lab/moe.json

The MoE checkpoint is SDAR-MoE's layout (Qwen3-MoE names, block-causal): hidden 768, 6 layers,
32 experts of width 768, 4 a token (1/8 of the experts; about 1.45 GB fp32). The dense one is the
block-causal SDAR layout with the same attention and an MLP of width 4 x 768 (the active set's):
the same active parameters. Both are written one layer per shard, so this script never holds a
model; the folders are deleted at the end unless --keep.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lab.big_export import _time_v, write_sharded  # noqa: E402

COMMON = {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
          "num_hidden_layers": 6, "vocab_size": 8192, "mask_token_id": 8191, "eos_token_id": 8190, "block_size": 32,
          "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
MOE = {**COMMON, "model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"], "intermediate_size": 3072,
       "moe_intermediate_size": 768, "num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": True}
DENSE = {**COMMON, "model_type": "sdar", "intermediate_size": 4 * 768}


def export(model: Path, out: Path, *flags: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    wall, peak, _ = _time_v([sys.executable, "-m", "dllm_deploy.cli", "export", "--model", str(model), "--out", str(out),
                             "--max-beam-width", "4", *flags])
    return {"artifact": str(out), "wall_s": round(wall, 1), "peak_rss_bytes": peak,
            "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dllm-moe-bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved forward-cost repeats (medians)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and artifacts")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    res: dict = {"moe_config": MOE, "dense_config": DENSE, "exports": {}}
    sizes = {"moe": write_sharded(a.work / "moe-ckpt", MOE), "dense": write_sharded(a.work / "dense-ckpt", DENSE)}
    res["checkpoint_bytes"] = sizes
    for label, model, flags in (("moe-contrib", "moe-ckpt", ("--moe-form", "contrib", "--precision", "fp32,int4")),
                                ("moe-gather", "moe-ckpt", ("--moe-form", "gather", "--precision", "fp32,int4")),
                                ("dense", "dense-ckpt", ("--precision", "fp32,int4"))):
        print(f"export {label} ...", flush=True)
        e = export(a.work / model, a.work / label, *flags)
        e["peak_over_checkpoint"] = round(e["peak_rss_bytes"] / sizes[model.split("-")[0]], 2)
        res["exports"][label] = e
        print(json.dumps(e), flush=True)
    bench_json = a.work / "bench.json"
    cmd = [sys.executable, "-m", "dllm_deploy.cli", "bench", "--artifact", str(a.work / "moe-contrib"),
           "--compare", f"moe-gather={a.work / 'moe-gather'},dense={a.work / 'dense'}", "--backends", "ort",
           "--strategies", "threshold,spd", "--beam-widths", "4", "--precisions", "fp32,int4", "--tasks", "upper",
           "--n", "1", "--repeats", "1", "--gen-length", "32", "--quiet", "--json-out", str(bench_json)]
    subprocess.run(cmd, check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    bench = json.loads(bench_json.read_text())
    res["compare"] = bench["compare"]
    res["machine"], res["versions"] = bench["machine"], bench["versions"]
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(table(res))
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)


def table(res: dict) -> str:
    out = ["| model | form | precision | params (M) | active (M) | W1 ms | W4 ms | us / token / M active (W4) | vs dense |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    dense = {p: {r["beam_width"]: r for r in rows} for p, rows in res["compare"]["dense"]["forward_cost"].items()}
    for label, c in res["compare"].items():
        form = (c.get("experts") or {}).get("form", {}).get("fp32", "-")
        for p, rows in c["forward_cost"].items():
            by = {r["beam_width"]: r for r in rows}
            out.append(f"| {label} | {form} | {p} | {c['params'] / 1e6:.0f} | {c['active_params'] / 1e6:.0f} "
                       f"| {by[1]['ms']:.1f} | {by[4]['ms']:.1f} | {by[4]['us_per_token_per_m_active']:.3f} "
                       f"| {by[4]['ms'] / dense[p][4]['ms']:.2f}x |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
