"""Seeded sampling (docs/algorithms.md, "Sampling"): reproducible by seed across runs and batch
shapes, greedy at temperature 0, lossless SPD still the base rule's exact tokens, torch == ONNX
Runtime, schema-2 artifacts refused in one line, and the graph's sampler draws the tempered,
filtered distribution.

torch vs ONNX Runtime "within float noise": both run models/sampling.py on the same uniforms, so a
choice can differ only where a uniform falls within the two backends' float difference (~1e-6) of
a CDF boundary: a chance of about 1e-5 per sampled position. The tests ask for identical tokens
on whole decodes (hundreds of sampled positions) and identical choices on every position of one
call.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dllm_deploy import Runtime, UserError
from dllm_deploy.evals import tasks
from dllm_deploy.runtime.noise import uniforms
from dllm_deploy.runtime.rows import RowOptions

SAMPLE = {"temperature": 0.7, "top_p": 0.9}
HOT = {"temperature": 2.0}     # the tiny model is confident: at 0.7 / top-p 0.9 (and at 1.5 on most prompts) its top-1
PROMPTS = [e.prompt for e in tasks.eval_split(families=tasks.FAMILIES, n=1)]
GEN = 64


@pytest.fixture(scope="module")
def ort_rt(tiny_artifact):
    return Runtime.load(artifact=str(tiny_artifact[0]), precision="fp32", profile="generic-cpu")


def ids(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def test_same_seed_same_tokens_across_runs_and_batches(ort_rt):
    rows = [RowOptions(seed=s, **HOT) for s in (4, 5, 6)]
    batch = ort_rt.generate(PROMPTS[:3], rows=rows, gen_length=96)
    assert any(r.finished and r.tokens < 64 for r in batch), "a row should leave the batch early"
    assert ids(ort_rt.generate(PROMPTS[:3], rows=rows, gen_length=96)) == ids(batch)
    for p, row, r in zip(PROMPTS[:3], rows, batch):     # alone == inside a batch of 3 (rows leave it)
        assert ort_rt.generate(p, rows=[row], gen_length=96)[0].token_ids == r.token_ids
    # the decode keywords give every row the same options
    assert ort_rt.generate(PROMPTS[1], seed=5, gen_length=96, **HOT)[0].token_ids == batch[1].token_ids


def test_different_seeds_differ_and_temperature_0_is_greedy(ort_rt):
    greedy = ids(ort_rt.generate(PROMPTS, gen_length=GEN))
    by_seed = [ids(ort_rt.generate(PROMPTS, seed=s, gen_length=GEN, **HOT)) for s in (0, 1, 2)]
    differ = sum(len({tuple(x[i]) for x in by_seed}) > 1 for i in range(len(PROMPTS)))
    assert differ >= 2, differ          # a confident model: on some prompts every seed agrees
    assert any(s != greedy for s in by_seed)
    assert ids(ort_rt.generate(PROMPTS, seed=9, top_k=3, top_p=0.5, temperature=0, gen_length=GEN)) == greedy
    mixed = ort_rt.generate(PROMPTS[:2], rows=[RowOptions(), RowOptions(seed=1, **HOT)], gen_length=GEN)
    assert ids(mixed) == [greedy[0], by_seed[1][1]]


@pytest.mark.parametrize("base", ["vanilla", "threshold"])
def test_lossless_spd_returns_the_base_rules_tokens_under_sampling(ort_rt, tiny_runtime, base):
    greedy = ids(ort_rt.generate(PROMPTS, strategy=base, gen_length=GEN))
    spd_forwards = base_forwards = 0
    for seed, opts in ((0, SAMPLE), (1, SAMPLE), (0, HOT)):
        want = ort_rt.generate(PROMPTS, strategy=base, seed=seed, gen_length=GEN, **opts)
        got = ort_rt.generate(PROMPTS, strategy="spd", base=base, beam_width=4, seed=seed, gen_length=GEN, **opts)
        assert ids(got) == ids(want), (base, seed, opts)
        # a verified draft only ever saves forwards; how many depends on the model and the prompts
        assert sum(r.forwards for r in got) <= sum(r.forwards for r in want), (base, seed, opts)
        spd_forwards += sum(r.forwards for r in got)
        base_forwards += sum(r.forwards for r in want)
    assert spd_forwards < base_forwards
    assert ids(want) != greedy          # HOT: sampled, not the greedy tokens
    for p in PROMPTS[:2]:       # torch too
        want = tiny_runtime.generate(p, strategy=base, seed=3, gen_length=GEN, **HOT)[0].token_ids
        assert tiny_runtime.generate(p, strategy="spd", base=base, beam_width=4, seed=3, gen_length=GEN,
                                     **HOT)[0].token_ids == want


def test_torch_and_onnx_runtime_sample_alike(ort_rt, tiny_runtime):
    for strategy in ("vanilla", "threshold"):
        kw = {"strategy": strategy, "seed": 11, "top_k": 20, "gen_length": GEN, **HOT}
        assert ids(tiny_runtime.generate(PROMPTS[:4], **kw)) == ids(ort_rt.generate(PROMPTS[:4], **kw)), strategy
    # one call, every position: the same uniforms choose the same ids in both backends
    b, t = 2, 48
    rng = np.random.default_rng(0)
    args = (rng.integers(0, 256, (b, t)), np.tile(np.arange(t), (b, 1)), np.ones((b, 1, t, t), dtype=bool))
    sampling = {"sample_u": uniforms(1, 0, args[1], 0), "temperature": np.array([0.7, 1.5], dtype=np.float32),
                "top_k": np.array([0, 30]), "top_p": np.array([0.9, 1.0], dtype=np.float32)}
    got = [be.verify(be.new_cache(b, 0), *args, sampling) for be in (tiny_runtime.backend, ort_rt.backend)]
    assert np.array_equal(got[0][0], got[1][0])
    assert np.allclose(got[0][1], got[1][1], atol=1e-4)


def test_top_k_over_the_pool_is_refused(ort_rt, tiny_runtime):
    assert ort_rt.backend.sample_pool == 64 == tiny_runtime.backend.sample_pool
    with pytest.raises(UserError, match=r"top k 65 is over the 64 tokens .* samples from \(its sampling pool"):
        ort_rt.generate(PROMPTS[0], temperature=0.7, top_k=65)
    assert ort_rt.generate(PROMPTS[0], temperature=0.7, top_k=64, gen_length=8)[0].tokens > 0


def test_the_sampler_draws_the_tempered_filtered_distribution():
    """Many real noise uniforms through models/sampling.py on one logits row: the frequencies of
    the choices match softmax(log p / T) over the pool's top-k, cut at top-p, renormalised."""
    import torch

    from dllm_deploy.models.sampling import sample
    n, v, pool = 200_000, 50, 16
    logits = torch.linspace(3.0, -3.0, v)[torch.randperm(v, generator=torch.Generator().manual_seed(0))]
    logits[7] = float("-inf")                                   # an excluded id never comes out
    probs = logits.softmax(-1).double().numpy()
    u = torch.from_numpy(uniforms(5, 0, np.arange(n), 0))[None]
    for temp, top_k, top_p in [(0.7, 0, 0.9), (1.0, 5, 1.0), (2.0, 12, 0.6)]:
        out_i, out_p = sample(logits.expand(1, n, v), u, torch.tensor([temp]), torch.tensor([top_k]),
                              torch.tensor([top_p]), pool=pool, k=3)
        order = np.argsort(-probs, kind="stable")[:pool]
        q = np.exp(np.log(probs[order]) / temp)
        q /= q.sum()
        keep = (np.arange(pool) < (top_k or pool)) & (np.cumsum(q) - q < top_p)
        want = np.zeros(v)
        want[order] = np.where(keep, q, 0) / (q * keep).sum()
        freq = np.bincount(out_i[0, :, 0].numpy(), minlength=v) / n
        tol = 5 * np.sqrt(want * (1 - want) / n) + 1e-9
        assert (np.abs(freq - want) <= tol).all(), (temp, top_k, top_p, np.abs(freq - want).max())
        assert freq[want == 0].sum() == 0 and freq[7] == 0
        # slot 0: the choice at its temperature-1 probability; then the pool in order without it
        assert np.allclose(out_p[0, :, 0].numpy(), probs[out_i[0, :, 0].numpy()], rtol=1e-5)
        cand = np.broadcast_to(order[:3], (n, 3))
        not_chosen = cand != out_i[0, :, 0:1].numpy()
        first_two = np.take_along_axis(cand, np.argsort(~not_chosen, axis=1, kind="stable")[:, :2], axis=1)
        assert np.array_equal(out_i[0, :, 1:].numpy(), first_two)
    greedy = sample(logits.expand(1, 4, v), u[:, :4], torch.zeros(1), torch.zeros(1, dtype=torch.int64),
                    torch.ones(1), pool=pool, k=3)
    top_p_, top_i_ = logits.softmax(-1).topk(3)
    assert torch.equal(greedy[0][0, 0], top_i_) and torch.equal(greedy[1][0, 0], top_p_)


def test_export_sample_pool(tmp_path):
    from dllm_deploy.export.exporter import export
    from tests.conftest import write_checkpoint
    ckpt = write_checkpoint(tmp_path / "ckpt", "llada")
    with pytest.raises(UserError, match=r"--sample-pool must be an integer in \[2, 300\]"):
        export(ckpt, tmp_path / "bad", sample_pool=301, log=lambda m: None)
    art = export(ckpt, tmp_path / "art", sample_pool=8, max_beam_width=2, log=lambda m: None)["artifact"]
    m = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert m["schema_version"] == 4 and m["sampling"] == {"pool": 8, "noise": "philox4x64-10/v1"}
    assert m["graphs"]["verify"]["inputs"][-4:] == ["sample_u", "temperature", "top_k", "top_p"]
    rt = Runtime.load(artifact=art, profile="generic-cpu")
    with pytest.raises(UserError, match="top k 9 is over the 8 tokens"):
        rt.generate("5 6", temperature=0.5, top_k=9)
    a, b = (rt.generate("5 6", temperature=1.0, top_k=8, seed=2, gen_length=16)[0].token_ids for _ in range(2))
    assert a == b and len(a) > 0
