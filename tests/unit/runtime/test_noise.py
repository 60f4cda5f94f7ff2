"""runtime/noise.py: the Philox4x64-10 counter-based noise against numpy's own Philox bit
generator, its uniforms, and the golden vectors the C++ runtime checks (tests/data/golden/noise.json;
DLLM_UPDATE_NOISE_FIXTURE=1 rewrites the file)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dllm_deploy.runtime.noise import NOISE, philox4x64, raw, uniforms

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "golden" / "noise.json"
# (seed, request, position, step): zeros, the largest words, carries in every lane, typical calls
CASES = [(0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (0, 1, 0, 0), (1, 0, 0, 0), (7, 0, 40, 3), (7, 0, 41, 3),
         (123456789, 5, 300, 12), (2**63, 0, 2**31, 7), (2**64 - 1, 2**64 - 1, 2**63 - 1, 2**32 + 5),
         (0xDEADBEEFCAFEF00D, 42, 511, 31)]


def numpy_philox_first_word(counter, key) -> int:
    """numpy's Philox increments its counter before each block of 4 outputs, so the first
    ``random_raw()`` of ``Philox(counter=c, key=k)`` is philox(c + 1, k)[0]: returns philox(c, k)[0]
    by starting numpy at c - 1 (the 256-bit counter, lane 0 lowest)."""
    c = sum(int(x) << (64 * i) for i, x in enumerate(counter))
    c = (c - 1) % 2**256
    words = np.array([(c >> (64 * i)) & (2**64 - 1) for i in range(4)], dtype=np.uint64)
    return int(np.random.Philox(counter=words, key=np.array(key, dtype=np.uint64)).random_raw())


def test_philox_is_numpys_philox():
    rng = np.random.default_rng(0)
    counters = rng.integers(0, 2**64, size=(50, 4), dtype=np.uint64, endpoint=False)
    counters[:5] = [[0, 0, 0, 0], [1, 0, 0, 0], [2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1], [0, 1, 0, 0], [5, 6, 7, 8]]
    keys = rng.integers(0, 2**64, size=(50, 2), dtype=np.uint64, endpoint=False)
    keys[:2] = 0
    ours = philox4x64(counters, keys)                                              # (50, 4) in one call
    for c, k, out in zip(counters, keys, ours):
        assert int(out[0]) == numpy_philox_first_word(c, k)
    # numpy's next three outputs are the rest of the same block
    g = np.random.Philox(counter=np.array([4, 6, 7, 8], dtype=np.uint64), key=np.array([9, 10], dtype=np.uint64))
    assert [int(g.random_raw()) for _ in range(4)] == [int(x) for x in philox4x64([5, 6, 7, 8], [9, 10])]


def test_uniforms_are_24_bit_floats_of_the_first_word():
    pos = np.arange(1000)
    u = uniforms(3, 0, pos, 0)
    assert u.dtype == np.float32 and u.shape == (1000,) and (u >= 0).all() and (u < 1).all()
    assert np.array_equal(u.astype(np.float64) * 2**24, (raw(3, 0, pos, 0) >> np.uint64(40)).astype(np.float64))
    assert abs(float(u.mean()) - 0.5) < 0.03 and len(np.unique(u)) > 990
    # a pure function of its arguments, broadcast; each argument changes the value
    grid = uniforms(np.array([[3], [4]], dtype=np.uint64), 0, pos[None, :5], np.array([[0], [0]]))
    assert np.array_equal(grid[0], u[:5]) and not np.array_equal(grid[1], u[:5])
    assert not np.array_equal(uniforms(3, 1, pos, 0), u) and not np.array_equal(uniforms(3, 0, pos, 1), u)


def fixture() -> dict:
    vectors = []
    for seed, request, position, step in CASES:
        r = int(raw(seed, request, position, step))
        vectors.append({"seed": str(seed), "request": str(request), "position": str(position), "step": str(step),
                        "raw": str(r), "u": float(uniforms(seed, request, position, step))})
    return {"noise": NOISE, "about": "u = float32((philox4x64_10((position, step, request, 0), (seed, 0))[0] >> 40) "
                                     "* 2**-24); 64-bit words as decimal strings (dllm_deploy/runtime/noise.py)",
            "vectors": vectors}


def test_golden_vectors_are_current():
    want = fixture()
    if os.environ.get("DLLM_UPDATE_NOISE_FIXTURE") == "1":
        FIXTURE.write_text(json.dumps(want, indent=1) + "\n")
    assert json.loads(FIXTURE.read_text()) == want, f"{FIXTURE} is stale: rerun with DLLM_UPDATE_NOISE_FIXTURE=1"
    for v in want["vectors"]:       # the numpy cross-check covers the fixture's values too
        c = [int(v["position"]), int(v["step"]), int(v["request"]), 0]
        assert int(v["raw"]) == numpy_philox_first_word(c, [int(v["seed"]), 0])
        assert v["u"] == (int(v["raw"]) >> 40) * 2.0 ** -24


@pytest.mark.parametrize("bad", [2**64])
def test_seeds_outside_64_bits_are_refused(bad):
    with pytest.raises((OverflowError, ValueError)):
        uniforms(bad, 0, np.arange(3), 0)
