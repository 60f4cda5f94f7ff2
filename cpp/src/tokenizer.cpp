#include "tokenizer.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <unordered_set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "error.hpp"

#ifndef DLLM_ORTX_LIBRARY_DEFAULT
#define DLLM_ORTX_LIBRARY_DEFAULT ""
#endif
#ifndef DLLM_PYTHON_LIBRARY_DEFAULT
#define DLLM_PYTHON_LIBRARY_DEFAULT ""
#endif

namespace dllm::detail {

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  const std::string valid = utf8_replace_invalid(text);  // Python's text is a str: always valid UTF-8
  std::vector<int64_t> out;
  out.reserve(valid.size());
  for (unsigned char c : valid) out.push_back(c);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (int64_t i : ids) {
    if (i == kEos) break;
    if (i >= 0 && i < 256) bytes += static_cast<char>(i);
  }
  return utf8_replace_invalid(bytes);
}

std::string utf8_replace_invalid(const std::string& s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < n) {
    unsigned char c = byte(i);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    int need;                  // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      unsigned char b = byte(j);
      unsigned char l = got == 0 ? lo : 0x80, h = got == 0 ? hi : 0xBF;
      if (b < l || b > h) break;
      ++j, ++got;
    }
    if (got == need) out.append(s, i, j - i);
    else out += kReplacement;  // one U+FFFD for the maximal invalid subpart; resume at s[j]
    i = j;
  }
  return out;
}

// ---- onnxruntime-extensions' tokenizer C API (include/ortx_tokenizer.h, ortx_utils.h of its sources),
// loaded with dlopen so that the runtime builds and runs byte artifacts without it.

namespace {

using OrtxObject = void;
using TokenId = uint32_t;  // extTokenId_t

struct OrtxTokenizerBlob {  // the C API's struct, field for field
  const char* config_json_blob;
  const char* vocab_json_blob;
  const char* token_module_blob;
  const char* raw_model_blob;
  const char* reserved_blob_1;
  size_t config_blob_len, vocab_blob_len, token_module_blob_len, raw_model_blob_len, reserved_blob_1_len;
};

const char kInstall[] =
    "the 'hf' tokenizer needs onnxruntime-extensions' tokenizer library: `pip install onnxruntime-extensions` "
    "and set DLLM_ORTX_LIBRARY to its onnxruntime_extensions/_extensions_pydll*.so (docs/cpp.md)";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) artifact_error(path + ": cannot read the tokenizer file");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

nlohmann::json parse_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    artifact_error(path + ": not valid JSON (" + e.what() + ")");
  }
}

std::string dir_of_this_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&dir_of_this_library), &info) || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The Python extension module of the wheel refers to libpython's symbols (its tokenizer API never
// calls them, and no interpreter is started): make them resolvable unless the process has them.
void load_python_symbols() {
  if (dlsym(RTLD_DEFAULT, "PyInstanceMethod_Type")) return;
  const char* env = std::getenv("DLLM_PYTHON_LIBRARY");
  const std::string path = env && *env ? env : DLLM_PYTHON_LIBRARY_DEFAULT;
  if (path.empty() || !dlopen(path.c_str(), RTLD_LAZY | RTLD_GLOBAL))
    fail(DLLM_ERROR_UNSUPPORTED, std::string(kInstall) + "; that library is a Python extension and needs "
                                 "libpython: set DLLM_PYTHON_LIBRARY to the libpython3.X.so of the Python it was "
                                 "installed for" + (path.empty() ? "" : " (" + path + ": " + dlerror() + ")"));
}

void* open_library(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    const std::string why = dlerror();
    if (why.find("undefined symbol: Py") == std::string::npos && why.find("undefined symbol: _Py") == std::string::npos)
      fail(DLLM_ERROR_UNSUPPORTED, std::string(kInstall) + " (" + why + ")");
    load_python_symbols();
    h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!h) fail(DLLM_ERROR_UNSUPPORTED, std::string(kInstall) + " (" + dlerror() + ")");
  }
  return h;
}

// DLLM_ORTX_LIBRARY, else libortextensions.so beside this library, else the build's default (the
// onnxruntime_extensions package of the Python that built it).
std::string find_library() {
  const char* env = std::getenv("DLLM_ORTX_LIBRARY");
  if (env && *env) {
    if (access(env, R_OK) != 0) fail(DLLM_ERROR_UNSUPPORTED, std::string(kInstall) + " (DLLM_ORTX_LIBRARY=" + env + ": no such file)");
    return env;
  }
  for (const std::string& path : {dir_of_this_library() + "/libortextensions.so", std::string(DLLM_ORTX_LIBRARY_DEFAULT)})
    if (!path.empty() && access(path.c_str(), R_OK) == 0) return path;
  fail(DLLM_ERROR_UNSUPPORTED, std::string(kInstall) + " (none found)");
}

}  // namespace

