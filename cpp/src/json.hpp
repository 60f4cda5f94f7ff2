// The JSON the runtime writes (result rows, tool output), byte for byte as Python's json module
// writes it. Reading JSON (manifest.json, prompts files) is nlohmann-json's job.
#pragma once

#include <string>

namespace dllm::detail {

// Appends s as a JSON string literal (quotes included). Like Python's json.dumps: non-ASCII is
// written as \uXXXX escapes (surrogate pairs above U+FFFF); s must be valid UTF-8.
void append_json_string(std::string& out, const std::string& s);

// Shortest text that reads back as the same double (Python's repr of a float).
std::string format_double(double v);

}  // namespace dllm::detail
