// The ONNX Runtime runner: the two graphs of an artifact (DESIGN §3) over preallocated buffers.
// Port of dllm_deploy/runtime/backends/ort_backend.py for batch 1 on the CPU execution provider.
//
// Per call the caller fills ids/pos (T,) and mask (T, P+T) (row-major, P = cache_length()), and
// sample_u (T,) when the graphs sample (schema 3; greedy feeds zeros, temperature 0),
// then runs prefill (which appends the KV of the first `keep` tokens to the cache) or verify
// (cache unchanged); top_ids/top_probs (T, K) hold the result until the next call.
// KV per layer: (Hkv, P, D) contiguous, fed in place as past_key_values.{i}.key/.value
// (1, Hkv, P, D); the graph's present (1, Hkv, P+T, D) lands in a second buffer and its first
// P+keep positions are copied back once per commit.
//
// Dimension legend: T new tokens, P cached positions, K top-k, Hkv KV heads, D head dim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "manifest.hpp"

namespace dllm::detail {

// The ONNX Runtime library's version string; fails clearly when the library does not provide the
// C API version these headers were compiled against.
const char* onnxruntime_version();
void ensure_onnxruntime_api();

class OrtBackend {
 public:
  OrtBackend(const Manifest& manifest, int intra_op_threads);
  ~OrtBackend();
  OrtBackend(const OrtBackend&) = delete;
  OrtBackend& operator=(const OrtBackend&) = delete;

  // Grow (never shrink) the buffers for calls of up to max_tokens new tokens over a cache of up
  // to max_past positions, and prefills whose cache + new tokens stay within max_present.
  // Called once per generate, before the loop.
  void reserve(size_t max_tokens, size_t max_past, size_t max_present);
  void clear_cache();
  size_t cache_length() const;
  int topk() const;

  int64_t* ids();   // (T,)
  int64_t* pos();   // (T,)
  uint8_t* mask();  // (T, P+T) bool

  // Schema 3: the graphs sample. sample_u (T,) holds each fed token's uniform (noise.hpp); the
  // row's temperature (0: greedy, the top-1), top_k (0: off) and top_p (1: off) hold until changed.
  bool samples() const;
  float* sample_u();
  void set_sampling(float temperature, int64_t top_k, float top_p);

  void prefill(size_t tokens, size_t keep);
  void verify(size_t tokens);
  const int64_t* top_ids() const;  // (T, K)
  const float* top_probs() const;  // (T, K)

  double run_seconds = 0.0;  // time inside OrtRun, accumulated

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dllm::detail
