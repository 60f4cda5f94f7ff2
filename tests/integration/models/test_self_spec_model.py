"""The committed tri-mode tiny model (checkpoints/tiny-selfspec): its draft is good enough for
self-speculation to pay, and speculation never changes its autoregressive output (ONNX Runtime,
batch 4, evaluation prompts of every task family)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runs(selfspec_artifact):
    from dllm_deploy.evals import tasks
    from dllm_deploy.runtime.backends.ort import load_ort
    from dllm_deploy.runtime.self_spec import SelfSpecOptions, generate
    loaded = load_ort(selfspec_artifact)
    be, tok, c = loaded.backend, loaded.tokenizer, loaded.backend.config
    examples = tasks.eval_split(tasks.FAMILIES, 2)
    prompts = [tok.encode(e.prompt) for e in examples]
    out = {}
    for name, strategy, width, ahead in (("ar", "ar", 1, False), ("linear", "linear-spec", 1, False),
                                         ("tree4", "tree-spec", 4, False), ("linear-ahead", "linear-spec", 1, True),
                                         ("tree4-ahead", "tree-spec", 4, True)):
        opts = SelfSpecOptions(strategy=strategy, beam_width=width, max_new_tokens=128, draft_ahead=ahead)
        res = [generate(be, prompts[i:i + 4], opts, c.mask_token_id, c.eos_token_id, c.block_size)
               for i in range(0, len(prompts), 4)]
        out[name] = {"tokens": [t for r in res for t in r.tokens], "forwards": sum(r.forwards for r in res),
                     "rounds": [a for r in res for row in r.accepted for a in row]}
    out["exact"] = sum(tasks.score(e, tok.decode(t)) for e, t in zip(examples, out["ar"]["tokens"])) / len(examples)
    return out


def test_speculation_is_lossless_on_the_trained_model(runs):
    assert runs["linear"]["tokens"] == runs["ar"]["tokens"] == runs["tree4"]["tokens"]


def test_drafting_ahead_saves_forwards_not_tokens(runs):
    """A verification that also drafts the next block spares the draft forward of every round
    after a wholly accepted chain: the same tokens, fewer forwards (its draft of the next block
    sees the bonus position masked, so its rounds may differ from a fresh draft's)."""
    for plain, ahead in (("linear", "linear-ahead"), ("tree4", "tree4-ahead")):
        assert runs[ahead]["tokens"] == runs["ar"]["tokens"]
        assert runs[ahead]["forwards"] < runs[plain]["forwards"], (runs[ahead]["forwards"], runs[plain]["forwards"])


def test_the_draft_accepts_several_tokens_per_round(runs):
    """The joint loss taught the draft: LinearSpec's rounds emit well over one token, and the
    tree's at least as many (it holds LinearSpec's chain)."""
    def mean(xs):
        return sum(xs) / len(xs)
    linear, tree = mean(runs["linear"]["rounds"]), mean(runs["tree4"]["rounds"])
    assert linear > 2.0, linear
    assert tree >= linear, (tree, linear)


def test_the_model_solves_its_tasks(runs):
    """Its autoregressive output is right on most evaluation prompts (the tasks it was trained on)."""
    assert runs["exact"] >= 0.5, runs["exact"]
