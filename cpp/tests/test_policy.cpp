// Golden policy traces: every verification step recorded in tests/data/golden/policy/*.json (the
// inputs and decisions of dllm_deploy/runtime/strategies.py::Policy during a real decode) is
// replayed through cpp/src/policy.cpp: plan(S, f(S), step) must draft the recorded nodes and
// select(nodes, f(nodes), step) must choose the recorded node with the recorded steps accepted.
//   test_policy FIXTURES_DIR      (CTest passes tests/data/golden/policy)
// A trace of an option the C++ runtime does not take (spd --candidates) is skipped, and said so.
// Prints each step that differs and exits 1 if any does (or if no trace was replayed).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "options.hpp"
#include "policy.hpp"

using dllm::detail::DecodeOptions;
using dllm::detail::Policy;
using fixtures::flat;
using nlohmann::json;

namespace {

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.dump();
}

// The trace's steps that differ, one line each (file, step, what).
size_t replay(const std::filesystem::path& path, const json& doc, size_t& steps) {
  DecodeOptions cfg;
  for (const auto& [name, value] : doc["options"].items()) dllm::detail::set_option(cfg, name, text_of(value));
  Policy policy(cfg, doc["mask_id"].get<int64_t>());
  size_t failed = 0, i = 0;
  for (const json& s : doc["steps"]) {
    const auto state = flat<int64_t>(s["state"]), top_ids = flat<int64_t>(s["top_ids"]);
    const auto top_probs = flat<float>(s["top_probs"]);
    const auto want_nodes = flat<int64_t>(s["nodes"]);
    const auto f_ids = flat<int64_t>(s["f_ids"]);
    const auto f_probs = flat<float>(s["f_probs"]);
    const int k = static_cast<int>(s["top_ids"][0].size());
    const int64_t step = s["step"].get<int64_t>();
    std::vector<int64_t> nodes(want_nodes.size());
    policy.plan(state.data(), top_ids.data(), top_probs.data(), k, step, nodes.data());
    int64_t accepted = 0;
    const int selected = policy.select(want_nodes.data(), f_ids.data(), f_probs.data(), k, step, &accepted);
    std::string what;
    if (nodes != want_nodes) what += " nodes";
    if (selected != s["selected"].get<int>()) what += " selected node";
    if (accepted != s["accepted"].get<int64_t>()) what += " steps accepted";
    if (!what.empty()) std::printf("%s step %zu:%s differ\n", path.filename().c_str(), i, what.c_str()), ++failed;
    ++i, ++steps;
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  size_t traces = 0, steps = 0, failed = 0;
  for (const auto& [path, doc] : fixtures::documents(argc, argv)) {
    try {
      failed += replay(path, doc, steps);
      ++traces;
    } catch (const std::exception& e) {  // an option this runtime does not take
      std::printf("%s skipped: %s\n", path.filename().c_str(), e.what());
    }
  }
  std::printf("%zu policy traces, %zu steps replayed, %zu differ\n", traces, steps, failed);
  return !traces || failed ? 1 : 0;
}
