import pytest

from dllm_deploy.models.train import tiny_config
from dllm_deploy.profiles.memory import beam_width_cap, estimate_bytes, param_count

TINY = tiny_config().to_dict()


def test_param_count_matches_the_module():
    from dllm_deploy.models.transformer import DLLM
    cfg = tiny_config()
    assert param_count(TINY) == sum(p.numel() for p in DLLM(cfg).parameters())


def test_estimate_hand_computed():
    cfg = {"hidden_size": 8, "intermediate_size": 16, "vocab_size": 10, "num_layers": 1, "num_heads": 2,
           "num_kv_heads": 1, "head_dim": 4, "max_seq": 100}
    e = estimate_bytes(cfg, "fp32", batch=1, beam_width=2, block_length=4, max_seq=100)
    assert e["kv"] == 100 * 2 * 1 * 1 * 4 * 4
    assert e["activations"] == 8 * (100 * 2 * 4 * 2 + (4 * 8 + 3 * 16) * 4 + 10 * 4 * 2)
    assert e["total"] == e["weights"] + e["kv"] + e["activations"]


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
