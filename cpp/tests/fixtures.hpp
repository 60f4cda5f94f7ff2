// Reading the golden fixtures of tests/data/golden (JSON written by the Python tests): nested
// arrays flattened row-major, and the fixture files of a folder in name order.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fixtures {

template <class T>
void flatten(const nlohmann::json& j, std::vector<T>& out) {
  if (!j.is_array()) return out.push_back(j.get<T>());
  for (const nlohmann::json& x : j) flatten(x, out);
}

// A nested JSON array of numbers, flattened row-major.
template <class T>
std::vector<T> flat(const nlohmann::json& j) {
  std::vector<T> out;
  flatten(j, out);
  return out;
}

// The *.json files directly in `dir`, sorted by name.
inline std::vector<std::filesystem::path> json_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// (file, document) of every fixture in the folder named on the command line (argv[1]), in name
// order; without that argument, a usage line and exit 2.
inline std::vector<std::pair<std::filesystem::path, nlohmann::json>> documents(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
    std::exit(2);
  }
  std::vector<std::pair<std::filesystem::path, nlohmann::json>> out;
  for (const auto& path : json_files(argv[1])) {
    std::ifstream f(path);
    out.emplace_back(path, nlohmann::json::parse(f));
  }
  return out;
}

}  // namespace fixtures
