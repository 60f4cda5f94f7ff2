// The sampling noise (docs/algorithms.md, "Sampling"): a counter-based generator, so the uniform a
// (row, position, step) sees is a pure function of (seed, request, position, step) and never "the
// next draw" of a stream. A drafted SPD node and the base rule's step it stands for see the same
// uniform, which keeps lossless SPD lossless under sampling. Mirrors dllm_deploy/runtime/noise.py
// bit for bit (tests/data/golden/noise.json, checked by cpp/tests/test_noise.cpp).
#pragma once

#include <array>
#include <cstdint>

namespace dllm::detail {

using PhiloxCounter = std::array<uint64_t, 4>;
using PhiloxKey = std::array<uint64_t, 2>;

// Philox4x64-10 (Random123; numpy's np.random.Philox bit generator) of one counter under a key.
// numpy increments its counter before each block of 4 outputs, so
// Philox(counter=c, key=k).random_raw() is philox4x64_10(c + 1, k)[0].
PhiloxCounter philox4x64_10(PhiloxCounter counter, PhiloxKey key);

// The first output word of counter (position, step, request, use) under key (seed, 0): noise.py's
// raw(). `use` tells apart draws of one position and step that serve different ends (the masked
// families draw one, use 0; the uniform-diffusion rule three: uniform_diffusion.hpp).
uint64_t philox_raw(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use = 0);

// The uniform in [0, 1) of one position: the top 24 bits of philox_raw, exact in float32.
float sample_uniform(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use = 0);

// A token id uniform over [0, vocab): the top 32 bits of philox_raw modulo vocab (noise.py's token_ids).
int64_t uniform_token(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use, int64_t vocab);

}  // namespace dllm::detail
