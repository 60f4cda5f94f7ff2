"""Export a dLLM to the artifact of DESIGN §3: prefill.onnx + verify.onnx sharing one weights
file, precision variants, manifest.json, and a parity check (ONNX Runtime vs PyTorch).

Nothing but its own artifact is ever deleted or left half-written (artifact/fsio.py):
- ``--out`` is checked before anything is written. An existing empty folder is used as is; any
  other existing folder needs ``--force``, and ``--force`` replaces only an artifact this tool
  wrote (manifest.json with schema_version and exporter_version). Never replaced: a regular
  file, a folder of other files, the source model's folder or a folder holding it, the current
  folder or one of its parents, ``/``. Paths are resolved (symlinks, ``.``, ``..``) first.
- The export holds a lock on the target (``.NAME.lock`` beside it) from start to end: a second
  export to the same folder fails in one line instead of silently replacing the first.
- The artifact is written into a marked scratch folder beside ``out`` and swapped in by renames,
  so the target is at every instant the whole old artifact or the whole new one. A failed or
  interrupted (Ctrl-C, SIGTERM) export removes its scratch folder; one left by a killed export
  (SIGKILL, power loss) is removed by the next export to that target.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..artifact import MANIFEST, SAMPLING_NOISE, write_manifest
from ..artifact.fsio import clean_stale, lock_target, remove_temp_dir, replace_dir, temp_dir
from ..text import TEMPLATE_FILE, load_chat_template, special_tokens
from ..errors import UserError
from ..models.exclusion import excluded_ids
from ..models.config import KV_IO, MOE_FORMS
from ..models.registry import get_family
from ..models.sampling import default_pool
from ..profiles.memory import INT8_FP32_DEFAULT
from .graphs import GRAPHS, dynamic_axes, io_names
from .lora import read_adapter
from .moe_quant import quantize_experts
from .smooth import DEFAULT_ALPHA, calibration_texts, input_ranges, smoothing
from .streamed import (WeightSource, fold_weights, loaded, materialized, param_shapes, params_as_inputs,
                       placeholder_module, tensor_bytes)

PRECISIONS = ("fp32", "fp16", "int8", "int4")
# the weight products of the exported graph, by the node names torch gives them (module paths),
# that the int8 variant can keep in fp32 (docs/precision.md: the MLP's down-projection reads the
# widest activations, and keeping it more than halves int8's logit error on the core-vocabulary
# weights (checkpoints/tiny-core))
INT8_PRODUCTS = {"qkv": r"/self_attn/MatMul$", "o_proj": r"/o_proj/MatMul$", "gate_up": r"/mlp/MatMul$",
                 "down_proj": r"/down_proj/MatMul$", "lm_head": r"/lm_head/MatMul$"}
# a mixture-of-experts router's product: never quantized (its weights are few, and a rounded score
# can route a token to other experts)
ROUTER = r"/mlp/gate/MatMul$"
QUANTIZED = ("int8", "int4")          # weight-only: top-1 may differ from fp32; parity reports, never fails
DEFAULT_OPSET = 17
TOPK = 2


def _export_graph(module, args, names: dict, axes: dict, opset: int, path: Path, weight) -> "onnx.ModelProto":
    """Trace ``module`` (placeholder weights, export/streamed.py) into ``path``: the graph with its
    weights read through ``weight(name) -> numpy array`` one tensor at a time and folded into
    ``data`` beside ``path`` (external data), returned without them loaded."""
    import warnings

    import onnx
    import torch

    from ..models.moe import MoE
    contrib = any(isinstance(m, MoE) and m.form == "contrib" for m in module.modules())
    with torch.no_grad(), params_as_inputs(), warnings.catch_warnings():
        # the contrib MoE's torch forward (replaced by its one node in the graph) loops over the
        # experts chosen; the tracer's warnings about it say nothing about the graph, which the
        # parity check runs at four other shapes
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(module, args, str(path), input_names=names["inputs"], output_names=names["outputs"],
                          dynamic_axes={k: v for k, v in axes.items() if k in names["inputs"] + names["outputs"]},
                          opset_version=opset, dynamo=False, export_params=False, do_constant_folding=False,
                          custom_opsets={"com.microsoft": 1} if contrib else None)
    model = onnx.load(str(path))
    fold_weights(model, weight, path.parent)
    onnx.save(model, str(path))
    return model


def _all_tensors(graph):
    """The initializers and the tensors of node attributes (torch stores large Constant values
    as external data too)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def share_weights(models: dict, folder: Path, weights_name: str, min_bytes: int = 1024,
                  bases: dict | None = None) -> int:
    """Store every large initializer of all graphs once, in ``weights_name``; graphs point at it
    (ONNX external data). Identical tensors (by content) are written once. Initializers already
    external are read one at a time from their files under ``bases[graph]`` (default ``folder``),
    so the weights never sit in memory all at once. Returns bytes written."""
    import onnx
    offsets: dict[str, tuple[int, int]] = {}
    with open(folder / weights_name, "wb") as f:
        for name, model in models.items():
            base = (bases or {}).get(name, folder)
            for t in _all_tensors(model.graph):
                raw = tensor_bytes(t, base)
                if len(raw) < min_bytes:
                    if t.data_location == onnx.TensorProto.EXTERNAL:
                        del t.external_data[:]
                        t.data_location = onnx.TensorProto.DEFAULT
                        t.raw_data = raw
                    continue
                key = hashlib.sha256(raw).hexdigest() + str(t.data_type)
                if key not in offsets:
                    pad = (-f.tell()) % 64
                    f.write(b"\0" * pad)
                    offsets[key] = (f.tell(), len(raw))
                    f.write(raw)
                del raw
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
    """Inputs of one call: ids, pos, mask, then the past and the sampling inputs (greedy: parity
    compares the top-K; tests/runtime/test_sampling.py compares sampled choices) in one list."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    pos = torch.arange(p, p + t).repeat(b, 1)
    mask = torch.ones(b, 1, t, p + t, dtype=torch.bool)
    past = [torch.randn(b, hkv, p, d, generator=g).to(dtype)
            for hkv, d in get_family(cfg.layout).kv_shapes(cfg) for _ in ("key", "value")]     # (B,Hkv,P,D) per layer
    sampling = [torch.rand(b, t, generator=g), torch.zeros(b), torch.zeros(b, dtype=torch.int64), torch.ones(b)]
    return ids, pos, mask, past + sampling


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max abs difference; equal entries count 0, so the excluded ids' -inf logits compare equal."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(invalid="ignore"):            # -inf - -inf
        diff = np.abs(a - b)
    return float(np.where(a == b, 0.0, diff).max())


def torch_outputs(module, cfg, shapes, dtype, pool: int, graphs=tuple(GRAPHS)) -> dict:
    """(graph, shape index) -> the torch graph wrapper's outputs (numpy) on the parity inputs."""
    import torch
    out = {}
    for g in graphs:
        wrap = GRAPHS[g]
        graph = wrap(module, TOPK, pool)
        for i, (b, t, p) in enumerate(shapes):
            ids, pos, mask, rest = _dummy(cfg, b, t, p, dtype, seed=i)
            with torch.no_grad():
                ref = graph(ids, pos, mask, *rest)
            out[g, i] = [x.numpy() if x.dtype in (torch.int64, torch.int32) else x.float().numpy() for x in ref]
    return out


