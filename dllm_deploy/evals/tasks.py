"""Task families of the bundled tiny dLLM: generators with fixed seeds, a held-out split, scoring.

Six families have answers that can be checked exactly (outputs 32-256 bytes); ``text`` is open
Python-standard-library text, scored by likelihood and not counted in accuracy. Every prompt is
``"<family>: <input>\\n"``; the answer follows, then EOS.

Each family draws from one of three distributions (``dist``):

- ``core``: the original one (sentences of the 149 ``WORDS``, names / cities / items / days from
  their lists, fixed length and number ranges); the in-distribution evaluation split;
- ``train``: the broad training distribution (``distill --dist train``, ``training.train --dist
  train``): half ``core``, half ``broad`` inputs (random lower-case words of 1-10 letters,
  sentences of 1-120 characters, wider number ranges), never a held-out word or length; the
  bundled model itself was trained on ``core``;
- ``general``: ``broad`` inputs made only of held-out words and lengths; the generalization split.

A word (or number) is held out when ``crc32(word) % 8 == 0`` and it is in none of the ``core``
lists; a sentence length is held out when ``length % 10 == 3``. Training never draws either, so the
generalization split's words and sentence lengths were never seen in training.
"""
from __future__ import annotations

import json
import random
import re
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education apple river stone cloud "
    "garden window light paper music bread table chair green blue red quick brown lazy small large "
    "happy early late open close north south east west winter summer spring autumn market street "
    "bridge forest island ocean valley desert planet engine signal model data graph token block"
).split()
NAMES = ("ann bob cara dan eva finn gus hana ivan jade kai lena milo nora omar pia quinn rosa sam "
         "tara uma vic wes xena yuri zoe").split()
CITIES = ("rome oslo lima kyiv doha baku riga bern cairo delhi lagos paris tokyo quito dakar "
          "hanoi minsk seoul sofia tunis").split()
ITEMS = "lamp desk kettle bicycle camera guitar jacket clock mirror backpack".split()
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
FAMILIES = ("upper", "reverse", "kv", "csv", "count", "letter")
OPEN_FAMILIES = ("text",)


@dataclass(frozen=True)
class Example:
    family: str
    prompt: str
    answer: str


DISTS = ("core", "train", "general")
_CORE_VALUES = frozenset(WORDS + NAMES + CITIES + ITEMS + DAYS)
_LOWER = "abcdefghijklmnopqrstuvwxyz"
MAX_SENTENCE = 120


def held_out(value: str) -> bool:
    """A word or number the training distribution never draws (the generalization split's)."""
    return value not in _CORE_VALUES and zlib.crc32(value.encode()) % 8 == 0


def held_out_length(n: int) -> bool:
    return n % 10 == 3


def _value(rng: random.Random, dist: str, make) -> str:
    """A fresh value from ``make(rng)``: held out for ``general``, not held out otherwise."""
    while True:
        v = make(rng)
        if held_out(v) == (dist == "general"):
            return v


def _word(rng: random.Random, dist: str, lo: int = 1, hi: int = 10) -> str:
    return _value(rng, dist, lambda r: "".join(r.choice(_LOWER) for _ in range(r.randint(lo, hi))))


def _pick(rng: random.Random, dist: str, pool: list[str]) -> str:
    """A list value (train: half the time) or a random word (general: always)."""
    if dist == "train" and rng.random() < 0.5:
        return rng.choice(pool)
    return _word(rng, dist)


