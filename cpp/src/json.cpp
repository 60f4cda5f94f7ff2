#include "json.hpp"

#include <charconv>
#include <cmath>

namespace dllm::detail {

namespace {

// Next code point of valid UTF-8 at s[i]; advances i. Invalid bytes map to U+FFFD.
unsigned next_code_point(const std::string& s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i++]);
  int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  if (c >= 0x80 && extra == 0) return 0xFFFD;
  unsigned cp = extra == 3 ? c & 0x07 : extra == 2 ? c & 0x0F : extra == 1 ? c & 0x1F : c;
  for (int k = 0; k < extra; ++k) {
    if (i >= s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (static_cast<unsigned char>(s[i++]) & 0x3F);
  }
  return cp;
}

}  // namespace

void append_json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  auto u4 = [&](unsigned u) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += hex[(u >> shift) & 0xF];
  };
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned cp = next_code_point(s, i);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (cp >= 0x7F && cp < 0x10000)) {
          if (cp == 0x7F) out += static_cast<char>(cp);
          else u4(cp);
        } else if (cp >= 0x10000) {
          cp -= 0x10000;
          u4(0xD800 + (cp >> 10));
          u4(0xDC00 + (cp & 0x3FF));
        } else {
          out += static_cast<char>(cp);
        }
    }
  }
  out += '"';
}

std::string format_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // 2 -> 2.0, as Python writes a float
  return s;
}

}  // namespace dllm::detail
