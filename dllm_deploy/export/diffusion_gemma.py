"""DiffusionGemma's two graphs (docs/diffusion_gemma.md), exported the streamed way (export/streamed.py):

    encode:  input_ids (B,T), position_ids (B,T), mask_full (B,1,T,Pf+T), mask_sliding (B,1,T,Ps+T) bool,
             past_key_values.{i}.key/.value (B,Hkv_i,P_i,D_i)
          -> present.{i}.key/.value: full layers P + T keys, sliding layers the last W - 1
    denoise: canvas_ids (B,T), position_ids (B,T), mask_full, mask_sliding, soft (B,T,C),
             temperature (B,), sample_u (B,T), past_key_values.{i}.key/.value
          -> argmax (B,T) int64, sampled (B,T) int64, entropy (B,T) fp32, soft_next (B,T,C)

The logits never leave ``denoise``: it returns what the decode rule reads
(runtime/uniform_diffusion.py) and the next step's self-conditioning input, softmax(z) · E · √C,
so no (B, T, V) tensor crosses to the host. The routed experts run gathered per expert in
standard operators (ONNX Runtime's MoE operator has no GeGLU on the CPU provider).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from ..errors import UserError

FORMAT = "diffusion_gemma/1"
# read outside their own forward: the embedding (also the head and the soft embeddings' matrix) and
# the encoder's layer scalars
RESIDENT = ("model.decoder.embed_tokens", "model.encoder")
GRAPHS = ("encode", "denoise")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")


def io_names(num_layers: int) -> dict:
    past = [n for i in range(num_layers) for n in (f"past_key_values.{i}.key", f"past_key_values.{i}.value")]
    present = [n for i in range(num_layers) for n in (f"present.{i}.key", f"present.{i}.value")]
    masks = ["mask_full", "mask_sliding"]
    return {"encode": {"inputs": ["input_ids", "position_ids", *masks, *past], "outputs": present},
            "denoise": {"inputs": ["canvas_ids", "position_ids", *masks, "soft", "temperature", "sample_u", *past],
                        "outputs": ["argmax", "sampled", "entropy", "soft_next"]}}


def dynamic_axes(num_layers: int) -> dict:
    bt = {0: "batch", 1: "tokens"}
    ax = {"input_ids": bt, "canvas_ids": bt, "position_ids": bt, "sample_u": bt, "argmax": bt, "sampled": bt,
          "entropy": bt, "soft": bt, "soft_next": bt, "temperature": {0: "batch"},
          "mask_full": {0: "batch", 2: "tokens", 3: "full_len"}, "mask_sliding": {0: "batch", 2: "tokens", 3: "sliding_len"}}
    for i in range(num_layers):
        for kind in ("key", "value"):
            ax[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: f"past_{i}"}
            ax[f"present.{i}.{kind}"] = {0: "batch", 2: f"present_{i}"}
    return ax


def _wrappers():
    import torch
    from torch import nn

    from ..models.diffusion_gemma import FULL, SLIDING
    from ..models.diffusion_gemma_decode import step_outputs

    def pairs(flat):
        return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]

    class EncodeGraph(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position_ids, mask_full, mask_sliding, *past):
            present = self.model.encode(input_ids, position_ids, {FULL: mask_full, SLIDING: mask_sliding}, pairs(past))
            return tuple(t for kv in present for t in kv)

    class DenoiseGraph(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, canvas_ids, position_ids, mask_full, mask_sliding, soft, temperature, sample_u, *past):
            logits = self.model.denoise(canvas_ids, position_ids, {FULL: mask_full, SLIDING: mask_sliding},
                                        pairs(past), soft)
            argmax, sampled, entropy, z = step_outputs(logits, temperature, sample_u)
            return argmax, sampled, entropy, self.model.soft_embeddings(z.to(soft.dtype))

    del torch
    return {"encode": EncodeGraph, "denoise": DenoiseGraph}


class _Names:
    """The checkpoint's names are the module's (a family-like shim for WeightSource)."""
    name = "diffusion_gemma"

    @staticmethod
    def to_ours(name: str) -> str:
        return name

    @staticmethod
    def build(cfg):
        from ..models.diffusion_gemma import DiffusionGemma
        return DiffusionGemma(cfg)


def dummy_inputs(cfg, role: str, b: int, t: int, p: int, seed: int = 0):
    """Inputs of one call of ``role`` (torch tensors, in io_names order): ``t`` tokens after ``p``
    cached ones (sliding layers hold min(p, W - 1)), the first row left-padded by 2."""
    import torch

    from ..models.diffusion_gemma import FULL, SLIDING, decoder_masks, encoder_masks
    g = torch.Generator().manual_seed(seed)
    w = cfg.sliding_window
    ps = min(p, w - 1)
    past = []
    for (hkv, d), kind in zip(cfg.kv_shapes(), cfg.layer_types):
        n = ps if kind == SLIDING else p
        past += [torch.randn(b, hkv, n, d, generator=g) for _ in (0, 1)]
    pos = torch.arange(p, p + t).repeat(b, 1)
    if role == "encode":
        keep = torch.ones(b, p + t, dtype=torch.bool)
        keep[0, :2] = False
        m = encoder_masks(keep, p, t, w)
        return [torch.randint(0, cfg.vocab_size, (b, t), generator=g), pos, m[FULL], m[SLIDING], *past]
    keep = torch.ones(b, p, dtype=torch.bool)
    keep[0, :min(2, p)] = False
    m = decoder_masks(keep, p, t, w)
    soft = torch.randn(b, t, cfg.hidden_size, generator=g)
    return [torch.randint(0, cfg.vocab_size, (b, t), generator=g), pos, m[FULL], m[SLIDING], soft,
            torch.full((b,), 0.6), torch.rand(b, t, generator=g), *past]


def export_diffusion_gemma(model: str | Path, out: str | Path, opset: int = 17, log=print) -> dict:
    """Export a DiffusionGemma checkpoint folder into a new artifact folder ``out`` (which must not
    exist; ``dllm-deploy export`` goes through exporter.export, which handles targets, locks and
    replacement). Returns the manifest."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists")
    work = out.parent / f".{out.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        manifest = write_artifact(work, Path(model), opset, log)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def write_artifact(work: Path, src: Path, opset: int = 17, log=print) -> dict:
    """Every file of a DiffusionGemma artifact (fp32), manifest last, into the empty folder
    ``work``: the two graphs over one ``weights.bin``, the tokenizer files the checkpoint has, and a
    parity check of each graph (ONNX Runtime against the torch module, run a layer at a time) at
    three shapes. Returns the manifest."""
    import onnx
    import torch

    from .exporter import __version__      # (the package version, as exporter imports it)
    from ..models.diffusion_gemma import DiffusionGemmaConfig, generation_defaults
    from .exporter import _export_graph, share_weights
    from .streamed import WeightSource, param_shapes, placeholder_module
    t0 = time.time()
    cfg = DiffusionGemmaConfig.from_file(src / "config.json")
    module = placeholder_module(_Names, cfg, torch.float32)
    source = WeightSource(src, _Names, cfg, param_shapes(module))
    names, axes = io_names(cfg.num_layers), dynamic_axes(cfg.num_layers)
    trace = work / ".trace"
    graphs, bases = {}, {}
    for role, wrap in _wrappers().items():
        log(f"export {role} ...")
        bases[role] = trace / role
        bases[role].mkdir(parents=True)
        graphs[role] = _export_graph(wrap(module), tuple(dummy_inputs(cfg, role, 2, 4, 6)), names[role], axes, opset,
                                     bases[role] / f"{role}.onnx", lambda n: source.get(n).numpy())
    share_weights(graphs, work, "weights.bin", bases=bases)
    shutil.rmtree(trace)
    for role, g in graphs.items():
        onnx.save(g, str(work / f"{role}.onnx"))
    tokenizer = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    for f in tokenizer:
        shutil.copyfile(src / f, work / f)
    log("parity ...")
    report = parity(work, module, source, cfg)
    manifest = {"format": FORMAT, "exporter_version": __version__, "family": "diffusion_gemma", "model": cfg.to_dict(),
                "source": str(src), "graphs": {r: {**names[r], "file": f"{r}.onnx"} for r in GRAPHS},
                "weights": "weights.bin", "tokenizer_files": tokenizer, "decoding": generation_defaults(src, cfg),
                "precisions": {"fp32": {**{r: f"{r}.onnx" for r in GRAPHS}, "weights": "weights.bin"}},
                "parity": report, "torch_version": torch.__version__, "onnx_opset": opset,
                "created_s": round(time.time() - t0, 1)}
    if max(report.values()) > 1e-3:
        raise UserError(f"parity check failed: {json.dumps(report)}")
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def parity(folder: Path, module, source, cfg) -> dict:
    """Max abs difference between ONNX Runtime and torch for each graph's float outputs (the id
    outputs must be equal), at three shapes (a prompt, a later canvas, a long prefix)."""
    import onnxruntime as ort
    import torch

    from .exporter import parity_session_options
    from .streamed import materialized
    names = io_names(cfg.num_layers)
    worst = {r: 0.0 for r in GRAPHS}
    so = parity_session_options()
    wrappers = _wrappers()
    for role in GRAPHS:
        sess = ort.InferenceSession(str(folder / f"{role}.onnx"), so, providers=["CPUExecutionProvider"])
        for i, (b, t, p) in enumerate([(2, 5, 0), (1, 8, 6), (2, 3, 2 * cfg.sliding_window)]):
            args = dummy_inputs(cfg, role, b, t, p, seed=i)
            with torch.no_grad(), materialized(module, source, resident=RESIDENT):
                ref = wrappers[role](module)(*args)
            got = sess.run(None, {n: a.numpy() for n, a in zip(names[role]["inputs"], args)})
            for r, g in zip(ref, got):
                r = r.numpy()
                if r.dtype == np.int64:
                    if role == "denoise" and not np.array_equal(r, g):
                        worst[role] = max(worst[role], float("inf"))
                else:
                    worst[role] = max(worst[role], float(np.abs(r - g).max()))
        del sess
    return worst
