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
import torch.nn.functional as F

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


# ---- LLaDA 2.x and LLaDA-MoE: an independent reference written from SGLang's llada2.py and the
# LLaDA-MoE modeling code, over the checkpoint's own tensors (so the name tables are checked too)

def _rms(x, w, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, rot, theta):
    """Rotate-half RoPE on the first ``rot`` dims of each head (B,T,H,D); the rest pass."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)
    ang = pos.float()[..., None] * inv                                     # (B,T,rot/2)
    cos, sin = torch.cat([ang, ang], -1).cos()[:, :, None], torch.cat([ang, ang], -1).sin()[:, :, None]
    r, rest = x[..., :rot], x[..., rot:]
    half = torch.cat([-r[..., rot // 2:], r[..., :rot // 2]], -1)
    return torch.cat([r * cos + half * sin, rest], -1)


def _swiglu(x, w, prefix):
    return F.linear(F.silu(F.linear(x, w[f"{prefix}.gate_proj.weight"])) * F.linear(x, w[f"{prefix}.up_proj.weight"]),
                    w[f"{prefix}.down_proj.weight"])


def _route(raw, logits, bias):
    """(weights, ids) per token, SGLang's biased grouped top-k (sigmoid) or LLaDA-MoE's softmax."""
    k, out = raw["num_experts_per_tok"], []
    for row in logits:
        if raw.get("score_function") == "sigmoid":
            s = torch.sigmoid(row)
            choice = s + bias
            g = choice.view(raw["n_group"], -1)
            best_groups = g.topk(2, -1).values.sum(-1).topk(raw["topk_group"]).indices.tolist()
            allowed = [e for e in range(len(row)) if e // g.shape[1] in best_groups]
            ids = sorted(allowed, key=lambda e: -float(choice[e]))[:k]
            w = s[ids] / (s[ids].sum() + 1e-20) * raw["routed_scaling_factor"]
        else:
            p = torch.softmax(row, -1)
            ids = p.topk(k).indices.tolist()
            w = p[ids]
        out.append((w, ids))
    return out


def reference_forward(raw, w, ids, pos, mask):
    """logits (B,T,V) of a LLaDA 2.x (names of SGLang's loader) or LLaDA-MoE (OLMoE names) checkpoint."""
    llada2 = raw["model_type"] == "llada2_moe"
    h, hkv = raw["num_attention_heads"], raw["num_key_value_heads"]
    d = raw.get("head_dim") or raw["hidden_size"] // h
    rot = int(d * raw.get("partial_rotary_factor", 1.0))
    eps = raw.get("rms_norm_eps", 1e-6 if llada2 else 1e-5)
    x = w["model.word_embeddings.weight" if llada2 else "model.embed_tokens.weight"][ids]
    b, t, _ = x.shape
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}"
        a = _rms(x, w[f"{p}.input_layernorm.weight"], eps)
        if llada2:
            q, k, v = F.linear(a, w[f"{p}.attention.query_key_value.weight"]).split([h * d, hkv * d, hkv * d], -1)
            qn, kn, on = f"{p}.attention.query_layernorm.weight", f"{p}.attention.key_layernorm.weight", f"{p}.attention.dense.weight"
        else:
            q, k, v = (F.linear(a, w[f"{p}.self_attn.{n}_proj.weight"]) for n in "qkv")
            qn, kn, on = f"{p}.self_attn.q_norm.weight", f"{p}.self_attn.k_norm.weight", f"{p}.self_attn.o_proj.weight"
        q, k, v = q.view(b, t, h, d), k.view(b, t, hkv, d), v.view(b, t, hkv, d)
        q, k = _rope(_rms(q, w[qn], eps), pos, rot, raw["rope_theta"]), _rope(_rms(k, w[kn], eps), pos, rot, raw["rope_theta"])
        k, v = k.repeat_interleave(h // hkv, 2), v.repeat_interleave(h // hkv, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d ** 0.5
        att = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        x = x + F.linear(torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, h * d), w[on])
        m = _rms(x, w[f"{p}.post_attention_layernorm.weight"], eps)
        if llada2 and i < raw["first_k_dense_replace"]:
            x = x + _swiglu(m, w, f"{p}.mlp")
            continue
        flat = m.reshape(-1, m.shape[-1])
        routes = _route(raw, F.linear(flat.float(), w[f"{p}.mlp.gate.weight"].float()), w.get(f"{p}.mlp.gate.expert_bias"))
        y = torch.stack([sum(wt * _swiglu(row, w, f"{p}.mlp.experts.{e}") for wt, e in zip(ws, es))
                         for row, (ws, es) in zip(flat, routes)])
        if llada2:
            y = y + _swiglu(flat, w, f"{p}.mlp.shared_experts")
        x = x + y.reshape(m.shape)
    return F.linear(_rms(x, w["model.norm.weight"], eps), w["lm_head.weight"])


