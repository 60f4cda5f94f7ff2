"""int8 / int4 accuracy of the routed experts (docs/moe.md): a random LLaDA 2.x-layout checkpoint
exported in both expert forms with fp32, int8 and int4, and a dense block-causal checkpoint of the
same attention and an MLP of the active width as the baseline; each variant's prefill logits
against its fp32's on the same random inputs: top-1 agreement, max and mean absolute logit
difference (the excluded mask id left out). End to end: a token routed to other experts counts
with everything else. Random weights give flat logits, so top-1 flips easily: compare the rows
with each other and with the dense baseline, not with a trained model's figures.

    PYTHONPATH=$PWD .venv/bin/python lab/moe_precision.py --json lab/moe-precision.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lab.big_export import write_sharded  # noqa: E402

CONFIG = {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"], "hidden_size": 256,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 4,
          "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 4,
          "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
          "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "norm_topk_prob": True,
          "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5, "rope_theta": 600000.0, "vocab_size": 2048,
          "mask_token_id": 2047, "eos_token_id": 2046, "pad_token_id": 2046, "block_size": 32,
          "max_position_embeddings": 1024, "rms_norm_eps": 1e-6}
DENSE = {"model_type": "sdar", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
         "num_hidden_layers": 4, "intermediate_size": 4 * 128 + 128, "vocab_size": 2048, "mask_token_id": 2047,
         "eos_token_id": 2046, "block_size": 32, "max_position_embeddings": 1024, "rope_theta": 600000.0}


def prefill_logits(art: Path, precision: str, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    from dllm_deploy.artifact import read_manifest
    m = read_manifest(art, verify=False)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(art / m["precisions"][precision]["prefill"]), so, providers=["CPUExecutionProvider"])
    b, t = ids.shape
    feeds = {"input_ids": ids, "position_ids": np.tile(np.arange(t), (b, 1)),
             "attention_mask": np.ones((b, 1, t, t), bool), "sample_u": np.zeros((b, t), np.float32),
             "temperature": np.zeros(b, np.float32), "top_k": np.zeros(b, np.int64), "top_p": np.ones(b, np.float32)}
    for i, (hkv, d) in enumerate(m["kv_shapes"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((b, hkv, 0, d), np.float32)
    return sess.run(["logits"], feeds)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dllm-moe-precision"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    from dllm_deploy.export.exporter import export
    shutil.rmtree(a.work, ignore_errors=True)
    write_sharded(a.work / "moe", CONFIG)
    write_sharded(a.work / "dense", DENSE)
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"] - 2, (4, 64))
    rows = []
    for model, form in (("moe", "contrib"), ("moe", "gather"), ("dense", "-")):
        art = a.work / f"{model}-{form}"
        export(a.work / model, art, precisions=["fp32", "int8", "int4"], moe_form="gather" if form == "-" else form,
               log=lambda m: None)
        ref = prefill_logits(art, "fp32", ids)
        keep = np.isfinite(ref)
        size32 = (art / "weights.bin").stat().st_size
        for p in ("int8", "int4"):
            got = np.where(keep, prefill_logits(art, p, ids), 0.0)
            ref = np.where(keep, ref, 0.0)
            rows.append({"model": model, "form": form, "precision": p,
                         "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
                         "max_abs_diff": float(np.abs(got - ref).max()), "mean_abs_diff": float(np.abs(got - ref).mean()),
                         "logit_std": float(ref.std()),
                         "weights_vs_fp32": round((art / p / "weights.bin").stat().st_size / size32, 3)})
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"config": CONFIG, "positions": int(ids.size), "rows": rows}, indent=1) + "\n")
    print("| model | form | precision | top-1 agreement with fp32 | max / mean abs logit diff (logit std) | weights vs fp32 |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['form']} | {r['precision']} | {r['top1_agreement']:.3f} | {r['max_abs_diff']:.3f} / "
              f"{r['mean_abs_diff']:.4f} ({r['logit_std']:.3f}) | {r['weights_vs_fp32']:.2f} |")
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
