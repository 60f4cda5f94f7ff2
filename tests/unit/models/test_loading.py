import json

import numpy as np
import pytest
import torch

from dllm_deploy.errors import UserError
from dllm_deploy.models.config import DLLMConfig
from dllm_deploy.models.loading import load_model
from tests.conftest import LAYOUT_CONFIGS, write_checkpoint


def _forward(model, ids, pos, mask, past=None):
    with torch.no_grad():
        return model(torch.tensor(ids), torch.tensor(pos), torch.tensor(mask), past)


def test_each_layout_loads_and_runs(layout_checkpoint):
    layout, folder = layout_checkpoint
    model, cfg = load_model(folder)
    assert cfg.layout == layout
    ids = np.array([[1, 2, 3, cfg.mask_token_id]])
    logits, present = _forward(model, ids, np.arange(4)[None], np.ones((1, 1, 4, 4), bool))
    assert logits.shape == (1, 4, cfg.vocab_size)
    assert present[0][0].shape == (1, cfg.num_kv_heads, 4, cfg.head_dim)
    assert torch.isfinite(logits).all()


def test_graph_form_computes_the_sdpa_function(layout_checkpoint):
    """set_attention("eager") (the exported form: fused projections, grouped queries, constant
    reshapes) gives the sdpa path's logits and KV, with a cache and keys hidden by the mask."""
    _, folder = layout_checkpoint
    model, cfg = load_model(folder)
    g = np.random.default_rng(0)
    p, t = 6, 5
    ids = g.integers(0, cfg.vocab_size - 2, (2, p + t))
    pos = np.tile(np.arange(p + t), (2, 1))
    mask = np.ones((2, 1, p + t, p + t), bool)
    mask[1, :, :, :2] = False                      # row 1: two left pads nobody attends
    mask[1, :, :2, :2] = np.eye(2, dtype=bool)     # (the pads attend themselves)
    out = {}
    for impl in ("sdpa", "eager"):
        model.set_attention(impl)
        _, past = _forward(model, ids[:, :p], pos[:, :p], mask[:, :, :p, :p])
        out[impl] = _forward(model, ids[:, p:], pos[:, p:], mask[:, :, p:], past)
    model.set_attention("sdpa")
    (a, pa), (b, pb) = out["sdpa"], out["eager"]
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    for (ka, va), (kb, vb) in zip(pa, pb):
        assert ka.shape == kb.shape == (2, cfg.num_kv_heads, p + t, cfg.head_dim)
        assert torch.allclose(ka, kb, atol=1e-5) and torch.allclose(va, vb, atol=1e-5)


def test_layout_specifics():
    llada = DLLMConfig.from_hf(LAYOUT_CONFIGS["llada"])
    dream = DLLMConfig.from_hf(LAYOUT_CONFIGS["dream"])
    block = DLLMConfig.from_hf(LAYOUT_CONFIGS["block_causal"])
    assert (llada.attention, llada.mask_token_id, llada.qkv_bias) == ("bidirectional", 299, False)
    assert (dream.qkv_bias, dream.shift_logits, dream.num_kv_heads) == (True, True, 2)
    assert (block.attention, block.block_size, block.qk_norm) == ("block_causal", 8, True)


def test_dream_logits_are_shifted(tmp_path):
    folder = write_checkpoint(tmp_path / "d", "dream")
    model, cfg = load_model(folder)
    ids = np.array([[5, 6, 7, 8]])
    mask = np.ones((1, 1, 4, 4), bool)
    shifted, _ = _forward(model, ids, np.arange(4)[None], mask)
    cfg.shift_logits = False
    raw, _ = _forward(model, ids, np.arange(4)[None], mask)
    assert torch.allclose(shifted[:, 1:], raw[:, :-1])
    assert torch.allclose(shifted[:, 0], raw[:, 0])


def test_sharded_checkpoint_equals_single_file(tmp_path):
    a, _ = load_model(write_checkpoint(tmp_path / "one", "dream", seed=3))
    b, _ = load_model(write_checkpoint(tmp_path / "two", "dream", sharded=True, seed=3))
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb)


def test_block_causal_kv_cache_equals_full_forward(tmp_path):
    model, cfg = load_model(write_checkpoint(tmp_path / "b", "block_causal"))
    L = cfg.block_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 290, size=(1, 6 + 2 * L))            # prompt of 6, two blocks
    blocks = np.array([0] * 6 + [1] * L + [2] * L)
    full_mask = (blocks[None, :] <= blocks[:, None])[None, None]
    pos = np.arange(ids.shape[1])[None]
    full, _ = _forward(model, ids, pos, full_mask)
    # prompt, then block 1 with the cache, then block 2 with the cache
    p = 6
    _, kv = _forward(model, ids[:, :p], pos[:, :p], full_mask[..., :p, :p])
    out1, kv = _forward(model, ids[:, p:p + L], pos[:, p:p + L], full_mask[..., p:p + L, :p + L], kv)
    out2, _ = _forward(model, ids[:, p + L:], pos[:, p + L:], full_mask[..., p + L:, :], kv)
    cached = torch.cat([out1, out2], dim=1)
    assert (cached - full[:, p:]).abs().max().item() <= 1e-5


def test_unknown_model_type(tmp_path):
    folder = write_checkpoint(tmp_path / "x", "dream")
    raw = json.loads((folder / "config.json").read_text())
    raw["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="unknown model_type 'gpt2'"):
        load_model(folder)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    folder = write_checkpoint(tmp_path / "x", "dream")
    t = load_file(str(folder / "model.safetensors"))
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(folder / "model.safetensors"))
    with pytest.raises(UserError, match="missing tensor model.layers.1.mlp.up_proj.weight"):
        load_model(folder)


def test_misshaped_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    folder = write_checkpoint(tmp_path / "x", "llada")
    t = load_file(str(folder / "model.safetensors"))
    t["model.transformer.blocks.0.q_proj.weight"] = torch.zeros(3, 3)
    save_file(t, str(folder / "model.safetensors"))
    with pytest.raises(UserError, match=r"model.transformer.blocks.0.q_proj.weight has shape \(3, 3\), expected \(64, 64\)"):
        load_model(folder)


def test_corrupt_safetensors(tmp_path):
    folder = write_checkpoint(tmp_path / "x", "dream")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(UserError, match="corrupt safetensors file"):
        load_model(folder)


def test_missing_shard(tmp_path):
    folder = write_checkpoint(tmp_path / "x", "dream", sharded=True)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="shard model-00002-of-00002.safetensors is missing"):
        load_model(folder)
