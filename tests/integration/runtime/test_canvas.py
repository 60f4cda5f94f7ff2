"""Bidirectional models (LLaDA, Dream): the canvas [prefix | block | suffix of masks] and the
cache modes none (LLaDA's generate), prefix and dual (Fast-dLLM's caches).

The bundled tiny model's weights are run here under bidirectional attention: a real, peaked
model (random weights would make near-ties everywhere), with the loop's bidirectional path."""
import dataclasses

import pytest
import torch

from dllm_deploy.evals import tasks
from dllm_deploy.models.capabilities import bidirectional
from dllm_deploy.runtime.api import decode_config
from dllm_deploy.runtime.loop import Decoder

L, GEN = 32, 96


@pytest.fixture(scope="module")
def bidi(tiny_runtime):
    cfg = dataclasses.replace(tiny_runtime.config, attention="bidirectional")
    return Decoder(tiny_runtime.backend, tiny_runtime.tokenizer, cfg, capabilities=bidirectional()), tiny_runtime


def llada_generate(runtime, cfg, prompt: str, gen_length: int = GEN) -> list[int]:
    """LLaDA's generate, written out plainly: the whole canvas [prompt | gen_length masks] goes
    through the model at every step (bidirectional); blocks of L are filled left to right, one
    token per step, the most confident masked position of the current block first."""
    model, tok, m = runtime.backend.model, runtime.tokenizer, cfg.mask_token_id
    p = tok.encode(prompt)
    x = p + [m] * gen_length
    for b in range(gen_length // L):
        lo = len(p) + b * L
        while m in x[lo:lo + L]:
            with torch.no_grad():
                logits, _ = model(torch.tensor([x]), torch.arange(len(x))[None],
                                  torch.ones(1, 1, len(x), len(x), dtype=torch.bool))
            conf, pred = torch.softmax(logits[0, lo:lo + L].float(), -1).max(-1)
            i = min((i for i in range(L) if x[lo + i] == m), key=lambda i: (-conf[i].item(), i))
            x[lo + i] = int(pred[i])
            blk = x[lo:lo + L]
            if cfg.eos_token_id in blk and m not in blk[:blk.index(cfg.eos_token_id)]:
                return x[len(p):lo + blk.index(cfg.eos_token_id) + 1]
    return x[len(p):]


def _prompts(n=1):
    return [e.prompt for e in tasks.eval_split(families=("upper", "count", "letter"), n=n)]


def test_vanilla_no_cache_is_llada_generate(bidi):
    dec, rt = bidi
    for p in _prompts():
        r = dec.generate([p], decode_config(strategy="vanilla", cache="none", gen_length=GEN))[0]
        assert r.token_ids == llada_generate(rt, dec.config, p), p
        # one canvas forward per step, as LLaDA: the block start's forward, then one per commit
        assert r.forwards == sum(r.accepted_hist.values()) + -(-len(r.token_ids) // L)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_spd_lossless_under_each_cache(bidi, cache):
    """Lossless SPD reproduces its base rule run one forward at a time, under the same cache."""
    dec, _ = bidi
    ps = _prompts()[:2]
    for base, kw in (("vanilla", {}), ("threshold", {"threshold": 0.9})):
        ref = dec.generate(ps, decode_config(strategy=base, cache=cache, gen_length=64, **kw))
        got = dec.generate(ps, decode_config(strategy="spd", base=base, beam_width=4, cache=cache, gen_length=64, **kw))
        assert [r.token_ids for r in got] == [r.token_ids for r in ref]
        assert sum(r.forwards for r in got) < sum(r.forwards for r in ref)


def test_batch_with_left_padding_equals_one_by_one(bidi):
    dec, _ = bidi
    ps = _prompts()             # three lengths: two rows are left-padded
    for cache in ("none", "prefix", "dual"):
        dc = decode_config(strategy="vanilla", cache=cache, gen_length=64)
        together = [r.token_ids for r in dec.generate(ps, dc)]
        alone = [dec.generate([p], dc)[0].token_ids for p in ps]
        assert together == alone, cache


def test_dual_needs_no_suffix_tokens_per_forward(bidi):
    """The dual cache verifies W*L tokens; the prefix cache carries the suffix in every branch."""
    dec, rt = bidi
    seen = []
    real = rt.backend.verify

    def spy(cache, ids, pos, mask, sampling=None):
        seen.append(ids.shape[1])
        return real(cache, ids, pos, mask, sampling)
    rt.backend.verify = spy
    try:
        p = _prompts()[:1]
        seen.clear()
        dec.generate(p, decode_config(strategy="spd", beam_width=2, cache="dual", gen_length=GEN))
        assert set(seen) == {2 * L}
        seen.clear()
        dec.generate(p, decode_config(strategy="spd", beam_width=2, cache="prefix", gen_length=GEN))
        assert max(seen) == 2 * GEN          # first block: each branch = block + 2 suffix blocks
    finally:
        rt.backend.verify = real


@pytest.mark.parametrize("layout", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_verify_after_refresh_reproduces_it(tmp_path, layout, cache):
    """Right after a refresh the cache is exact for the canvas, so verifying the unchanged block
    (two branches, left-padded batch) must give the refresh's f(block) position for position. For
    Dream (logits shifted one step) this holds only because the prefix's last token, whose row
    predicts the block's first position, rides just before the block in every branch (the anchor)
    instead of in the cache."""
    import numpy as np

    from dllm_deploy.runtime import canvas
    from dllm_deploy.runtime.backends.torch import TorchBackend
    from dllm_deploy.runtime.prefix import PrefixState
    from tests.conftest import write_checkpoint

    be = TorchBackend.load(str(write_checkpoint(tmp_path / layout, layout)), topk=3)
    c, L = be.config, 8
    assert c.shift_logits == (layout == "dream")
    state = PrefixState(be, canvas.Prefix.of_prompts([[5, 6, 7, 8, 9], [11, 12, 13]], c.pad_token_id))
    block = np.full((2, L), c.mask_token_id, dtype=np.int64)
    block[:, 2] = 40                                       # a committed token inside the block
    args = (L, c.mask_token_id, cache, c.shift_logits)     # one block of masks after it
    ri, rp = state.run(canvas.refresh(state.prefix, block, *args))                            # (B,1,L,K)
    vi, vp = state.run(canvas.canvas_verify(state.prefix, np.stack([block, block], axis=1), *args))
    for w in range(2):
        np.testing.assert_array_equal(vi[:, w, :, 0], ri[:, 0, :, 0])
        np.testing.assert_allclose(vp[:, w], rp[:, 0], atol=1e-5)
