"""kv_io "new" (schema 5): prefill returns only the new tokens' keys and values and the ONNX
Runtime cache is a buffer written in place (export/graphs.py, runtime/backends/ort.py).
The buffer cache shows every call what the appending cache shows, through every cache operation;
a new-KV artifact decodes token for token and forward for forward as the appending one of the
same model, on every family kind and cache mode."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_deploy.errors import UserError
from dllm_deploy.runtime.backends.ort import OrtBufferCache, OrtCache
from dllm_deploy.runtime.rows import RowOptions

from tests.conftest import STRATEGIES

SHAPES = [(2, 8), (1, 4)]          # (Hkv, D) of two layers


def _present(cache: OrtCache, new: list) -> list:
    """What an appending graph returns: each layer's past joined with the new tokens'."""
    return [np.concatenate([old, n], axis=2) for old, n in zip([x for kv in zip(cache.k, cache.v) for x in kv], new)]


def _seen(cache, mask):
    """Per layer (keys, values) a call reads where ``mask`` (B,1,T,P+T) allows, as the graph gets them."""
    ks, vs, mask = cache.feeds(mask)
    p = mask.shape[-1] - mask.shape[2]
    assert all(k.shape[2] == p and k.flags.c_contiguous for k in ks + vs)
    cols = mask[:, 0, 0, :p]                                   # (B,P): the cache columns the first token attends
    return [(k.transpose(0, 2, 1, 3)[cols], v.transpose(0, 2, 1, 3)[cols]) for k, v in zip(ks, vs)]


OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(1, 5), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("keep_rows"), st.integers(0, 7)),
    st.tuples(st.just("pad_left"), st.integers(1, 3)),
    st.tuples(st.just("drop_left"), st.integers(1, 3)),
    st.tuples(st.just("truncate"), st.integers(0, 4)),
    st.tuples(st.just("add_rows"), st.integers(0, 6))), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, capacity=st.integers(0, 12), seed=st.integers(0, 2**16))
def test_buffer_cache_shows_what_the_appending_cache_shows(ops, capacity, seed):
    rng = np.random.default_rng(seed)
    batch = 3
    a, b = OrtCache(SHAPES, batch, np.float32), OrtBufferCache(SHAPES, batch, np.float32, capacity)
    valid = np.zeros((batch, 0), dtype=bool)               # the columns a row attends (pads are not)
    for op in ops:
        rows = len(valid)
        if op[0] == "write":
            _, t, keep, chosen = op
            keep = min(keep, t)
            new = [rng.standard_normal((rows, h, t, d)).astype(np.float32) for h, d in SHAPES for _ in "kv"]
            idx = np.sort(rng.permuted(np.tile(np.arange(t), (rows, 1)), axis=1)[:, :keep], axis=1) if chosen else None
            a.write(_present(a, new), idx, keep)
            b.write(new, idx, keep)
            valid = np.concatenate([valid, np.ones((rows, keep), dtype=bool)], axis=1)
        elif op[0] == "keep_rows" and rows > 1:
            idx = np.flatnonzero((np.arange(rows) + op[1]) % 3 != 0) if rows > 2 else np.array([1])
            a.keep_rows(idx), b.keep_rows(idx)
            valid = valid[idx]
        elif op[0] == "pad_left":
            a.pad_left(op[1]), b.pad_left(op[1])
            valid = np.concatenate([np.zeros((rows, op[1]), dtype=bool), valid], axis=1)
        elif op[0] == "drop_left" and op[1] <= a.length:
            a.drop_left(op[1]), b.drop_left(op[1])
            valid = valid[:, op[1]:]
        elif op[0] == "truncate" and op[1] <= a.length:
            a.truncate(op[1]), b.truncate(op[1])
            valid = valid[:, :op[1]]
        elif op[0] == "add_rows":
            other_a = OrtCache(SHAPES, 1, np.float32)
            other_b = OrtBufferCache(SHAPES, 1, np.float32, op[1])
            if a.length:
                other_a.pad_left(a.length), other_b.pad_left(a.length)
            a.add_rows(other_a), b.add_rows(other_b)
            valid = np.concatenate([valid, np.zeros((1, a.length), dtype=bool)])
        assert a.length == b.length == valid.shape[1]
        t = 2
        mask = np.concatenate([np.broadcast_to(valid[:, None, None, :], (len(valid), 1, t, a.length)),
                               np.ones((len(valid), 1, t, t), dtype=bool)], axis=3)
        for (ka, va), (kb, vb) in zip(_seen(a, mask), _seen(b, mask)):
            np.testing.assert_array_equal(ka, kb)
            np.testing.assert_array_equal(va, vb)


CASES = {**STRATEGIES, "vanilla-k2-delayed": {"strategy": "vanilla", "tokens_per_step": 2, "cache": "delayed"},
         "threshold-none": {"strategy": "threshold", "cache": "none"}}
BIDI = {"vanilla-prefix": {"strategy": "vanilla", "tokens_per_step": 2, "cache": "prefix"},
        "threshold-dual": {"strategy": "threshold", "cache": "dual"},
        "spd-prefix": {"strategy": "spd", "beam_width": 3, "cache": "prefix"},
        "threshold-none": {"strategy": "threshold", "cache": "none"}}
PROMPTS = ["upper: cat\n", "reverse: river stone cloud\n", "count: from 7 by 2, 3 terms\n"]


@pytest.fixture(scope="module")
def runtimes(kv_io_pairs):
    from dllm_deploy import Runtime
    return {name: tuple(Runtime.load(artifact=str(x)) for x in pair) for name, pair in kv_io_pairs.items()}


def _rows(rt, options, sampled=False):
    rows = [RowOptions(temperature=0.8, seed=11)] * len(PROMPTS) if sampled else None
    return [(r.token_ids, r.forwards) for r in rt.generate(PROMPTS, rows=rows, gen_length=64, **options)]


@pytest.mark.parametrize("name,case", [("tiny", c) for c in CASES] + [(m, c) for m in ("llada", "dream") for c in BIDI])
def test_new_kv_decodes_as_appending_kv(runtimes, name, case):
    options = {**CASES, **BIDI}[case] if name == "tiny" else BIDI[case]
    append, new = runtimes[name]
    assert new.backend.kv_io == "new" and append.backend.kv_io == "append"
    assert _rows(new, options) == _rows(append, options)


def test_new_kv_samples_as_appending_kv(runtimes):
    append, new = runtimes["tiny"]
    options = {"strategy": "spd", "beam_width": 4}
    assert _rows(new, options, sampled=True) == _rows(append, options, sampled=True)


def test_rows_join_a_new_kv_batch_as_they_decode_alone(runtimes):
    """Continuous batching pads and stacks the buffers (pad_left, add_rows, keep_rows)."""
    _, new = runtimes["tiny"]
    waves, g = [[("reverse: lantern harbor meadow copper violet thunder\n", RowOptions())], [(PROMPTS[0], RowOptions())]], RowOptions()
    got = {}
    for c in new.stream([PROMPTS[1]], rows=[g], join=lambda: waves.pop(0) if waves else [], gen_length=64):
        got.setdefault(c["index"], []).extend(c["token_ids"])
    alone = [new.generate([p], gen_length=64)[0].token_ids
             for p in (PROMPTS[1], "reverse: lantern harbor meadow copper violet thunder\n", PROMPTS[0])]
    assert [got[i] for i in range(3)] == alone


@pytest.mark.parametrize("strategy", ["ar", "tree-spec", "fastdiffuser"])
def test_self_speculation_over_new_kv(runtimes, strategy):
    """The self-speculative loop's cache starts empty (capacity 0) and grows in place."""
    results = [rt.generate(PROMPTS, strategy=strategy, gen_length=24) for rt in runtimes["selfspec"]]
    assert [r.token_ids for r in results[0]] == [r.token_ids for r in results[1]]
    assert all(r.token_ids for r in results[0])


def test_manifest_records_kv_io_and_schema(kv_io_pairs, tmp_path):
    from dllm_deploy.artifact import read_manifest
    append, new = kv_io_pairs["tiny"]
    assert (read_manifest(append)["schema_version"], read_manifest(append)["kv_io"]) == (4, "append")
    m = read_manifest(new)
    assert (m["schema_version"], m["kv_io"]) == (5, "new")
    assert m["graphs"]["prefill"]["dims"]["present"][2] == "tokens"
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in new.iterdir():
        (bad / f.name).symlink_to(f)
    (bad / "manifest.json").unlink()
    (bad / "manifest.json").write_text(json.dumps({**m, "kv_io": "append"}))
    with pytest.raises(UserError, match=r"corrupt manifest \(schema_version 5 with kv_io 'append'\)"):
        read_manifest(bad, verify=False)


def test_tensorrt_refuses_new_kv(kv_io_pairs):
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.export.engines import plan_engines
    from dllm_deploy.profiles import get_profile
    new = kv_io_pairs["tiny"][1]
    with pytest.raises(UserError, match="kv_io 'new'; the TensorRT runner reads the whole cache"):
        plan_engines(new, read_manifest(new), get_profile("h100")[0])
