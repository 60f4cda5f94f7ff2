#include "json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace dllm::detail {

const Json* Json::find(const std::string& key) const {
  if (type != Type::Object) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Json document() {
    skip_ws();
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("Extra data");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 200;
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void error(const char* what) const {
    size_t line = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) line += s_[k] == '\n';
    throw std::runtime_error(std::string(what) + ", line " + std::to_string(line));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) error("Nesting too deep");
    if (i_ >= s_.size()) error("Expecting value");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.type = Json::Type::Object;
      skip_ws();
      if (eat('}')) return v;
      for (;;) {
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != '"') error("Expecting property name enclosed in double quotes");
        std::string key = string_body();
        skip_ws();
        if (!eat(':')) error("Expecting ':' delimiter");
        skip_ws();
        v.object.emplace_back(std::move(key), value(depth + 1));
        skip_ws();
        if (eat('}')) return v;
        if (!eat(',')) error("Expecting ',' delimiter");
      }
    }
    if (c == '[') {
      ++i_;
      v.type = Json::Type::Array;
      skip_ws();
      if (eat(']')) return v;
      for (;;) {
        skip_ws();
        v.array.push_back(value(depth + 1));
        skip_ws();
        if (eat(']')) return v;
        if (!eat(',')) error("Expecting ',' delimiter");
      }
    }
    if (c == '"') {
      v.type = Json::Type::String;
      v.string = string_body();
      return v;
    }
    if (literal("true")) {
      v.type = Json::Type::Bool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = Json::Type::Bool;
      return v;
    }
    if (literal("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    error("Expecting value");
  }

  Json number() {
    size_t start = i_;
    bool integral = true;
    eat('-');
    if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) error("Expecting value");
    if (s_[i_] == '0') {
      ++i_;
    } else {
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    if (eat('.')) {
      integral = false;
      if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) error("Expecting digits after '.'");
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      integral = false;
      ++i_;
      if (!eat('+')) eat('-');
      if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) error("Expecting exponent digits");
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    Json v;
    v.type = Json::Type::Number;
    const char* first = s_.data() + start;
    const char* last = s_.data() + i_;
    if (integral) {
      auto r = std::from_chars(first, last, v.integer);
      if (r.ec == std::errc()) {
        v.integral = true;
        v.number = static_cast<double>(v.integer);
        return v;
      }
    }
    std::string text(first, last);
    v.number = std::strtod(text.c_str(), nullptr);
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) error("Invalid \\uXXXX escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= c - '0';
      else if (c >= 'a' && c <= 'f') u |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') u |= c - 'A' + 10;
      else error("Invalid \\uXXXX escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string_body() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) error("Unterminated string starting at");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("Invalid control character");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) error("Unterminated string starting at");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            size_t save = i_;
            i_ += 2;
            unsigned lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              i_ = save;
            }
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate has no UTF-8 form
          put_utf8(out, cp);
          break;
        }
        default: error("Invalid \\escape");
      }
    }
  }
};

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

Json parse_json(const std::string& text) { return Parser(text).document(); }

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
