"""Every prompt format in docs/model_card.md is shown with an example: the bundled model answers it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CARD = Path(__file__).resolve().parents[3] / "docs" / "model_card.md"
ROW = re.compile(r"^\| `(\w+)` \|[^|]*\| `(.+?)` \| `(.+?)` \|$")


def card_examples() -> list[tuple[str, str, str]]:
    rows = [ROW.match(line) for line in CARD.read_text().splitlines()]
    return [(m[1], m[2].replace("\\n", "\n"), m[3]) for m in rows if m]


def test_card_shows_every_family():
    from dllm_deploy.evals.tasks import FAMILIES
    assert sorted(f for f, _, _ in card_examples()) == sorted(FAMILIES)


@pytest.mark.parametrize("family,prompt,answer", card_examples(), ids=lambda x: x if isinstance(x, str) and ":" not in x else None)
def test_card_example_is_answered(tiny_runtime, family, prompt, answer):
    assert prompt.startswith(f"{family}: ") and prompt.endswith("\n")
    assert tiny_runtime.generate([prompt], strategy="vanilla")[0].text == answer
