"""Exporter + ONNX Runtime backend on the bundled tiny model (and the three random layouts)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_deploy.artifact import read_manifest
from dllm_deploy.errors import UserError
from dllm_deploy.evals import tasks

REPO = Path(__file__).resolve().parents[3]


def test_artifact_layout_and_manifest(tiny_artifact):
    folder, report = tiny_artifact
    m = read_manifest(folder)
    assert m["schema_version"] == 4 and m["sampling"] == {"pool": 64, "noise": "philox4x64-10/v1"}
    assert set(m["precisions"]) == {"fp32", "int8", "int4"}
    for f in ("prefill.onnx", "verify.onnx", "weights.bin", "int8/prefill.onnx", "int8/verify.onnx", "int8/weights.bin"):
        assert f in m["files"], f
    assert m["graphs"]["prefill"]["inputs"][:3] == ["input_ids", "position_ids", "attention_mask"]
    assert "present.0.key" in m["graphs"]["prefill"]["outputs"]
    assert m["graphs"]["verify"]["outputs"] == ["top_ids", "top_probs"]
    # schema 4: the family, what it can do (the runtimes ask this, never the family's name), KV per layer
    cfg = m["model"]
    assert m["family"] == "block_causal" and set(m["capabilities"]["graphs"]) == set(m["graphs"]) == {"prefill", "verify"}
    assert m["capabilities"]["attention"] == "block_causal" and m["capabilities"]["cache"]["auto"] == "exact"
    assert m["kv_shapes"] == [[cfg["num_kv_heads"], cfg["head_dim"]]] * cfg["num_layers"]
    # excluded: the ids the graphs never choose (the mask, and the pad as it is not EOS)
    assert m["special_ids"] == {"mask": 256, "eos": 257, "pad": 258, "excluded": [256, 258]}
    # weights are stored once: both graphs together are far smaller than two copies of the weights
    onnx_bytes = (folder / "prefill.onnx").stat().st_size + (folder / "verify.onnx").stat().st_size
    assert onnx_bytes < 0.1 * (folder / "weights.bin").stat().st_size


def test_parity_fp32(tiny_artifact):
    _, report = tiny_artifact
    par = report["parity"]["fp32"]
    assert par["max_abs_diff"]["prefill_logits"] <= 1e-4
    assert par["max_abs_diff"]["prefill_kv"] <= 1e-4
    assert par["max_abs_diff"]["verify_probs"] <= 1e-4
    assert par["top1_ids_identical"]
    assert [1, 8 * 32, 48] in par["shapes"] and [1, 24, 0] in par["shapes"]   # largest W*L and P = 0


@pytest.mark.parametrize("kw", [
    {"strategy": "vanilla"},
    {"strategy": "threshold", "threshold": 0.9},
    {"strategy": "spd", "beam_width": 4, "tree": "wide"},
    {"strategy": "spd", "beam_width": 4, "base": "threshold"},
    {"strategy": "spd", "beam_width": 4, "select": "threshold"},
])
def test_ort_generation_identical_to_torch(tiny_artifact, tiny_runtime, kw):
    from dllm_deploy import Runtime
    ort_rt = Runtime.load(artifact=str(tiny_artifact[0]))
    prompts = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=1)]
    a = ort_rt.generate(prompts, gen_length=128, **kw)
    b = tiny_runtime.generate(prompts, gen_length=128, **kw)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    # SPD drafts from stale confidences: a float-noise swap of two near-equal confidences may change
    # a draft (never the output), so forwards agree only closely across engines
    assert all(abs(x.forwards - y.forwards) <= 2 for x, y in zip(a, b))
    assert ort_rt.backend.name == "ort"


def test_int8_variant_runs(tiny_artifact):
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(tiny_artifact[0]), precision="int8")
    r = rt.generate("upper: hello world\n", strategy="vanilla")[0]
    assert r.tokens > 0


def test_runtime_path_does_not_import_torch(tiny_artifact, tmp_path):
    """generate on an artifact with torch made unimportable."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "torch.py").write_text("raise ImportError('torch is blocked in this test')\n")
    env = {"PYTHONPATH": f"{block}:{REPO}", "PATH": "/usr/bin:/bin"}
    code = ("import sys, json; from dllm_deploy.cli import main; "
            f"rc = main(['generate', '--artifact', {str(tiny_artifact[0])!r}, '--prompt', 'upper: abc def\\n', "
            "'--strategy', 'spd', '--json']); assert 'torch' not in sys.modules or sys.modules['torch'] is None; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"] > 0


