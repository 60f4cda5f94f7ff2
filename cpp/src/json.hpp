// A small JSON reader (for manifest.json) and the string escaping the JSON writer needs.
// Objects keep their key order (the order Python's json module reports errors in).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dllm::detail {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Type type = Type::Null;
  bool boolean = false;
  double number = 0.0;
  bool integral = false;    // the number was written without fraction or exponent
  int64_t integer = 0;      // its value when integral
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  bool is_object() const { return type == Type::Object; }
  const Json* find(const std::string& key) const;  // nullptr if absent or not an object
};

// Parses text; on a syntax error throws std::runtime_error("<what>, line N").
Json parse_json(const std::string& text);

// Appends s as a JSON string literal (quotes included). Like Python's json.dumps: non-ASCII is
// written as \uXXXX escapes (surrogate pairs above U+FFFF); s must be valid UTF-8.
void append_json_string(std::string& out, const std::string& s);

// Shortest text that reads back as the same double (Python's repr of a float).
std::string format_double(double v);

}  // namespace dllm::detail
