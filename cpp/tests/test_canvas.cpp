// Golden plan check: every engine call recorded in tests/data/golden/*.json (plans made by
// dllm_deploy/runtime/canvas.py during a real decode) is rebuilt with cpp/src/canvas.cpp from the
// recorded inputs and compared exactly: ids, positions, mask, keep, cache and read.
//   test_canvas FIXTURES_DIR      (CTest passes tests/data/golden)
// Prints each call that differs (file, call index, builder, field) and exits 1 if any does.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "canvas.hpp"

using dllm::detail::CacheMode;
using dllm::detail::Plan;
using dllm::detail::PlanCache;
using dllm::detail::Prefix;
using fixtures::flat;
using nlohmann::json;

namespace {

// A nested JSON array of numbers, flattened row-major.
Prefix prefix_of(const json& j) {
  Prefix p;
  p.rows = j["ids"].size();
  p.length = p.rows ? j["ids"][0].size() : 0;
  p.ids = flat<int64_t>(j["ids"]);
  p.positions = flat<int64_t>(j["positions"]);
  p.valid = flat<uint8_t>(j["valid"]);
  p.blocks = flat<int64_t>(j["blocks"]);
  return p;
}

// The named builder over the recorded inputs.
Plan build(const std::string& builder, const json& in) {
  const Prefix prefix = prefix_of(in["prefix"]);
  if (builder == "held_verify") {
    const std::vector<int64_t> block = flat<int64_t>(in["block"]);
    return held_verify(prefix, flat<uint8_t>(in["held"]), in["held"][0].size(), block.data(),
                       flat<uint8_t>(in["fresh"]).data(), in["block"][0].size(), in["mask_id"], in["pad_id"]);
  }
  const CacheMode mode = dllm::detail::cache_mode_named(in["mode"]);
  if (builder == "tree_verify" || builder == "canvas_verify") {
    const std::vector<int64_t> nodes = flat<int64_t>(in["nodes"]);
    const size_t w = in["nodes"][0].size(), n = in["nodes"][0][0].size();
    if (builder == "tree_verify") return tree_verify(prefix, nodes.data(), w, n, mode);
    return canvas_verify(prefix, nodes.data(), w, n, in["suffix_len"], in["mask_id"], mode, in["anchor"]);
  }
  const std::vector<int64_t> block = flat<int64_t>(in["block"]);
  const size_t n = in["block"][0].size();
  if (builder == "first_block") return first_block(prefix, block.data(), n, mode);
  if (builder == "commit_next") return commit_next(prefix, block.data(), flat<int64_t>(in["nxt"]).data(), n, mode);
  if (builder == "refresh") return refresh(prefix, block.data(), n, in["suffix_len"], in["mask_id"], mode, in["anchor"]);
  throw std::invalid_argument("unknown builder " + builder);
}

const char* cache_name(PlanCache c) {
  return c == PlanCache::kReuse ? "reuse" : c == PlanCache::kNew ? "new" : "scratch";
}

// The fields of `got` that differ from the recorded plan, comma separated ("" when none).
std::string differences(const Plan& got, const json& want) {
  std::vector<uint8_t> mask;
  for (const json& row : want["mask"])
    for (const json& q : row)
      for (char c : q.get<std::string>()) mask.push_back(c == '1');
  std::string d;
  auto check = [&d](bool same, const char* field) { if (!same) d += (d.empty() ? "" : ", ") + std::string(field); };
  check(got.ids == flat<int64_t>(want["ids"]), "ids");
  check(got.positions == flat<int64_t>(want["positions"]), "positions");
  check(got.mask == mask, "mask");
  check(got.keep == want["keep"].get<size_t>(), "keep");
  check(cache_name(got.cache) == want["cache"].get<std::string>(), "cache");
  check(got.read == flat<int64_t>(want["read"]) &&
            got.branches == (got.per_row ? want["read"][0].size() : want["read"].size()), "read");
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  size_t calls = 0, failed = 0, plan_files = 0;
  for (const auto& [path, doc] : fixtures::documents(argc, argv)) {
    if (!doc.contains("calls")) continue;  // another fixture (noise.json)
    ++plan_files;
    size_t i = 0;
    for (const json& call : doc["calls"]) {
      const std::string builder = call["builder"];
      const std::string d = differences(build(builder, call["inputs"]), call["plan"]);
      if (!d.empty()) {
        std::printf("%s call %zu (%s): %s differ\n", path.filename().c_str(), i, builder.c_str(), d.c_str());
        ++failed;
      }
      ++i, ++calls;
    }
  }
  std::printf("%zu plan fixture files, %zu calls compared, %zu differ\n", plan_files, calls, failed);
  return !plan_files || failed ? 1 : 0;
}
