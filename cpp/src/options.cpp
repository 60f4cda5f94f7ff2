#include "options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "decode_options.gen.hpp"
#include "error.hpp"

namespace dllm::detail {

size_t option_count() { return kDecodeOptionCount; }
const OptionSpec& option_at(size_t index) { return kDecodeOptions[index]; }

namespace {

// A declared bound as Python's options._num writes it: an integral value without a fraction
// (the seed's 2**64 - 1, stored as the double 2**64, included).
std::string number(double v) {
  if (v == 0x1p64) return "18446744073709551615";
  char buf[32];
  std::snprintf(buf, sizeof buf, std::floor(v) == v && std::fabs(v) < 0x1p53 ? "%.0f" : "%g", v);
  return buf;
}

[[noreturn]] void bad(const OptionSpec& o, const std::string& what) {
  option_error(DLLM_ERROR_BAD_OPTION, o.name, std::string(o.label) + " " + what);
}

bool has_choice(const OptionSpec& o, const std::string& v) {
  const std::string all = std::string("|") + o.choices + "|";
  return all.find("|" + v + "|") != std::string::npos;
}

std::string choices_text(const OptionSpec& o) {
  std::string s = o.choices;
  for (size_t at = s.find('|'); at != std::string::npos; at = s.find('|', at)) s.replace(at, 1, ", ");
  return s;
}

std::string range_text(const OptionSpec& o) {
  if (o.has_min && o.has_max)
    return std::string("in ") + (o.min_exclusive ? "(" : "[") + number(o.min) + ", " + number(o.max) +
           (o.max_exclusive ? ")" : "]");
  if (o.has_min) return std::string(o.min_exclusive ? "> " : ">= ") + number(o.min);
  return std::string(o.max_exclusive ? "< " : "<= ") + number(o.max);
}

bool in_range(const OptionSpec& o, double v) {
  const bool low = !o.has_min || (o.min_exclusive ? v > o.min : v >= o.min);
  return low && (!o.has_max || (o.max_exclusive ? v < o.max : v <= o.max));
}

bool is_default(const OptionSpec& o, const OptionValue& v) {
  const std::string d = o.default_text;
  if (v.null || d == "null") return v.null && d == "null";
  switch (o.type) {
    case OptionType::kStr: return v.s == d;
    case OptionType::kBool: return v.b == (d == "true");
    case OptionType::kInt: return v.f == std::strtod(d.c_str(), nullptr);
    case OptionType::kFloat: return v.f == std::strtod(d.c_str(), nullptr);
  }
  return false;
}

// `shown`: the value as the user wrote it, for the message.
void check(const OptionSpec& o, const OptionValue& v, const std::string& shown) {
  if (v.null) {
    if (!o.nullable) bad(o, "must be set, got null");
    return;
  }
  if (*o.choices && !has_choice(o, v.s))
    option_error(DLLM_ERROR_BAD_OPTION, o.name, std::string("unknown ") + o.label + " '" + v.s +
                                                    "' (expected one of " + choices_text(o) + ")");
  const double x = v.f;
  if ((o.type == OptionType::kInt || o.type == OptionType::kFloat) && (o.has_min || o.has_max) && !in_range(o, x))
    bad(o, "must be " + range_text(o) + ", got " + shown);
  if (!o.implemented && !is_default(o, v))
    option_error(DLLM_ERROR_UNSUPPORTED, o.name, std::string(o.label) + " is not implemented yet (only " +
                                                     o.default_text + " is accepted), got " + shown);
}

// An int declared with a maximum beyond int32: a uint64_t field (gen_decode_options.py).
bool wide(const OptionSpec& o) { return o.type == OptionType::kInt && o.has_max && o.max > 2147483647.0; }

OptionValue parse(const OptionSpec& o, const std::string& text) {
  OptionValue v;
  if (o.nullable && text == "null") {
    v.null = true;
    return v;
  }
  char* end = nullptr;
  errno = 0;
  switch (o.type) {
    case OptionType::kInt: {
      if (wide(o) && !text.empty() && text[0] != '-') {  // a uint64_t field: all 64 bits
        const unsigned long long x = std::strtoull(text.c_str(), &end, 10);
        if (*end != '\0' || errno != 0) bad(o, "must be an integer, got '" + text + "'");
        return option_value(static_cast<uint64_t>(x));
      }
      const long long x = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno != 0 || x < -2147483647LL || x > 2147483647LL)
        bad(o, "must be an integer, got '" + text + "'");
      v.i = x, v.u = x < 0 ? 0 : static_cast<uint64_t>(x), v.f = static_cast<double>(x);
      break;
    }
    case OptionType::kFloat:
      v.f = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || std::isnan(v.f)) bad(o, "must be a number, got '" + text + "'");
      break;
    case OptionType::kBool:
      if (text != "true" && text != "false" && text != "1" && text != "0")
        bad(o, "must be true or false, got '" + text + "'");
      v.b = text == "true" || text == "1";
      break;
    case OptionType::kStr:
      v.s = text;
      break;
  }
  return v;
}

std::string shown(const OptionSpec& o, const OptionValue& v) {
  if (v.null) return "null";
  switch (o.type) {
    case OptionType::kInt: return v.i < 0 ? std::to_string(v.i) : std::to_string(v.u);
    case OptionType::kFloat: return number(v.f);
    case OptionType::kBool: return v.b ? "true" : "false";
    case OptionType::kStr: return v.s;
  }
  return "";
}

}  // namespace

void set_option(DecodeOptionFields& options, const std::string& name, const std::string& text) {
  for (size_t i = 0; i < kDecodeOptionCount; ++i) {
    if (name != kDecodeOptions[i].name) continue;
    const OptionValue v = parse(kDecodeOptions[i], text);
    check(kDecodeOptions[i], v, text);
    set_field(options, i, v);
    return;
  }
  option_error(DLLM_ERROR_UNKNOWN_OPTION, name, "unknown decode option '" + name + "'");
}

void check_rules(const DecodeOptionFields& options) {
  auto index = [](const char* name) {
    size_t i = 0;
    while (std::string(kDecodeOptions[i].name) != name) ++i;  // the generator keeps only rules of known options
    return i;
  };
  for (const OptionRule& r : kOptionRules) {
    const size_t a = index(r.option), b = index(r.than);
    const OptionValue x = get_field(options, a), y = get_field(options, b);
    if (x.null || y.null || (std::string(r.op) == "<=" ? x.f <= y.f : x.f >= y.f)) continue;
    std::string text = r.message;
    for (const auto& [field, value] : {std::pair<std::string, std::string>{"{value}", shown(kDecodeOptions[a], x)},
                                       {"{than}", shown(kDecodeOptions[b], y)}})
      for (size_t at; (at = text.find(field)) != std::string::npos;) text.replace(at, field.size(), value);
    option_error(DLLM_ERROR_BAD_OPTION, r.option, text);
  }
}

void validate(const DecodeOptionFields& options) {
  for (size_t i = 0; i < kDecodeOptionCount; ++i) {
    const OptionValue v = get_field(options, i);
    check(kDecodeOptions[i], v, shown(kDecodeOptions[i], v));
  }
}

}  // namespace dllm::detail