def _copy(folder, tmp_path):
    import shutil
    dst = tmp_path / "art"
    shutil.copytree(folder, dst)
    return dst


def test_sha_mismatch_is_refused(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact[0], tmp_path)
    with open(art / "weights.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\x01\x02\x03")
    with pytest.raises(UserError, match="weights.bin: sha256 mismatch"):
        read_manifest(art)


def test_unknown_schema_and_corrupt_manifest(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact[0], tmp_path)
    m = json.loads((art / "manifest.json").read_text())
    m["schema_version"] = 99
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="unknown schema_version 99"):
        read_manifest(art)
    (art / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt manifest"):
        read_manifest(art)


def test_missing_onnx_and_missing_precision(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact[0], tmp_path)
    (art / "verify.onnx").unlink()
    with pytest.raises(UserError, match="verify.onnx: missing"):
        read_manifest(art)
    with pytest.raises(UserError, match="has no 'fp16' variant"):
        read_manifest(tiny_artifact[0], precision="fp16")


def test_export_refuses_existing_folder_and_leaves_nothing_on_failure(tmp_path):
    from dllm_deploy.export.exporter import export
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("an existing empty folder is used as is; this one is not empty")
    with pytest.raises(UserError, match="already exists"):
        export("tiny", tmp_path / "taken", log=lambda m: None)
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        export("tiny", tmp_path / "new", precisions=["fp8"], log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def _assert_lean_graph(path, cfg):
    """The exported form (models/transformer.py, Attention._graph): every Reshape has a constant
    shape (no Shape / Gather / Concat chain per call), no layer expands K or V per query head (the
    mask is repeated once per call),
    and each layer has four weight products (q/k/v, o, gate/up, down) besides the LM head."""
    import onnx
    g = onnx.load(str(path), load_external_data=False).graph
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    assert [n.input[1] in consts for n in g.node if n.op_type == "Reshape"] == \
        [True] * sum(n.op_type == "Reshape" for n in g.node)
    assert not [n.name for n in g.node if n.op_type in ("Expand", "Tile") and "/layers." in n.name]
    assert sum(n.op_type == "MatMul" and n.input[1] in consts for n in g.node) == 4 * cfg["num_layers"] + 1


def test_export_of_each_layout_passes_parity(layout_checkpoint, tmp_path):
    from dllm_deploy.export.exporter import export
    layout, folder = layout_checkpoint
    rep = export(folder, tmp_path / f"{layout}-art", max_beam_width=2, log=lambda m: None)
    d = rep["parity"]["fp32"]["max_abs_diff"]
    assert d["prefill_logits"] <= 1e-4 and d["prefill_kv"] <= 1e-4 and d["verify_probs"] <= 1e-4
    _assert_lean_graph(tmp_path / f"{layout}-art" / "verify.onnx", read_manifest(tmp_path / f"{layout}-art")["model"])
    if layout != "block_causal":
        # the bidirectional canvas (prefix | block | suffix) through the exported graphs, each cache mode
        from dllm_deploy import Runtime
        rt = Runtime.load(artifact=str(tmp_path / f"{layout}-art"))
        for kw in ({"strategy": "vanilla", "cache": "none"}, {"strategy": "spd", "beam_width": 2, "cache": "prefix"},
                   {"strategy": "spd", "beam_width": 2, "cache": "dual"}):
            r = rt.generate("upper: ab cd\n", gen_length=64, block_length=32, **kw)[0]
            assert r.tokens == len(r.token_ids) > 0 and r.forwards > 0, kw
