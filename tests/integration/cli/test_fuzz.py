"""Property-based fuzzing of the readers of user input: whatever the bytes, each ends in a result or
a UserError, never another exception. Bounded (a few seconds per target) and derandomized, so a
run is repeatable in CI; a failure prints the smallest input hypothesis found."""
from __future__ import annotations

import functools
import json
import random
import struct
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a dev dependency (pip install -e '.[dev]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dllm_deploy.artifact import read_manifest  # noqa: E402
from dllm_deploy.errors import UserError  # noqa: E402
from dllm_deploy.models.loading import read_tensors  # noqa: E402
from dllm_deploy.models.tokenizer import ByteTokenizer, HFTokenizer  # noqa: E402
from dllm_deploy.profiles import explain, get_profile, load_profiles  # noqa: E402
from dllm_deploy.text import decode_escapes, valid_text  # noqa: E402
from dllm_deploy.runtime.api import Runtime, decode_config  # noqa: E402

from tests.fuzz_corpus import mutate_bytes, mutate_json, mutated_manifest, stub_artifact, write_corpus  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
RNG = st.randoms(use_true_random=False)
# text with everything a user can type or a file can hold: controls, NULs, lone surrogates
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=80)


def clean(fn, *args, **kw):
    """Call ``fn``; a UserError is a clean outcome (returned as None), anything else fails the test."""
    try:
        return fn(*args, **kw)
    except UserError as e:
        assert "\n" not in str(e), f"a UserError must be one line: {e!r}"
        return None


# -- the manifest reader ----------------------------------------------------------------------

@FUZZ
@given(rng=RNG, raw=st.one_of(st.none(), st.binary(max_size=300)), precision=st.sampled_from([None, "fp32", "int8"]))
def test_manifest_reader(rng, raw, precision):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        valid = stub_artifact(folder)
        (folder / "manifest.json").write_bytes(raw if raw is not None else mutated_manifest(rng, valid))
        m = clean(read_manifest, folder, verify=True, precision=precision)
        if m is not None:
            assert isinstance(m["files"], dict) and isinstance(m["precisions"], dict)


def test_the_manifest_fuzzer_also_reaches_valid_manifests(tmp_path):
    # the mutations keep the manifest valid often enough that the deeper checks run too
    valid = stub_artifact(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(valid))
    assert read_manifest(tmp_path, verify=True)["files"] == valid["files"]
    rng, ok = random.Random(1), 0
    for _ in range(200):
        (tmp_path / "manifest.json").write_bytes(mutated_manifest(rng, valid))
        ok += clean(read_manifest, tmp_path) is not None
    assert 5 < ok < 195


@pytest.fixture(scope="module")
def artifact_copy(tiny_artifact, tmp_path_factory):
    """The tiny artifact's files (symlinked) in a folder whose manifest.json each example rewrites."""
    good = Path(tiny_artifact[0])
    d = tmp_path_factory.mktemp("fuzz-artifact")
    for f in good.iterdir():
        if f.name != "manifest.json":
            (d / f.name).symlink_to(f)
    return d, json.loads((good / "manifest.json").read_text())


@settings(FUZZ, max_examples=12)     # each example loads ONNX Runtime sessions and decodes a few tokens
@given(rng=RNG, key=st.sampled_from(["model", "topk", "graphs", "tokenizer", "max_beam_width", "block_length",
                                     "precisions", "special_ids"]))
def test_runtime_load_of_an_edited_manifest(artifact_copy, rng, key):
    # the hashes still match: what the runtime reads from the manifest is what is fuzzed
    folder, valid = artifact_copy
    m = json.loads(json.dumps(valid))
    m[key] = mutate_json(m[key], rng)
    (folder / "manifest.json").write_text(json.dumps(m))
    rt = clean(Runtime.load, artifact=str(folder), profile="generic-cpu")
    if rt is not None:
        clean(rt.generate, ["upper: ab\n"], gen_length=8)


# -- the profile loader -----------------------------------------------------------------------

_PROFILE = {"name": "mine", "description": "fuzzed", "match": {"kind": "cpu", "arch": ["x86_64"]},
            "backends": ["CPUExecutionProvider"], "precision": "fp32", "priority": 3,
            "decode": {"strategy": "spd", "beam_width": 4, "max_beam_width": 8, "threshold": 0.9, "tree": "fork",
                       "select": "lossless", "base": "vanilla", "block_length": 32, "max_seq": 512},
            "memory": {"fraction": 0.5, "reserve_mb": 512}, "ort": {"intra_op_threads": 2},
            "trt": {"workspace_mb": 1024, "opt_level": 3}}


def _profile_text(rng: random.Random) -> bytes:
    return yaml.safe_dump(mutate_json(_PROFILE, rng), allow_unicode=True).encode("utf-8", "surrogatepass")


@settings(FUZZ, max_examples=40)     # each example parses the 19 bundled profiles too
@given(rng=RNG, raw=st.one_of(st.none(), st.binary(max_size=200), ANY_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass"))),
       mutate=st.booleans())
def test_profile_loader(rng, raw, mutate):
    data = _profile_text(rng) if raw is None else raw
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "mine.yaml").write_bytes(mutate_bytes(data, rng) if mutate else data)
        ps = load_profiles(d)       # a broken user profile never fails the load ...
        assert "generic-cpu" in ps
        got = clean(get_profile, "mine", ps)     # ... naming it does, cleanly
        if got is not None:
            prof = got[0]
            clean(explain, {"mine": prof}, {"kind": "cpu", "arch": "x86_64", "memory_gb": 8.0})
            rt = Runtime.__new__(Runtime)
            rt.profile = prof
            decode_config(**rt.decode_defaults())     # a profile that loads gives valid decode defaults


