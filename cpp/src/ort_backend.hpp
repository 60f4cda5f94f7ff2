// The ONNX Runtime runner: the two graphs of an artifact (DESIGN §3) over preallocated buffers.
// Port of dllm_deploy/runtime/backends/ort.py on the CPU execution provider.
//
// Per call the caller fills ids/pos (B,T) and mask (B,T,P+T) (row-major, P = cache_length()), and
// sample_u (B,T) when the graphs sample (schema 3; greedy feeds zeros, temperature 0),
// then runs prefill (which appends the KV of the first `keep` tokens to the cache) or verify
// (cache unchanged); top_ids/top_probs (B,T,K) hold the result until the next call.
// KV per layer: (B, Hkv, P, D) contiguous, fed in place as past_key_values.{i}.key/.value; the
// graph's present (B, Hkv, P+T, D) lands in a second buffer and its first P+keep positions are
// copied back once per commit. An artifact of kv_io "new" (schema 5) returns only the new tokens'
// (B, Hkv, T, D): the cache is then (B, Hkv, capacity, D), its positions written in place, fed
// whole with the mask widened over the unwritten ones (or just the written part when that is all
// or none of it): no call copies the cached positions. keep_rows drops finished rows from the cache (prefix.py::
// PrefixState.keep).
//
// Dimension legend: B rows, T new tokens, P cached positions, K top-k, Hkv KV heads, D head dim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

  // Sets the batch to `rows` rows and grows (never shrinks) the buffers for calls of up to
  // max_tokens new tokens over a cache of up to max_past positions, and prefills whose cache +
  // new tokens stay within max_present. Called once per generate, before the loop.
  void reserve(size_t rows, size_t max_tokens, size_t max_past, size_t max_present);
  // The cache empties; `capacity` (kv_io "new"): the positions it will hold until the next clear,
  // when known (0: what reserve sized it for).
  void clear_cache(size_t capacity = 0);
  size_t cache_length() const;
  void truncate(size_t n);  // only the first n cached positions stay
  size_t rows() const;
  int topk() const;
  // Only the rows idx (ascending indices of the current rows) go on, their cache with them.
  void keep_rows(const std::vector<size_t>& idx);

  int64_t* ids();   // (B,T)
  int64_t* pos();   // (B,T)
  uint8_t* mask();  // (B,T,P+T) bool

  // Schema 3: the graphs sample. sample_u (B,T) holds each fed token's uniform (noise.hpp); the
  // rows' temperature (0: greedy, the top-1), top_k (0: off) and top_p (1: off) hold until changed.
  float* sample_u();
  void set_sampling(float temperature, int64_t top_k, float top_p);

  void prefill(size_t tokens, size_t keep);
  // A prefill whose kept KV is chosen after its outputs are seen (a tree verification keeps its
  // accepted path): prefill_run leaves the call's KV aside; commit_selected appends, per row b,
  // the KV of the new tokens idx[b*n .. b*n+n) (indices among the T new tokens) to the cache.
  void prefill_run(size_t tokens);
  void commit_selected(const std::vector<int64_t>& idx, size_t n);
  void verify(size_t tokens);
  const int64_t* top_ids() const;  // (B,T,K)
  const float* top_probs() const;  // (B,T,K)

  double run_seconds = 0.0;  // time inside OrtRun, accumulated

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dllm::detail
