"""``dllm-deploy export``: a model to an ONNX artifact."""
from __future__ import annotations

import json
import sys

from ..models.config import KV_IO, MOE_FORMS
from ..profiles.memory import INT4_BLOCK, INT8_FP32_DEFAULT


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="export a model to an ONNX artifact (prefill + verify graphs)")
    x.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face folder")
    x.add_argument("--out", required=True, help="artifact folder to write")
    x.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8,int4 (fp32 always)")
    x.add_argument("--int4-block-size", type=int, default=INT4_BLOCK,
                   help="int4: weights per quantization block along the input dimension (power of two >= 16)")
    x.add_argument("--int4-asymmetric", dest="int4_symmetric", action="store_false",
                   help="int4: a zero point per block (default symmetric: scales only)")
    x.add_argument("--int4-accuracy-level", type=int, default=0, metavar="N",
                   help="int4: the products' compute type, MatMulNBits' accuracy_level: 0 (default) fp32, 4 int8 "
                        "activations, for CPUs with fast int8 dot products; docs/precision.md)")
    x.add_argument("--int8-smooth", type=float, default=0.5, metavar="ALPHA",
                   help="int8: SmoothQuant strength in [0, 1], moving activation outliers into the weights before "
                        "quantization (0: none; default 0.5; docs/precision.md)")
    x.add_argument("--int8-fp32", default=",".join(INT8_FP32_DEFAULT), metavar="PRODUCTS",
                   help="int8: weight products kept in fp32, comma-separated from qkv, o_proj, gate_up, down_proj, "
                        "lm_head, or 'none' (default down_proj: the widest activations; docs/precision.md)")
    x.add_argument("--int8-reduce-range", action="store_true",
                   help="int8: 7-bit weights (-64..64), for x86 CPUs without VNNI (AVX2 only), where full-range int8 "
                        "products saturate in ONNX Runtime's kernels (docs/precision.md)")
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
    x.set_defaults(func=run)


def run(a) -> int:
    from ..export.exporter import export
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    res = export(model=a.model, out=a.out, precisions=[p.strip() for p in a.precision.split(",") if p.strip()],
                 block_length=a.block_length, max_beam_width=a.max_beam_width, opset=a.opset, force=a.force, log=log,
                 int4_block_size=a.int4_block_size, int4_symmetric=a.int4_symmetric,
                 int4_accuracy_level=a.int4_accuracy_level, sample_pool=a.sample_pool,
                 int8_smooth=a.int8_smooth, int8_calibration=a.int8_calibration, moe_form=a.moe_form,
                 chat_template=a.chat_template, kv_io=a.kv_io, int8_reduce_range=a.int8_reduce_range,
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
