"""Export a dLLM to the artifact of DESIGN §3: prefill.onnx + verify.onnx sharing one weights
file, precision variants, manifest.json, and a parity check (ONNX Runtime vs PyTorch).

The artifact is written to a temporary folder beside ``out`` and renamed at the end: an
interrupted or failed export leaves nothing behind.
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..artifact import write_manifest
from ..errors import UserError
from ..models.exclusion import excluded_ids
from .graphs import PrefillGraph, VerifyGraph, dynamic_axes, io_names

PRECISIONS = ("fp32", "fp16", "int8")
DEFAULT_OPSET = 17
TOPK = 2


def _export_graph(module, args, names: dict, axes: dict, opset: int):
    import onnx
    import torch
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module, args, buf, input_names=names["inputs"], output_names=names["outputs"],
                          dynamic_axes={k: v for k, v in axes.items() if k in names["inputs"] + names["outputs"]},
                          opset_version=opset, dynamo=False, do_constant_folding=True)
    return onnx.load_from_string(buf.getvalue())


def share_weights(models: dict, folder: Path, weights_name: str, min_bytes: int = 1024) -> int:
    """Store every large initializer of all graphs once, in ``weights_name``; graphs point at it
    (ONNX external data). Identical tensors (by content) are written once. Returns bytes written."""
    import onnx
    offsets: dict[str, tuple[int, int]] = {}
    with open(folder / weights_name, "wb") as f:
        for model in models.values():
            for t in model.graph.initializer:
                raw = onnx.numpy_helper.to_array(t).tobytes() if not t.raw_data else t.raw_data
                if len(raw) < min_bytes:
                    continue
                key = hashlib.sha256(raw).hexdigest() + str(t.data_type)
                if key not in offsets:
                    pad = (-f.tell()) % 64
                    f.write(b"\0" * pad)
                    offsets[key] = (f.tell(), len(raw))
                    f.write(raw)
                off, n = offsets[key]
                t.ClearField("raw_data")
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    t.ClearField(field)
                del t.external_data[:]
                for k, v in (("location", weights_name), ("offset", str(off)), ("length", str(n))):
                    entry = t.external_data.add()
                    entry.key, entry.value = k, v
                t.data_location = onnx.TensorProto.EXTERNAL
        return f.tell()


def _dummy(cfg, b: int, t: int, p: int, dtype, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    pos = torch.arange(p, p + t).repeat(b, 1)
    mask = torch.ones(b, 1, t, p + t, dtype=torch.bool)
    past = [torch.randn(b, cfg.num_kv_heads, p, cfg.head_dim, generator=g).to(dtype) for _ in range(2 * cfg.num_layers)]
    return ids, pos, mask, past


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max abs difference; equal entries count 0, so the excluded ids' -inf logits compare equal."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(invalid="ignore"):            # -inf - -inf
        diff = np.abs(a - b)
    return float(np.where(a == b, 0.0, diff).max())


def parity(folder: Path, files: dict, module, cfg, shapes, dtype, providers=("CPUExecutionProvider",)) -> dict:
    """Run both graphs in ONNX Runtime and in torch on the same inputs; report max abs diffs."""
    import onnxruntime as ort
    import torch
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = {g: ort.InferenceSession(str(folder / files[g]), so, providers=list(providers)) for g in ("prefill", "verify")}
    names = io_names(cfg.num_layers)
    worst = {"prefill_logits": 0.0, "prefill_kv": 0.0, "verify_probs": 0.0}
    ids_equal = True
    for i, (b, t, p) in enumerate(shapes):
        ids, pos, mask, past = _dummy(cfg, b, t, p, dtype, seed=i)
        # realistic masks: block-diagonal branches when t is a multiple of the block
        feeds = {"input_ids": ids.numpy(), "position_ids": pos.numpy(), "attention_mask": mask.numpy()}
        feeds.update({n: x.numpy() for n, x in zip(names["prefill"]["inputs"][3:], past)})
        with torch.no_grad():
            pt = PrefillGraph(module, TOPK)(ids, pos, mask, *past)
            vt = VerifyGraph(module, TOPK)(ids, pos, mask, *past)
        po = sess["prefill"].run(None, feeds)
        vo = sess["verify"].run(None, feeds)
        worst["prefill_logits"] = max(worst["prefill_logits"], _max_diff(po[0], pt[0].float().numpy()))
        kv = max(float(np.abs(o.astype(np.float32) - x.float().numpy()).max()) for o, x in zip(po[3:], pt[3:]))
        worst["prefill_kv"] = max(worst["prefill_kv"], kv)
        worst["verify_probs"] = max(worst["verify_probs"], float(np.abs(vo[1] - vt[1].numpy()).max()))
        # top-1 ids must agree (ties among lower ranks may legitimately swap)
        ids_equal &= bool((vo[0][..., 0] == vt[0].numpy()[..., 0]).all())
    return {"max_abs_diff": worst, "top1_ids_identical": ids_equal, "shapes": [list(s) for s in shapes]}


def export(model: str = "tiny", out: str | Path = "artifact", precisions=("fp32",), block_length: int | None = None,
           max_beam_width: int = 8, opset: int = DEFAULT_OPSET, force: bool = False, log=print) -> dict:
    """Export ``model`` (``tiny`` or a Hugging Face folder) into the artifact folder ``out``."""
    import onnx
    import torch

    from ..models.loading import load_model, resolve_model_dir
    from ..models.tokenizer import load_tokenizer

    precisions = list(dict.fromkeys(precisions))
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise UserError(f"unknown precision {bad[0]!r} (expected some of {', '.join(PRECISIONS)})")
    if "fp32" not in precisions:
        precisions.insert(0, "fp32")
    if max_beam_width < 1:
        raise UserError("--max-beam-width must be >= 1")
    out = Path(out)
    if out.exists() and not force:
        raise UserError(f"{out}: already exists (pass --force to replace it)")
    src = resolve_model_dir(model)
    module, cfg = load_model(src, attention="eager")
    L = block_length or cfg.block_size
    tok = load_tokenizer(src, cfg.eos_token_id)
    names = io_names(cfg.num_layers)
    axes = dynamic_axes(cfg.num_layers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    t0 = time.time()
    try:
        files: dict[str, dict] = {}
        parity_report: dict[str, dict] = {}
        shapes = [(1, 24, 0), (2, L, 24), (1, 2 * L, 40), (1, max_beam_width * L, 48)]
        for prec in precisions:
            log(f"export {prec} ...")
            sub = tmp if prec == "fp32" else tmp / prec
            sub.mkdir(exist_ok=True)
            rel = "" if prec == "fp32" else f"{prec}/"
            if prec == "int8":
                graphs = _int8_variant(tmp, sub)
                dtype, mod = torch.float32, module
            else:
                dtype = torch.float16 if prec == "fp16" else torch.float32
                mod = module.to(dtype) if prec == "fp16" else module
                args = _dummy(cfg, 1, L, 4, dtype)
                args = (args[0], args[1], args[2], *args[3])
                graphs = {"prefill": _export_graph(PrefillGraph(mod, TOPK), args, names["prefill"], axes, opset),
                          "verify": _export_graph(VerifyGraph(mod, TOPK), args, names["verify"], axes, opset)}
            share_weights(graphs, sub, "weights.bin")
            for g, m in graphs.items():
                onnx.save(m, str(sub / f"{g}.onnx"))
            files[prec] = {"prefill": f"{rel}prefill.onnx", "verify": f"{rel}verify.onnx", "weights": f"{rel}weights.bin"}
            log(f"parity {prec} ...")
            try:
                parity_report[prec] = parity(tmp, files[prec], mod, cfg, shapes, dtype)
            except Exception as e:  # fp16 kernels may be missing on the CPU execution provider
                if prec == "fp32":
                    raise
                parity_report[prec] = {"skipped": f"ONNX Runtime CPU could not run it here: {type(e).__name__}"}
            if prec == "fp16":
                module = module.float()
        if tok.kind == "hf":
            shutil.copy(src / "tokenizer.json", tmp / "tokenizer.json")
        manifest = {
            "exporter_version": __version__, "torch_version": torch.__version__, "onnx_opset": opset,
            "model": cfg.to_dict(), "source": str(src),
            "tokenizer": tok.to_manifest(),
            "special_ids": {"mask": cfg.mask_token_id, "eos": cfg.eos_token_id, "pad": cfg.pad_token_id,
                            "excluded": list(excluded_ids(cfg))},
            "block_length": L, "max_beam_width": max_beam_width, "topk": TOPK,
            "cache_mode": "exact" if cfg.attention == "block_causal" else "prefix",
            "graphs": {g: {**names[g], "dims": {"input_ids": ["batch", "tokens"], "position_ids": ["batch", "tokens"],
                                                "attention_mask": ["batch", 1, "tokens", "kv_len"],
                                                "past": ["batch", cfg.num_kv_heads, "past", cfg.head_dim],
                                                "top": ["batch", "tokens", TOPK]}} for g in names},
            "precisions": files, "parity": parity_report,
            "created_s": round(time.time() - t0, 1),
        }
        fp32 = parity_report["fp32"]
        if fp32["max_abs_diff"]["prefill_logits"] > 1e-3 or not fp32["top1_ids_identical"]:
            raise UserError(f"parity check failed: {json.dumps(fp32)}")
        write_manifest(tmp, manifest)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sizes = {p: sum((out / f).stat().st_size for f in fs.values()) for p, fs in files.items()}
    return {"artifact": str(out), "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
            "sizes_bytes": sizes, "parity": parity_report, "seconds": round(time.time() - t0, 1)}


def _int8_variant(fp32_dir: Path, sub: Path) -> dict:
    """Dynamic int8 quantization (MatMul weights) of the fp32 graphs, for CPU / edge."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    graphs = {}
    for g in ("prefill", "verify"):
        dst = sub / f"{g}.q.onnx"
        quantize_dynamic(str(fp32_dir / f"{g}.onnx"), str(dst), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})
        graphs[g] = onnx.load(str(dst))
        dst.unlink()
        for leftover in sub.glob("*.data"):
            leftover.unlink()
    return graphs
