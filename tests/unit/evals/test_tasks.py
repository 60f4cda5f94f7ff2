import random

from dllm_deploy.evals import tasks
from dllm_deploy.training import train


def test_eval_split_is_fixed_and_has_50_per_family():
    a, b = tasks.eval_split(), tasks.eval_split()
    assert a == b
    for fam in tasks.FAMILIES + tasks.OPEN_FAMILIES:
        assert sum(e.family == fam for e in a) == 50


def test_core_answers_are_32_to_256_bytes():
    for fam, gen in tasks.GENERATORS.items():
        rng = random.Random(fam)
        for _ in range(300):
            e = gen(rng)
            assert 32 <= len(e.answer.encode()) <= 256, (fam, e.answer)
            assert e.prompt.startswith(fam + ": ") and e.prompt.endswith("\n")


def test_training_sampler_never_draws_an_eval_prompt():
    held = tasks.eval_prompts()
    rng = random.Random(0)
    drawn = [train.sample_example(rng, held).prompt for _ in range(3000)]
    assert not held.intersection(drawn)


def test_answers_are_checkable():
    rng = random.Random(1)
    e = tasks.gen_csv(rng)
    import json
    assert isinstance(json.loads(e.answer), list)
    c = tasks.gen_count(random.Random(2))
    nums = [int(x) for x in c.answer.split()]
    assert len({b - a for a, b in zip(nums, nums[1:])}) == 1
    assert tasks.score(e, e.answer + "  ") and not tasks.score(e, e.answer[:-1])


def test_core_distribution_answers_stay_32_to_256_bytes_and_broad_ones_are_1_to_256():
    for fam, gen in tasks.GENERATORS.items():
        rng = random.Random(fam)
        for dist in ("train", "general"):
            for _ in range(200):
                e = gen(rng, dist)
                assert 1 <= len(e.answer.encode()) <= 256, (fam, dist, e.answer)
                assert e.prompt.startswith(fam + ": ") and e.prompt.endswith("\n")
                assert e.prompt.count("\n") == 1


def _words(e):
    """The held-out-able values of a prompt: sentence words, kv keys, letter fields, csv cells."""
    import re
    body = e.prompt.split(": ", 1)[1].strip()
    if e.family in ("upper", "reverse"):
        return body.split()
    if e.family == "kv":
        return re.findall(r"\b([a-z]+)=", body)
    if e.family == "letter":
        return re.findall(r"=([a-z]+)", body)
    if e.family == "csv":
        return [c for row in body.split(";")[1:] for c in row.split(",") if c.isalpha()]
    return []


def test_generalization_split_holds_out_words_and_lengths_the_training_distribution_never_draws():
    general = tasks.eval_split(split="general")
    assert len(general) == 50 * 7 and general == tasks.eval_split(split="general")
    closed = [e for e in general if e.family != "text"]      # open text has one split, shared
    assert not {e.prompt for e in closed} & {e.prompt for e in tasks.eval_split()}
    sentences = [e for e in general if e.family in ("upper", "reverse")]
    # every sentence length is a held-out one, and spans short to long inputs
    lengths = [len(e.prompt.split(": ", 1)[1].rstrip("\n")) for e in sentences]
    assert all(tasks.held_out_length(n) for n in lengths) and min(lengths) <= 13 and max(lengths) >= 103
    held_words = {w for e in general if e.family != "text" for w in _words(e)}
    assert held_words and all(tasks.held_out(w) for w in held_words)
    rng = random.Random(3)
    seen = set()
    for _ in range(3000):
        for fam, gen in tasks.GENERATORS.items():
            e = gen(rng, "train")
            seen.update(_words(e))
            if fam in ("upper", "reverse"):
                assert not tasks.held_out_length(len(e.prompt.split(": ", 1)[1].rstrip("\n")))
    assert not seen & held_words
    assert any(len(w) == 1 for w in seen) and any(w not in tasks.WORDS for w in seen)   # broad inputs are drawn


def test_unknown_split_is_refused():
    import pytest
    with pytest.raises(ValueError, match="unknown split"):
        tasks.eval_split(split="nope")
