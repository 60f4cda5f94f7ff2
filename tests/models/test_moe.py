"""Mixture-of-experts families (models/moe.py): the module against independent references on
random checkpoints in the released layouts. SDAR-MoE is Qwen3-MoE with block-causal attention, so
transformers' Qwen3MoeForCausalLM (a test-only dependency, pinned in pyproject.toml) loads the same
checkpoint and is fed the same block-causal mask."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dllm_deploy.errors import UserError
from dllm_deploy.models.config import DLLMConfig
from dllm_deploy.models.loading import load_model
from tests.conftest import MOE_CONFIGS, write_random_checkpoint


def _block_causal(t: int, block: int, batch: int = 2) -> torch.Tensor:
    blk = torch.arange(t) // block
    return (blk[None, :] <= blk[:, None])[None, None].repeat(batch, 1, 1, 1)      # (B,1,T,T)


@pytest.fixture(scope="module")
def sdar_moe(tmp_path_factory):
    """(our checkpoint folder, the same weights as a qwen3_moe folder transformers loads)."""
    root = tmp_path_factory.mktemp("sdar_moe")
    ours = write_random_checkpoint(root / "ours", MOE_CONFIGS["sdar_moe"])
    theirs = root / "qwen3_moe"
    theirs.mkdir()
    raw = {**MOE_CONFIGS["sdar_moe"], "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}
    (theirs / "config.json").write_text(json.dumps(raw))
    shutil.copy(ours / "model.safetensors", theirs / "model.safetensors")
    return ours, theirs


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_sdar_moe_logits_match_transformers_qwen3_moe(sdar_moe, impl):
    from transformers import Qwen3MoeForCausalLM
    ours_dir, theirs_dir = sdar_moe
    ref = Qwen3MoeForCausalLM.from_pretrained(str(theirs_dir), attn_implementation="eager", dtype=torch.float32).eval()
    model, cfg = load_model(ours_dir, attention=impl)
    assert (cfg.layout, cfg.num_experts, cfg.experts_per_token, cfg.attention) == ("sdar_moe", 8, 2, "block_causal")
    t = 3 * cfg.block_size
    ids = torch.randint(0, cfg.vocab_size - 2, (2, t), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(t)[None].repeat(2, 1)
    mask = _block_causal(t, cfg.block_size)
    with torch.no_grad():
        want = ref(input_ids=ids, position_ids=pos,
                   attention_mask=torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))).logits
        got, _ = model(ids, pos, mask)
    assert float((got - want).abs().max()) <= 1e-4
    assert float(want.std()) > 0.1                                   # a real signal, not zeros


def test_the_experts_chosen_match_transformers_router(sdar_moe):
    """Qwen3-MoE's router (softmax, top-k, renormalised) chooses the same experts with the same weights."""
    from transformers import Qwen3MoeForCausalLM
    ours_dir, theirs_dir = sdar_moe
    ref = Qwen3MoeForCausalLM.from_pretrained(str(theirs_dir), dtype=torch.float32).eval()
    model, cfg = load_model(ours_dir)
    x = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        w, ids = model.model.layers[1].mlp.gate(x)
        logits = torch.nn.functional.linear(x, ref.model.layers[1].mlp.gate.weight)
        p = torch.softmax(logits, -1)
        rw, rid = torch.topk(p, cfg.experts_per_token, -1)
        rw = rw / rw.sum(-1, keepdim=True)
    assert torch.equal(ids, rid) and torch.allclose(w, rw, atol=1e-6)


def test_gather_form_uses_every_expert_and_skips_none():
    """The graph's loop over all experts and the torch loop over the chosen ones give the same output."""
    cfg = DLLMConfig.from_hf(MOE_CONFIGS["sdar_moe"])
    from dllm_deploy.models.moe import MoE
    torch.manual_seed(0)
    moe = MoE(cfg)
    for p in moe.parameters():
        p.data.normal_(0, 0.2)
    x = torch.randn(2, 9, cfg.hidden_size)
    with torch.no_grad():
        a = moe(x)
        w, ids = moe.gate(x.reshape(-1, cfg.hidden_size))
        b = moe._gathered(x.reshape(-1, cfg.hidden_size), w, ids, range(cfg.num_experts)).reshape(x.shape)
        dense = sum(w[:, j, None] * torch.stack([moe.experts[int(e)](r) for e, r in zip(ids[:, j], x.reshape(-1, cfg.hidden_size))])
                    for j in range(cfg.experts_per_token)).reshape(x.shape)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(a, dense, atol=1e-5)


@pytest.mark.parametrize("change, message", [
    ({"mlp_only_layers": [0]}, "dense layers among the experts"),
    ({"num_experts_per_tok": 9}, r"experts_per_token 9 must be in \[1, num_experts 8\]"),
    ({"moe_intermediate_size": 0}, "needs expert_size"),
])
def test_bad_moe_configs_are_refused_in_one_line(change, message):
    with pytest.raises(UserError, match=message):
        DLLMConfig.from_hf({**MOE_CONFIGS["sdar_moe"], **change})


def test_moe_fields_survive_the_manifest_round_trip():
    cfg = DLLMConfig.from_hf(MOE_CONFIGS["sdar_moe"])
    assert DLLMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UserError, match="'num_experts' must be >= 0"):
        DLLMConfig.from_dict({**cfg.to_dict(), "num_experts": -1})
    assert np.all([cfg.moe_layer(i) for i in range(cfg.num_layers)])