# -- prompts: escapes and text that is not valid Unicode ----------------------------------------

def _escape(text: str) -> str:
    """The inverse of decode_escapes for any text without lone surrogates."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif not c.isprintable():
            out.append(f"\\U{ord(c):08x}" if ord(c) > 0xFFFF else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


@FUZZ
@given(text=ANY_TEXT)
def test_escapes_decoder(text):
    out = clean(decode_escapes, text)
    if "\\" not in text:
        assert out == text          # nothing to decode: non-ASCII text is kept as it is


@FUZZ
@given(text=st.text(st.characters(codec="utf-8"), max_size=80))
def test_escapes_round_trip(text):
    assert decode_escapes(_escape(text)) == text


@FUZZ
@given(text=ANY_TEXT)
def test_valid_text_is_always_encodable(text):
    out = valid_text(text)
    out.encode("utf-8")
    assert len(out) == len(text)


# -- tokenizers ----------------------------------------------------------------------------------

@FUZZ
@given(text=ANY_TEXT, ids=st.lists(st.integers(-5, 400), max_size=40))
def test_byte_tokenizer(text, ids):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == valid_text(text)
    assert isinstance(tok.decode(ids), str)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A small byte-level BPE tokenizer.json trained here: every string has an exact round trip."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["upper: hello world", "count: from 100 by 5", "é ü 日本 \t\n"] * 20, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path, eos_token_id=tok.token_to_id("<|eos|>"))


@FUZZ
@given(text=ANY_TEXT, ids=st.lists(st.integers(0, 399), max_size=40))
def test_bpe_tokenizer(bpe, text, ids):
    if "<|eos|>" not in text:
        assert bpe.decode(bpe.encode(text)) == valid_text(text)
    assert isinstance(bpe.decode([i for i in ids if i < bpe._tok.get_vocab_size()]), str)


# -- the safetensors reader ------------------------------------------------------------------------

_DTYPES = ["F32", "F16", "BF16", "I64", "I8", "U8", "BOOL", "F64", "X9", "", "f32"]


@st.composite
def safetensors_bytes(draw):
    """A file with a fuzzed header: dtypes, shapes and offsets, some consistent, most not."""
    header, at = {}, 0
    for i in range(draw(st.integers(0, 3))):
        shape = draw(st.lists(st.integers(-2, 5) | st.sampled_from([2**31, 2**62]), max_size=3))
        size = draw(st.integers(0, 64))
        start = draw(st.sampled_from([at, at + 1, max(at - 1, 0), 2**63]))
        header[f"t{i}"] = {"dtype": draw(st.sampled_from(_DTYPES)), "shape": shape, "data_offsets": [start, start + size]}
        at = start + size
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.sampled_from([{"format": "pt"}, {"a": 1}, [], "x"]))
    text = json.dumps(header).encode()
    length = draw(st.sampled_from([len(text), len(text) + 1, max(len(text) - 1, 0), 2**40, 0]))
    body = draw(st.binary(min_size=0, max_size=80)) if draw(st.booleans()) else b"\0" * min(at, 4096)
    return struct.pack("<Q", length) + text + body


@functools.lru_cache(maxsize=1)
def _valid_safetensors() -> bytes:
    import torch
    from safetensors.torch import save
    return save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64)})


@FUZZ
@given(rng=RNG, kind=st.sampled_from(["random", "mutated", "header"]), raw=st.binary(max_size=120),
       header=safetensors_bytes())
def test_safetensors_reader(rng, kind, raw, header):
    data = {"random": raw, "mutated": mutate_bytes(_valid_safetensors(), rng), "header": header}[kind]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "model.safetensors").write_bytes(data)
        clean(read_tensors, Path(d))


@FUZZ
@given(index=st.one_of(st.binary(max_size=80), st.recursive(
    st.none() | st.integers() | st.text(max_size=8), lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["weight_map", "a", "model.safetensors", ""]), c, max_size=3), max_leaves=8).map(
    lambda v: json.dumps(v).encode())))
def test_safetensors_index_reader(index):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "model.safetensors").write_bytes(_valid_safetensors())
        (Path(d) / "model.safetensors.index.json").write_bytes(index)
        clean(read_tensors, Path(d))


# -- the shared corpus -------------------------------------------------------------------------------

def test_write_corpus_is_repeatable_and_read_cleanly(tmp_path):
    a = write_corpus(tmp_path / "a", n=20, seed=7)
    b = write_corpus(tmp_path / "b", n=20, seed=7)
    assert len(a) == 40 and sum(p.is_dir() for p in a) == 20

    def content(p):
        return (p / "manifest.json").read_bytes() if p.is_dir() else p.read_bytes()
    assert [content(p) for p in a] == [content(p) for p in b]
    prompts = b"".join(content(p) for p in a if p.is_file())
    assert b"\0" in prompts and b"\xff" in prompts
    for art in (p for p in a if p.is_dir()):
        clean(read_manifest, art)
