// SHA-256 (FIPS 180-4) of a file, as lower-case hex: the digests manifest.json lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dllm::detail {

class Sha256 {
 public:
  Sha256();
  void update(const unsigned char* data, size_t n);
  std::string hex_digest();  // finishes the hash; call once

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

// Hex digest of the file at path; false if it cannot be read.
bool sha256_file(const std::string& path, std::string& hex);

}  // namespace dllm::detail
