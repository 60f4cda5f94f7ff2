#!/usr/bin/env python3
"""Where the test suite's CPU goes: a pytest plugin that records every test's wall time, its
process CPU and the CPU of the child processes it reaped, per pytest-xdist worker, and a summary.

    PYTEST_CPU_DIR=build/pytest-cpu .venv/bin/python -m pytest -p tests.pytest_cpu \\
        -q -n auto --dist loadfile tests
    python tests/pytest_cpu.py build/pytest-cpu [--top 30]

On a 2-core machine the suite is CPU-bound: its wall time is about the CPU of all its tests over
two, so the tests to make cheaper are the ones at the top of the CPU list, and a file whose wall
time is well above its CPU is waiting (a server starting, a lock another worker holds). A child's
CPU counts for the test that reaps it: a module-scoped server's lands on the test that ends the
module (per-file sums are right). Each run appends: give a fresh folder.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        own0, child0 = _cpu()
        t0 = time.perf_counter()
        yield
        own1, child1 = _cpu()
        out = Path(os.environ.get("PYTEST_CPU_DIR", "build/pytest-cpu"))
        out.mkdir(parents=True, exist_ok=True)
        row = {"id": item.nodeid, "wall": time.perf_counter() - t0, "self": own1 - own0, "child": child1 - child0}
        with open(out / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
except ImportError:         # the summary needs no pytest
    pass


def summarize(folder: Path, top: int) -> None:
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        rows += [dict(json.loads(line), worker=path.stem) for line in path.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"{folder}: no records (run pytest with -p tests.pytest_cpu first)")
    cpu = lambda r: r["self"] + r["child"]  # noqa: E731
    workers = collections.defaultdict(lambda: [0.0, 0.0])
    files = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        workers[r["worker"]][0] += r["wall"]
        workers[r["worker"]][1] += cpu(r)
        f = files[r["id"].split("::")[0]]
        f[0], f[1], f[2] = f[0] + r["wall"], f[1] + cpu(r), f[2] + 1
    print(f"{len(rows)} tests, {sum(cpu(r) for r in rows):.0f} CPU-s")
    for w, (wall, c) in sorted(workers.items()):
        print(f"  worker {w}: wall {wall:.0f} s, CPU {c:.0f} s")
    print(f"\n{'wall s':>7} {'CPU s':>7} {'tests':>5}  file (by CPU)")
    for name, (wall, c, n) in sorted(files.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{wall:7.1f} {c:7.1f} {n:5d}  {name}")
    print(f"\n{'wall s':>7} {'CPU s':>7}  test (by CPU)")
    for r in sorted(rows, key=lambda r: -cpu(r))[:top]:
        print(f"{r['wall']:7.1f} {cpu(r):7.1f}  {r['id']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="the PYTEST_CPU_DIR of a run")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    summarize(a.folder, a.top)
