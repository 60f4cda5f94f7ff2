// The byte tokenizer of the tiny dLLM (dllm_deploy/models/tokenizer.py::ByteTokenizer):
// bytes 0-255 are their own ids; specials follow: mask=256, eos=257, pad=258.
// Hugging Face tokenizer.json ("hf" kind) is not supported in C++ yet.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dllm::detail {

struct ByteTokenizer {
  static constexpr int64_t kMask = 256, kEos = 257, kPad = 258;

  // The UTF-8 bytes of text; invalid bytes are read as U+FFFD first (utf8_replace_invalid).
  std::vector<int64_t> encode(const std::string& text) const;
  // Bytes before the first EOS, specials dropped, decoded as UTF-8 with U+FFFD for each maximal
  // invalid subsequence (Python's bytes.decode("utf-8", errors="replace")).
  std::string decode(const std::vector<int64_t>& ids) const;
};

// Python's errors="replace" UTF-8 decoding, re-encoded as valid UTF-8.
std::string utf8_replace_invalid(const std::string& bytes);

}  // namespace dllm::detail