@pytest.mark.parametrize("family", ["llada2", "llada_moe"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llada_moe_layouts_match_the_reference(tmp_path, family, impl):
    from safetensors.torch import load_file
    raw = MOE_CONFIGS[family]
    folder = write_random_checkpoint(tmp_path / family, raw)
    model, cfg = load_model(folder, attention=impl)
    assert cfg.layout == family
    t = 3 * cfg.block_size if cfg.attention == "block_causal" else 20
    ids = torch.randint(0, cfg.vocab_size - 2, (2, t), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(t)[None].repeat(2, 1)
    mask = _block_causal(t, cfg.block_size) if cfg.attention == "block_causal" else torch.ones(2, 1, t, t, dtype=torch.bool)
    with torch.no_grad():
        got, _ = model(ids, pos, mask)
        want = reference_forward(raw, load_file(str(folder / "model.safetensors")), ids, pos, mask)
    assert float((got - want).abs().max()) <= 1e-4
    assert float(want.std()) > 0.1


def test_llada2_router_chooses_the_experts_transformers_deepseek_v3_gate_chooses(tmp_path):
    """The sigmoid + bias + group-limited router against transformers' DeepSeek-V3 gate, which
    computes the same routing: the same experts at every position, the same weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    raw = MOE_CONFIGS["llada2"]
    model, cfg = load_model(write_random_checkpoint(tmp_path / "m", raw))
    ours = model.model.layers[1].mlp.gate
    ref = DeepseekV3TopkRouter(DeepseekV3Config(
        hidden_size=cfg.hidden_size, n_routed_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
        n_group=cfg.router_groups, topk_group=cfg.router_topk_groups, norm_topk_prob=True,
        routed_scaling_factor=cfg.routing_scale))
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        ref.e_score_correction_bias.copy_(ours.expert_bias)
        x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
        w, ids = ours(x)
        _, rw, rid = ref(x)
    order, rorder = ids.argsort(-1), rid.argsort(-1)
    assert torch.equal(ids.gather(-1, order), rid.gather(-1, rorder))
    assert torch.allclose(w.gather(-1, order), rw.gather(-1, rorder), atol=1e-6)
    assert len(set(ids[:, 0].tolist())) > 2                     # the routing varies by token


def test_llada_moe_is_found_by_architecture_although_its_model_type_is_llada():
    from dllm_deploy.models.registry import family_for
    assert family_for(MOE_CONFIGS["llada_moe"]).name == "llada_moe"
    assert family_for({**MOE_CONFIGS["llada_moe"], "architectures": ["LLaDAModelLM"]}).name == "llada"


@pytest.mark.parametrize("family", ["llada2", "sdar_moe"])
def test_int8_smoothing_keeps_a_moe_models_function_and_routing(tmp_path, family):
    """One scale per MoE layer input for every expert, the shared experts and the router (they all
    read the same norm), one per expert for its down-projection: the logits and the experts chosen
    are unchanged."""
    from dllm_deploy.export.smooth import input_ranges, smooth_
    from dllm_deploy.models.tokenizer import ByteTokenizer
    model, cfg = load_model(write_random_checkpoint(tmp_path / "m", MOE_CONFIGS[family]), attention="eager")
    t = 2 * cfg.block_size
    ids = torch.randint(0, cfg.vocab_size - 2, (1, t), generator=torch.Generator().manual_seed(3))
    args = (ids, torch.arange(t)[None], _block_causal(t, cfg.block_size, 1))
    x = torch.randn(30, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    gate = model.model.layers[-1].mlp.gate
    with torch.no_grad():
        before, (_, chosen) = model(*args)[0], gate(x * model.model.layers[-1].post_attention_layernorm.weight)
    texts = [("count: from 3 by 4", "3 7 11"), ("upper: abc", "ABC")]
    done = smooth_(model, cfg, input_ranges(model, cfg, ByteTokenizer(), texts, cfg.block_size))
    assert f"model.layers.{cfg.num_layers - 1}.mlp.down_proj" in done
    with torch.no_grad():
        after, (_, again) = model(*args)[0], gate(x * model.model.layers[-1].post_attention_layernorm.weight)
    assert torch.allclose(before, after, atol=1e-4, rtol=1e-4)
    assert torch.equal(chosen, again)