struct OrtxLibrary {
  int (*create_from_blob)(OrtxObject**, const OrtxTokenizerBlob*);
  int (*update_options)(OrtxObject*, const char**, const char**, size_t);
  int (*tokenize)(const OrtxObject*, const char**, size_t, OrtxObject**);
  int (*ids_item)(const OrtxObject*, size_t, const TokenId**, size_t*);
  int (*detokenize_1d)(const OrtxObject*, const TokenId*, size_t, OrtxObject**);
  int (*strings_item)(const OrtxObject*, size_t, const char**);
  int (*dispose)(OrtxObject**);
  const char* (*last_error)();

  // Throws DLLM_ERROR_INTERNAL with the library's message on a failed call.
  void check(int status, const char* what) const {
    if (status != 0) fail(DLLM_ERROR_INTERNAL, std::string("onnxruntime-extensions ") + what + ": " + last_error());
  }

  static std::shared_ptr<const OrtxLibrary> get() {  // loaded once per process, never unloaded
    static std::mutex mu;
    static std::shared_ptr<const OrtxLibrary> lib;
    std::lock_guard<std::mutex> lock(mu);
    if (!lib) lib = load(find_library());
    return lib;
  }

 private:
  static std::shared_ptr<const OrtxLibrary> load(const std::string& path) {
    void* h = open_library(path);
    auto lib = std::make_shared<OrtxLibrary>();
    auto sym = [&](const char* name) {
      void* f = dlsym(h, name);
      if (!f) fail(DLLM_ERROR_UNSUPPORTED, path + ": no " + name + " (onnxruntime-extensions >= 0.13 has it)");
      return f;
    };
    lib->create_from_blob = reinterpret_cast<decltype(create_from_blob)>(sym("OrtxCreateTokenizerFromBlob"));
    lib->update_options = reinterpret_cast<decltype(update_options)>(sym("OrtxUpdateTokenizerOptions"));
    lib->tokenize = reinterpret_cast<decltype(tokenize)>(sym("OrtxTokenize"));
    lib->ids_item = reinterpret_cast<decltype(ids_item)>(sym("OrtxTokenId2DArrayGetItem"));
    lib->detokenize_1d = reinterpret_cast<decltype(detokenize_1d)>(sym("OrtxDetokenize1D"));
    lib->strings_item = reinterpret_cast<decltype(strings_item)>(sym("OrtxStringArrayGetItem"));
    lib->dispose = reinterpret_cast<decltype(dispose)>(sym("OrtxDispose"));
    lib->last_error = reinterpret_cast<decltype(last_error)>(sym("OrtxGetLastErrorMessage"));
    return lib;
  }
};

namespace {

// An onnxruntime-extensions object, disposed at scope exit.
struct Owned {
  const OrtxLibrary& lib;
  OrtxObject* p = nullptr;
  ~Owned() {
    if (p) lib.dispose(&p);
  }
};

// A tokenizer from the two files' texts, with tokenizers' Python defaults: no special tokens added on
// encode, skipped on decode, no clean-up of spaces (that is transformers', not tokenizers').
OrtxObject* create(const OrtxLibrary& lib, const nlohmann::json& tokenizer, nlohmann::json config,
                   const std::string& where) {
  config["clean_up_tokenization_spaces"] = false;
  const std::string cfg = config.dump(), vocab = tokenizer.dump();
  const OrtxTokenizerBlob blob{cfg.data(), vocab.data(), nullptr, nullptr, nullptr, cfg.size(), vocab.size(), 0, 0, 0};
  OrtxObject* tok = nullptr;
  if (lib.create_from_blob(&tok, &blob) != 0)
    fail(DLLM_ERROR_UNSUPPORTED, where + ": onnxruntime-extensions cannot load this tokenizer: " + lib.last_error());
  const char* keys[] = {"add_special_tokens", "skip_special_tokens"};
  const char* values[] = {"false", "true"};
  lib.check(lib.update_options(tok, keys, values, 2), "tokenizer options");
  return tok;
}

}  // namespace

