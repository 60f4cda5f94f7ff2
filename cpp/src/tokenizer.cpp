#include "tokenizer.hpp"

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

}  // namespace dllm::detail
