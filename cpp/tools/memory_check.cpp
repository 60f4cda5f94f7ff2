// dllm-memory-check: the C++ runtime's memory-aware beam-width cap for an artifact's manifest and
// a given free memory, as JSON, so a test can compare it with dllm_deploy/profiles/memory.py.
//
//   dllm-memory-check ARTIFACT_DIR PRECISION FREE_BYTES LIMIT [FRACTION RESERVE_MB]
//   -> {"beam_width_cap": W, "estimates": [bytes at W = 1..LIMIT], "fraction": F, "reserve_mb": R,
//       "free_bytes_now": MemAvailable}
// FRACTION and RESERVE_MB default to the built-in CPU profile's (cpu_memory_budget).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "json.hpp"
#include "manifest.hpp"
#include "memory.hpp"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) {
    std::fprintf(stderr, "usage: dllm-memory-check ARTIFACT_DIR PRECISION FREE_BYTES LIMIT [FRACTION RESERVE_MB]\n");
    return 2;
  }
  try {
    using namespace dllm::detail;
    const Manifest m = read_manifest(argv[1], argv[2], false);
    const int64_t free_bytes = std::strtoll(argv[3], nullptr, 10);
    const int limit = std::atoi(argv[4]);
    MemoryBudget budget = cpu_memory_budget();
    if (argc == 7) budget = {std::strtod(argv[5], nullptr), std::strtoll(argv[6], nullptr, 10)};
    std::string estimates;
    for (int w = 1; w <= limit; ++w)
      estimates += (w > 1 ? ", " : "") + std::to_string(estimate_bytes(m.model, m.precision, w, m.model.block_size,
                                                                       m.model.max_seq));
    std::printf("{\"beam_width_cap\": %d, \"estimates\": [%s], \"fraction\": %s, \"reserve_mb\": %lld, "
                "\"free_bytes_now\": %lld}\n",
                beam_width_cap(m.model, free_bytes, budget, m.precision, limit), estimates.c_str(),
                format_double(budget.fraction).c_str(), static_cast<long long>(budget.reserve_mb),
                static_cast<long long>(free_memory_bytes()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dllm-memory-check: error: %s\n", e.what());
    return 2;
  }
}
