"""The sampler's noise: one uniform per (seed, request, absolute position, base-rule step).

A counter-based generator (Philox4x64-10, Random123; numpy's ``np.random.Philox`` bit generator
runs the same function) makes the noise a pure function of where it is used, never "the next
draw" of a stream: a drafted SPD node and its verification see the noise the base rule sees at
that step, so lossless SPD stays lossless under sampling, and a row's tokens do not depend on the
batch around it. The C++ runtime implements the same function (tests/data/golden/noise.json).

    counter = (position, step, request, use), key = (seed, 0)     (use 0 here)
    u = float32((philox(counter, key)[0] >> 40) * 2**-24)      # 24 bits: exact, in [0, 1)

Vectorised numpy: 64x64 -> 128-bit products through 32-bit limbs held in uint64.
"""
from __future__ import annotations

import numpy as np

from ..artifact import SAMPLING_NOISE as NOISE   # the manifest's name for this function ("sampling": {"noise": ...})

ROUNDS = 10
M0, M1 = np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157)
W0, W1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B)
_LO32, _32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def _mulhilo(a: np.uint64, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) 64-bit halves of the 128-bit products a * b (uint64 arrays)."""
    a_lo, a_hi = a & _LO32, a >> _32
    b_lo, b_hi = b & _LO32, b >> _32
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi     # each < 2**64: exact
    mid = (ll >> _32) + (lh & _LO32) + (hl & _LO32)                          # < 3 * 2**32
    return hh + (lh >> _32) + (hl >> _32) + (mid >> _32), a * b


def philox4x64(counter, key) -> np.ndarray:
    """Philox4x64-10 of ``counter`` (..., 4) and ``key`` (..., 2) uint64 (broadcast): (..., 4) uint64."""
    counter, key = np.asarray(counter, dtype=np.uint64), np.asarray(key, dtype=np.uint64)
    c0, c1, c2, c3 = np.moveaxis(counter, -1, 0)
    k0, k1 = np.moveaxis(key, -1, 0)
    with np.errstate(over="ignore"):
        for r in range(ROUNDS):
            if r:
                k0, k1 = k0 + W0, k1 + W1
            hi0, lo0 = _mulhilo(M0, c0)
            hi1, lo1 = _mulhilo(M1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1)


def raw(seed, request, positions, steps, use=0) -> np.ndarray:
    """philox((position, step, request, use), (seed, 0))[0] as uint64, the arguments broadcast.
    ``use`` tells apart draws of one position and step that serve different ends (the masked
    families draw one: use 0; runtime/uniform_diffusion.py draws three)."""
    seed, request, positions, steps, use = np.broadcast_arrays(*(np.asarray(x, dtype=np.uint64)   # 2**64: OverflowError
                                                                 for x in (seed, request, positions, steps, use)))
    counter = np.stack([positions, steps, request, use], axis=-1)
    return philox4x64(counter, np.stack([seed, np.zeros_like(seed)], axis=-1))[..., 0]


def uniforms(seed, request, positions, steps, use=0) -> np.ndarray:
    """The float32 uniforms in [0, 1) of the given (seed, request, position, step, use) (broadcast):
    the top 24 bits of the first Philox output word, exact in float32."""
    return ((raw(seed, request, positions, steps, use) >> np.uint64(40)).astype(np.float64) * 2.0 ** -24).astype(np.float32)


def token_ids(seed, request, positions, steps, use, vocab_size: int) -> np.ndarray:
    """Token ids uniform over [0, vocab_size) of the given (seed, request, position, step, use):
    the top 32 bits of the first Philox output word modulo the vocabulary (int64)."""
    return ((raw(seed, request, positions, steps, use) >> np.uint64(32)) % np.uint64(vocab_size)).astype(np.int64)
