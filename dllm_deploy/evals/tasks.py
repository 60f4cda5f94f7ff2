"""Task families of the bundled tiny dLLM: generators with fixed seeds, a held-out split, scoring.

Six families have answers that can be checked exactly (outputs 32-256 bytes); ``text`` is open
Python-standard-library text, scored by likelihood and not counted in accuracy. Every prompt is
``"<family>: <input>\\n"``; the answer follows, then EOS.
"""
from __future__ import annotations

import json
import random
import re
import sysconfig
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


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    out: list[str] = []
    while len(" ".join(out)) < lo:
        out.append(rng.choice(WORDS))
    s = " ".join(out)
    return s[:hi].rstrip()


def gen_upper(rng: random.Random) -> Example:
    s = _sentence(rng, rng.randint(32, 110), 120)
    return Example("upper", f"upper: {s}\n", s.upper())


def gen_reverse(rng: random.Random) -> Example:
    words = _sentence(rng, rng.randint(32, 100), 110).split()
    return Example("reverse", f"reverse: {' '.join(words)}\n", " ".join(reversed(words)))


def gen_kv(rng: random.Random) -> Example:
    letters = "abcdefghijklmnopqrstuvwxyz"
    n = rng.randint(6, 10)
    keys: list[str] = []
    while len(keys) < n:
        k = "".join(rng.choice(letters) for _ in range(3))
        if k not in keys:
            keys.append(k)
    vals = ["".join(rng.choice(letters + "0123456789") for _ in range(rng.randint(3, 5))) for _ in keys]
    table = dict(zip(keys, vals))
    q = rng.sample(keys, rng.randint(5, min(8, n)))
    prompt = "kv: " + " ".join(f"{k}={v}" for k, v in table.items()) + " ? " + " ".join(q) + "\n"
    return Example("kv", prompt, " ".join(f"{k}={table[k]}" for k in q))


def gen_csv(rng: random.Random) -> Example:
    cols = rng.sample(["name", "age", "city"], rng.randint(2, 3))
    if "name" not in cols:
        cols[0] = "name"
    rows = []
    for _ in range(rng.randint(2, 3)):
        rows.append({"name": rng.choice(NAMES), "age": rng.randint(18, 90), "city": rng.choice(CITIES)})
    csv = ",".join(cols) + ";" + ";".join(",".join(str(r[c]) for c in cols) for r in rows)
    answer = json.dumps([{c: r[c] for c in cols} for r in rows], separators=(",", ":"))
    return Example("csv", f"csv: {csv}\n", answer)


def gen_count(rng: random.Random) -> Example:
    start, step = rng.randint(100, 9999), rng.randint(2, 19)
    n = rng.randint(9, 14)
    terms = [str(start + i * step) for i in range(n)]
    return Example("count", f"count: from {start} by {step}, {n} terms\n", " ".join(terms))


_LETTERS = {
    "order": "Dear {name}, your {item} has shipped to {city} and will arrive on {day}. Thank you!",
    "invite": "Hi {name}, join us in {city} on {day}. Please bring your {item}. See you there!",
    "lost": "Hello {name}, we found a {item} in {city} on {day}. Is it yours? Call us soon.",
}


def gen_letter(rng: random.Random) -> Example:
    kind = rng.choice(sorted(_LETTERS))
    f = {"name": rng.choice(NAMES), "city": rng.choice(CITIES), "item": rng.choice(ITEMS), "day": rng.choice(DAYS)}
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


def eval_split(families=FAMILIES + OPEN_FAMILIES, n: int = EVAL_PER_FAMILY) -> list[Example]:
    """The held-out evaluation split: n examples per family from a fixed seed."""
    out: list[Example] = []
    for fam in families:
        rng = random.Random(f"{EVAL_SEED}:{fam}")
        seen: set[str] = set()
        while len([e for e in out if e.family == fam]) < n:
            ex = gen_text(rng, "eval") if fam == "text" else GENERATORS[fam](rng)
            if ex.prompt not in seen:
                seen.add(ex.prompt)
                out.append(ex)
    return out


def eval_prompts() -> set[str]:
    return {e.prompt for e in eval_split()}


def score(example: Example, output: str) -> bool:
    """Exact match of the generated answer (trailing whitespace ignored)."""
    return output.rstrip() == example.answer.rstrip()
