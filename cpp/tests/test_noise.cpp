// Golden noise check: cpp/src/noise.cpp against tests/cpp/fixtures/noise.json (dumped from
// dllm_deploy/runtime/noise.py): the Philox4x64-10 words of a few (counter, key) pairs, and the
// raw word and uniform of a few (seed, request, position, step).
//   test_noise FIXTURES_DIR/noise.json      (CTest passes tests/cpp/fixtures/noise.json)
// Prints each vector that differs and exits 1 if any does.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "noise.hpp"

using nlohmann::json;

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
  int bad = 0, checked = 0;
  for (const json& v : golden.at("philox")) {
    const auto out = dllm::detail::philox4x64_10(v.at("counter").get<dllm::detail::PhiloxCounter>(),
                                                 v.at("key").get<dllm::detail::PhiloxKey>());
    ++checked;
    if (out != v.at("out").get<dllm::detail::PhiloxCounter>()) {
      std::fprintf(stderr, "philox %s: got %llu ...\n", v.at("counter").dump().c_str(),
                   static_cast<unsigned long long>(out[0]));
      ++bad;
    }
  }
  for (const json& c : golden.at("cases")) {
    const uint64_t seed = c.at("seed").get<uint64_t>(), request = c.at("request").get<uint64_t>();
    const int64_t position = c.at("position").get<int64_t>(), step = c.at("step").get<int64_t>();
    const auto out = dllm::detail::philox4x64_10(
        {static_cast<uint64_t>(position), static_cast<uint64_t>(step), request, 0}, {seed, 0});
    const float u = dllm::detail::sample_uniform(seed, request, position, step);
    ++checked;
    if (out[0] != c.at("raw").get<uint64_t>() || u != c.at("u").get<float>()) {
      std::fprintf(stderr, "case %s: raw %llu, u %.9g\n", c.dump().c_str(), static_cast<unsigned long long>(out[0]),
                   static_cast<double>(u));
      ++bad;
    }
  }
  std::printf("%d of %d noise vectors match\n", checked - bad, checked);
  return bad || !checked ? 1 : 0;
}
