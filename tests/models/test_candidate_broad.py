"""checkpoints/tiny-broad (docs/training.md): a training candidate base-trained on the broad inputs
answers words outside the bundled model's 149-word vocabulary, which the bundled model does not."""
from __future__ import annotations

from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-broad"
PROMPTS = {"upper: hello world\n": "HELLO WORLD",
           "reverse: the zebra likes green mangoes\n": "mangoes green likes zebra the"}


@pytest.fixture(scope="module")
def broad():
    from dllm_deploy.runtime.api import Runtime
    return Runtime.load(model=str(FOLDER))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_candidate_copies_unseen_words(broad, prompt):
    assert broad.generate([prompt], strategy="vanilla")[0].text == PROMPTS[prompt]


def test_bundled_model_does_not(tiny_runtime):
    """The contrast the candidate is for: the bundled weights know only their training words."""
    assert tiny_runtime.generate(["upper: hello world\n"], strategy="vanilla")[0].text != "HELLO WORLD"