def _broad_sentence(rng: random.Random, dist: str, hi: int = MAX_SENTENCE) -> str:
    """Exactly n characters of words (n from 1..hi; held-out lengths only for ``general``):
    random words, or for ``train`` half the time the ``core`` words."""
    while True:
        n = rng.randint(1, hi)
        if held_out_length(n) == (dist == "general"):
            break
    core = dist == "train" and rng.random() < 0.5
    out: list[str] = []
    left = n
    while left > 0:
        if left <= 10:
            w = (_value(rng, dist, lambda r: "".join(r.choice(_LOWER) for _ in range(left)))
                 if not core or not (c := [x for x in WORDS if len(x) == left]) else rng.choice(c))
        else:
            w = rng.choice([x for x in WORDS if len(x) <= left - 2]) if core else _word(rng, dist, 1, min(10, left - 2))
        out.append(w)
        left -= len(w) + 1
    return " ".join(out)


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    out: list[str] = []
    while len(" ".join(out)) < lo:
        out.append(rng.choice(WORDS))
    s = " ".join(out)
    return s[:hi].rstrip()


def _core(rng: random.Random, dist: str) -> bool:
    return dist == "core" or (dist == "train" and rng.random() < 0.5)


def _input_sentence(rng: random.Random, dist: str, lo: int, hi: int) -> str:
    while True:
        s = _sentence(rng, rng.randint(lo, hi), hi + 10) if _core(rng, dist) else _broad_sentence(rng, dist)
        if dist != "train" or not held_out_length(len(s)):
            return s


def gen_upper(rng: random.Random, dist: str = "core") -> Example:
    s = _input_sentence(rng, dist, 32, 110)
    return Example("upper", f"upper: {s}\n", s.upper())


def gen_reverse(rng: random.Random, dist: str = "core") -> Example:
    words = _input_sentence(rng, dist, 32, 100).split()
    return Example("reverse", f"reverse: {' '.join(words)}\n", " ".join(reversed(words)))


def gen_kv(rng: random.Random, dist: str = "core") -> Example:
    letters = "abcdefghijklmnopqrstuvwxyz"
    core = _core(rng, dist)
    n = rng.randint(6, 10) if core else rng.randint(1, 10)
    keys: list[str] = []
    while len(keys) < n:
        k = ("".join(rng.choice(letters) for _ in range(3)) if dist == "core"
             else _value(rng, dist, lambda r: "".join(r.choice(letters) for _ in range(3))))
        if k not in keys:
            keys.append(k)
    vals = ["".join(rng.choice(letters + "0123456789") for _ in range(rng.randint(3, 5))) for _ in keys]
    table = dict(zip(keys, vals))
    q = rng.sample(keys, rng.randint(5, min(8, n)) if core else rng.randint(1, min(8, n)))
    prompt = "kv: " + " ".join(f"{k}={v}" for k, v in table.items()) + " ? " + " ".join(q) + "\n"
    return Example("kv", prompt, " ".join(f"{k}={table[k]}" for k in q))


def gen_csv(rng: random.Random, dist: str = "core") -> Example:
    cols = rng.sample(["name", "age", "city"], rng.randint(2, 3))
    if "name" not in cols:
        cols[0] = "name"
    rows = []
    core = _core(rng, dist)
    for _ in range(rng.randint(2, 3) if core else rng.randint(1, 3)):
        if core:
            rows.append({"name": rng.choice(NAMES), "age": rng.randint(18, 90), "city": rng.choice(CITIES)})
        else:
            rows.append({"name": _pick(rng, dist, NAMES), "age": rng.randint(0, 120), "city": _pick(rng, dist, CITIES)})
    csv = ",".join(cols) + ";" + ";".join(",".join(str(r[c]) for c in cols) for r in rows)
    answer = json.dumps([{c: r[c] for c in cols} for r in rows], separators=(",", ":"))
    return Example("csv", f"csv: {csv}\n", answer)


def gen_count(rng: random.Random, dist: str = "core") -> Example:
    if _core(rng, dist):
        start = rng.randint(100, 9999) if dist == "core" else int(_value(rng, dist, lambda r: str(r.randint(100, 9999))))
        step, n = rng.randint(2, 19), rng.randint(9, 14)
    else:
        start = int(_value(rng, dist, lambda r: str(r.randint(0, 10 ** r.randint(1, 6) - 1))))
        step, n = rng.randint(1, 99), rng.randint(1, 14)
    terms = [str(start + i * step) for i in range(n)]
    return Example("count", f"count: from {start} by {step}, {n} terms\n", " ".join(terms))


