"""Quantization options of the export (docs/precision.md): the int8 variant's reduce_range
(--int8-reduce-range: 7-bit weights, so that the byte-pair sums of ONNX Runtime's x86 kernels
without VNNI, 255 x 64 x 2 < 2**15, cannot saturate their 16-bit lanes; without it the weights
use the full -127..127), the int4 variant's MatMulNBits accuracy level (--int4-accuracy-level), and
the refusal of an option for a variant --precision does not ask for."""
import numpy as np
import pytest
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from dllm_deploy.cli import main
from dllm_deploy.export.exporter import share_weights
from dllm_deploy.export.graphs import GRAPHS
from dllm_deploy.export.quantize import int4_variant, int8_variant


def _weights(model) -> list[np.ndarray]:
    return [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]


def test_reduce_range_keeps_the_weights_in_seven_bits_and_runs(tiny_artifact, tmp_path):
    for rr, bound in ((True, 64), (False, 127)):
        sub = tmp_path / str(rr)
        sub.mkdir()
        graphs = int8_variant({g: tiny_artifact[0] for g in GRAPHS}, sub,
                              {"per_channel": True, "fp32_products": [], "reduce_range": rr})
        for g, model in graphs.items():
            w = _weights(model)
            assert w and max(int(np.abs(x.astype(np.int32)).max()) for x in w) == bound, (g, rr)
            onnx.save(model, str(sub / f"{g}.onnx"))
            ort.InferenceSession(str(sub / f"{g}.onnx"), providers=["CPUExecutionProvider"])    # loads


def test_the_int4_accuracy_level_is_every_products_and_runs(tiny_artifact, tmp_path):
    """Level 4 (int8 activations) on every MatMulNBits node, unset by default; both run, and
    level 4 stays near level 0's logits on the same inputs."""
    from tests.integration.cpp.test_graph_run import _inputs
    logits = {}
    for level in (0, 4):
        opts = {"block_size": 32, "symmetric": True, "op_types": ["MatMul"], "accuracy_level": level}
        graphs, bases = int4_variant(tiny_artifact[0], opts, tmp_path / str(level))
        for g, model in graphs.items():
            nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
            got = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0) for n in nodes}
            assert nodes and got == {level}, (g, level, got)
        out = tmp_path / f"variant-{level}"           # the variant's folder, as the exporter writes it
        out.mkdir()
        share_weights(graphs, out, "weights.bin", bases=bases)
        onnx.save(graphs["prefill"], str(out / "prefill.onnx"))
        sess = ort.InferenceSession(str(out / "prefill.onnx"), providers=["CPUExecutionProvider"])
        feeds = _inputs(sess, 256, 0, np.random.default_rng(0))          # ids < any vocabulary here
        logits[level] = sess.run(["logits"], feeds)[0]
    finite = np.isfinite(logits[0])
    assert (finite == np.isfinite(logits[4])).all()
    assert np.abs(logits[0][finite] - logits[4][finite]).max() < 0.1 * np.abs(logits[0][finite]).max()


def test_the_flags_reach_the_exporter(monkeypatch, tmp_path):
    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise SystemExit(0)
    monkeypatch.setattr("dllm_deploy.export.exporter.export", fake)
    for argv, want in ((["--int8-reduce-range", "--int4-accuracy-level", "4"], (True, 4)), ([], (False, 0))):
        try:
            main(["export", "--out", str(tmp_path / "a"), "--precision", "fp32,int8,int4", *argv])
        except SystemExit:
            pass
        assert (seen["int8_reduce_range"], seen["int4_accuracy_level"]) == want


def test_a_bad_int4_accuracy_level_is_one_line(tmp_path, capsys):
    assert main(["export", "--out", str(tmp_path / "a"), "--precision", "fp32,int4", "--int4-accuracy-level", "5"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["dllm-deploy: error: --int4-accuracy-level must be one of 0, 1, 2, 3, 4 (got 5)"]
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("argv, option, variant", [
    (["--precision", "fp32,int4", "--int8-reduce-range"], "--int8-reduce-range", "int8"),
    (["--precision", "fp32,int4", "--int8-smooth", "0.3"], "--int8-smooth", "int8"),
    (["--int8-fp32", "none"], "--int8-fp32", "int8"),
    (["--precision", "fp32,int8", "--int4-block-size", "64"], "--int4-block-size", "int4"),
    (["--int4-asymmetric"], "--int4-asymmetric", "int4"),
    (["--precision", "fp32,int8", "--int4-accuracy-level", "4"], "--int4-accuracy-level", "int4"),
])
def test_an_option_of_a_variant_not_asked_for_is_refused(tmp_path, capsys, argv, option, variant):
    """Not ignored: the user meant to change a variant the export would not write."""
    assert main(["export", "--out", str(tmp_path / "a"), *argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dllm-deploy: error: {option} applies to the {variant} variant, which --precision ")
    assert f"add {variant} to --precision" in line
    assert not (tmp_path / "a").exists()


def test_an_option_at_its_default_is_no_change(monkeypatch, tmp_path):
    """Giving an option its default value is not refused (the variant would be the same)."""
    from dllm_deploy.export import exporter
    monkeypatch.setattr(exporter, "check_target", lambda *a, **k: (_ for _ in ()).throw(SystemExit(7)))
    with pytest.raises(SystemExit) as e:
        main(["export", "--out", str(tmp_path / "a"), "--int4-block-size", "32", "--int8-smooth", "0.5",
              "--int8-fp32", "down_proj", "--int4-accuracy-level", "0"])
    assert e.value.code == 7                 # past every check, at the target folder
