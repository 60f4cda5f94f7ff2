// Internal errors: thrown inside the library, turned into dllm_error objects at the C ABI.
#pragma once

#include <stdexcept>
#include <string>

#include "dllm_deploy/dllm.h"

namespace dllm::detail {

class Failure : public std::runtime_error {
 public:
  Failure(dllm_code code, const std::string& message, const std::string& key = std::string())
      : std::runtime_error(message), code(code), key(key) {}
  dllm_code code;
  std::string key;  // the decode option an option error is about ("" otherwise)
};

[[noreturn]] inline void fail(dllm_code code, const std::string& message) { throw Failure(code, message); }
[[noreturn]] inline void user_error(const std::string& message) { fail(DLLM_ERROR_INVALID_ARGUMENT, message); }
[[noreturn]] inline void option_error(dllm_code code, const std::string& key, const std::string& message) {
  throw Failure(code, message, key);
}
[[noreturn]] inline void artifact_error(const std::string& message) { fail(DLLM_ERROR_ARTIFACT, message); }

// Python's repr() of a str, for messages that mirror the Python runtime's ('x').
inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace dllm::detail
