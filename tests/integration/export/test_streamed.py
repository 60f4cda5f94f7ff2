"""The streamed export (export/streamed.py): graphs traced over placeholder weights, the real
weights folded in from the checkpoint one tensor at a time, the torch reference run one unit at
a time. What it must keep: the same graphs as torch's own constant folding over the loaded
module, and never the whole model in memory."""
from __future__ import annotations

import json
import weakref

import numpy as np
import pytest

from tests.conftest import LAYOUT_CONFIGS, MOE_CONFIGS, write_random_checkpoint

CASES = {"llada": (LAYOUT_CONFIGS["llada"], "gather"),
         "dream-tied": ({**LAYOUT_CONFIGS["dream"], "tie_word_embeddings": True}, "gather"),
         "block_causal": (LAYOUT_CONFIGS["block_causal"], "gather"),
         "sdar_moe-contrib": (MOE_CONFIGS["sdar_moe"], "contrib"),
         "llada2-gather": (MOE_CONFIGS["llada2"], "gather")}


def _feeds(cfg, dtype, b=2, t=8, p=4):
    from dllm_deploy.export.graphs import io_names
    from dllm_deploy.models.registry import get_family
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (b, t)), "position_ids": np.tile(np.arange(p, p + t), (b, 1)),
             "attention_mask": np.ones((b, 1, t, p + t), bool)}
    past = io_names(cfg.num_layers)["prefill"]["inputs"][3:3 + 2 * cfg.num_layers]
    shapes = [s for s in get_family(cfg.layout).kv_shapes(cfg) for _ in (0, 1)]
    feeds.update({n: rng.standard_normal((b, hkv, p, d)).astype(dtype) for n, (hkv, d) in zip(past, shapes)})
    feeds.update(sample_u=rng.random((b, t)).astype(np.float32), temperature=np.zeros(b, np.float32),
                 top_k=np.zeros(b, np.int64), top_p=np.ones(b, np.float32))
    return feeds


@pytest.mark.parametrize("case,precision", [(c, "fp32") for c in CASES] + [("dream-tied", "fp16"), ("sdar_moe-contrib", "fp16")])
def test_folded_graphs_compute_what_torchs_constant_folding_gives(tmp_path, case, precision):
    """The prefill graph traced over placeholders with the checkpoint folded in, and the one torch
    exports from the loaded module with its own constant folding: ONNX Runtime's outputs are
    bit-identical (fused q|k|v with the attention scale, gate|up, stacked experts, tied head, fp16)."""
    import onnx
    import onnxruntime as ort
    import torch

    from dllm_deploy.export.exporter import TOPK, _dummy, _trace_graphs
    from dllm_deploy.export.graphs import GRAPHS, dynamic_axes, io_names
    from dllm_deploy.export.streamed import WeightSource, param_shapes, placeholder_module
    from dllm_deploy.models.loading import load_model
    from dllm_deploy.models.registry import get_family
    raw, form = CASES[case]
    ckpt = write_random_checkpoint(tmp_path / "ckpt", raw)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    module, cfg = load_model(ckpt, dtype=dtype, attention="eager")
    module.set_moe_form(form)
    names, axes = io_names(cfg.num_layers), dynamic_axes(cfg.num_layers)
    ids, pos, mask, rest = _dummy(cfg, 1, 8, 4, dtype)
    ref = tmp_path / "torch.onnx"
    with torch.no_grad():
        torch.onnx.export(GRAPHS["prefill"](module, TOPK, 16), (ids, pos, mask, *rest), str(ref),
                          input_names=names["prefill"]["inputs"], output_names=names["prefill"]["outputs"],
                          dynamic_axes=axes, opset_version=17, dynamo=False, custom_opsets={"com.microsoft": 1})
    family = get_family(cfg.layout)
    placeholders = placeholder_module(family, cfg, dtype).set_attention("eager").set_moe_form(form)
    assert sum(p.untyped_storage().nbytes() for p in placeholders.parameters()) < 4096     # no weights held
    source = WeightSource(ckpt, family, cfg, param_shapes(placeholders))
    graphs, bases = _trace_graphs(placeholders, cfg, 8, dtype, 17, tmp_path / "trace", 16, source)
    g = graphs["prefill"].graph
    assert not [i.name for i in g.input if i.name.startswith("model.")]       # every weight folded in
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in g.initializer if np.prod(t.dims) * 2 >= 1024)
    feeds = _feeds(cfg, np.float16 if precision == "fp16" else np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    got = ort.InferenceSession(str(bases["prefill"] / "prefill.onnx"), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(str(ref), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_the_export_holds_one_layer_of_weights_at_a_time(tmp_path, monkeypatch):
    """Every weight tensor the export reads is tracked while it is alive: the most alive at once
    is about one layer's (a mixture layer's experts are stacked together), never the model."""
    from dllm_deploy.export import streamed
    from dllm_deploy.export.exporter import export
    raw = {**MOE_CONFIGS["llada2"], "num_hidden_layers": 8}
    ckpt = write_random_checkpoint(tmp_path / "ckpt", raw)
    total = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    live = {"now": 0, "peak": 0}
    get = streamed.WeightSource.get

    def tracked(self, name, dtype=None):
        t = get(self, name, dtype)
        n = t.untyped_storage().nbytes()
        live["now"] += n
        live["peak"] = max(live["peak"], live["now"])
        weakref.finalize(t.untyped_storage(), lambda: live.__setitem__("now", live["now"] - n))
        return t

    monkeypatch.setattr(streamed.WeightSource, "get", tracked)
    export(ckpt, tmp_path / "art", precisions=["fp32", "int8"], log=lambda m: None)
    layer = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / raw["num_hidden_layers"]
    assert 0 < live["peak"] < 2.5 * layer < total / 3, (live, layer, total)


def test_a_bf16_checkpoint_exports_as_its_fp32_values(tmp_path):
    """A bf16 checkpoint is cast tensor by tensor: its artifact is byte-identical to the one of an
    fp32 checkpoint holding the same (bf16-rounded) values."""
    import torch
    from safetensors.torch import load_file, save_file

    from dllm_deploy.export.exporter import export
    fp32 = write_random_checkpoint(tmp_path / "fp32", MOE_CONFIGS["sdar_moe"])
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text((fp32 / "config.json").read_text())
    tensors = load_file(str(fp32 / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(bf16 / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16).float() for k, v in tensors.items()}, str(fp32 / "model.safetensors"))
    for src in (fp32, bf16):
        export(src, tmp_path / f"art-{src.name}", log=lambda m: None)
    assert (tmp_path / "art-fp32" / "weights.bin").read_bytes() == (tmp_path / "art-bf16" / "weights.bin").read_bytes()


@pytest.mark.parametrize("family", ["sdar_moe", "llada_moe"])
def test_int8_smoothing_calibrates_the_contrib_form(tmp_path, family):
    """The contrib form runs the experts from their stacked weights, so calibration runs the
    gathered form to see each expert's inputs (it failed on 'stack expects a non-empty list')."""
    from dllm_deploy.export.exporter import export
    ckpt = write_random_checkpoint(tmp_path / "ckpt", MOE_CONFIGS[family])
    export(ckpt, tmp_path / "art", precisions=["int8"], moe_form="contrib", log=lambda m: None)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["quantization"]["int8"]["smooth"]["alpha"] > 0
    assert manifest["experts"]["form"]["int8"] == "contrib"
    assert manifest["parity"]["int8"]["max_abs_diff"]["prefill_logits"] < 1.0
