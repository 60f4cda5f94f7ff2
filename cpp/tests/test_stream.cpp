// Golden chunk check: cpp/src/stream.cpp against tests/data/golden/stream.json (dumped from
// dllm_deploy/runtime/stream.py::RowText by tests/integration/cpp/test_stream_cpp.py): per case, the row's
// final ids after each report, and the chunk (delta, token ids, finish reason) each report gives.
// Multi-byte characters split across tokens, stop strings held back and cut, EOS, the budget.
//   test_stream FIXTURES_DIR/stream.json
// Prints each chunk that differs and exits 1 if any does.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stream.hpp"

using nlohmann::json;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_stream STREAM_JSON\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "test_stream: cannot read %s\n", argv[1]);
    return 2;
  }
  const json golden = json::parse(in);
  int bad = 0, checked = 0, index = 0;
  const dllm::detail::ByteTokenizer tokenizer;
  for (const json& c : golden.at("cases")) {
    dllm::detail::RowStream stream(tokenizer, c.at("stop").get<std::vector<std::string>>(), c.at("budget").get<int64_t>(),
                                   c.at("eos_id").get<int64_t>());
    std::vector<json> got;
    for (const json& ids : c.at("reports")) {
      dllm::detail::Chunk chunk;
      if (!stream.report(ids.get<std::vector<int64_t>>(), 0, &chunk)) continue;
      got.push_back({{"delta", chunk.delta},
                     {"token_ids", chunk.token_ids},
                     {"tokens", chunk.tokens},
                     {"finish_reason", chunk.finish_reason ? json(chunk.finish_reason) : json(nullptr)}});
    }
    const json& want = c.at("chunks");
    ++checked;
    if (json(got) != want) {
      std::fprintf(stderr, "case %d (%s):\n  got  %s\n  want %s\n", index, c.at("name").get<std::string>().c_str(),
                   json(got).dump().c_str(), want.dump().c_str());
      ++bad;
    }
    ++index;
  }
  std::printf("%d of %d chunk cases match\n", checked - bad, checked);
  return bad || !checked ? 1 : 0;
}
