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

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..artifact import SAMPLING_NOISE, write_manifest
from ..artifact.fsio import clean_stale, lock_target
from ..text import TEMPLATE_FILE, load_chat_template, special_tokens
from ..errors import UserError
from ..models.exclusion import excluded_ids
from ..models.config import KV_IO, MOE_FORMS
from ..models.registry import get_family
from ..models.sampling import default_pool
from ..profiles.memory import INT4_BLOCK, INT8_FP32_DEFAULT
from .graphs import GRAPHS, dynamic_axes, io_names
from .lora import read_adapter
from .quantize import INT8_PRODUCTS, all_tensors, int4_variant, int8_variant
from .smooth import DEFAULT_ALPHA, calibration_texts, input_ranges, smoothing
from .streamed import (WeightSource, fold_weights, loaded, materialized, param_shapes, params_as_inputs,
                       placeholder_module, tensor_bytes)
from .target import check_target, make_parent, swap_in

PRECISIONS = ("fp32", "fp16", "int8", "int4")
INT4_ACCURACY_LEVELS = (0, 1, 2, 3, 4)   # MatMulNBits: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 products
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
            for t in all_tensors(model.graph):
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
    compares the top-K; tests/integration/runtime/test_sampling.py compares sampled choices) in one list."""
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


def parity_session_options():
    """ONNX Runtime options of the export's parity sessions: quiet, idle threads sleeping (a
    spinning pool takes the cores from the torch references run beside it)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def parity(folder: Path, files: dict, refs: dict, cfg, shapes, dtype,
           providers=("CPUExecutionProvider",)) -> dict:
    """Run both graphs in ONNX Runtime on the parity inputs and compare with torch's outputs
    ``refs`` (torch_outputs); report max abs diffs. One session is alive at a time."""
    import onnxruntime as ort
    so = parity_session_options()
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


def _refuse_options_of_variants_not_asked(precisions: list[str], given: dict[str, dict[str, bool]]) -> None:
    """A UserError naming the first option set away from its default for a variant ``precisions``
    does not ask for (``given``: variant -> option -> set), which would otherwise be ignored."""
    for variant, options in given.items():
        if variant in precisions:
            continue
        for option, changed in options.items():
            if changed:
                raise UserError(f"{option} applies to the {variant} variant, which --precision "
                                f"{','.join(precisions)} does not ask for: add {variant} to --precision or leave "
                                f"the option out")


def export(model: str = "tiny", out: str | Path = "artifact", precisions=("fp32",), block_length: int | None = None,
           max_beam_width: int = 8, opset: int = DEFAULT_OPSET, force: bool = False, log=print,
           int4_block_size: int = INT4_BLOCK, int4_symmetric: bool = True, int4_accuracy_level: int = 0,
           sample_pool: int | None = None,
           int8_smooth: float = DEFAULT_ALPHA, int8_calibration: str | Path | None = None,
           int8_fp32=INT8_FP32_DEFAULT, int8_per_channel: bool = True, int8_reduce_range: bool = False,
           moe_form: str = "contrib",
           chat_template: str | Path | None = None, kv_io: str = "append") -> dict:
    """Export ``model`` (``tiny`` or a Hugging Face folder) into the artifact folder ``out``.
    ``int4_block_size`` / ``int4_symmetric``: the int4 variant's quantization (MatMulNBits blocks
    along each weight's input dimension; symmetric = no zero points); ``int4_accuracy_level``:
    MatMulNBits' accuracy_level (0: fp32 products; 4: int8 activations, the fast kernels of CPUs;
    docs/precision.md). ``int8_smooth``: the int8
    variant's smoothing strength alpha (export/smooth.py; 0: none), calibrated on the lines of
    ``int8_calibration`` (default: task prompts); ``int8_fp32``: the products the int8 variant keeps
    in fp32 (names of ``INT8_PRODUCTS``); ``int8_per_channel``: a weight scale per output channel
    (False: one per tensor, ONNX Runtime's default); ``int8_reduce_range``: 7-bit weights, whose
    byte-pair sums cannot saturate the 16-bit lanes of x86 CPUs without VNNI (docs/precision.md).
    ``sample_pool``: the P most probable tokens the
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
    if isinstance(int4_accuracy_level, bool) or int4_accuracy_level not in INT4_ACCURACY_LEVELS:
        raise UserError(f"--int4-accuracy-level must be one of {', '.join(map(str, INT4_ACCURACY_LEVELS))} "
                        f"(got {int4_accuracy_level!r})")
    if isinstance(int8_smooth, bool) or not isinstance(int8_smooth, (int, float)) or not 0 <= int8_smooth <= 1:
        raise UserError(f"--int8-smooth must be a number in [0, 1] (0: no smoothing), got {int8_smooth!r}")
    int8_fp32 = list(dict.fromkeys(int8_fp32))
    bad = [x for x in int8_fp32 if x not in INT8_PRODUCTS]
    if bad:
        raise UserError(f"--int8-fp32: unknown product {bad[0]!r} (expected some of {', '.join(INT8_PRODUCTS)}, or none)")
    _refuse_options_of_variants_not_asked(precisions, {
        "int8": {"--int8-reduce-range": bool(int8_reduce_range), "--int8-smooth": int8_smooth != DEFAULT_ALPHA,
                 "--int8-fp32": tuple(int8_fp32) != tuple(INT8_FP32_DEFAULT), "int8_per_channel": not int8_per_channel},
        "int4": {"--int4-block-size": int4_block_size != INT4_BLOCK, "--int4-asymmetric": not int4_symmetric,
                 "--int4-accuracy-level": int4_accuracy_level != 0}})
    calibration = None
    if "int8" in precisions and int8_smooth > 0:
        calibration = calibration_texts(int8_calibration)
    elif int8_calibration is not None:
        raise UserError("--int8-calibration needs the int8 precision with --int8-smooth above 0")
    quant = {"int4": {"method": "MatMulNBits", "bits": 4, "block_size": int4_block_size, "symmetric": int4_symmetric,
                      "accuracy_level": int4_accuracy_level,
                      "op_types": ["MatMul"]},
             "int8": {"method": "dynamic", "bits": 8, "symmetric": True, "op_types": ["MatMul"],
                      "per_channel": bool(int8_per_channel), "reduce_range": bool(int8_reduce_range),
                      "fp32_products": int8_fp32,
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
    make_parent(out)
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
        files, parity_report = swap_in(out, lambda work: _write_artifact(
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
            graphs, bases = int4_variant(tmp, quant["int4"], trace)
        elif prec == "int8" and calibration:
            log(f"smooth int8 (alpha {quant['int8']['smooth']['alpha']}, {len(calibration)} calibration texts) ...")
            module = module_of(dtype)
            with materialized(module, source):
                ranges = input_ranges(module, cfg, tok, calibration, L)
            ops, _ = smoothing(module, cfg, ranges, quant["int8"]["smooth"]["alpha"],
                               real=lambda unit: loaded(module, source, unit))
            _trace_graphs(module, cfg, L, dtype, opset, trace, pool, source.scaled(ops), draft.scaled(ops), kv_io)
            graphs = int8_variant({g: trace / g for g in GRAPHS}, sub, quant["int8"])
        elif prec == "int8":
            graphs = int8_variant({g: tmp for g in GRAPHS}, sub, quant["int8"])
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
    make_parent(out)
    with lock_target(out):
        check_target(out, src, force)
        clean_stale(out)
        manifest = swap_in(out, lambda work: write_artifact(work, src, opset, log))
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
