// Golden noise check: cpp/src/noise.cpp against tests/data/golden/noise.json (dumped from
// dllm_deploy/runtime/noise.py by tests/unit/runtime/test_noise.py): per vector (seed, request,
// position, step; 64-bit words as decimal strings) the first Philox4x64-10 output word (raw) of
// counter (position, step, request, 0) under key (seed, 0), and the uniform u.
//   test_noise NOISE_JSON      (CTest passes tests/data/golden/noise.json)
// Prints each vector that differs and exits 1 if any does.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "noise.hpp"

using nlohmann::json;

namespace {

uint64_t word(const json& v, const char* key) { return std::strtoull(v.at(key).get<std::string>().c_str(), nullptr, 10); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_noise NOISE_JSON\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "test_noise: cannot read %s\n", argv[1]);
    return 2;
  }
  const json golden = json::parse(in);
  if (golden.at("noise") != "philox4x64-10/v1") {
    std::fprintf(stderr, "test_noise: the fixture's noise is %s\n", golden.at("noise").dump().c_str());
    return 1;
  }
  int bad = 0, checked = 0;
  for (const json& v : golden.at("vectors")) {
    const uint64_t seed = word(v, "seed"), request = word(v, "request");
    const int64_t position = static_cast<int64_t>(word(v, "position")), step = static_cast<int64_t>(word(v, "step"));
    const auto out = dllm::detail::philox4x64_10(
        {static_cast<uint64_t>(position), static_cast<uint64_t>(step), request, 0}, {seed, 0});
    const float u = dllm::detail::sample_uniform(seed, request, position, step);
    ++checked;
    if (out[0] != word(v, "raw") || u != v.at("u").get<float>()) {
      std::fprintf(stderr, "vector %s: raw %llu, u %.9g\n", v.dump().c_str(), static_cast<unsigned long long>(out[0]),
                   static_cast<double>(u));
      ++bad;
    }
  }
  std::printf("%d of %d noise vectors match\n", checked - bad, checked);
  return bad || !checked ? 1 : 0;
}
