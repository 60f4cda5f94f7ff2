// The decode loop for a batch of prompts: a port of dllm_deploy/runtime/loop.py (_Run) that is
// token-identical to it, counters included, in the same steps (each over the live rows, B):
//     first_block                        the first block's all-mask state and f of it
//     per block, decode_block:           until the block is full or ends (block_status)
//         nodes = policy.plan(S, f(S))       # W drafted block states (node 0 = base rule's step)
//         f(nodes) = one verify forward      # W branches under a tree mask
//         S, f(S) = policy.select(nodes, f)  # as deep as verification allows
//     next_block                         commit (block-causal) or refresh (bidirectional)
// What each forward feeds is a canvas.hpp Plan (the builders of canvas.py); run_plan is the one
// place an engine call is made. Every forward counts. Under sampling (temperature > 0)
// each forward also feeds every token's uniform: a pure function of (seed, request,
// position, base-rule step), so a drafted node sees the noise its base-rule step would.
//
// Rows move block by block in lockstep: a row whose block is full waits for the others (its
// results are ignored and it is not charged the forward); a finished row (EOS, a stop string, the
// budget) leaves the batch at the end of the block, its cache rows with it.
//
// Dimension legend: B live rows, p longest prompt (the rows are left-padded to it), L block length,
// W beam width, K top-k, N = p + n_blocks * L.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "canvas.hpp"
#include "manifest.hpp"
#include "ort_backend.hpp"
#include "policy.hpp"
#include "self_spec.hpp"
#include "stream.hpp"
#include "tokenizer.hpp"

namespace dllm::detail {

struct RowResult {
  std::string text;                    // the released text: the chunks' deltas joined
  std::vector<int64_t> token_ids;
  int64_t forwards = 0;
  int64_t tokens = 0;
  double tpf = 0.0;
  double wall_s = 0.0;
  double tokens_per_s = 0.0;
  double backend_s = 0.0;
  int beam_width_used = 1;
  int beam_width_requested = 1;
  bool finished = false;               // eos or stop
  std::string finish_reason;           // "eos" | "stop" | "length" | "cancelled" (the callback said stop)
  double time_to_first_token_s = -1;   // decode start -> the first chunk with token ids; -1: none
  std::vector<int64_t> accepted_hist;  // [steps] -> verifications that accepted that many
  std::string warnings;

  std::string to_json() const;  // the keys of `dllm-deploy generate --json` + backend_s
  // The row's released text and ids from its stream (no finish reason: "cancelled"), and the
  // counters derived from them over `forwards` (set before), the call's wall and backend seconds.
  void finish(const RowStream& stream, double wall, double backend);
};

struct RuntimeOptions {
  std::string precision = "fp32";
  int intra_op_threads = 0;
  int max_beam_width = 0;  // user cap; 0 = none
  bool verify_hashes = true;
  bool warnings_to_stderr = true;
};

// models/capabilities.py::resolve_cache (the same message table): the mode a model with these
// capabilities runs under beam width W.
CacheMode resolve_cache(const std::string& mode, const Capabilities& caps, int width);

// Called on the decoding thread with each chunk (stream.hpp) of row `index` (the prompt's position
// in the call); false cancels the generation.
using ChunkSink = std::function<bool(size_t index, const Chunk&)>;
using TraceSink = std::function<void(const std::string& json_line)>;

class Runtime {
 public:
  Runtime(const std::string& artifact_dir, const RuntimeOptions& options);
  // The row decoded under cfg's stop conditions (max_tokens, stop, EOS); sink (optional) gets the
  // chunks as they become final. A cancelled generation returns what was delivered, finish_reason
  // "cancelled"; the runtime stays usable.
  RowResult generate(const std::string& prompt, const DecodeOptions& cfg, const ChunkSink& sink = ChunkSink());
  // The prompts decoded together as one batch (every row under cfg): one result per prompt. A
  // cancel ends every row that has not finished ("cancelled").
  std::vector<RowResult> generate(const std::vector<std::string>& prompts, const DecodeOptions& cfg,
                                  const ChunkSink& sink = ChunkSink());
  // A self-speculative model's decode (self_spec.cpp): its capabilities' attention is "causal".
  // sink (optional) gets each round's final text as chunks; a cancel ends every unfinished row.
  std::vector<RowResult> self_spec(const std::vector<std::string>& prompts, const SelfSpecOptions& options,
                                   const ChunkSink& sink = ChunkSink());
  bool self_speculative() const { return manifest_.caps.attention == "causal"; }
  // Each decision record of the masked decode loop (trace.cpp), one JSON line, as its iteration
  // ends; an empty sink turns tracing off.
  void set_trace(TraceSink sink) { trace_ = std::move(sink); }
  int max_seq() const { return manifest_.model.max_seq; }
  int max_beam_width() const { return cap_; }

