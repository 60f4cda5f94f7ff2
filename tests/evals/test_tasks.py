import random

from dllm_deploy.evals import tasks
from dllm_deploy.models import train


def test_eval_split_is_fixed_and_has_50_per_family():
    a, b = tasks.eval_split(), tasks.eval_split()
    assert a == b
    for fam in tasks.FAMILIES + tasks.OPEN_FAMILIES:
        assert sum(e.family == fam for e in a) == 50


def test_answers_are_32_to_256_bytes():
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
