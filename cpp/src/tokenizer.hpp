// Tokenizers of the C++ runtime, as the manifest's "tokenizer" section names them
// (dllm_deploy/models/tokenizer.py):
//   - "byte": the tiny dLLM's; bytes 0-255 are their own ids, specials follow: mask=256, eos=257, pad=258;
//   - "hf": a Hugging Face tokenizer.json, run by onnxruntime-extensions' tokenizer C API, loaded at
//     run time (docs/cpp.md, "Hugging Face tokenizers in C++").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dllm::detail {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of the text; invalid UTF-8 is read as U+FFFD first (Python's text is a str).
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The text of the ids before the first EOS, special tokens dropped (valid UTF-8).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
};

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kMask = 256, kEos = 257, kPad = 258;

  std::vector<int64_t> encode(const std::string& text) const override;
  // Bytes before the first EOS, specials dropped, decoded as UTF-8 with U+FFFD for each maximal
  // invalid subsequence (Python's bytes.decode("utf-8", errors="replace")).
  std::string decode(const std::vector<int64_t>& ids) const override;
};

struct OrtxLibrary;  // the loaded onnxruntime-extensions library (tokenizer.cpp)

// Python's HFTokenizer: encode is tokenizers' encode(text, add_special_tokens=False), decode is
// decode(ids before the first EOS, skip_special_tokens=True).
class HFTokenizer : public Tokenizer {
 public:
  // folder: the artifact; file / config: its tokenizer.json and tokenizer_config.json.
  HFTokenizer(const std::string& folder, const std::string& file, const std::string& config, int64_t eos_id);
  ~HFTokenizer() override;
  HFTokenizer(const HFTokenizer&) = delete;
  HFTokenizer& operator=(const HFTokenizer&) = delete;

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;

 private:
  void encode_plain(const std::string& piece, std::vector<int64_t>& out) const;

  std::shared_ptr<const OrtxLibrary> lib_;
  void* encoder_ = nullptr;  // the tokenizer without its added tokens: plain text only
  void* decoder_ = nullptr;  // the tokenizer as the files say
  std::vector<std::pair<std::string, int64_t>> added_;  // added tokens' contents and ids, longest first
  std::unordered_set<int64_t> special_;  // special added tokens: dropped by decode
  int64_t max_id_ = -1;                  // ids above are no token: dropped by decode
  int64_t eos_id_;
  // A byte-level BPE (decoder "ByteLevel"): each id's token string, decoded here as tokenizers
  // does (bytes through GPT-2's byte alphabet, invalid UTF-8 replaced sequence by sequence); the
  // extensions' detokenizer ends the text at the first invalid sequence. Empty: the extensions decode.
  std::vector<std::string> byte_level_;
};

// The manifest's tokenizer: kind "byte" or "hf" (an unknown kind is an artifact error).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& folder, const std::string& kind,
                                          const std::string& file, const std::string& config, int64_t eos_id);

// Python's errors="replace" UTF-8 decoding, re-encoded as valid UTF-8.
std::string utf8_replace_invalid(const std::string& bytes);

}  // namespace dllm::detail
