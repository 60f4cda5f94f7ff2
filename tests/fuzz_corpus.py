"""Mutated inputs shared by the Python fuzz tests (tests/integration/cli/test_fuzz.py) and the C++ readers' fuzzing:
``write_corpus`` writes artifact-like folders with a mutated manifest.json and prompt files with
odd bytes, so both runtimes are tried on the very same files.

    write_corpus(Path("build/fuzz"), n=200, seed=0)
        -> [build/fuzz/artifact-000/, ..., build/fuzz/prompts-000.txt, ...]
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from dllm_deploy.models.capabilities import block_causal

#: stub graph and weight files of a one-precision artifact (content is not ONNX: a manifest that
#: survives mutation passes the hash checks and then fails to load, which is a clean error too)
STUB_FILES = {"prefill.onnx": b"prefill-stub", "verify.onnx": b"verify-stub", "weights.bin": b"\0" * 64}

_ODD_STRINGS = ["", "\0", "..", "../../etc/passwd", "/etc/passwd", "fp16", "\udcff",
                "é", "x" * 4096, "prefill.onnx\0", "\\", "\"", "NaN"]
_ODD_VALUES = [None, True, False, 0, -1, 1, 2, 2**63, -(2**63) - 1, 1e308, -0.0, 1.5, "", "1", [], {}, [1, [2, [3]]],
               {"a": {"b": {}}}]


def stub_artifact(folder: Path) -> dict:
    """Write the stub files into ``folder`` and return a valid manifest (schema 4) listing them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in STUB_FILES.items():
        (folder / name).write_bytes(data)
    return {
        "schema_version": 4, "block_length": 32, "cache_mode": "exact", "max_beam_width": 8, "topk": 2,
        "model": {"layout": "block_causal", "vocab_size": 259, "hidden_size": 64, "num_layers": 1, "num_heads": 4,
                  "num_kv_heads": 2, "intermediate_size": 96, "mask_token_id": 256, "eos_token_id": 257,
                  "pad_token_id": 258, "max_seq": 256, "block_size": 32, "attention": "block_causal"},
        "family": "block_causal", "capabilities": block_causal().to_dict(), "kv_shapes": [[2, 16]],
        "sampling": {"pool": 64, "noise": "philox4x64-10/v1"},
        "precisions": {"fp32": {"prefill": "prefill.onnx", "verify": "verify.onnx", "weights": "weights.bin"}},
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in STUB_FILES.items()},
        "graphs": {"prefill": {"inputs": ["input_ids"], "outputs": ["top_ids"]},
                   "verify": {"inputs": ["input_ids"], "outputs": ["top_ids"]}},
        "tokenizer": {"kind": "byte", "mask": 256, "eos": 257, "pad": 258},
        "special_ids": {"mask": 256, "eos": 257, "pad": 258},
    }


def random_value(rng: random.Random, depth: int = 0):
    """An odd JSON value: the edge cases above, or a small random one."""
    pick = rng.random()
    if pick < 0.5 or depth > 2:
        return rng.choice(_ODD_VALUES + _ODD_STRINGS)
    if pick < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(_ODD_STRINGS + ["model", "files", "fp32"]): random_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def mutate_json(obj, rng: random.Random):
    """A copy of ``obj`` with one value somewhere replaced, one key deleted or one key added."""
    if not isinstance(obj, (dict, list)) or not obj or rng.random() < 0.2:
        return random_value(rng)
    obj = json.loads(json.dumps(obj))       # a deep copy
    key = rng.choice(list(obj)) if isinstance(obj, dict) else rng.randrange(len(obj))
    what = rng.random()
    if isinstance(obj, dict) and what < 0.2:
        del obj[key]
    elif isinstance(obj, dict) and what < 0.35:
        obj[rng.choice(_ODD_STRINGS)] = random_value(rng)
    else:
        obj[key] = mutate_json(obj[key], rng)
    return obj


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """``data`` with a few bytes flipped, inserted, deleted or the tail cut off."""
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        what, at = rng.random(), rng.randrange(len(b) + 1)
        if what < 0.3 and at < len(b):
            b[at] = rng.randrange(256)
        elif what < 0.6:
            b[at:at] = rng.choice([b"\0", b"\xff", b"\xc3", b"{", b"]", b'"', b"\\", b"\xed\xa0\x80", bytes([rng.randrange(256)])])
        elif what < 0.85:
            del b[at:at + rng.randrange(1, 9)]
        else:
            del b[at:]
    return bytes(b)


