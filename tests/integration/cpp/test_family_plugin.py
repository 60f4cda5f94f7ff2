"""A family registered from outside the package (tests/plugins/toy_family.py, one file: its own
config keys, tensor names and a per-layer KV pattern) loads, exports with parity, and decodes in
Python (torch and ONNX Runtime) and in C++ with no other file touched; its artifact decodes in a
process where the family is not registered, as it would on a machine that has only the runtime."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dllm_deploy.runtime.api import decode_config
from tests.conftest import write_random_checkpoint
from tests.plugins import toy_family

from .conftest import generate_many

KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished")
PROMPTS = ["hello", "a longer prompt, 2+3="]
OPTIONS = {"vanilla-prefix": {"strategy": "vanilla", "cache": "prefix"},
           "spd-dual": {"strategy": "spd", "beam_width": 4, "cache": "dual"},
           "threshold-none": {"strategy": "threshold", "cache": "none"}}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(checkpoint folder, artifact folder, export report) of a random toy_llada checkpoint."""
    from dllm_deploy.export.exporter import export
    root = tmp_path_factory.mktemp("toy")
    ckpt = write_random_checkpoint(root / "ckpt", toy_family.CONFIG)
    report = export(ckpt, root / "art", max_beam_width=4, log=lambda m: None)
    return ckpt, root / "art", report


def test_the_checkpoint_uses_the_familys_own_names_and_kv_pattern(toy):
    from safetensors import safe_open
    ckpt, art, report = toy
    with safe_open(str(ckpt / "model.safetensors"), "np") as f:
        names = set(f.keys())
        assert f.get_slice("layer0.attn.wk").get_shape() == [2 * 16, 64]      # even layer: kv_heads 2
        assert f.get_slice("layer1.attn.wk").get_shape() == [1 * 16, 64]      # odd layer: one kv head
    assert "embed.weight" in names and not any(n.startswith("model.") for n in names)
    m = json.loads((art / "manifest.json").read_text())
    assert m["family"] == "toy_llada" and m["kv_shapes"] == [[2, 16], [1, 16], [2, 16], [1, 16]]
    assert m["capabilities"]["attention"] == "bidirectional" and m["capabilities"]["cache"]["auto"] == "prefix"
    assert report["parity"]["fp32"]["top1_ids_identical"]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_torch_ort_and_cpp_decode_the_same_tokens(name, toy, cpp_build, tmp_path):
    from dllm_deploy import Runtime
    ckpt, art, _ = toy
    options = {"block_length": 8, "gen_length": 16, **OPTIONS[name]}
    torch_rt, ort_rt = Runtime.load(model=str(ckpt)), Runtime.load(artifact=str(art))
    want = [ort_rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in PROMPTS]
    ref = [torch_rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in PROMPTS]
    assert [w["token_ids"] for w in want] == [r["token_ids"] for r in ref]
    assert all(len(set(w["token_ids"])) > 1 for w in want)          # not a degenerate repeat
    got = generate_many(cpp_build, art, PROMPTS, options, tmp_path)
    assert [{k: g[k] for k in KEYS} for g in got] == [{k: w[k] for k in KEYS} for w in want]


def test_the_artifact_decodes_where_the_family_is_not_registered(toy):
    """A fresh interpreter that never imports the plugin: the manifest carries what the runtime needs."""
    from dllm_deploy import Runtime
    _, art, _ = toy
    code = ("import json, sys, dllm_deploy as dd\n"
            "from dllm_deploy.models.registry import families\n"
            "assert 'toy_llada' not in families()\n"
            "r = dd.Runtime.load(artifact=sys.argv[1]).generate('hello', block_length=8, gen_length=16)[0]\n"
            "print(json.dumps(r.token_ids))\n")
    p = subprocess.run([sys.executable, "-c", code, str(art)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    want = Runtime.load(artifact=str(art)).generate("hello", block_length=8, gen_length=16)[0].token_ids
    assert json.loads(p.stdout) == want


def test_a_taken_name_is_refused_unless_replaced():
    import dllm_deploy as dd
    from dllm_deploy.errors import UserError
    with pytest.raises(UserError, match="family 'toy_llada' is registered already"):
        dd.register_family(toy_family.FAMILY)
    clash = dd.Family(name="other", model_types=("sdar",), config=toy_family.config, capabilities=lambda c: None)
    with pytest.raises(UserError, match="model_type 'sdar' is registered already"):
        dd.register_family(clash)
