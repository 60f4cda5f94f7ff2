"""Fuzzing the C++ manifest reader and prompts-file reader through `dllm-generate` under
AddressSanitizer + UBSan: a fixed-seed corpus of mutated manifests (each in a folder that
symlinks the real artifact's other files) and of odd prompts files. Every input must end in a
result (exit 0) or one clean error line (exit 2): no sanitizer report, no `terminate called`."""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import pytest

from .conftest import run_generate

SEED = 1604
N_MANIFESTS = 48
N_PROMPT_FILES = 16
ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99:allocator_may_return_null=1",
       "UBSAN_OPTIONS": "print_stacktrace=1"}
# small runs: the point is the readers, not the decode
DECODE = ["--gen-length", "8", "--block-length", "8", "--json"]
ODD_VALUES = [None, True, False, "", "x\u00e9", 0, -1, 1.5, 2**31, -(2**31) - 1, 2**63, 10**30, 1e308, -1e308, [], {},
              [1, "a"], {"k": None}]
NEST = "<nested lists>"          # replaced by [[[...0...]]] in the text (json.dumps would recurse)


def _paths(node, prefix=()):
    """Every (path of keys/indices) into a JSON value, the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _parent(doc, path):
    for k in path[:-1]:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    _parent(doc, path)[path[-1]] = value


def _drop(doc, path):
    parent = _parent(doc, path)
    del parent[path[-1]]


def mutate_manifest(text: str, rng: random.Random) -> bytes:
    """One mutation of manifest.json: a dropped key, a changed type, a huge number, deep nesting,
    wrong sizes (model dims, graph name lists), truncated bytes, non-UTF-8 bytes or flipped bytes."""
    doc = json.loads(text)
    paths = list(_paths(doc))
    kind = rng.choice(["drop", "type", "huge", "nest", "sizes", "truncate", "utf8", "flip"])
    if kind == "drop":
        _drop(doc, rng.choice(paths))
    elif kind == "type":
        _set(doc, rng.choice(paths), copy.deepcopy(rng.choice(ODD_VALUES)))
    elif kind == "huge":
        numeric = [p for p in paths if isinstance(_parent(doc, p)[p[-1]], (int, float))
                   and not isinstance(_parent(doc, p)[p[-1]], bool)]
        _set(doc, rng.choice(numeric), rng.choice([2**31 - 1, 2**31, 2**62, 2**64, -(2**40), 10**400, 1e300, 0, -1]))
    elif kind == "nest":
        _set(doc, rng.choice(paths), NEST)
    elif kind == "sizes":
        model = doc["model"]
        key = rng.choice(["num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_seq", "hidden_size",
                          "num_heads", "block_size", "topk", "max_beam_width", "inputs", "outputs"])
        if key in ("topk", "max_beam_width"):
            doc[key] = rng.choice([0, 1, 3, 64, 10**6, 2**31 - 1])
        elif key in ("inputs", "outputs"):
            names = doc["graphs"][rng.choice(["prefill", "verify"])][key]
            del names[rng.randrange(len(names))]
        else:
            model[key] = rng.choice([0, 1, model[key] // 2, model[key] * 2 + 1, 2**31 - 1])
    depth = rng.choice([50, 199, 201, 5000])
    data = json.dumps(doc).replace(json.dumps(NEST), "[" * depth + "0" + "]" * depth).encode()
    if kind == "truncate":
        data = data[:rng.randrange(len(data))]
    elif kind == "utf8":
        at = data.index(b'"', rng.randrange(len(data) // 2)) + 1     # inside a string
        data = data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"]) + data[at:]
    elif kind == "flip":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        data = bytes(buf)
    return data


def prompts_file(rng: random.Random) -> bytes:
    """A prompts file with NULs, bad UTF-8, very long lines, blank lines, CRLF and JSON lines."""
    pieces = [b"upper: air\n", b"", b"   \t", b"\x00", b"a\x00b", b"\xff\xfe", b"\xc3", b"caf\xc3\xa9", b"\xed\xa0\x80",
              b"x" * rng.choice([400, 5000, 100000]), b'"upper: war\\n"', b'"\\u0000"', b'"\\ud800"', b'"unterminated',
              b'"\\x"', b"\r"]
    lines = [b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 5))]
    return rng.choice([b"\n", b"\r\n"]).join(lines) + rng.choice([b"", b"\n", b"\r\n"])


@pytest.fixture(scope="module")
def corpus(tiny_artifact, tmp_path_factory):
    """(kind, path) pairs: artifact folders with a mutated manifest, and prompts files."""
    good = Path(tiny_artifact[0])
    root = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(SEED)
    text = (good / "manifest.json").read_text()
    out = []
    for i in range(N_MANIFESTS):
        d = root / f"manifest-{i:03d}"
        d.mkdir()
        for f in good.iterdir():
            if f.name != "manifest.json":
                os.symlink(f, d / f.name)
        (d / "manifest.json").write_bytes(mutate_manifest(text, rng))
        out.append(("artifact", d))
    for i in range(N_PROMPT_FILES):
        f = root / f"prompts-{i:03d}.txt"
        f.write_bytes(prompts_file(rng))
        out.append(("prompts", f))
    return good, out


def test_fuzz_readers_under_sanitizers(cpp_asan_build, corpus):
    good, inputs = corpus
    exits = {0: 0, 2: 0}
    for kind, path in inputs:
        if kind == "artifact":
            args = ["--artifact", str(path), "--prompt", "upper: air\n"]
        else:
            args = ["--artifact", str(good), "--prompts-file", str(path)]
        r = run_generate(cpp_asan_build, *args, *DECODE, env=ENV, timeout=60)
        where = f"{path}: exit {r.returncode}\n{r.stderr[-3000:]}"
        assert r.returncode in (0, 2), where
        for report in ("Sanitizer", "runtime error:", "terminate called", "internal error"):
            assert report not in r.stderr, where
        if r.returncode == 2:
            lines = r.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("dllm-generate: error: "), where
        exits[r.returncode] += 1
    assert exits[2] > len(inputs) // 2          # the corpus mostly breaks things ...
    assert exits[0] > 0                          # ... and some inputs still decode