def mutated_manifest(rng: random.Random, valid: dict) -> bytes:
    """The bytes of a manifest.json: a structural mutation, a byte mutation, or both; sometimes a
    value replaced by lists nested deeper than a JSON reader's recursion limit."""
    what = rng.random()
    obj = mutate_json(valid, rng) if what < 0.7 else valid
    if rng.random() < 0.15 and isinstance(valid.get("model"), dict):     # wrong sizes: model dims
        obj = json.loads(json.dumps(valid))
        dims = [k for k, v in obj["model"].items() if isinstance(v, int) and not isinstance(v, bool)]
        key = rng.choice(dims)
        obj["model"][key] = rng.choice([0, 1, obj["model"][key] // 2, obj["model"][key] * 2 + 1, 2**31 - 1])
    data = json.dumps(obj, indent=2).encode()
    if rng.random() < 0.1 and isinstance(obj, dict) and obj:
        depth = rng.choice([199, 201, 5000])
        key = json.dumps(rng.choice(sorted(obj, key=str))).encode()
        data = data.replace(key + b": ", key + b": " + b"[" * depth + b"0" + b"]" * depth + b", \"_was\": ", 1)
    return mutate_bytes(data, rng) if what > 0.5 else data


def odd_prompts(rng: random.Random) -> bytes:
    """A prompts file (one prompt a line) with NULs, bytes that are not UTF-8, CRs, long lines and
    JSON-string lines (good and broken escapes)."""
    pieces = [b"upper: hello\n", b"a\0b\n", b"\xff\xfe bad utf-8 \xc3\n", b"\xed\xa0\x80 surrogate\n", b"\r\n", b"\n",
              "\u00e9 \u00fc \u65e5\u672c\n".encode(), b"x" * rng.choice([100, 5000, 70000]) + b"\n", b"\\x41 \\u00e9 \\\n",
              b'"upper: war\\n"\n', b'"\\u0000"\n', b'"\\ud800"\n', b'"unterminated\n', b'"\\x"\n', b"no newline at end"]
    return b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))


def write_corpus(folder: Path, n: int, seed: int, base: Path | None = None) -> list[Path]:
    """Write ``n`` artifact-like folders (``artifact-NNN/``) and ``n`` prompt files
    (``prompts-NNN.txt``) under ``folder``; the same seed writes the same files. Each folder holds a
    mutated manifest.json beside stub files, or, with ``base`` (a real artifact), beside symlinks
    to the base's files, so that a manifest that survives mutation reaches the graph loader.
    Returns their paths, folders first."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    valid = json.loads((Path(base) / "manifest.json").read_text()) if base is not None else None
    artifacts, prompts = [], []
    for i in range(n):
        art = folder / f"artifact-{i:03d}"
        if base is None:
            manifest = stub_artifact(art)
        else:
            art.mkdir()
            for f in Path(base).iterdir():
                if f.name != "manifest.json":
                    (art / f.name).symlink_to(f.resolve())
            manifest = valid
        (art / "manifest.json").write_bytes(mutated_manifest(rng, manifest))
        artifacts.append(art)
        p = folder / f"prompts-{i:03d}.txt"
        p.write_bytes(odd_prompts(rng))
        prompts.append(p)
    return artifacts + prompts


def fuzz_texts(rng: random.Random, n: int) -> list[str]:
    """``n`` prompts for tokenizer parity: Unicode from every plane a tokenizer meets (Latin, CJK,
    emoji with skin-tone modifiers, combining marks), whitespace runs (spaces, tabs, newlines, CRs),
    very long words, digits and punctuation, plus the fixed edge cases (empty, one space)."""
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCXYZ", "0123456789", " ", "  \t\t\n\n\r\n   ", ".,:;!?()[]{}'\"-_/\\@#$%^&*+=~`|",
             "é ü ñ ß ø å", "日本語中文한국어", "🤖👍🏽🎉🧪🇫🇷", "e\u0301 a\u0308", "\u00a0\u2003\u3000"]
    out = ["", " ", "\n", "\t\t", "x" * 3000, "supercalifragilistic" * 40, "   leading and trailing   ", "🤖" * 50]
    while len(out) < n:
        parts = []
        for _ in range(rng.randrange(1, 12)):
            pool = rng.choice(pools)
            parts.append("".join(rng.choice(pool) for _ in range(rng.choice([1, 2, 5, 20, 200]))))
        out.append("".join(parts))
    return out[:n]