_LETTERS = {
    "order": "Dear {name}, your {item} has shipped to {city} and will arrive on {day}. Thank you!",
    "invite": "Hi {name}, join us in {city} on {day}. Please bring your {item}. See you there!",
    "lost": "Hello {name}, we found a {item} in {city} on {day}. Is it yours? Call us soon.",
}


def gen_letter(rng: random.Random, dist: str = "core") -> Example:
    kind = rng.choice(sorted(_LETTERS))
    if _core(rng, dist):
        f = {"name": rng.choice(NAMES), "city": rng.choice(CITIES), "item": rng.choice(ITEMS), "day": rng.choice(DAYS)}
    else:
        f = {"name": _pick(rng, dist, NAMES), "city": _pick(rng, dist, CITIES), "item": _pick(rng, dist, ITEMS),
             "day": _pick(rng, dist, DAYS)}
    prompt = f"letter: {kind} name={f['name']} city={f['city']} item={f['item']} day={f['day']}\n"
    return Example("letter", prompt, _LETTERS[kind].format(**f))


_TEXT_CACHE: dict[str, list[str]] = {}
_NON_PRINTABLE = re.compile(r"[^\x20-\x7e\n]")


def _stdlib_chunks(split: str) -> list[str]:
    """Printable-ASCII chunks of the Python standard library's own sources (offline corpus).

    Files are split by name so the eval split never sees training files."""
    if split in _TEXT_CACHE:
        return _TEXT_CACHE[split]
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    chunks: list[str] = []
    for i, p in enumerate(files):
        if (i % 10 == 0) != (split == "eval"):
            continue
        try:
            src = p.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
        src = _NON_PRINTABLE.sub("", src)
        for j in range(0, len(src) - 200, 160):
            chunks.append(src[j:j + 160])
    _TEXT_CACHE[split] = chunks
    return chunks


def gen_text(rng: random.Random, split: str = "train") -> Example:
    chunks = _stdlib_chunks(split)
    c = rng.choice(chunks)
    return Example("text", "text: " + c[:64].replace("\n", " ") + "\n", c[64:160])


GENERATORS = {"upper": gen_upper, "reverse": gen_reverse, "kv": gen_kv, "csv": gen_csv,
              "count": gen_count, "letter": gen_letter}

EVAL_SEED = 20261130
EVAL_PER_FAMILY = 50


SPLITS = {"core": "in distribution", "general": "generalization: held-out words and lengths"}


def eval_split(families=FAMILIES + OPEN_FAMILIES, n: int = EVAL_PER_FAMILY, split: str = "core") -> list[Example]:
    """A held-out evaluation split: n examples per family from a fixed seed.

    ``split``: ``core`` (in distribution) or ``general`` (held-out words and lengths; ``text``
    has only the one split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    out: list[Example] = []
    for fam in families:
        rng = random.Random(f"{EVAL_SEED}:{fam}" if split == "core" or fam == "text" else f"{EVAL_SEED}:{split}:{fam}")
        seen: set[str] = set()
        while len([e for e in out if e.family == fam]) < n:
            ex = gen_text(rng, "eval") if fam == "text" else GENERATORS[fam](rng, split)
            if ex.prompt not in seen:
                seen.add(ex.prompt)
                out.append(ex)
    return out


def eval_prompts() -> set[str]:
    """Every prompt of both evaluation splits (training skips them)."""
    return {e.prompt for split in SPLITS for e in eval_split(split=split)}


def score(example: Example, output: str) -> bool:
    """Exact match of the generated answer (trailing whitespace ignored)."""
    return output.rstrip() == example.answer.rstrip()
