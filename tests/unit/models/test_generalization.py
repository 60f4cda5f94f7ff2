"""The bundled model copies words it never saw in training (it was base-trained on broad inputs,
docs/training.md); lab/tiny-core, trained on the 149-word core vocabulary only, does not."""
from __future__ import annotations

from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "lab" / "tiny-core"
PROMPTS = {"upper: hello world\n": "HELLO WORLD",
           "reverse: the zebra likes green mangoes\n": "mangoes green likes zebra the"}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_bundled_model_copies_unseen_words(tiny_runtime, prompt):
    assert tiny_runtime.generate([prompt], strategy="vanilla")[0].text == PROMPTS[prompt]


def test_core_weights_do_not():
    """The contrast: weights trained on the core inputs alone spell their training words only."""
    from dllm_deploy.runtime.api import Runtime
    core = Runtime.load(model=str(CORE))
    assert core.generate(["upper: hello world\n"], strategy="vanilla")[0].text != "HELLO WORLD"
