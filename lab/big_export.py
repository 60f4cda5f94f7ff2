"""Big exports: peak memory and wall time of ``dllm-deploy export`` on random-weight LLaDA-layout
checkpoints of several sizes, and an ONNX Runtime vs torch logits check of each artifact.

    PYTHONPATH=$PWD .venv/bin/python lab/big_export.py --layers 1 4 12 --work /tmp/big --json out.json

Each size is a LLaDA-layout folder (config.json + sharded safetensors + index) written one shard
(one transformer block) at a time, so this script never holds the model. The export runs in its
own process under ``/usr/bin/time -v`` (peak RSS = "Maximum resident set size"); the check loads
the artifact's prefill graph in ONNX Runtime and the checkpoint in torch, in another process, and
compares the logits of a few positions. Each size's folders are deleted after its row.
Prints a markdown table (docs/export.md) and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# LLaDA's config keys; n_layers is set per size
BASE_CONFIG = {"model_type": "llada", "d_model": 2048, "n_heads": 16, "n_kv_heads": 16, "mlp_hidden_size": 5632,
               "vocab_size": 8192, "embedding_size": 8192, "mask_token_id": 8191, "eos_token_id": 8190,
               "rope_theta": 500000.0, "max_sequence_length": 4096, "weight_tying": False}
def write_sharded(folder: Path, raw: dict, seed: int = 0, scale: float = 0.02) -> int:
    """A random checkpoint of ``raw``'s family (any registered one) in its own tensor names, one
    shard per layer (and one for the embedding, final norm and head): norms at 1, matrices normal
    with standard deviation ``scale`` (0.02: activations stay finite through the depth; larger
    gives peaked predictions, whose decisions have margins). Returns the tensors' bytes."""
    import torch
    from safetensors.torch import save_file

    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.models.registry import family_for
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    cfg, family = DLLMConfig.from_hf(raw), family_for(raw)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in family.build(cfg).state_dict().items()}
    groups: dict[str, list[str]] = {}
    for name in shapes:
        m = re.match(r"model\.layers\.(\d+)\.", name)
        groups.setdefault(f"layer{int(m.group(1)):03d}" if m else "outer", []).append(name)
    g = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for i, (_, names) in enumerate(sorted(groups.items())):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for n in names:
            shape = shapes[n]
            t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * scale
            shard[family.to_theirs(n)] = t
            weight_map[family.to_theirs(n)] = fname
            total += t.numel() * 4
        save_file(shard, str(folder / fname))
        del shard
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    return total


def write_checkpoint(folder: Path, n_layers: int, seed: int = 0) -> int:
    """A random LLaDA-layout checkpoint of ``n_layers`` blocks (write_sharded)."""
    return write_sharded(folder, {**BASE_CONFIG, "n_layers": n_layers}, seed)


def _time_v(cmd: list[str]) -> tuple[float, int, str]:
    """Run ``cmd`` under /usr/bin/time -v: (wall seconds, peak RSS bytes, its output)."""
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    return wall, peak, p.stdout


CHECK = r'''
import json, sys
import numpy as np, onnxruntime as ort, torch
from dllm_deploy.models.loading import load_model
from dllm_deploy.export.graphs import PrefillGraph
from dllm_deploy.artifact import read_manifest
from dllm_deploy.models.sampling import default_pool
model_dir, art = sys.argv[1], sys.argv[2]
m = read_manifest(art, verify=False)
module, cfg = load_model(model_dir, attention="eager")
g = torch.Generator().manual_seed(1)
T = 16
ids = torch.randint(0, cfg.vocab_size - 2, (1, T), generator=g)
pos = torch.arange(T)[None]
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
past = [torch.zeros(1, cfg.num_kv_heads, 0, cfg.head_dim) for _ in range(2 * cfg.num_layers)]
greedy = [torch.zeros(1, T), torch.zeros(1), torch.zeros(1, dtype=torch.int64), torch.ones(1)]   # sample_u .. top_p
with torch.no_grad():
    ref = PrefillGraph(module, 2, default_pool(cfg.vocab_size))(ids, pos, mask, *past, *greedy)[0][0].float().numpy()
del module
so = ort.SessionOptions(); so.log_severity_level = 3
sess = ort.InferenceSession(f"{art}/{m['precisions']['fp32']['prefill']}", so, providers=["CPUExecutionProvider"])
feeds = {"input_ids": ids.numpy(), "position_ids": pos.numpy(), "attention_mask": mask.numpy()}
feeds.update({n: x.numpy() for n, x in zip(m["graphs"]["prefill"]["inputs"][3:], past + greedy)})
got = sess.run(["logits"], feeds)[0][0]
keep = np.isfinite(got)     # the excluded ids (mask token) are -inf in the graph only
diff = float(np.abs(got[keep] - ref[keep]).max())
print(json.dumps({"positions": T, "max_abs_diff": diff, "max_abs_logit": float(np.abs(ref[keep]).max()),
                  "argmax_equal": bool((np.where(keep, got, -np.inf).argmax(-1) == np.where(keep, ref, -np.inf).argmax(-1)).all())}))
'''


def run_size(work: Path, n_layers: int) -> dict:
    model, art = work / f"llada-{n_layers}l", work / f"art-{n_layers}l"
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(art, ignore_errors=True)
    size = write_checkpoint(model, n_layers)
    print(f"[{n_layers} layers] checkpoint {size / 1e9:.2f} GB; exporting ...", flush=True)
    wall, peak, _ = _time_v([sys.executable, "-m", "dllm_deploy.cli", "export", "--model", str(model),
                             "--out", str(art), "--max-beam-width", "2"])
    art_bytes = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    weights = (art / "weights.bin").stat().st_size
    print(f"[{n_layers} layers] export {wall:.0f} s, peak RSS {peak / 1e9:.2f} GB; checking logits ...", flush=True)
    cwall, cpeak, out = _time_v([sys.executable, "-c", CHECK, str(model), str(art)])
    check = json.loads(out.strip().splitlines()[-1])
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(art, ignore_errors=True)
    return {"n_layers": n_layers, "checkpoint_bytes": size, "artifact_bytes": art_bytes, "weights_bin_bytes": weights,
            "export_wall_s": round(wall, 1), "export_peak_rss_bytes": peak, "peak_over_checkpoint": round(peak / size, 2),
            "check": check, "check_wall_s": round(cwall, 1), "check_peak_rss_bytes": cpeak}


def table(rows: list[dict]) -> str:
    out = ["| layers | checkpoint GB | artifact GB | export wall s | export peak RSS GB | peak / checkpoint "
           "| ORT vs torch max abs diff (logits, 16 positions) | argmax equal |",
           "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        c = r["check"]
        out.append(f"| {r['n_layers']} | {r['checkpoint_bytes'] / 1e9:.2f} | {r['artifact_bytes'] / 1e9:.2f} "
                   f"| {r['export_wall_s']:.0f} | {r['export_peak_rss_bytes'] / 1e9:.2f} | {r['peak_over_checkpoint']:.2f} "
                   f"| {c['max_abs_diff']:.1e} (max logit {c['max_abs_logit']:.1f}) | {c['argmax_equal']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 4, 12],
                    help="block counts, one checkpoint each (d_model 2048: 1 -> 0.34 GB, 4 -> 0.97 GB, 12 -> 2.6 GB)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/dllm-big-export"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in a.layers:
        rows.append(run_size(a.work, n))
        print(json.dumps(rows[-1]), flush=True)
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
