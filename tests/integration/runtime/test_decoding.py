"""The decode loop on the bundled tiny model against independent reference implementations."""
import random

import numpy as np
import pytest
import torch

from dllm_deploy.evals import tasks
from dllm_deploy.runtime.api import decode_config

L = 32


def reference_decode(runtime, prompt: str, rule: str, tau: float = 0.9, gen_length: int = 128,
                     floor: float | None = None, far: float | None = None, lead: float | None = None) -> list[int]:
    """A straightforward full-recompute implementation: every step runs the model on
    [prompt | committed blocks | current block] under a block-causal mask and commits by the rule
    (LLaDA low-confidence remasking with one token per step, or Fast-dLLM's threshold; with
    ``floor``, the dynamic tau: tau * 0.97**step down to floor, tau again for the last 2 masked;
    with ``far``, positions left of the first masked one under its bar at tau, the others at ``far``;
    with ``lead``, the leftmost masked position's bar is min(lead, tau))."""
    model, cfg, tok = runtime.backend.model, runtime.config, runtime.tokenizer
    prompt_ids = tok.encode(prompt)
    out: list[int] = []
    for _ in range(gen_length // L):
        block = [cfg.mask_token_id] * L
        step = -1
        while cfg.mask_token_id in block:
            step += 1
            seq = prompt_ids + out + block
            blocks = np.array([0] * len(prompt_ids) + [1 + i // L for i in range(len(out) + L)])
            mask = torch.tensor(blocks[None, :] <= blocks[:, None])[None, None]
            with torch.no_grad():
                logits, _ = model(torch.tensor([seq]), torch.arange(len(seq))[None], mask)
            probs = torch.softmax(logits[0, -L:].float(), -1)
            conf, pred = probs.max(-1)
            masked = [i for i in range(L) if block[i] == cfg.mask_token_id]
            order = sorted(masked, key=lambda i: (-conf[i].item(), i))
            if rule == "vanilla":
                chosen = order[:1]
            else:
                t = tau if floor is None or len(masked) <= 2 else max(floor, tau * 0.97 ** step)
                near = {i: t for i in masked}
                if lead is not None:
                    near[masked[0]] = min(lead, t)
                gap = next((i for i in masked if conf[i].item() < near[i]), L)
                bar = {i: near[i] if far is None or i < gap else max(far, t) for i in masked}
                chosen = [i for i in order if conf[i].item() >= bar[i]] or order[:1]
            for i in chosen:
                block[i] = int(pred[i])
            if cfg.eos_token_id in block:
                e = block.index(cfg.eos_token_id)
                if cfg.mask_token_id not in block[:e]:
                    return out + block[:e + 1]
        out += block
    return out


def _prompts(n_per_family=2):
    ex = tasks.eval_split(families=tasks.FAMILIES, n=n_per_family)
    return [e.prompt for e in ex]


def test_vanilla_equals_reference(tiny_runtime):
    for p in _prompts(1):
        got = tiny_runtime.generate(p, strategy="vanilla", gen_length=128)[0].token_ids
        assert got == reference_decode(tiny_runtime, p, "vanilla"), p


def test_threshold_equals_reference(tiny_runtime):
    for p in _prompts(1):
        got = tiny_runtime.generate(p, strategy="threshold", threshold=0.9, gen_length=128)[0].token_ids
        assert got == reference_decode(tiny_runtime, p, "threshold", tau=0.9), p


def test_dynamic_threshold_equals_reference_and_lossless_spd_keeps_it(tiny_runtime):
    prompts = _prompts(1)[::2]
    dyn = tiny_runtime.generate(prompts, strategy="threshold", threshold=0.95, threshold_floor=0.6, gen_length=128)
    fixed = tiny_runtime.generate(prompts, strategy="threshold", threshold=0.95, gen_length=128)
    for p, r in zip(prompts, dyn):
        assert r.token_ids == reference_decode(tiny_runtime, p, "threshold", tau=0.95, floor=0.6), p
    assert sum(r.forwards for r in dyn) < sum(r.forwards for r in fixed)     # the lower middle commits more per step
    spd = tiny_runtime.generate(prompts, strategy="spd", base="threshold", threshold=0.95, threshold_floor=0.6,
                                beam_width=4, gen_length=128)
    assert [s.token_ids for s in spd] == [r.token_ids for r in dyn]


def test_far_threshold_equals_reference_and_lossless_spd_keeps_it(tiny_runtime):
    prompts = _prompts(1)[1::2]
    far = tiny_runtime.generate(prompts, strategy="threshold", threshold=0.8, threshold_far=0.999, gen_length=128)
    plain = tiny_runtime.generate(prompts, strategy="threshold", threshold=0.8, gen_length=128)
    for p, r in zip(prompts, far):
        assert r.token_ids == reference_decode(tiny_runtime, p, "threshold", tau=0.8, far=0.999), p
    assert sum(r.forwards for r in far) > sum(r.forwards for r in plain)     # positions past a gap wait
    spd = tiny_runtime.generate(prompts, strategy="spd", base="threshold", threshold=0.8, threshold_far=0.999,
                                beam_width=4, gen_length=128)
    assert [s.token_ids for s in spd] == [r.token_ids for r in far]


def test_lead_threshold_equals_reference_and_lossless_spd_keeps_it(tiny_runtime):
    prompts = _prompts(1)[::2]
    kw = {"strategy": "threshold", "threshold": 0.98, "threshold_far": 0.999, "gen_length": 128}
    lead = tiny_runtime.generate(prompts, threshold_lead=0.7, **kw)
    plain = tiny_runtime.generate(prompts, **kw)
    for p, r in zip(prompts, lead):
        assert r.token_ids == reference_decode(tiny_runtime, p, "threshold", tau=0.98, far=0.999, lead=0.7), p
    assert sum(r.forwards for r in lead) < sum(r.forwards for r in plain)     # the leftmost commits sooner
    spd = tiny_runtime.generate(prompts, base="threshold", beam_width=4, threshold_lead=0.7,
                                **{**kw, "strategy": "spd"})
    assert [s.token_ids for s in spd] == [r.token_ids for r in lead]


def test_cache_none_equals_exact(tiny_runtime):
    p = _prompts(1)[:3]
    a = tiny_runtime.generate(p, strategy="vanilla", cache="none")
    b = tiny_runtime.generate(p, strategy="vanilla", cache="exact")
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.forwards for r in a] == [r.forwards for r in b]


@pytest.fixture(scope="module")
def vanilla_base(tiny_runtime):
    prompts = _prompts(1)        # one of each family (test_spd_lossless_property_random_prompts adds random ones)
    return prompts, tiny_runtime.generate(prompts, strategy="vanilla")


@pytest.mark.parametrize("tree, width", [("chain", 2), ("chain", 8), ("binary", 4), ("wide", 6), ("fork", 8)])
def test_spd_lossless_equals_vanilla(tiny_runtime, vanilla_base, tree, width):
    prompts, base = vanilla_base
    spd = tiny_runtime.generate(prompts, strategy="spd", beam_width=width, tree=tree, select="lossless", base="vanilla")
    for b, s in zip(base, spd):
        assert s.token_ids == b.token_ids
        assert s.forwards <= b.forwards
        assert s.beam_width_used == width


@pytest.mark.parametrize("tau", [0.7, 0.9])
def test_spd_lossless_equals_threshold(tiny_runtime, tau):
    prompts = _prompts(2)
    base = tiny_runtime.generate(prompts, strategy="threshold", threshold=tau)
    spd = tiny_runtime.generate(prompts, strategy="spd", beam_width=4, tree="wide", base="threshold", threshold=tau)
    assert [s.token_ids for s in spd] == [b.token_ids for b in base]


def test_spd_lossless_property_random_prompts(tiny_runtime):
    """Random prompts (random bytes in random task frames): lossless SPD == its base, always."""
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 =,;:"
    prompts = []
    for _ in range(8):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        prompts.append(f"{rng.choice(tasks.FAMILIES + ('zzz',))}: {body}\n")
    for base, kw in (("vanilla", {}), ("threshold", {"threshold": 0.8})):
        ref = tiny_runtime.generate(prompts, strategy=base, gen_length=96, **kw)
        got = tiny_runtime.generate(prompts, strategy="spd", beam_width=rng.choice([2, 3, 5]), base=base,
                                    tree=rng.choice(["chain", "binary", "wide", "fork"]), gen_length=96, **kw)
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]


def test_batch_equals_one_by_one(tiny_runtime):
    prompts = _prompts(1)
    together = tiny_runtime.generate(prompts, strategy="spd", beam_width=4)
    alone = [tiny_runtime.generate(p, strategy="spd", beam_width=4)[0] for p in prompts]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    # drafts come from stale confidences; a float-noise swap of near-equal ones may change a draft
    assert all(abs(x.forwards - y.forwards) <= 2 for x, y in zip(together, alone))


def test_counters_are_consistent(tiny_runtime):
    r = tiny_runtime.generate(_prompts(1)[0], strategy="spd", beam_width=4)[0]
    assert r.tokens == len(r.token_ids)
    assert r.tpf == pytest.approx(r.tokens / r.forwards)
    # every verification forward shows up in the histogram; prefill and commits do not
    assert sum(r.accepted_hist.values()) < r.forwards
    if r.finished:
        assert r.token_ids[-1] == tiny_runtime.config.eos_token_id


def test_spd_threshold_mode_runs_and_is_reported(tiny_runtime):
    r = tiny_runtime.generate(_prompts(1)[:2], strategy="spd", select="threshold", beam_width=4)
    assert all(x.tokens > 0 and x.forwards > 0 for x in r)


def test_beam_width_cap_is_reported(tiny_runtime):
    from dllm_deploy.runtime.loop import Decoder
    capped = Decoder(tiny_runtime.backend, tiny_runtime.tokenizer, tiny_runtime.config, max_beam_width=2)
    with pytest.warns(UserWarning, match="beam width 8 lowered to 2"):
        r = capped.generate([_prompts(1)[0]], decode_config(strategy="spd", beam_width=8))[0]
    assert r.beam_width_used == 2 and r.beam_width_requested == 8


def test_generate_takes_a_resolved_config_or_keywords_not_both(tiny_runtime):
    """The one decode surface: the CLI, bench and eval pass a DecodeConfig they resolved once."""
    from dllm_deploy import UserError
    cfg = tiny_runtime.decode_config(strategy="threshold", gen_length=32)
    chunks: list = []
    a = tiny_runtime.generate("upper: ab\n", config=cfg, on_chunk=chunks.append)[0]
    b = tiny_runtime.generate("upper: ab\n", strategy="threshold", gen_length=32)[0]
    assert a.token_ids == b.token_ids and "".join(c["delta"] for c in chunks) == a.text and a.text
    with pytest.raises(UserError, match="as keywords or as config=, not both"):
        tiny_runtime.generate("upper: ab\n", config=cfg, strategy="vanilla")
