// dllm-tokenize: the C++ runtime's tokenizer of an artifact on JSON lines, so that a test can
// compare it with Python's (tests/integration/cpp/test_tokenizer_cpp.py).
//
//   dllm-tokenize ARTIFACT_DIR < lines
//   a line "text"      -> {"ids": encode(text), "text": decode(ids)}
//   a line [id, ...]   -> {"text": decode(ids)}
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "json.hpp"
#include "manifest.hpp"
#include "tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dllm-tokenize ARTIFACT_DIR < JSON_LINES\n");
    return 2;
  }
  try {
    using namespace dllm::detail;
    const Manifest m = read_manifest(argv[1], "fp32", false);
    const auto tok = make_tokenizer(m.folder, m.tokenizer_kind, m.tokenizer_file, m.tokenizer_config,
                                    m.model.eos_token_id);
    std::string line;
    while (std::getline(std::cin, line)) {
      const nlohmann::json in = nlohmann::json::parse(line);
      std::string out = "{";
      std::vector<int64_t> ids;
      if (in.is_string()) {
        ids = tok->encode(in.get<std::string>());
        out += "\"ids\": [";
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
        out += "], ";
      } else {
        ids = in.get<std::vector<int64_t>>();
      }
      out += "\"text\": ";
      append_json_string(out, tok->decode(ids));
      std::printf("%s}\n", out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dllm-tokenize: error: %s\n", e.what());
    return 2;
  }
}
