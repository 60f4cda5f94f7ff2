"""The C++ runtime over kv_io "new" artifacts (schema 5: the cache a buffer written in place,
cpp/src/ort_backend.cpp) against the Python runtime over the same artifacts: the same tokens and
forwards on a block-causal model (exact, delayed, none), LLaDA and Dream layouts (prefix, dual:
caches made per block) and the self-speculative model (a cache that grows call by call, batch 4)."""
from __future__ import annotations

import pytest

from dllm_deploy.runtime.api import decode_config

from .conftest import generate_many

PROMPTS = ["upper: cat\n", "reverse: river stone cloud\n", "count: from 7 by 2, 3 terms\n"]
CASES = {
    "tiny": {"spd-exact": {"strategy": "spd", "beam_width": 4}, "threshold-delayed": {"strategy": "threshold", "cache": "delayed"},
             "vanilla-none": {"strategy": "vanilla", "tokens_per_step": 2, "cache": "none"},
             "spd-sampled": {"strategy": "spd", "beam_width": 4, "temperature": 0.8, "seed": 4}},
    "llada": {"threshold-prefix": {"strategy": "threshold", "cache": "prefix"},
              "spd-dual": {"strategy": "spd", "beam_width": 3, "cache": "dual"}},
    "dream": {"vanilla-prefix": {"strategy": "vanilla", "tokens_per_step": 2, "cache": "prefix"},
              "threshold-dual": {"strategy": "threshold", "cache": "dual"}},
}


@pytest.mark.parametrize("name,case", [(n, c) for n, cs in CASES.items() for c in cs])
def test_cpp_over_new_kv_equals_python(cpp_build, kv_io_pairs, name, case, tmp_path):
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.api import row_options
    options = CASES[name][case]
    new = kv_io_pairs[name][1]
    rt = Runtime.load(artifact=str(new))
    want = [rt.decoder.generate([p], decode_config(gen_length=64, **options), [row_options(**options)])[0] for p in PROMPTS]
    got = generate_many(cpp_build, new, PROMPTS, {"gen_length": 64, **options}, tmp_path)
    assert [(g["token_ids"], g["forwards"]) for g in got] == [(w.token_ids, w.forwards) for w in want]


@pytest.mark.parametrize("strategy", ["ar", "tree-spec"])
def test_cpp_self_speculation_over_new_kv(cpp_build, kv_io_pairs, strategy, tmp_path):
    """Batch 4 of different prompt lengths: the buffer grows (and its rows move) as the cache does."""
    append, new = kv_io_pairs["selfspec"]
    prompts = [*PROMPTS, "kv"]
    opts = {"strategy": strategy, "gen_length": 24, **({"beam_width": 4} if strategy == "tree-spec" else {})}
    rows = {io: generate_many(cpp_build, art, prompts, opts, tmp_path, extra=("--batch-size", "4"))
            for io, art in (("append", append), ("new", new))}
    assert [r["token_ids"] for r in rows["new"]] == [r["token_ids"] for r in rows["append"]]
    assert all(r["token_ids"] for r in rows["new"])


@pytest.mark.parametrize("name,options,extra", [
    ("tiny", {"strategy": "threshold", "cache": "delayed", "temperature": 5.0, "top_p": 0.9, "seed": 1}, ()),
    ("selfspec", {"strategy": "tree-spec", "beam_width": 4}, ("--batch-size", "4"))])
def test_new_kv_under_address_sanitizer(cpp_asan_build, cpp_build, kv_io_pairs, name, options, extra, tmp_path):
    """Batch 4: rows leave (their buffer rows compacted), held keys are cut, the buffer regrows."""
    from .test_errors import ASAN_ENV
    prompts = [*PROMPTS, "kv"]
    opts = {"gen_length": 64 if name == "tiny" else 24, **options}
    extra = extra or ("--batch-size", "4")
    new = kv_io_pairs[name][1]
    asan = generate_many(cpp_asan_build, new, prompts, opts, tmp_path, extra=extra, env=ASAN_ENV)
    release = generate_many(cpp_build, new, prompts, opts, tmp_path, extra=extra)
    assert [r["token_ids"] for r in asan] == [r["token_ids"] for r in release]
