// The decode loop for one prompt (batch 1): a port of dllm_deploy/runtime/loop.py (Decoder._run)
// that is token-identical to it, counters included.
//
// Per block (L positions, all [MASK] at the start), per iteration:
//     nodes = policy.plan(S, f(S))          # W drafted block states (node 0 = base rule's step)
//     f(nodes) = verify(nodes)              # ONE forward, W branches under a tree mask
//     S, f(S) = policy.select(nodes, f)     # as deep as verification allows
// Block-causal models: the prompt prefill is fused with the first block's all-mask forward; when
// a block is full one fused forward commits its KV and predicts the next block's first state
// (cache `exact`; `none` recomputes the prefix in every forward with the verify graph).
// Bidirectional models (LLaDA, Dream): every forward sees the whole canvas
// [prefix | block | suffix of masks for the remaining blocks]; at each block start one forward
// over the canvas refreshes the cache (`prefix`: the prefix KV; `dual`: the prefix and suffix
// KV, the suffix ordered before the block); `none` runs the whole canvas at every step (W = 1).
// Every forward counts.
//
// Dimension legend: p prompt tokens, L block length, W beam width, P cached positions, K top-k,
// S suffix tokens, N = p + n_blocks * L the whole canvas.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "ort_backend.hpp"
#include "policy.hpp"
#include "tokenizer.hpp"

namespace dllm::detail {

struct RowResult {
  std::string text;
  std::vector<int64_t> token_ids;
  int64_t forwards = 0;
  int64_t tokens = 0;
  double tpf = 0.0;
  double wall_s = 0.0;
  double tokens_per_s = 0.0;
  double backend_s = 0.0;
  int beam_width_used = 1;
  int beam_width_requested = 1;
  bool finished = false;
  std::vector<int64_t> accepted_hist;  // [steps] -> verifications that accepted that many
  std::string warnings;

  std::string to_json() const;  // the keys of `dllm-deploy generate --json` + backend_s
};

struct EngineOptions {
  std::string precision = "fp32";
  int intra_op_threads = 0;
  int max_beam_width = 0;  // user cap; 0 = none
  bool verify_hashes = true;
  bool warnings_to_stderr = true;
};

enum class CacheMode { kNone, kExact, kPrefix, kDual };

// loop.py::resolve_cache (the same messages): the mode a model and beam width W run under.
CacheMode resolve_cache(const std::string& mode, const std::string& attention, int width);

class Engine {
 public:
  Engine(const std::string& artifact_dir, const EngineOptions& options);
  RowResult generate(const std::string& prompt, const DecodeOptions& cfg);
  int max_seq() const { return manifest_.model.max_seq; }
  int max_beam_width() const { return cap_; }

 private:
  void set_beam_width_cap();
  void run(const std::vector<int64_t>& prompt, const DecodeOptions& cfg, Policy& policy, int n_blocks,
           CacheMode mode, RowResult& out);
  // bidirectional models (loop.py::_Batch.refresh / verify_canvas)
  void refresh(const int64_t* block, int64_t block_base, size_t suffix_len, int64_t* fi, float* fp);
  void verify_canvas(int64_t block_base, size_t suffix_len);
  // block-causal models: one forward over the t new tokens the caller put in ids/pos/mask
  void forward_block_causal(size_t t, size_t keep);

  Manifest manifest_;
  EngineOptions options_;
  int cap_;                   // min(manifest max_beam_width, user cap, free-memory estimate)
  std::string cap_reason_;    // what set cap_, for the warning
  std::string load_warning_;  // a schema-1 artifact's warning, until the first result carries it
  ByteTokenizer tokenizer_;
  std::unique_ptr<OrtBackend> backend_;
  // loop state, sized once per generate (grow-only)
  CacheMode mode_ = CacheMode::kExact;
  bool anchor_ = false;  // shifted logits under a bidirectional cache: the prefix's last token rides in each call
  size_t L_ = 0, W_ = 1, K_ = 1;
  int64_t mask_id_ = 0;
  std::vector<int64_t> state_;   // (L,)   the block state S
  std::vector<int64_t> nodes_;   // (W,L)  drafted states
  std::vector<int64_t> fi_;      // (L,K)  f(S): top ids
  std::vector<float> fp_;        // (L,K)  f(S): top probabilities
  std::vector<int64_t> vi_;      // (W,L,K) f(nodes): top ids
  std::vector<float> vp_;        // (W,L,K) f(nodes): top probabilities
  std::vector<int64_t> prefix_;  // prompt + committed blocks (canvas prefix; block-causal `none`)
  std::vector<int64_t> blk_;     // block id of each prefix token (block-causal `none`; prompt = 0)
};

}  // namespace dllm::detail
