// Engine calls as plain values: the tokens, positions and mask of every forward the decode loop
// makes. A mirror of dllm_deploy/runtime/canvas.py: the same builders, the same argument meaning,
// the same Plan (tests/data/golden/ hold Python's plans; cpp/tests/test_canvas.cpp rebuilds each
// one here and compares exactly). Nothing here runs a model.
//
//     block-causal model (cache exact | none | delayed)   bidirectional model (LLaDA, Dream: none | prefix | dual)
//     first_block    [prompt | block]                   refresh        [prefix | block | suffix]
//     tree_verify    W branches of the block                             dual: [prefix | suffix | block]
//     commit_next    [block | next block]               canvas_verify  W branches [anchor | node | suffix]
//     held_verify    delayed: [fresh | masked] of the block
//
// Mode delayed (W = 1) is exact at block boundaries (first_block, commit_next as in exact) and
// approximate inside a block: a committed position's KV is cached by the first call after its
// commit, later calls feed only the positions committed since and the masked ones; the decoder
// drops those held keys before the commit.
//
// Dimension legend: B rows, P prefix positions, L block length, W branches, S suffix positions,
// G positions of one branch, T tokens fed, C cached positions the fed tokens attend besides
// themselves. Every array is row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dllm::detail {

enum class CacheMode { kNone, kExact, kPrefix, kDual, kDelayed };

// The mode of a cache-mode name (none, prefix, dual, exact, delayed); std::invalid_argument for another.
CacheMode cache_mode_named(const std::string& name);

// Which cache a plan runs over: the rows' own, a new one that becomes the rows' (refresh), or a
// throwaway one (mode none).
enum class PlanCache { kReuse, kNew, kScratch };

// The rows' committed tokens: what every call attends before the block.
struct Prefix {
  size_t rows = 0, length = 0;      // B, P
  std::vector<int64_t> ids;         // (B,P) left-padded prompt, then committed blocks
  std::vector<int64_t> positions;   // (B,P) position ids (a pad takes position 0)
  std::vector<uint8_t> valid;       // (B,P) 0: left pad, attended by nothing but itself
  std::vector<int64_t> blocks;      // (B,P) block id: the prompt 0, generated blocks 1, 2, ...

  static Prefix of_prompt(const std::vector<int64_t>& prompt);  // one row, no padding
  // One row per prompt, left-padded with pad_id to the longest (canvas.py::Prefix.of_prompts).
  static Prefix of_prompts(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id);
  void take(const std::vector<size_t>& keep);   // only the rows keep (ascending) go on
  void extend(const int64_t* block, size_t n);  // a finished block (B,n) joins as the next block id
  int64_t next_position(size_t r, size_t i) const { return positions[r * length + length - 1] + 1 + int64_t(i); }
};

// One engine call.
struct Plan {
  size_t rows = 0, tokens = 0, cached = 0;   // B, T, C
  std::vector<int64_t> ids;                  // (B,T) tokens fed
  std::vector<int64_t> positions;            // (B,T) their position ids
  std::vector<uint8_t> mask;                 // (B,T,C+T) 1: may attend; keys are [cache | fed tokens]
  size_t keep = 0;                           // fed tokens whose KV the cache keeps; 0: verify only
  PlanCache cache = PlanCache::kReuse;
  size_t branches = 0, length = 0;           // W, L of read
  std::vector<int64_t> read;                 // (W,L) output column of each branch position
  bool per_row = false;                      // read is (B,W,L): each row's own columns (held_verify)
};

// Block-causal models (mode exact or none; another mode throws std::invalid_argument).
Plan first_block(const Prefix& prefix, const int64_t* block, size_t n, CacheMode mode);       // block (B,n)
Plan tree_verify(const Prefix& prefix, const int64_t* nodes, size_t w, size_t n, CacheMode mode);  // (B,w,n)
Plan commit_next(const Prefix& prefix, const int64_t* block, const int64_t* nxt, size_t n, CacheMode mode);
// Mode delayed (W = 1): the block state (B,n) over the prefix and `held` (B,e) in-block keys (0: a
// pad slot); each row feeds [its fresh positions | its masked positions], each part padded to the
// batch's longest, and the cache keeps the fresh part. fresh (B,n): committed, KV not cached yet.
// Reads (B,1,n) per row: a masked position's column, 0 elsewhere (canvas.py::held_verify).
Plan held_verify(const Prefix& prefix, const std::vector<uint8_t>& held, size_t e, const int64_t* block,
                 const uint8_t* fresh, size_t n, int64_t mask_id, int64_t pad_id);
// Bidirectional models (mode none, prefix or dual); anchor: shifted logits (Dream).
Plan refresh(const Prefix& prefix, const int64_t* block, size_t n, size_t suffix_len, int64_t mask_id,
             CacheMode mode, bool anchor);
Plan canvas_verify(const Prefix& prefix, const int64_t* nodes, size_t w, size_t n, size_t suffix_len,
                   int64_t mask_id, CacheMode mode, bool anchor);

}  // namespace dllm::detail
