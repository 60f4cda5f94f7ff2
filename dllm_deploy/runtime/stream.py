"""A row's text as its final ids grow: what each chunk releases, and when the row finishes
(the rules: docs/streaming.md, "Chunks"). Text only: the loop (loop.py) says which ids are
final, this module turns them into deltas, held back where the next token could still change
them (an incomplete UTF-8 sequence, the start of a stop string).

    t = RowText(ByteTokenizer().decode, eos_id=257, stop=("\\n",), budget=64)
    t.update([104, 105, 10, 120])   ->  ("hi", [104, 105], "stop")
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"      # what an incomplete UTF-8 sequence decodes to (so far)


def stop_at(text: str, stop: Sequence[str]) -> int | None:
    """The smallest start index of any stop string in ``text`` (None: none occurs)."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(hits) if hits else None


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of an unfinished row's text wait for the next token: a
    trailing U+FFFD, then the longest trailing part of the rest that is a proper prefix of a
    stop string."""
    n = 1 if text.endswith(REPLACEMENT) else 0
    rest = text[:len(text) - n]
    return n + max((k for s in stop for k in range(1, min(len(s) - 1, len(rest)) + 1) if rest.endswith(s[:k])),
                   default=0)


def ids_within(decode: Callable, ids: list[int], text: str, start: int) -> int:
    """The largest count n >= ``start`` of ``ids`` whose decoded text is a prefix of ``text``
    (the ids whose text lies wholly within it; ``start`` ids are known to)."""
    for n in range(len(ids), start, -1):
        if text.startswith(decode(ids[:n])):
            return n
    return start


class RowText:
    """One row's released text and ids. ``update`` takes the row's final ids (which only grow)
    and returns (delta, new ids, finish reason or None)."""

    def __init__(self, decode: Callable, eos_id: int, stop: Sequence[str], budget: int):
        self.decode, self.eos_id, self.stop, self.budget = decode, eos_id, tuple(stop), budget
        self.text, self.sent = "", 0          # released so far: text, and that many ids
        self.seen = 0                         # final ids at the last update
        self.finish_reason: str | None = None

    def update(self, ids: list[int]) -> tuple[str, list[int], str | None]:
        self.seen = len(ids)
        text = self.decode(ids)
        cut = stop_at(text, self.stop)
        if cut is not None:
            reason, text = "stop", text[:cut]
        elif self.eos_id in ids:
            reason = "eos"
        else:
            reason = "length" if len(ids) >= self.budget else None
        if reason is None:
            text = text[:len(text) - held_back(text, self.stop)]
        n = len(ids) if reason in ("eos", "length") else ids_within(self.decode, ids, text, self.sent)
        delta, new = text[len(self.text):], ids[self.sent:n]
        self.text, self.sent, self.finish_reason = text, n, reason
        return delta, new, reason
