#include "noise.hpp"

namespace dllm::detail {

namespace {

constexpr uint64_t kMul0 = 0xD2E7470EE14C6C93ULL, kMul1 = 0xCA5A826395121157ULL;
constexpr uint64_t kWeyl0 = 0x9E3779B97F4A7C15ULL, kWeyl1 = 0xBB67AE8584CAA73BULL;

PhiloxCounter round_of(const PhiloxCounter& c, const PhiloxKey& k) {
  const unsigned __int128 p0 = static_cast<unsigned __int128>(kMul0) * c[0];
  const unsigned __int128 p1 = static_cast<unsigned __int128>(kMul1) * c[2];
  const uint64_t hi0 = static_cast<uint64_t>(p0 >> 64), lo0 = static_cast<uint64_t>(p0);
  const uint64_t hi1 = static_cast<uint64_t>(p1 >> 64), lo1 = static_cast<uint64_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

PhiloxCounter philox4x64_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r) key = {key[0] + kWeyl0, key[1] + kWeyl1};
    counter = round_of(counter, key);
  }
  return counter;
}

uint64_t philox_raw(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use) {
  return philox4x64_10({static_cast<uint64_t>(position), static_cast<uint64_t>(step), request, use}, {seed, 0})[0];
}

float sample_uniform(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use) {
  return static_cast<float>(static_cast<double>(philox_raw(seed, request, position, step, use) >> 40) * 0x1p-24);
}

int64_t uniform_token(uint64_t seed, uint64_t request, int64_t position, int64_t step, uint64_t use, int64_t vocab) {
  return static_cast<int64_t>((philox_raw(seed, request, position, step, use) >> 32) % static_cast<uint64_t>(vocab));
}

}  // namespace dllm::detail
