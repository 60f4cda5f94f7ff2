"""A row's text as its final ids grow: what each chunk releases, and when the row finishes
(the rules: docs/streaming.md, "Chunks"). Text only: the loop (loop.py) says which ids are
final, this module turns them into deltas, held back where the next token could still change
them (an incomplete UTF-8 sequence, the start of a stop string).

    t = RowText(ByteTokenizer().decode, eos_id=257, stop=("\\n",), budget=64)
    t.update([104, 105, 10, 120])   ->  ("hi", [104, 105], "stop")

The row's text is decoded as its ids grow: with a tokenizer that decodes incrementally (the byte
tokenizer's ``incremental()``) at a cost per new id, else (any ``decode`` callable) by decoding
all the ids again at each growth (``DecodedText``); the chunks are the same either way.
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"      # what an incomplete UTF-8 sequence decodes to (so far)


def stop_at(text: str, stop: Sequence[str], start: int = 0) -> int | None:
    """The smallest start index of any stop string in ``text`` (None: none occurs), looking from
    ``start`` (none starts before it)."""
    hits = [i for i in (text.find(s, start) for s in stop) if i >= 0]
    return min(hits) if hits else None


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of an unfinished row's text wait for the next token: a
    trailing U+FFFD, then the longest trailing part of the rest that is a proper prefix of a
    stop string."""
    n = 1 if text.endswith(REPLACEMENT) else 0
    end = len(text) - n                       # the rest: text[:end]
    return n + max((k for s in stop for k in range(1, min(len(s) - 1, end) + 1) if text.endswith(s[:k], 0, end)),
                   default=0)


def ids_within(decode: Callable, ids: list[int], text: str, start: int) -> int:
    """The largest count n >= ``start`` of ``ids`` whose decoded text is a prefix of ``text``
    (the ids whose text lies wholly within it; ``start`` ids are known to)."""
    for n in range(len(ids), start, -1):
        if text.startswith(decode(ids[:n])):
            return n
    return start


class DecodedText:
    """A row's text as its ids grow, for any tokenizer: ``decode`` (ids -> str) of all the ids at
    each growth. A tokenizer's incremental text (``ByteTokenizer.incremental``) has the same
    members at a cost per new id."""

    settled = 0      # characters of ``text`` that no later id can change (none known here)

    def __init__(self, decode: Callable):
        self.decode, self.ids, self.text = decode, [], ""

    def extend(self, ids) -> None:
        """``ids`` follow the ids so far; ``text`` becomes the decoded text of them all."""
        self.ids.extend(ids)
        self.text = self.decode(self.ids)

    def within(self, text: str, start: int) -> int:
        """``ids_within`` of the ids so far (``text``: a prefix of ``self.text``)."""
        return ids_within(self.decode, self.ids, text, start)


class RowText:
    """One row's released text and ids. ``update`` takes the row's final ids (which only grow)
    and returns (delta, new ids, finish reason or None)."""

    def __init__(self, decode, eos_id: int | Sequence[int], stop: Sequence[str], budget: int):
        """``decode``: the tokenizer's decode (ids -> str), or the row's incremental text (an object
        with DecodedText's ``extend``, ``text``, ``settled`` and ``within``, e.g.
        ``ByteTokenizer().incremental()``); ``eos_id``: the id, or ids, that end a row."""
        self.decoded = DecodedText(decode) if callable(decode) else decode
        self.eos = frozenset([eos_id] if isinstance(eos_id, int) else eos_id)
        self.stop, self.budget = tuple(stop), budget
        self.text, self.sent = "", 0          # released so far: text, and that many ids
        self.seen = 0                         # final ids at the last update
        self.finish_reason: str | None = None
        self.ended = False                    # EOS is among the final ids
        self.scanned = 0                      # no stop string starts before this index of the text
        self.reach = max(map(len, self.stop), default=1) - 1    # a stop string's characters past its first

    def update(self, ids: list[int]) -> tuple[str, list[int], str | None]:
        new = ids[self.seen:]
        self.seen = len(ids)
        self.decoded.extend(new)
        self.ended = self.ended or not self.eos.isdisjoint(new)
        text = self.decoded.text
        cut = stop_at(text, self.stop, self.scanned)
        if cut is not None:
            reason, text = "stop", text[:cut]
        else:       # a stop string starting before settled - reach would lie in text no id changes
            self.scanned = max(self.scanned, self.decoded.settled - self.reach)
            reason = "eos" if self.ended else "length" if len(ids) >= self.budget else None
        if reason is None:
            text = text[:len(text) - held_back(text, self.stop)]
        n = len(ids) if reason in ("eos", "length") else self.decoded.within(text, self.sent)
        delta, new = text[len(self.text):], ids[self.sent:n]
        self.text, self.sent, self.finish_reason = text, n, reason
        return delta, new, reason
