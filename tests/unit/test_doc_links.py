"""Every relative link of the README and docs/ reaches a file of the repository, and every
``#anchor`` a heading of that file (GitHub's heading ids), so moving a section breaks a test, not
a reader's link."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's id of a heading: lower case, punctuation dropped (hyphens and underscores kept),
    spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)          # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slug_is_githubs():
    assert slug("Left to right: the far threshold") == "left-to-right-the-far-threshold"
    assert slug("The self-speculative model (`checkpoints/tiny-selfspec`)") == \
        "the-self-speculative-model-checkpointstiny-selfspec"
    assert slug("Measured on the bundled model (not adopted)") == "measured-on-the-bundled-model-not-adopted"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no {path}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert broken == [], broken


def test_the_architecture_names_every_module():
    """docs/architecture.md's Modules section names every module of the package (as `name.py`)."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc.split("## Modules", 1)[1].split("\n## ", 1)[0]
    missing = [str(p.relative_to(REPO)) for p in sorted((REPO / "dllm_deploy").rglob("*.py"))
               if not p.name.startswith("__") and f"`{p.name}`" not in section
               and f"`{p.parent.name}/{p.name}`" not in section]
    assert missing == [], missing
