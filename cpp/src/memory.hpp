// The memory-aware beam-width cap: a port of dllm_deploy/profiles/memory.py (estimate_bytes,
// beam_width_cap, free_memory_bytes) for the ONNX Runtime CPU backend, batch 1, so that the C++
// runtime lowers W exactly where the Python runtime does for the same artifact and free memory.
// Byte counts saturate at INT64_MAX instead of overflowing (a corrupt manifest's dimensions
// then simply do not fit).
#pragma once

#include <cstdint>
#include <string>

#include "manifest.hpp"

namespace dllm::detail {

// The share of free memory a decode may use: fraction * free - reserve_mb MiB (a profile's
// `memory:` section). cpu_memory_budget() is the built-in CPU profile for this machine's
// architecture (profiles/cpu-x86_64.yaml, cpu-arm64.yaml, else generic-cpu.yaml).
struct MemoryBudget {
  double fraction = 0.5;
  int64_t reserve_mb = 512;
};
MemoryBudget cpu_memory_budget();

// estimate_bytes(...)["total"] for batch 1 and the worst case under max_seq (prefix_len unset).
int64_t estimate_bytes(const ModelConfig& model, const std::string& precision, int beam_width, int64_t block_length,
                       int64_t max_seq);

// The largest W <= limit whose estimate fits the budget; 1 when even W = 1 does not fit.
int beam_width_cap(const ModelConfig& model, int64_t free_bytes, const MemoryBudget& budget,
                   const std::string& precision, int limit);

// Available host memory: /proc/meminfo MemAvailable, else the free physical pages.
int64_t free_memory_bytes();

}  // namespace dllm::detail
