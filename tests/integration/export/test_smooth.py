"""SmoothQuant for the int8 variant (export/smooth.py): the fp32 function is kept, the activation
ranges are evened out, the int8 graphs come closer to fp32 than without it, and bad options fail
before anything is written."""
import json

import pytest
import torch

from dllm_deploy.cli import main
from dllm_deploy.errors import UserError
from dllm_deploy.evals import tasks
from dllm_deploy.evals.fidelity import compare, decode_states
from dllm_deploy.export.exporter import export
from dllm_deploy.export.smooth import calibration_texts, input_ranges, smooth_
from dllm_deploy.models.loading import load_model
from dllm_deploy.models.tokenizer import ByteTokenizer


def test_smoothing_keeps_the_function_and_evens_the_ranges():
    module, cfg = load_model("tiny", attention="eager")
    tok = ByteTokenizer()
    states = [tuple(map(torch.from_numpy, x[:3])) for x in decode_states(tok, cfg.mask_token_id, cfg.block_size, n=2)]
    with torch.no_grad():
        before = [module(*s)[0] for s in states]
    texts, source = calibration_texts(None)
    assert source == "tasks" and len(texts) == 32
    assert not {p for p, _ in texts} & tasks.eval_prompts()          # never an evaluation prompt
    ranges = input_ranges(module, cfg, tok, texts, cfg.block_size)
    assert module.model.layers[0].self_attn.impl == "eager"           # calibration restores the exported form
    done = smooth_(module, cfg, ranges)
    assert len(done) == 3 * cfg.num_layers + 1 and "lm_head" in done
    with torch.no_grad():
        after = [module(*s)[0] for s in states]
    for a, b in zip(before, after):
        assert torch.allclose(a, b, atol=2e-4, rtol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    # the outlier channel of the down-projection's input is tamed: max / median over channels
    spread = lambda r: float(r.max() / r.median())          # noqa: E731
    new = input_ranges(module, cfg, tok, texts, cfg.block_size)
    for i in range(cfg.num_layers):
        name = f"model.layers.{i}.mlp.down_proj"
        assert spread(new[name]) < spread(ranges[name])


def test_int8_error_falls_with_smoothing_and_the_fp32_down_projection(tiny_artifact, tmp_path):
    """On held-out decode states, the default int8 (smoothed, the down-projection kept in fp32) is
    closer to fp32 than plain per-channel int8. Each step's share is a measurement
    (lab/int8_fidelity.py, docs/precision.md); here the recipe's record and the direction."""
    plain = tmp_path / "plain"
    export("tiny", plain, precisions=["fp32", "int8"], int8_smooth=0, int8_fp32=(), log=lambda m: None)
    default = tiny_artifact[0]
    q = {a: json.loads((a / "manifest.json").read_text())["quantization"]["int8"] for a in (plain, default)}
    assert q[plain]["smooth"] is None and q[plain]["fp32_products"] == [] and q[plain]["per_channel"]
    assert q[default]["smooth"] == {"alpha": 0.5, "calibration": "tasks", "texts": 32}
    assert q[default]["fp32_products"] == ["down_proj"]
    _, cfg = load_model("tiny")
    states = decode_states(ByteTokenizer(), cfg.mask_token_id, cfg.block_size, n=4)
    c = {a: compare(a, "int8", states) for a in (plain, default)}
    assert c[default]["logit_error"] < 0.6 * c[plain]["logit_error"], c
    assert c[default]["top1_agreement"] > c[plain]["top1_agreement"] and c[default]["positions"] == 24 * 32


def test_int8_products_name_the_graphs_products(tiny_artifact):
    """Each product of INT8_PRODUCTS matches one MatMul with a constant weight per layer (the LM
    head: one) in both fp32 graphs; the default int8 graphs keep exactly the down-projections."""
    import onnx

    from dllm_deploy.export.quantize import INT8_PRODUCTS, int8_kept
    _, cfg = load_model("tiny")
    for g in ("prefill", "verify"):
        graph = onnx.load(str(tiny_artifact[0] / f"{g}.onnx"), load_external_data=False).graph
        consts = {i.name for i in graph.initializer}
        for name in INT8_PRODUCTS:
            nodes = int8_kept(graph, [name])
            assert len(nodes) == (1 if name == "lm_head" else cfg.num_layers), (g, name, nodes)
            by = {n.name: n for n in graph.node}
            assert all(by[n].input[1] in consts for n in nodes)
        q = onnx.load(str(tiny_artifact[0] / "int8" / f"{g}.onnx"), load_external_data=False).graph
        q_consts = {i.name for i in q.initializer}
        fp32_weighted = [n for n in q.node if n.op_type == "MatMul" and n.input[1] in q_consts]
        assert len(fp32_weighted) == cfg.num_layers and all("down_proj" in n.name for n in fp32_weighted)
        assert sum(n.op_type == "MatMulInteger" for n in q.node) == 3 * cfg.num_layers + 1


def test_calibration_file(tmp_path):
    """--int8-calibration FILE: each non-blank line a prompt without an answer; the ranges then
    come from [prompt | a block of masks]."""
    f = tmp_path / "calib.txt"
    f.write_text("upper: river stone\n\nreverse: cloud garden\n")
    texts, source = calibration_texts(f)
    assert texts == [("upper: river stone", ""), ("reverse: cloud garden", "")] and source == "calib.txt"
    module, cfg = load_model("tiny", attention="eager")
    ranges = input_ranges(module, cfg, ByteTokenizer(), texts, cfg.block_size)
    assert set(ranges) == {n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    assert all(r.shape == (m.in_features,) and (r > 0).all() for n, m in module.named_modules()
               if isinstance(m, torch.nn.Linear) for r in [ranges[n]])


@pytest.mark.parametrize("args,words", [
    (["--precision", "fp32,int8", "--int8-smooth", "2"], "--int8-smooth"),
    (["--precision", "fp32,int8", "--int8-calibration", "MISSING"], "cannot read the calibration texts"),
    (["--precision", "fp32,int8", "--int8-calibration", "EMPTY"], "no calibration text"),
    (["--precision", "fp32", "--int8-calibration", "EMPTY"], "needs the int8 precision"),
    (["--precision", "fp32,int8", "--int8-fp32", "down_proj,mlp"], "unknown product 'mlp'"),
])
def test_bad_smoothing_options_fail_before_writing(tmp_path, capsys, args, words):
    (tmp_path / "EMPTY").write_text("\n\n")
    args = [str(tmp_path / a) if a in ("MISSING", "EMPTY") else a for a in args]
    out = tmp_path / "art"
    assert main(["export", "--model", "tiny", "--out", str(out), *args]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(UserError):
        export("tiny", out, precisions=["fp32", "int8"], int8_smooth=True)


def test_int8_weights_file_matches_the_memory_model(tiny_artifact):
    """int8/weights.bin = the memory model's int8 weight bytes (int8 products with per-channel
    scales and zero points, the down-projections and other parameters fp32) + the constants the
    fp32 file holds beyond its parameters (rotary tables)."""
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.profiles.memory import param_count, weight_bytes
    folder, _ = tiny_artifact
    cfg = read_manifest(folder)["model"]
    extra = (folder / "weights.bin").stat().st_size - param_count(cfg) * 4
    int8 = (folder / "int8/weights.bin").stat().st_size
    est = weight_bytes(cfg, "int8") + extra
    assert abs(int8 - est) / int8 < 0.01, (int8, est)


def test_fp16_before_int8_leaves_int8_as_without_it(tiny_artifact, fp16_artifact):
    """fp16 is exported before int8; int8's smoothing must still start from the exact fp32
    weights (not ones rounded through fp16), so its files equal those of an export without fp16."""
    out = fp16_artifact
    for f in ("int8/weights.bin", "int8/verify.onnx", "weights.bin"):
        assert (out / f).read_bytes() == (tiny_artifact[0] / f).read_bytes(), f
    assert (out / "fp16/weights.bin").exists()
