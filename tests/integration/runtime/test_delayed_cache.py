"""Cache mode ``delayed`` (block-causal models, W = 1): a committed position's KV is cached by the
first verify call after its commit, later calls feed only the newly committed and the masked
positions, and the block's held keys give way to its exact KV at the commit. Checked against a
reference decode written here from that definition, across batch shapes and backends."""
import numpy as np
import pytest

from dllm_deploy.errors import UserError
from dllm_deploy.runtime import canvas
from dllm_deploy.models.capabilities import bidirectional, block_causal, resolve_cache
from dllm_deploy.runtime.rules import Threshold

GEN = 64
PROMPTS = ["reverse: river stone cloud garden window light\n", "upper: cat\n",
           "count: 117 to 131\n", 'kv: {"abc": 4} abc\n']
RULE = {"strategy": "threshold", "threshold": 0.98, "threshold_far": 0.999, "threshold_lead": 0.7}


@pytest.fixture(scope="module")
def ort(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


def test_held_verify_feeds_fresh_then_masked_positions_per_row():
    M, PAD = 9, 8
    prefix = canvas.Prefix.of_prompts([[1, 2, 3], [4]], pad_id=PAD)                # row 1 left-padded
    held = np.array([[True, True], [True, False]])                                  # (B,E): row 1 held one key
    block = np.array([[5, M, 6, M], [7, 7, M, 5]])
    fresh = np.array([[False, False, True, False], [False, True, False, True]])      # row 0: 1 fresh, row 1: 2
    plan = canvas.held_verify(prefix, held, block, fresh, M, PAD)
    assert plan.keep == 2 and plan.cache == "reuse"                                 # F = 2 fresh slots, M = 2
    assert plan.ids.tolist() == [[6, PAD, M, M], [7, 5, M, PAD]]
    assert plan.positions.tolist() == [[5, 3, 4, 6], [2, 4, 3, 1]]                  # a pad sits at the block's start
    assert plan.read.tolist() == [[[0, 2, 0, 3]], [[0, 0, 2, 0]]]                   # masked positions' columns
    m = plan.mask[:, 0]                                                             # (B,T,P+E+T)
    assert m.shape == (2, 4, 3 + 2 + 4)
    assert m[0, 0].tolist() == [True] * 5 + [True, False, True, True]              # a real token: cache, real fed
    assert m[0, 1].tolist() == [False] * 5 + [False, True, False, False]           # a pad: itself only
    assert m[1, 0].tolist() == [False, False, True, True, False] + [True, True, True, False]


def reference(rt, prompt: str) -> list[int]:
    """The delayed decode of one prompt from its definition, on the backend's own calls."""
    be, c, L = rt.backend, rt.config, rt.config.block_size
    rule = Threshold(tau=RULE["threshold"], far=RULE["threshold_far"], lead=RULE["threshold_lead"])
    ids = np.array(rt.tokenizer.encode(prompt))
    p, cache, out = len(ids), be.new_cache(1, 0), []

    def call(x, pos, mask, keep):
        ti, tp = be.prefill(cache, x[None], pos[None], mask[None, None], keep)
        return ti[0, keep:, 0], tp[0, keep:, 0]

    mask = np.ones((p + L, p + L), dtype=bool)
    mask[:p, p:] = False                                                            # the prompt sees only itself
    f_ids, f_p = call(np.r_[ids, [c.mask_token_id] * L], np.arange(p + L), mask, p)
    base = p
    for k in range(GEN // L):
        block, held, step = np.full(L, c.mask_token_id), np.zeros(L, dtype=bool), 0
        while True:
            at = rule.positions(block, f_p, step, c.mask_token_id)
            block[at], step = f_ids[at], step + 1
            eos = np.flatnonzero(block == c.eos_token_id)
            ended = eos.size and not (block[:eos[0]] == c.mask_token_id).any()
            masked = np.flatnonzero(block == c.mask_token_id)
            if ended or not masked.size:
                break
            fresh = np.flatnonzero((block != c.mask_token_id) & ~held)
            feed = np.r_[fresh, masked]
            f = np.zeros(L, np.int64), np.zeros(L, np.float32)
            f[0][masked], f[1][masked] = call(block[feed], base + feed, np.ones((feed.size, cache.length + feed.size), bool),
                                              fresh.size)
            f_ids, f_p, held[fresh] = *f, True
        out += block.tolist()
        if ended or k == GEN // L - 1:
            return out[: len(out) - L + int(eos[0]) + 1] if ended else out
        cache.truncate(cache.length - int(held.sum()))                              # the held keys go
        mask = np.ones((2 * L, cache.length + 2 * L), dtype=bool)
        mask[:L, cache.length + L:] = False
        f_ids, f_p = call(np.r_[block, [c.mask_token_id] * L], base + np.arange(2 * L), mask, L)
        base += L


def test_delayed_decodes_as_its_definition(ort):
    for prompt in PROMPTS:
        r = ort.generate(prompt, cache="delayed", gen_length=GEN, **RULE)[0]
        assert r.token_ids == reference(ort, prompt), prompt


@pytest.mark.parametrize("strategy", ["threshold", "vanilla"])
def test_batched_rows_decode_as_they_do_alone(ort, strategy):
    """Rows of different prompt lengths and fresh/masked counts pad each other's calls."""
    kw = {**RULE, "strategy": strategy} if strategy == "threshold" else {"strategy": strategy}
    together = ort.generate(PROMPTS, cache="delayed", gen_length=GEN, **kw)
    for prompt, r in zip(PROMPTS, together):
        alone = ort.generate(prompt, cache="delayed", gen_length=GEN, **kw)[0]
        assert (r.token_ids, r.forwards) == (alone.token_ids, alone.forwards), prompt


def test_torch_and_onnx_runtime_agree(ort, tiny_runtime):
    for prompt in PROMPTS[:2]:
        a = ort.generate(prompt, cache="delayed", gen_length=GEN, **RULE)[0]
        b = tiny_runtime.generate(prompt, cache="delayed", gen_length=GEN, **RULE)[0]
        assert (a.token_ids, a.forwards) == (b.token_ids, b.forwards), prompt


def test_delayed_feeds_fewer_tokens_than_exact(ort):
    fed = {}
    for mode in ("exact", "delayed"):
        calls = []
        for name in ("prefill", "verify"):
            real = getattr(ort.backend, name)
            setattr(ort.backend, name, lambda *a, _real=real, **kw: calls.append(a[1].shape[1]) or _real(*a, **kw))
        try:
            ort.generate(PROMPTS[0], cache=mode, gen_length=GEN, **RULE)
        finally:
            for name in ("prefill", "verify"):
                delattr(ort.backend, name)
        fed[mode] = calls
    assert fed["delayed"][0] == fed["exact"][0]                  # the prompt's call is the same
    assert sum(fed["delayed"]) < sum(fed["exact"])
    assert max(fed["delayed"][1:]) <= 2 * ort.config.block_size


def test_delayed_needs_one_branch_and_a_block_causal_model(ort):
    with pytest.raises(UserError, match="beam width 1"):
        ort.generate(PROMPTS[1], strategy="spd", beam_width=2, cache="delayed", gen_length=GEN)
    assert resolve_cache("delayed", block_causal(), 1) == "delayed"
    with pytest.raises(UserError, match="needs a block-causal model"):
        resolve_cache("delayed", bidirectional(), 1)


def test_a_profiles_delayed_cache_gives_way_to_an_spd_tree(ort):
    """A tuned profile may pick cache delayed for its threshold rule; a call asking for spd at
    W > 1 then runs on the exact cache, and only an explicit cache delayed is refused."""
    import dataclasses
    saved = ort.profile
    ort.profile = dataclasses.replace(saved, decode={**saved.decode, "strategy": "threshold", "cache": "delayed"})
    try:
        assert ort.decode_config().cache == "delayed"
        assert ort.decode_config(strategy="spd", beam_width=4).cache == "auto"
        assert ort.decode_config(strategy="spd", beam_width=1).cache == "delayed"
        with pytest.raises(UserError, match="beam width 1"):
            ort.generate(PROMPTS[1], strategy="spd", beam_width=4, cache="delayed", gen_length=GEN)
    finally:
        ort.profile = saved
