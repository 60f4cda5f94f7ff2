// Decode options by name, checked against the declaration (dllm_deploy/decode_options.json, from
// which the build generates decode_options.gen.hpp: the fields, their defaults and the option table).
// Errors carry a code and the option's key, as Python's OptionError does:
//   DLLM_ERROR_UNKNOWN_OPTION (unknown_option), DLLM_ERROR_BAD_OPTION (bad_option: type, range,
//   choice), DLLM_ERROR_UNSUPPORTED (unsupported: declared, not implemented yet; only the default).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace dllm::detail {

enum class OptionType { kInt, kFloat, kStr, kBool };

struct OptionSpec {
  const char* name;
  const char* label;          // what messages call it
  const char* flag;           // CLI flag ("" = none)
  OptionType type;
  bool nullable;              // "null" unsets it
  const char* default_text;
  bool has_min;
  double min;
  bool min_exclusive;
  bool has_max;
  double max;
  bool max_exclusive;
  const char* choices;        // "a|b|c" ("" = any)
  const char* help;
  bool implemented;           // false: only the default is accepted
};

struct OptionValue {          // one option's value, whatever its type
  bool null = false;
  int64_t i = 0;              // an int (a uint64_t beyond INT64_MAX: INT64_MAX)
  uint64_t u = 0;             // an int >= 0, all 64 bits (the seed)
  double f = 0.0;             // a float; an int as a number (for range checks)
  std::string s;
  bool b = false;
};

inline OptionValue option_value(int v) {
  OptionValue x;
  x.i = v, x.u = v < 0 ? 0 : static_cast<uint64_t>(v), x.f = v;
  return x;
}
inline OptionValue option_value(uint64_t v) {
  OptionValue x;
  x.u = v, x.i = v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v), x.f = static_cast<double>(v);
  return x;
}
inline OptionValue option_value(double v) { OptionValue x; x.f = v; return x; }
inline OptionValue option_value(const std::string& v) { OptionValue x; x.s = v; return x; }
inline OptionValue option_value(bool v) { OptionValue x; x.b = v; return x; }
template <class T>
OptionValue option_value(const std::optional<T>& v) {
  if (v) return option_value(*v);
  OptionValue x;
  x.null = true;
  return x;
}

inline void assign(int& x, const OptionValue& v) { x = static_cast<int>(v.i); }
inline void assign(uint64_t& x, const OptionValue& v) { x = v.u; }
inline void assign(double& x, const OptionValue& v) { x = v.f; }
inline void assign(std::string& x, const OptionValue& v) { x = v.s; }
inline void assign(bool& x, const OptionValue& v) { x = v.b; }
template <class T>
void assign(std::optional<T>& x, const OptionValue& v) {
  if (v.null) return x.reset();
  T t{};
  assign(t, v);
  x = t;
}

struct DecodeOptionFields;  // decode_options.gen.hpp

// A rule between two options (decode_options.json "rules"): where `option` is set, `option` `op`
// (<= or >=) `than`, else `message` ({value}, {than} filled in) as a bad-option error.
struct OptionRule {
  const char* option;
  const char* op;
  const char* than;
  const char* message;
};

// The declared options the C++ runtime takes, in declaration order.
size_t option_count();
const OptionSpec& option_at(size_t index);

// Parses `text` by the option's declared type and checks it; throws a Failure naming `name`.
void set_option(DecodeOptionFields& options, const std::string& name, const std::string& text);
// Every field against its declared range / choices / implementation (the struct ABI's path).
void validate(const DecodeOptionFields& options);
// The declared rules between options, in order (after validate; gen_length defaulted already).
void check_rules(const DecodeOptionFields& options);

}  // namespace dllm::detail
