"""Never hang, in C++ (DESIGN §8): the checkpoints whose raw top-1 is [MASK] or the pad token
(tests/conftest.py::argmax_models) decode with every strategy and cache mode, token-identical
to the Python ONNX Runtime runtime; an artifact of an older schema is refused in one line asking
for a re-export, as in Python."""
from __future__ import annotations

import pytest

from dllm_deploy.runtime.api import decode_config

from .conftest import STRATEGIES, generate_many, run_generate

KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished")
L, GEN = 8, 16
PROMPTS = ["hello", "a longer prompt, 2+3="]
CASES = [("llada-mask", "none"), ("llada-mask", "prefix"), ("llada-mask", "dual"), ("dream-pad", "prefix"),
         ("dream-pad", "dual"), ("block_causal-mask", "exact"), ("block_causal-mask", "none"), ("block_causal-mask", "delayed")]
EXCLUDED = {"llada-mask": {299}, "dream-pad": {297, 299}, "block_causal-mask": {299}}

_runtimes: dict = {}


def _options(name: str, mode: str, strategy: str) -> dict:
    o = {"cache": mode, "block_length": L, "gen_length": GEN, **STRATEGIES[strategy]}
    if "beam_width" in o and (mode == "delayed" or mode == "none" and not name.startswith("block_causal")):
        o["beam_width"] = 1          # none on a bidirectional model, delayed: one branch per forward
    return o


def _python(artifact: str, options: dict) -> list[dict]:
    """Batch 1 per prompt, as the C++ runtime decodes."""
    from dllm_deploy import Runtime
    rt = _runtimes.get(artifact) or _runtimes.setdefault(artifact, Runtime.load(artifact=artifact))
    return [rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in PROMPTS]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name,mode", CASES)
def test_cpp_ends_like_python(name, mode, strategy, cpp_build, argmax_models, tmp_path):
    artifact = argmax_models[name][1]
    options = _options(name, mode, strategy)
    want = _python(artifact, options)
    got = generate_many(cpp_build, artifact, PROMPTS, options, tmp_path)
    assert [{k: g[k] for k in KEYS} for g in got] == [{k: w[k] for k in KEYS} for w in want]
    for g in got:
        assert g["forwards"] <= GEN and not set(g["token_ids"]) & EXCLUDED[name]


def test_cpp_refuses_an_older_schema_as_python_does(cpp_build, argmax_models, tmp_path):
    """Schema 3 (and older) in one line, the same as Python's, exit 2; the current schema decodes."""
    import json
    import shutil

    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.errors import UserError
    old = shutil.copytree(argmax_models["llada-mask"][1], tmp_path / "old")
    m = json.loads((old / "manifest.json").read_text())
    m["schema_version"] = 3
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError) as py:
        read_manifest(old)
    r = run_generate(cpp_build, "--artifact", str(old), "--prompt", "hello")
    assert r.returncode == 2 and r.stderr.strip().endswith(str(py.value)), r.stderr
    assert "re-export the model" in r.stderr
    ok = run_generate(cpp_build, "--artifact", argmax_models["llada-mask"][1], "--prompt", "hello", "--json",
                      "--block-length", str(L), "--gen-length", str(GEN))
    assert ok.returncode == 0, ok.stderr