 private:
  void set_beam_width_cap();
  void run(const std::vector<std::vector<int64_t>>& prompts, const DecodeOptions& cfg, Policy& policy,
           int n_blocks, CacheMode mode, std::vector<RowResult>& out);
  bool report(std::vector<RowResult>& out);  // after every forward: the rows' final ids to their streams; true: cancelled
  void size_buffers(const std::vector<std::vector<int64_t>>& prompts, size_t n_blocks, CacheMode mode, size_t W);
  void first_block();
  void decode_block(size_t k, Policy& policy, std::vector<RowResult>& out);
  bool finish_block(size_t k);  // the rows' tokens kept; the finished rows leave; true: some row goes on
  void next_block(size_t k);
  Plan verify_plan(size_t k) const;
  void held_verify_run(const int64_t* steps);  // mode delayed's verify forward (held_verify)
  void drop_held();                            // the held keys leave the cache
  size_t suffix_len(size_t k) const { return bidi_ ? (n_blocks_ - k - 1) * L_ : 0; }
  size_t B() const { return rows_.size(); }
  // steps (B,W): the base-rule step each of the plan's branches serves (noise.hpp; NULL: a
  // block-start forward, step 0).
  void run_plan(const Plan& plan, const int64_t* steps, int64_t* top_ids, float* top_probs);
  void fill_noise(const Plan& plan, const int64_t* steps);
  void set_sampling(const DecodeOptions& cfg);

  Manifest manifest_;
  RuntimeOptions options_;
  int cap_;                   // min(manifest max_beam_width, user cap, free-memory estimate)
  std::string cap_reason_;    // what set cap_, for the warning
  std::unique_ptr<Tokenizer> tokenizer_;  // the manifest's
  std::unique_ptr<OrtBackend> backend_;
  // loop state, sized once per generate (grow-only)
  CacheMode mode_ = CacheMode::kExact;
  bool bidi_ = false;    // LLaDA / Dream: the canvas carries the suffix of masks
  bool anchor_ = false;  // shifted logits: under a bidirectional cache the prefix's last token rides in each call
  size_t L_ = 0, W_ = 1, K_ = 1, n_blocks_ = 0;
  int64_t mask_id_ = 0, eos_id_ = 0;
  bool sampling_ = false;        // temperature > 0: each fed token gets its uniform
  uint64_t seed_ = 0, request_ = 0;
  std::vector<int> depths_;      // (W,) the policy's node depths
  TraceSink trace_;                    // decision records (set_trace)
  std::vector<TraceRecord> records_;   // (B,) this iteration's, when tracing
  std::vector<uint8_t> recorded_;      // (B,) records_[r] is this iteration's
  void flush_trace();
  std::vector<int64_t> branch_steps_;  // (B,W) the step each verified node serves
  std::vector<int64_t> col_steps_;     // (B,T) the step of each fed column
  Prefix prefix_;                // (B,P) prompts + committed blocks
  std::vector<size_t> rows_;     // (B,) live row -> its prompt's index
  std::vector<std::vector<int64_t>> done_;  // per prompt: its finished blocks' tokens
  std::vector<uint8_t> stopped_; // per prompt: finished by its report (stop string, EOS, budget)
  std::vector<int64_t> final_;   // scratch: done_ + the current block's committed prefix
  std::vector<RowStream> streams_;  // per prompt
  const ChunkSink* sink_ = nullptr;
  Chunk chunk_;
  bool cancelled_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::vector<int64_t> state_;   // (B,L)   the block states S
  std::vector<int64_t> nodes_;   // (B,W,L) drafted states
  std::vector<int64_t> fi_;      // (B,L,K) f(S): top ids
  std::vector<float> fp_;        // (B,L,K) f(S): top probabilities
  std::vector<int64_t> vi_;      // (B,W,L,K) f(nodes): top ids
  std::vector<float> vp_;        // (B,W,L,K) f(nodes): top probabilities
  std::vector<int64_t> step_;    // (B,) rule steps taken in the block
  std::vector<uint8_t> full_;    // (B,) the row's block is full (or ended) or the row stopped
  // mode delayed: the block's held keys after the prefix in the cache, and its positions' state
  std::vector<uint8_t> held_;    // (B,E) 0: a pad slot
  size_t held_len_ = 0;          // E
  std::vector<uint8_t> cached_;  // (B,L) the position's KV is held
  std::vector<uint8_t> fresh_;   // (B,L) committed, KV not held yet
};

}  // namespace dllm::detail
