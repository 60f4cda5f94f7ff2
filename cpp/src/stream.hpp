// Stop conditions and streaming for one row (docs/streaming.md; Python: dllm_deploy/runtime/
// stream.py): after every forward the decode loop reports the row's final ids, and this turns them
// into chunks under the same rules as Python, so both cut the same chunks from the same tokens:
//   - final ids: cut just after the first EOS and to max_tokens (the loop passes the finished
//     blocks' tokens and the current block's committed left-to-right prefix);
//   - a chunk whenever the final id count grew; a stop string cuts the text before it and finishes
//     the row ("stop"), then EOS ("eos"), then the budget min(max_tokens, canvas) ("length");
//   - while the row goes on, a trailing U+FFFD and then the longest trailing proper prefix of a stop
//     string are held back, and the ids whose text is not yet released with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer.hpp"

namespace dllm::detail {

struct Chunk {
  std::string delta;               // new text (valid UTF-8)
  std::vector<int64_t> token_ids;  // new final ids
  int64_t forwards = 0;            // the row's forwards so far
  int64_t tokens = 0;              // its ids released so far (the chunks' token_ids joined; Python's t.sent)
  const char* finish_reason = nullptr;  // NULL, except on the row's last chunk: "eos" | "stop" | "length"

  std::string to_json(int index) const;  // one line of `generate --stream --json`
};

class RowStream {
 public:
  // budget: min(max_tokens, canvas) final ids at most; tokenizer: the engine's, which outlives the stream.
  RowStream(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t budget, int64_t eos_id);
  // A model with several ids that end a row (Gemma: <eos> and <end_of_turn>).
  RowStream(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t budget, std::vector<int64_t> eos_ids);

  // The row's final ids before the cuts (finished blocks, then the committed prefix); true when a
  // chunk is due, written to *out. always: a chunk even when no id came (one per uniform-diffusion
  // canvas, as Python's uniform_decoder.py yields).
  bool report(const std::vector<int64_t>& ids, int64_t forwards, Chunk* out, bool always = false);

  // Fewer final ids than the budget said will come (a uniform-diffusion row whose canvases ran
  // out, pad tokens not counted): the next report that reaches `budget` ends the row ("length").
  void set_budget(int64_t budget) { budget_ = budget; }
  int64_t budget() const { return budget_; }
  bool finished() const { return reason_ != nullptr; }
  const char* finish_reason() const { return reason_; }
  const std::string& text() const { return text_; }           // released so far
  const std::vector<int64_t>& ids() const { return ids_; }    // released so far

 private:
  std::string held_back(const std::string& text) const;        // text without the held-back tail
  size_t stop_cut(const std::string& text) const;              // the earliest stop string's start, or npos
  size_t ids_within(const std::vector<int64_t>& ids, size_t n_max, const std::string& text) const;
  bool is_eos(int64_t id) const;

  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_;
  int64_t budget_;
  std::vector<int64_t> eos_ids_;
  size_t reported_ = 0;             // the final id count at the last chunk
  const char* reason_ = nullptr;
  std::string text_;
  std::vector<int64_t> ids_;
  std::vector<int64_t> final_;      // scratch: the cut final ids
};

}  // namespace dllm::detail