HFTokenizer::HFTokenizer(const std::string& folder, const std::string& file, const std::string& config,
                         int64_t eos_id)
    : lib_(OrtxLibrary::get()), eos_id_(eos_id) {
  const std::string where = folder + "/" + file;
  const nlohmann::json tok = parse_json(where), cfg = parse_json(folder + "/" + config);
  const bool normalizer = tok.contains("normalizer") && !tok["normalizer"].is_null();
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (const nlohmann::json& a : tok["added_tokens"]) {
      const std::string content = a.value("content", "");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (a.value(flag, false))
          fail(DLLM_ERROR_UNSUPPORTED, where + ": added token " + quoted(content) + " has " + flag +
                                       ": not supported by the C++ runtime");
      if (a.value("normalized", false) && normalizer)
        fail(DLLM_ERROR_UNSUPPORTED, where + ": added token " + quoted(content) +
                                     " is matched after normalization: not supported by the C++ runtime");
      const int64_t id = a.value("id", int64_t{-1});
      if (!content.empty()) added_.emplace_back(content, id);
      if (a.value("special", false)) special_.insert(id);
      max_id_ = std::max(max_id_, id);
    }
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object())
    for (const auto& kv : tok["model"]["vocab"].items())
      if (kv.value().is_number_integer()) max_id_ = std::max(max_id_, kv.value().get<int64_t>());
  std::stable_sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  const bool byte_level = tok.contains("decoder") && tok["decoder"].is_object() &&
                          tok["decoder"].value("type", "") == "ByteLevel" && tok.contains("model") &&
                          tok["model"].is_object() && tok["model"].value("type", "") == "BPE";
  if (byte_level) {
    byte_level_.assign(static_cast<size_t>(max_id_ + 1), std::string());
    for (const auto& kv : tok["model"]["vocab"].items())
      if (kv.value().is_number_integer() && kv.value().get<int64_t>() >= 0)
        byte_level_[static_cast<size_t>(kv.value().get<int64_t>())] = kv.key();
    for (const auto& [content, id] : added_)
      if (id >= 0) byte_level_[static_cast<size_t>(id)] = content;
  }
  // The extensions' own added-token matcher drops the text after a '<' that begins no added token
  // near the end of the input (0.15.2): the encoder gets none, and encode() splits them off itself.
  nlohmann::json plain_tok = tok, plain_cfg = cfg;
  plain_tok["added_tokens"] = nlohmann::json::array();
  plain_cfg.erase("added_tokens_decoder");
  decoder_ = create(*lib_, tok, cfg, where);
  try {
    encoder_ = create(*lib_, plain_tok, plain_cfg, where);
  } catch (...) {
    lib_->dispose(&decoder_);
    throw;
  }
}

HFTokenizer::~HFTokenizer() {
  lib_->dispose(&encoder_);
  lib_->dispose(&decoder_);
}

void HFTokenizer::encode_plain(const std::string& piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  Owned ids{*lib_};
  const char* input[] = {piece.c_str()};
  lib_->check(lib_->tokenize(encoder_, input, 1, &ids.p), "tokenize");
  const TokenId* p = nullptr;
  size_t n = 0;
  lib_->check(lib_->ids_item(ids.p, 0, &p, &n), "tokenize");
  out.insert(out.end(), p, p + n);
}

// tokenizers' added-token split (leftmost, then longest match on the text), the text between them
// through the extensions' tokenizer.
std::vector<int64_t> HFTokenizer::encode(const std::string& text) const {
  const std::string s = utf8_replace_invalid(text);
  std::vector<int64_t> out;
  size_t start = 0;  // of the plain text not yet encoded
  for (size_t i = 0; i < s.size();) {
    const auto hit = std::find_if(added_.begin(), added_.end(),
                                  [&](const auto& a) { return s.compare(i, a.first.size(), a.first) == 0; });
    if (hit == added_.end()) {
      ++i;
      continue;
    }
    encode_plain(s.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_plain(s.substr(start), out);
  return out;
}

namespace {

// GPT-2's byte alphabet (tokenizers' ByteLevel): the code point that stands for each byte, inverted.
const std::array<int, 324>& byte_of_char() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[printable ? b : 256 + extra++] = b;
    }
    return t;
  }();
  return table;
}

// One token's bytes: every character through the byte alphabet, or, where one has no byte (an
// added token's text), the token's own UTF-8 (tokenizers' ByteLevel decoder does the same).
void append_byte_level(const std::string& token, std::string& out) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    int cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len && i + k < token.size(); ++k) cp = (cp << 6) | (token[i + k] & 0x3F);
    const auto& table = byte_of_char();
    if (cp < 0 || cp >= static_cast<int>(table.size()) || table[cp] < 0) {
      out += token;
      return;
    }
    bytes += static_cast<char>(table[cp]);
    i += len;
  }
  out += bytes;
}

}  // namespace

std::string HFTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<TokenId> kept;
  for (int64_t i : ids) {
    if (i == eos_id_) break;
    if (i >= 0 && i <= max_id_ && !special_.count(i)) kept.push_back(static_cast<TokenId>(i));  // others: dropped
  }
  if (!byte_level_.empty()) {
    std::string bytes;
    for (TokenId i : kept) append_byte_level(byte_level_[static_cast<size_t>(i)], bytes);
    return utf8_replace_invalid(bytes);
  }
  if (kept.empty()) return "";  // the C API refuses no ids, and gives U+FFFD for no text
  Owned strings{*lib_};
  lib_->check(lib_->detokenize_1d(decoder_, kept.data(), kept.size(), &strings.p), "detokenize");
  const char* text = nullptr;
  lib_->check(lib_->strings_item(strings.p, 0, &text), "detokenize");
  return text;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& folder, const std::string& kind,
                                          const std::string& file, const std::string& config, int64_t eos_id) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "hf") {
    if (config.empty())
      fail(DLLM_ERROR_UNSUPPORTED, folder + ": the manifest's tokenizer has no tokenizer_config.json for C++: "
                                   "re-export the artifact with this version");
    return std::make_unique<HFTokenizer>(folder, file, config, eos_id);
  }
  artifact_error(folder + ": unknown tokenizer kind " + quoted(kind) + " in the manifest");
}

}  // namespace dllm::detail