def parity(folder: Path, files: dict, refs: dict, cfg, shapes, dtype,
           providers=("CPUExecutionProvider",)) -> dict:
    """Run both graphs in ONNX Runtime on the parity inputs and compare with torch's outputs
    ``refs`` (torch_outputs); report max abs diffs. One session is alive at a time."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    names = io_names(cfg.num_layers)
    worst = {"prefill_logits": 0.0, "prefill_kv": 0.0, "verify_probs": 0.0}
    ids_equal = True
    for g in GRAPHS:
        sess = ort.InferenceSession(str(folder / files[g]), so, providers=list(providers))
        for i, (b, t, p) in enumerate(shapes):
            ids, pos, mask, rest = _dummy(cfg, b, t, p, dtype, seed=i)
            feeds = {"input_ids": ids.numpy(), "position_ids": pos.numpy(), "attention_mask": mask.numpy()}
            feeds.update({n: x.numpy() for n, x in zip(names["prefill"]["inputs"][3:], rest)})
            ref = refs[g, i]
            got = sess.run(None, feeds)
            if g == "prefill":
                worst["prefill_logits"] = max(worst["prefill_logits"], _max_diff(got[0], ref[0]))
                kv = max(float(np.abs(o.astype(np.float32) - x).max()) for o, x in zip(got[3:], ref[3:]))
                worst["prefill_kv"] = max(worst["prefill_kv"], kv)
            else:
                worst["verify_probs"] = max(worst["verify_probs"], float(np.abs(got[1] - ref[1]).max()))
                # top-1 ids must agree (ties among lower ranks may legitimately swap)
                ids_equal &= bool((got[0][..., 0] == ref[0][..., 0]).all())
        del sess
    return {"max_abs_diff": worst, "top1_ids_identical": ids_equal, "shapes": [list(s) for s in shapes]}


def export(model: str = "tiny", out: str | Path = "artifact", precisions=("fp32",), block_length: int | None = None,
           max_beam_width: int = 8, opset: int = DEFAULT_OPSET, force: bool = False, log=print,
           int4_block_size: int = 32, int4_symmetric: bool = True, sample_pool: int | None = None,
           int8_smooth: float = DEFAULT_ALPHA, int8_calibration: str | Path | None = None,
           int8_fp32=INT8_FP32_DEFAULT, int8_per_channel: bool = True, moe_form: str = "contrib",
           chat_template: str | Path | None = None, kv_io: str = "append") -> dict:
    """Export ``model`` (``tiny`` or a Hugging Face folder) into the artifact folder ``out``.
    ``int4_block_size`` / ``int4_symmetric``: the int4 variant's quantization (MatMulNBits blocks
    along each weight's input dimension; symmetric = no zero points). ``int8_smooth``: the int8
    variant's smoothing strength alpha (export/smooth.py; 0: none), calibrated on the lines of
    ``int8_calibration`` (default: task prompts); ``int8_fp32``: the products the int8 variant keeps
    in fp32 (names of ``INT8_PRODUCTS``); ``int8_per_channel``: a weight scale per output channel
    (False: one per tensor, ONNX Runtime's default). ``sample_pool``: the P most probable tokens the
    graphs sample from (default min(vocabulary, 64)). ``moe_form``: how a mixture-of-experts model's
    routed experts are exported, "contrib" (ONNX Runtime's com.microsoft.MoE) or "gather" (standard
    operators; models/moe.py). ``chat_template``: a file with the chat template the artifact carries
    (default: the model folder's, text.py::load_chat_template). ``kv_io``: what prefill's present
    outputs hold, "append" (the past and the new tokens, schema 4) or "new" (the new tokens only;
    the runtime's cache is a buffer written in place, schema 5; export/graphs.py)."""
    import torch

    from ..models.config import DLLMConfig
    from ..models.loading import resolve_model_dir
    from ..models.tokenizer import load_tokenizer

    precisions = list(dict.fromkeys(precisions))
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise UserError(f"unknown precision {bad[0]!r} (expected some of {', '.join(PRECISIONS)})")
    if "fp32" not in precisions:
        precisions.insert(0, "fp32")
    if max_beam_width < 1:
        raise UserError("--max-beam-width must be >= 1")
    if kv_io not in KV_IO:
        raise UserError(f"--kv-io must be one of {', '.join(KV_IO)}, got {kv_io!r}")
    if moe_form not in MOE_FORMS:
        raise UserError(f"--moe-form must be one of {', '.join(MOE_FORMS)}, got {moe_form!r}")
    if int4_block_size < 16 or int4_block_size & (int4_block_size - 1):
        raise UserError(f"--int4-block-size must be a power of two >= 16 (got {int4_block_size})")
    if isinstance(int8_smooth, bool) or not isinstance(int8_smooth, (int, float)) or not 0 <= int8_smooth <= 1:
        raise UserError(f"--int8-smooth must be a number in [0, 1] (0: no smoothing), got {int8_smooth!r}")
    int8_fp32 = list(dict.fromkeys(int8_fp32))
    bad = [x for x in int8_fp32 if x not in INT8_PRODUCTS]
    if bad:
        raise UserError(f"--int8-fp32: unknown product {bad[0]!r} (expected some of {', '.join(INT8_PRODUCTS)}, or none)")
    calibration = None
    if "int8" in precisions and int8_smooth > 0:
        calibration = calibration_texts(int8_calibration)
    elif int8_calibration is not None:
        raise UserError("--int8-calibration needs the int8 precision with --int8-smooth above 0")
    quant = {"int4": {"method": "MatMulNBits", "bits": 4, "block_size": int4_block_size, "symmetric": int4_symmetric,
                      "op_types": ["MatMul"]},
             "int8": {"method": "dynamic", "bits": 8, "symmetric": True, "op_types": ["MatMul"],
                      "per_channel": bool(int8_per_channel), "fp32_products": int8_fp32,
                      "smooth": {"alpha": float(int8_smooth), "calibration": calibration[1],
                                 "texts": len(calibration[0])} if calibration else None}}
    quant = {p: q for p, q in quant.items() if p in precisions}
    given = Path(out)
    out = given.resolve()
    t0 = time.time()
    src = resolve_model_dir(model).resolve()
    from ..models.families import OWN_EXPORT
    if _model_type(src) in OWN_EXPORT:
        if kv_io != "append":
            raise UserError(f"{src}: --kv-io {kv_io} is for the masked families' prefill / verify graphs; "
                            f"{_model_type(src)} has its own graphs")
        return _export_own(OWN_EXPORT[_model_type(src)], src, given, out, precisions, opset, force, log, t0)
    check_target(out, src, force)
    chat = load_chat_template(src, chat_template)
    _make_parent(out)
    with lock_target(out):
        check_target(out, src, force)       # again: another process may have written it meanwhile
        clean_stale(out)
        cfg = DLLMConfig.from_file(src / "config.json")
        family = get_family(cfg.layout)
        # the weights stay in the checkpoint; read one tensor at a time as the export needs them
        module = placeholder_module(family, cfg, torch.float32)
        source = WeightSource(src, family, cfg, param_shapes(module))
        pool = _sample_pool(sample_pool, cfg.vocab_size)
        tok = load_tokenizer(src, cfg.eos_token_id)
        files, parity_report = _swap_in(out, lambda work: _write_artifact(
            work, source, cfg, tok, src, block_length or cfg.block_size, precisions, max_beam_width, opset, log,
            quant, pool, calibration[0] if calibration else None, chat, moe_form, kv_io))
    sizes = {p: sum((out / f).stat().st_size for f in fs.values()) for p, fs in files.items()}
    return {"artifact": str(given), "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
            "sizes_bytes": sizes, "parity": parity_report, "seconds": round(time.time() - t0, 1)}


def _write_artifact(tmp: Path, source: WeightSource, cfg, tok, src: Path, L: int, precisions: list,
                    max_beam_width: int, opset: int, log, quant: dict, pool: int,
                    calibration: list[str] | None = None, chat: str | None = None,
                    moe_form: str = "contrib", kv_io: str = "append") -> tuple[dict, dict]:
    """Every file of the artifact, manifest last, into the empty folder ``tmp``; ``quant``: the
    options of each quantized precision (recorded in the manifest's ``quantization``);
    ``calibration``: the texts the int8 variant's smoothing is calibrated on (None: not smoothed).
    The model is never resident: fp32 / fp16 graphs are traced over placeholder weights and the
    checkpoint's tensors folded in one at a time (export/streamed.py); the torch reference of the
    parity check runs a layer at a time. The quantized variants are made from the fp32 graphs
    (int8 with smoothing: from an fp32 trace of the smoothed weights) and checked against the
    fp32 reference outputs."""
    import onnx
    import torch
    t0 = time.time()
    order = sorted(precisions, key=lambda p: (p != "fp32", p == "int8"))
    names = io_names(cfg.num_layers)
    family = get_family(cfg.layout)
    caps = family.capabilities(cfg)
    if set(caps.graphs) != set(GRAPHS):
        raise UserError(f"family {family.name!r} has graphs of roles {', '.join(caps.graphs)}; this exporter builds "
                        f"{', '.join(GRAPHS)}")
    modules = {}
    adapter = read_adapter(src, family, source.shapes) if caps.attention == "causal" else None
    draft = source.with_deltas(adapter.deltas) if adapter else source    # the verify graph drafts
    if adapter:
        log(f"draft adapter {adapter.folder.name}: r {adapter.r}, scale {adapter.scale:g}, {len(adapter.deltas)} weights "
            "folded into the draft graph only")

    def module_of(dtype):
        if dtype not in modules:
            modules[dtype] = (placeholder_module(family, cfg, dtype).set_attention("eager").set_moe_form(moe_form)
                              .set_kv_io(kv_io))
        return modules[dtype]

    files: dict[str, dict] = {}
    parity_report: dict[str, dict] = {}
    shapes = [(1, 24, 0), (2, L, 24), (1, 2 * L, 40), (1, max_beam_width * L, 48)]
    refs32 = None
    for prec in order:
        log(f"export {prec} ...")
        sub = tmp if prec == "fp32" else tmp / prec
        sub.mkdir(exist_ok=True)
        rel = "" if prec == "fp32" else f"{prec}/"
        trace = tmp.parent / "trace"
        bases: dict = {}
        dtype = torch.float16 if prec == "fp16" else torch.float32
        if prec == "int4":
            graphs, bases = _int4_variant(tmp, quant["int4"], trace)
        elif prec == "int8" and calibration:
            log(f"smooth int8 (alpha {quant['int8']['smooth']['alpha']}, {len(calibration)} calibration texts) ...")
            module = module_of(dtype)
            with materialized(module, source):
                ranges = input_ranges(module, cfg, tok, calibration, L)
            ops, _ = smoothing(module, cfg, ranges, quant["int8"]["smooth"]["alpha"],
                               real=lambda unit: loaded(module, source, unit))
            _trace_graphs(module, cfg, L, dtype, opset, trace, pool, source.scaled(ops), draft.scaled(ops), kv_io)
            graphs = _int8_variant({g: trace / g for g in GRAPHS}, sub, quant["int8"])
        elif prec == "int8":
            graphs = _int8_variant({g: tmp for g in GRAPHS}, sub, quant["int8"])
        else:
            graphs, bases = _trace_graphs(module_of(dtype), cfg, L, dtype, opset, trace, pool, source, draft, kv_io)
        share_weights(graphs, sub, "weights.bin", bases=bases)
        shutil.rmtree(trace, ignore_errors=True)
        for g, m in graphs.items():
            onnx.save(m, str(sub / f"{g}.onnx"))
        files[prec] = {**{g: f"{rel}{g}.onnx" for g in GRAPHS}, "weights": f"{rel}weights.bin"}
        if prec not in QUANTIZED:
            module = module_of(dtype)
            refs = {}
            for g in GRAPHS:
                with materialized(module, draft if g == "verify" else source):
                    refs.update(torch_outputs(module, cfg, shapes, dtype, pool, graphs=(g,)))
            refs32 = refs if prec == "fp32" else refs32
        log(f"parity {prec} ...")
        try:
            parity_report[prec] = parity(tmp, files[prec], refs if prec not in QUANTIZED else refs32, cfg, shapes, dtype)
            if prec in QUANTIZED:
                parity_report[prec]["note"] = "quantized: compared with fp32 torch, top-1 may differ"
        except Exception as e:  # fp16 kernels may be missing on the CPU execution provider
            if prec == "fp32":
                raise
            parity_report[prec] = {"skipped": f"ONNX Runtime CPU could not run it here: {type(e).__name__}"}
    if tok.kind == "hf":
        tok.write_files(src, tmp)
    if chat is not None:
        (tmp / TEMPLATE_FILE).write_text(chat, encoding="utf-8")
    manifest = {
        "exporter_version": __version__, "torch_version": torch.__version__, "onnx_opset": opset,
        "model": cfg.to_dict(), "source": str(src),
        "tokenizer": tok.to_manifest(),
        "special_ids": {"mask": cfg.mask_token_id, "eos": cfg.eos_token_id, "pad": cfg.pad_token_id,
                            "excluded": list(excluded_ids(cfg))},
        "block_length": L, "max_beam_width": max_beam_width, "topk": TOPK,
        "family": family.name, "capabilities": caps.to_dict(), "cache_mode": caps.cache["auto"],
        "kv_shapes": [list(s) for s in family.kv_shapes(cfg)], "kv_io": kv_io,
        "graphs": {g: {**names[g], "dims": {"input_ids": ["batch", "tokens"], "position_ids": ["batch", "tokens"],
                                            "attention_mask": ["batch", 1, "tokens", "kv_len"],
                                            "past": ["batch", "kv_shapes[layer][0]", "past", "kv_shapes[layer][1]"],
                                            "sample_u": ["batch", "tokens"], "temperature": ["batch"],
                                            "top_k": ["batch"], "top_p": ["batch"],
                                            "top": ["batch", "tokens", TOPK],
                                            **({"present": ["batch", "kv_shapes[layer][0]",
                                                            "past + tokens" if kv_io == "append" else "tokens",
                                                            "kv_shapes[layer][1]"]} if g == "prefill" else {})}}
                   for g in names},
        "sampling": {"pool": pool, "noise": SAMPLING_NOISE},
        **({"experts": expert_record(cfg, moe_form, files)} if cfg.num_experts else {}),
        **({"draft_adapter": adapter.record()} if adapter else {}),
        **({"chat": {"template": TEMPLATE_FILE, **special_tokens(src)}} if chat is not None else {}),
        "precisions": files, "quantization": quant, "parity": parity_report,
        "created_s": round(time.time() - t0, 1),
    }
    fp32 = parity_report["fp32"]
    if fp32["max_abs_diff"]["prefill_logits"] > 1e-3 or not fp32["top1_ids_identical"]:
        raise UserError(f"parity check failed: {json.dumps(fp32)}")
    write_manifest(tmp, manifest)
    return files, parity_report


def expert_record(cfg, form: str, files: dict) -> dict:
    """The manifest's ``experts``: the routing, and per precision the form the routed experts run in
    (docs/moe.md): "contrib" (com.microsoft.MoE) or "gather" (standard operators)."""
    return {"num_experts": cfg.num_experts, "experts_per_token": cfg.experts_per_token, "router": cfg.router,
            "form": {p: form for p in files}}


def _trace_graphs(module, cfg, L: int, dtype, opset: int, trace: Path, pool: int,
                 source: WeightSource, draft: WeightSource | None = None, kv_io: str = "append") -> tuple[dict, dict]:
    """Both graphs of ``module`` (placeholder weights of ``dtype``) traced into their own
    sub-folders of ``trace``, each with the weights of ``source`` folded into its ``data`` file
    (``draft``: the verify graph's, when they differ: a draft-only adapter); returns the graphs
    (weights not loaded) and those folders."""
    names, axes = io_names(cfg.num_layers), dynamic_axes(cfg.num_layers, kv_io)
    ids, pos, mask, rest = _dummy(cfg, 1, L, 4, dtype)
    graphs, bases = {}, {}
    for g, wrap in GRAPHS.items():
        bases[g] = trace / g
        bases[g].mkdir(parents=True)
        src = draft if g == "verify" and draft is not None else source
        graphs[g] = _export_graph(wrap(module, TOPK, pool), (ids, pos, mask, *rest), names[g], axes, opset,
                                  bases[g] / f"{g}.onnx", lambda n, src=src: src.get(n, dtype).numpy())
    return graphs, bases


def _swap_in(out: Path, write):
    """``write(folder)`` into a scratch folder beside ``out``, then swapped in by renames (under the
    caller's lock); the scratch folder is removed whatever happens. Returns what ``write`` returns."""
    try:
        scratch = temp_dir(out)
    except OSError as e:
        raise UserError(f"{out}: cannot write in {out.parent} ({e.strerror})") from None
    try:
        work = scratch / "artifact"
        work.mkdir()
        result = write(work)
        replace_dir(work, out, scratch)
    except OSError as e:
        raise UserError(f"{out}: cannot write the artifact: {e.filename or out}: {e.strerror}") from None
    finally:
        remove_temp_dir(scratch)
    return result


def _model_type(src: Path) -> str:
    """config.json's model_type, lower case ("" when unreadable: the loader reports it)."""
    try:
        raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(raw.get("model_type", "")).lower() if isinstance(raw, dict) else ""


def _export_own(writer: str, src: Path, given: Path, out: Path, precisions: list, opset: int, force: bool, log,
                t0: float) -> dict:
    """An artifact written by a family's own ``writer`` ("module:function", models/families
    OWN_EXPORT; DiffusionGemma's export/diffusion_gemma.py) at ``out``, with the target handling of
    every export (checked, locked, written aside and swapped in)."""
    import importlib
    mod, _, fn = writer.partition(":")
    write_artifact = getattr(importlib.import_module(mod), fn)
    if precisions != ["fp32"]:
        raise UserError(f"DiffusionGemma exports fp32 only so far (asked for {', '.join(precisions)})")
    check_target(out, src, force)
    _make_parent(out)
    with lock_target(out):
        check_target(out, src, force)
        clean_stale(out)
        manifest = _swap_in(out, lambda work: write_artifact(work, src, opset, log))
    files = manifest["precisions"]["fp32"]
    return {"artifact": str(given), "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
            "sizes_bytes": {"fp32": sum((out / f).stat().st_size for f in files.values())},
            "parity": {"fp32": {"graphs": manifest["parity"]}}, "seconds": round(time.time() - t0, 1)}


def _sample_pool(pool: int | None, vocab_size: int) -> int:
    """The sampling pool P: the given one (TOPK <= P <= the vocabulary), else min(vocabulary, 64)."""
    if pool is None:
        return default_pool(vocab_size)
    if isinstance(pool, bool) or not isinstance(pool, int) or not TOPK <= pool <= vocab_size:
        raise UserError(f"--sample-pool must be an integer in [{TOPK}, {vocab_size}] (the model's vocabulary), got {pool}")
    return pool


def _is_artifact(folder: Path) -> bool:
    """Whether ``folder`` holds a manifest this tool wrote (schema_version, or a family's format
    such as DiffusionGemma's, and exporter_version)."""
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and ("schema_version" in m or "format" in m) and "exporter_version" in m


def check_target(out: Path, src: Path, force: bool) -> None:
    """Refuse an ``out`` (resolved) that export must not write or replace; reads only, so a
    refusal leaves everything as it was. An existing empty folder is used as is."""
    if out == Path(out.anchor):
        raise UserError(f"{out}: refusing to replace the root folder")
    if Path.cwd().resolve().is_relative_to(out):
        raise UserError(f"{out}: refusing to replace the current folder or one of its parents")
    if src.is_relative_to(out):
        what = "the source model's folder" if src == out else f"a folder holding the source model {src}"
        raise UserError(f"{out}: refusing to replace {what}")
    try:
        if not os.path.lexists(out):
            return
        if not out.is_dir():
            raise UserError(f"{out}: exists and is not a folder (export writes an artifact folder; choose another --out)")
        if not any(out.iterdir()):
            return
    except OSError as e:
        raise UserError(f"{out}: cannot read it ({e.strerror})") from None
    if not force:
        raise UserError(f"{out}: already exists (pass --force to replace an artifact written by dllm-deploy export)")
    if not _is_artifact(out):
        raise UserError(f"{out}: not an artifact written by dllm-deploy export (no manifest.json of ours); "
                        "--force replaces only those, so move or delete it yourself")


def _make_parent(out: Path) -> None:
    """Create the folders above ``out``; a one-line error naming the path when that is impossible."""
    blocker = next((p for p in out.parents if os.path.lexists(p) and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"{out}: {blocker} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create {e.filename or out.parent} ({e.strerror})") from None


def _int4_variant(fp32_dir: Path, opts: dict, spill: Path) -> tuple[dict, dict]:
    """Weight-only int4 (ONNX Runtime's MatMulNBits, the format of ONNX Runtime GenAI's LLMs) of
    the fp32 graphs: every MatMul with a constant weight, in blocks of ``opts['block_size']``
    input rows, one fp32 scale (and, asymmetric, one 4-bit zero point) per block. One graph at a
    time: each is written with its weights beside it under ``spill`` before the next is loaded.
    Returns (graphs without their weights loaded, their folders) for share_weights."""
    import onnx
    graphs, bases = {}, {}
    with _quiet_root_logger():
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        for g in GRAPHS:
            # the weights stay in their file: the quantizer reads each one as it quantizes it
            model = onnx.load(str(fp32_dir / f"{g}.onnx"), load_external_data=False)
            _absolute_locations(model, fp32_dir)
            q = MatMulNBitsQuantizer(model, bits=4, block_size=opts["block_size"], is_symmetric=opts["symmetric"],
                                     op_types_to_quantize=tuple(opts["op_types"]),
                                     nodes_to_exclude=_matmuls(model.graph, [ROUTER]))
            q.process()
            quantize_experts(q.model.model, 4, opts["block_size"])
            bases[g] = spill / g
            bases[g].mkdir(parents=True)
            onnx.save_model(q.model.model, str(bases[g] / f"{g}.onnx"), save_as_external_data=True,
                            all_tensors_to_one_file=True, location="data", size_threshold=1024)
            del q, model
            graphs[g] = onnx.load(str(bases[g] / f"{g}.onnx"), load_external_data=False)
    return graphs, bases


def _absolute_locations(model, base: Path) -> None:
    """Point every external tensor of ``model`` at its file by absolute path (its location is
    relative to ``base``), so a tool reading tensors one at a time (ONNX Runtime's quantizers,
    share_weights) finds them wherever the graph is saved."""
    import onnx
    for t in _all_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    e.value = str((base / e.value).resolve())


@contextlib.contextmanager
def _quiet_root_logger():
    """ONNX Runtime's quantizers log through the root logger: advice to pre-process, one line per
    tensor, and ``matmul_nbits_quantizer`` calls ``logging.basicConfig(level=INFO)`` on import.
    Errors only while they run; the caller's root level and handlers as they were afterwards."""
    import logging
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)


def int8_kept(graph, products) -> list[str]:
    """The MatMul nodes of ``graph`` (onnx GraphProto) that compute one of ``products`` (names of
    INT8_PRODUCTS) or a router, which the int8 variant leaves in fp32."""
    return _matmuls(graph, [INT8_PRODUCTS[p] for p in products] + [ROUTER])


def _matmuls(graph, patterns: list[str]) -> list[str]:
    """The MatMul nodes of ``graph`` whose names match one of ``patterns``."""
    pats = [re.compile(p) for p in patterns]
    return [n.name for n in graph.node if n.op_type == "MatMul" and any(p.search(n.name) for p in pats)]


def _int8_variant(fp32_dirs: dict, sub: Path, opts: dict) -> dict:
    """Dynamic int8 quantization of the fp32 graphs in ``fp32_dirs[graph]`` (the artifact's, or
    the smoothed module's trace), for CPU / edge: MatMul weights int8 (``opts['per_channel']``: a
    scale per output channel), activations quantized per call; the products named in
    ``opts['fp32_products']`` stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    graphs = {}
    for g in GRAPHS:
        dst = sub / f"{g}.q.onnx"
        src = fp32_dirs[g] / f"{g}.onnx"
        kept = int8_kept(onnx.load(str(src), load_external_data=False).graph, opts["fp32_products"])
        with _quiet_root_logger():
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=opts["per_channel"],
                             nodes_to_exclude=kept,
                             op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})
        graphs[g] = onnx.load(str(dst))
        quantize_experts(graphs[g], 8, None)
        dst.unlink()
        for leftover in sub.glob("*.data"):
            leftover.unlink()
    return graphs
