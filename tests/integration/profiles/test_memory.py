import sys
from pathlib import Path

import pytest

from dllm_deploy.bench.memory import measure_peak_bytes
from dllm_deploy.training.train import tiny_config
from dllm_deploy.profiles.memory import RESIDENCY, beam_width_cap, estimate_bytes, param_count

TINY = tiny_config().to_dict()


def test_param_count_matches_the_module():
    from dllm_deploy.models.transformer import DLLM
    cfg = tiny_config()
    assert param_count(TINY) == sum(p.numel() for p in DLLM(cfg).parameters())


def test_param_count_and_kv_follow_each_layers_shape():
    """The out-of-tree toy family (tests/plugins/toy_family.py): odd layers have one KV head; the
    memory model reads the artifact's kv_shapes, so it counts the module's parameters and its cache."""
    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.profiles.memory import kv_bytes_per_token
    from tests.plugins import toy_family
    cfg = DLLMConfig.from_hf(toy_family.CONFIG)
    facts = {**cfg.to_dict(), "kv_shapes": [list(x) for x in toy_family.kv_shapes(cfg)]}
    assert param_count(facts) == sum(p.numel() for p in toy_family.build(cfg).parameters())
    assert param_count(facts) < param_count(cfg.to_dict())              # the uniform formula over-counts
    assert kv_bytes_per_token(facts) == 2 * (2 + 1 + 2 + 1) * 16 * 4     # K and V, Hkv per layer, D, fp32


def test_estimate_hand_computed():
    cfg = {"hidden_size": 8, "intermediate_size": 16, "vocab_size": 10, "num_layers": 1, "num_heads": 2,
           "num_kv_heads": 1, "head_dim": 4, "max_seq": 100}
    kv_tok = 2 * 1 * 1 * 4 * 4                                          # K and V, layers, Hkv, D, fp32

    def tok(s):                                                         # per new token attending s keys
        return s * 2 * 4 * 2 + (4 * 8 + 3 * 16) * 4 + 10 * (4 + 4)

    # one measured configuration: P = 20 cached, W = 2 branches of L = 4
    e = estimate_bytes(cfg, "fp32", batch=1, beam_width=2, block_length=4, prefix_len=20)
    assert e["weights"] == 2 * param_count(cfg) * 4                     # prefill + verify sessions, one copy each
    assert e["kv"] == 20 * kv_tok
    assert e["prefill"] == 20 * (tok(20) + 10 * 4 + kv_tok)             # prefill of the 20-token prefix
    assert e["activations"] == 2 * 8 * tok(20 + 8)                      # arena + memory pattern: twice the live set
    assert e["total"] == e["weights"] + e["kv"] + e["prefill"] + e["activations"]
    # the worst case under max_seq: the last block verified over P = max_seq - L, prefill of max_seq
    w = estimate_bytes(cfg, "fp32", 1, 2, 4, max_seq=100)
    assert w["prefix_len"] == 96 and w["kv"] == 96 * kv_tok and w["prefill"] == 100 * (tok(100) + 40 + kv_tok)
    # TensorRT: activations once (the context's memory), weights still in two engines
    t = estimate_bytes(cfg, "fp32", 1, 2, 4, prefix_len=20, backend="trt")
    assert t["activations"] * RESIDENCY["ort"]["verify"] == e["activations"] and t["weights"] == e["weights"]


def test_estimate_grows_with_width_and_cap_respects_budget():
    totals = [estimate_bytes(TINY, beam_width=w)["total"] for w in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals) and totals[0] < totals[-1]
    budget_for_4 = estimate_bytes(TINY, beam_width=4)["total"]
    cap = beam_width_cap(TINY, free_bytes=int(2 * (budget_for_4 + 512 * 2**20)) + 1, fraction=0.5, reserve_mb=512)
    assert cap == 4
    assert beam_width_cap(TINY, free_bytes=10**13, limit=16) == 16
    assert beam_width_cap(TINY, free_bytes=0) == 1


@pytest.mark.parametrize("prec", ["fp32", "fp16", "int8"])
def test_lower_precision_is_smaller(prec):
    assert estimate_bytes(TINY, prec)["weights"] <= estimate_bytes(TINY, "fp32")["weights"]
    assert estimate_bytes(TINY, prec)["total"] <= estimate_bytes(TINY, "fp32")["total"]


@pytest.fixture(scope="module")
def small_artifact(tmp_path_factory):
    """A 2-layer random block-causal model exported with W up to 8 (about 10 s)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from dllm_deploy.export.exporter import export
    from tests.conftest import write_checkpoint
    root = tmp_path_factory.mktemp("mem")
    ck = write_checkpoint(root / "ck", "block_causal")
    export(str(ck), root / "art", max_beam_width=8, log=lambda m: None)
    return root / "art"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_measured_peak_grows_with_width_as_the_estimate_says(small_artifact):
    one = measure_peak_bytes(small_artifact, beam_width=1, prefix_len=64, block_length=32, runs=2)
    eight = measure_peak_bytes(small_artifact, beam_width=8, prefix_len=64, block_length=32, runs=2)
    assert eight["peak_bytes"] > one["peak_bytes"] + 2 * 2**20          # W=8 verifies 8x the tokens
    assert 0 < one["loaded_bytes"] <= one["prefill_peak_bytes"] <= one["peak_bytes"]
    assert {"baseline_bytes", "ratio", "estimate", "beam_width", "prefix_len", "block_length"} <= set(eight)
    # the W-dependent part of the model against the measured growth (runtime constants cancel);
    # the +-25 % table of totals is docs/profiles.md, regenerated by lab/memory_table.py
    grew = eight["peak_bytes"] - one["peak_bytes"]
    predicted = eight["estimate"]["total"] - one["estimate"]["total"]
    assert 0.5 < grew / predicted < 1.5


def test_a_mixture_counts_every_expert_and_its_active_set(tmp_path):
    """param_count is the module's for the MoE families (router, experts, shared experts, q/k norms,
    router bias); the per-token activations grow with the active set (k experts), not with E."""
    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.models.registry import get_family
    from dllm_deploy.profiles.memory import mlp_width, weight_bytes
    from tests.conftest import MOE_CONFIGS
    for raw in MOE_CONFIGS.values():
        cfg = DLLMConfig.from_hf(raw)
        assert param_count(cfg.to_dict()) == sum(p.numel() for p in get_family(cfg.layout).build(cfg).parameters())
    cfg = DLLMConfig.from_hf(MOE_CONFIGS["llada2"]).to_dict()
    assert mlp_width(cfg) == max(96, 2 * 32 + 32)
    more = {**cfg, "num_experts": 64}
    assert param_count(more) > param_count(cfg) and mlp_width(more) == mlp_width(cfg)
    assert estimate_bytes(more)["activations"] == estimate_bytes(cfg)["activations"]
    assert weight_bytes(cfg, "int4") < weight_bytes(cfg, "int8") < weight_bytes(cfg, "fp32")
