"""Fuzzing the C++ manifest reader and prompts-file reader through `dllm-generate` under
AddressSanitizer + UBSan, on the corpus the Python fuzz tests use (tests/fuzz_corpus.py): mutated
manifests beside the real tiny artifact's files (so a manifest that survives reaches the graph
loader), mutated manifests beside stub files, and odd prompts files. Every input must end in a
result (exit 0) or one clean error line (exit 2): no sanitizer report, no `terminate called`."""
from __future__ import annotations

from pathlib import Path

from tests.fuzz_corpus import write_corpus
from .conftest import run_generate

SEED = 1604
N_REAL, N_STUB = 40, 12          # mutated manifests over the real artifact / over stub files
ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99:allocator_may_return_null=1",
       "UBSAN_OPTIONS": "print_stacktrace=1"}
# small runs: the point is the readers, not the decode
DECODE = ["--gen-length", "8", "--block-length", "8", "--json"]


def _check(r, where: str) -> int:
    where = f"{where}: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert r.returncode in (0, 2), where
    for report in ("Sanitizer", "runtime error:", "terminate called", "internal error"):
        assert report not in r.stderr, where
    if r.returncode == 2:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("dllm-generate: error: "), where
    return r.returncode


def test_fuzz_readers_under_sanitizers(cpp_asan_build, tiny_artifact, tmp_path):
    good = Path(tiny_artifact[0])
    real = write_corpus(tmp_path / "real", N_REAL, SEED, base=good)
    stub = write_corpus(tmp_path / "stub", N_STUB, SEED + 1)
    exits = {0: 0, 2: 0}
    for path in real + stub:
        if path.is_dir():
            args = ["--artifact", str(path), "--prompt", "upper: air\n"]
        elif path.parent.name == "real":          # each prompts file once
            args = ["--artifact", str(good), "--prompts-file", str(path)]
        else:
            continue
        exits[_check(run_generate(cpp_asan_build, *args, *DECODE, env=ENV, timeout=60), str(path))] += 1
    assert exits[2] > (N_REAL + N_STUB) // 2     # the corpus mostly breaks things ...
    assert exits[0] > 0                          # ... and some inputs still decode
