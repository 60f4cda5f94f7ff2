"""Never hang (DESIGN §8): whatever the weights, no decode step chooses the mask token (or a pad
token distinct from EOS), and every base-rule step commits a real token, so a block of L
positions fills in at most L forwards.

Random checkpoints edited so that the model's raw top-1 is [MASK] (LLaDA and block-causal
layouts) or the pad token (Dream: pad 297, EOS 298) at every position; decoded with every
strategy and cache mode on torch and on ONNX Runtime, and through a schema-1 artifact (graphs
that do not exclude: the runtime demotes on the host)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dllm_deploy.models.config import DLLMConfig
from dllm_deploy.models.exclusion import excluded_ids
from dllm_deploy.models.loading import load_model
from dllm_deploy.runtime.api import decode_config
from dllm_deploy.runtime.strategies import DecodeConfig, Policy
from tests.conftest import ARGMAX_CASES, STRATEGIES

L, GEN = 8, 16        # two blocks of 8: the commit / refresh forward between blocks runs too
MODES = {"llada": ("none", "prefix", "dual"), "dream": ("none", "prefix", "dual"), "block_causal": ("exact", "none", "delayed")}
PROMPTS = ["hello", "a longer prompt, 2+3="]

_runtimes: dict = {}


def runtime(argmax_models, name: str, backend: str):
    """One Runtime per (model, backend) for the module: torch on the checkpoint, ort on the artifact."""
    from dllm_deploy import Runtime
    key = (name, backend)
    if key not in _runtimes:
        ckpt, artifact = argmax_models[name]
        _runtimes[key] = Runtime.load(model=str(ckpt)) if backend == "torch" else Runtime.load(artifact=artifact)
    return _runtimes[key]


def options(mode: str, strategy: str) -> dict:
    o = {"cache": mode, "block_length": L, "gen_length": GEN, **STRATEGIES[strategy]}
    if mode in ("none", "delayed") and "beam_width" in o:
        o["beam_width"] = 1          # none on a bidirectional model, delayed: one branch per forward
    return o


def check_progress(rows, cfg: DLLMConfig) -> None:
    """Every row ends within L forwards per block, with no excluded id among its tokens."""
    for r in rows:
        assert r.forwards <= GEN // L * L, r.forwards
        assert r.finished or r.tokens == GEN
        assert not set(r.token_ids) & set(excluded_ids(cfg)), r.token_ids


@pytest.mark.parametrize("name", list(ARGMAX_CASES))
def test_the_raw_argmax_is_the_excluded_token(name, argmax_models):
    """The premise: the untouched model's logits choose the special token at every position."""
    layout, token = ARGMAX_CASES[name]
    model, cfg = load_model(argmax_models[name][0])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 40), generator=g)
    ids[:, 12:] = cfg.mask_token_id
    with torch.no_grad():
        logits, _ = model(ids, torch.arange(40).repeat(2, 1), torch.ones(2, 1, 40, 40, dtype=torch.bool))
    want = getattr(cfg, f"{token}_token_id")
    assert (logits.argmax(-1) == want).all()
    assert want in excluded_ids(cfg) and (token == "mask" or cfg.pad_token_id != cfg.eos_token_id)


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name,mode", [(n, m) for n, (layout, _) in ARGMAX_CASES.items() for m in MODES[layout]])
def test_every_strategy_and_cache_mode_ends(name, mode, strategy, backend, argmax_models):
    rt = runtime(argmax_models, name, backend)
    rows = rt.decoder.generate(PROMPTS, decode_config(**options(mode, strategy)))
    check_progress(rows, rt.config)


def test_the_cli_case_of_the_issue_ends(argmax_models):
    """`generate --strategy vanilla --cache none` on the LLaDA checkpoint: one real token per step."""
    from dllm_deploy import Runtime
    rt = Runtime.load(model=str(argmax_models["llada-mask"][0]))
    row = rt.generate("hello", strategy="vanilla", cache="none", block_length=L, gen_length=GEN)[0]
    check_progress([row], rt.config)
    assert row.forwards == GEN and row.accepted_hist == {1: GEN - 2}   # L per block, refresh included


def test_the_graphs_exclude_and_the_manifest_says_so(argmax_models):
    """verify.onnx itself never returns the mask token; prefill's logits hold -inf there."""
    import onnxruntime as ort

    from dllm_deploy.runtime.backends.base import sampling_feeds
    artifact = argmax_models["llada-mask"][1]
    m = json.loads(open(f"{artifact}/manifest.json").read())
    assert m["schema_version"] == 4 and m["special_ids"]["excluded"] == [299]
    feeds = {"input_ids": np.full((1, 6), 299, dtype=np.int64), "position_ids": np.arange(6)[None],
             "attention_mask": np.ones((1, 1, 6, 6), dtype=bool)}
    feeds.update({n: np.zeros((1, 4, 0, 16), dtype=np.float32) for n in m["graphs"]["verify"]["inputs"][3:]
                  if n.startswith("past_key_values.")})
    feeds.update(sampling_feeds(None, 1, 6))                    # greedy
    top_i, top_p = ort.InferenceSession(f"{artifact}/verify.onnx").run(None, feeds)
    assert (top_i != 299).all() and np.isfinite(top_p).all() and (top_p[..., 0] > 0).all()
    logits = ort.InferenceSession(f"{artifact}/prefill.onnx").run(["logits"], feeds)[0]
    assert np.isneginf(logits[..., 299]).all() and np.isfinite(logits[..., :299]).all()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_schema_is_refused_asking_for_a_re_export(argmax_models, tmp_path, version):
    """Schemas 1-3 are not read (CHANGELOG.md): one line naming the fix, before any graph is opened."""
    from dllm_deploy import Runtime
    from dllm_deploy.errors import UserError
    old = shutil.copytree(argmax_models["llada-mask"][1], tmp_path / "old")
    m = json.loads((old / "manifest.json").read_text())
    m["schema_version"] = version
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=rf"schema_version {version} was written by an older dllm-deploy; "
                                        r"re-export the model \(this runtime reads 4, 5; CHANGELOG.md\)"):
        Runtime.load(artifact=str(old))


def test_an_unknown_schema_is_still_refused(argmax_models, tmp_path):
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.errors import UserError
    bad = shutil.copytree(argmax_models["llada-mask"][1], tmp_path / "bad")
    m = json.loads((bad / "manifest.json").read_text())
    for version in (6, 0, True):
        m["schema_version"] = version
        (bad / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(UserError, match=r"unknown schema_version .* \(this runtime reads 4, 5\)"):
            read_manifest(bad)


def test_a_step_that_commits_nothing_is_an_error_not_a_loop():
    """The guard under every strategy: predictions that are all [MASK] (no backend returns them
    any more) stop the decode with an internal error instead of looping."""
    mask = 9
    state = np.full(4, mask)
    top_i, top_p = np.full((4, 2), mask), np.full((4, 2), 0.5, dtype=np.float32)
    for strategy in STRATEGIES.values():
        policy = Policy(DecodeConfig(**{**strategy, "block_length": 4, "gen_length": 4}), mask)
        with pytest.raises(RuntimeError, match="committed no token"):
            policy.plan(state, top_i, top_p, 0)
