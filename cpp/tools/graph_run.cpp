// dllm-graph-run: run one graph of an artifact once, on ONNX Runtime's CPU provider, from .npy
// inputs to .npy outputs, so two machines (an x86-64 host and an arm64 board, a build and its
// emulation) can be compared on the very same inputs, graph by graph.
//
//   dllm-graph-run --artifact DIR --role ROLE [--precision fp32] --inputs IN_DIR --outputs OUT_DIR [--threads N]
//
// ROLE is one of the manifest's graphs (prefill, verify; encode, denoise for DiffusionGemma).
// Every input of the graph is read from IN_DIR/<name>.npy (little-endian, C order, the graph's
// dtype: float32, float16, int64, int32, int8, uint8, bool); every output is written to
// OUT_DIR/<name>.npy (created if missing; each file written whole, then renamed into place).
// Prints one JSON line: the role, the graph file, each output's shape, the run's seconds.
// A user error (a missing input, a wrong dtype or rank) prints one line and exits with 2.
#include <onnxruntime_cxx_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ort_backend.hpp"

namespace fs = std::filesystem;

namespace {

struct UserError {
  std::string message;
};

struct DType {
  const char* descr;  // numpy's
  size_t size;
};

const std::map<ONNXTensorElementDataType, DType>& dtypes() {
  static const std::map<ONNXTensorElementDataType, DType> table{
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {"<f4", 4}}, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, {"<f2", 2}},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {"<i8", 8}}, {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, {"<i4", 4}},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, {"|i1", 1}},  {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, {"|u1", 1}},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, {"|b1", 1}}};
  return table;
}

struct Array {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// The header's value of 'key' (a Python dict literal written by numpy).
std::string header_field(const std::string& header, const std::string& key, const std::string& path) {
  const size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw UserError{path + ": not a .npy file (no " + key + " in its header)"};
  size_t v = header.find(':', at) + 1;
  while (v < header.size() && header[v] == ' ') ++v;
  if (header[v] == '(') return header.substr(v + 1, header.find(')', v) - v - 1);
  if (header[v] == '\'') return header.substr(v + 1, header.find('\'', v + 1) - v - 1);
  return header.substr(v, header.find_first_of(",}", v) - v);
}

Array read_npy(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError{path.string() + ": cannot read (" + std::strerror(errno) + ")"};
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw UserError{path.string() + ": not a .npy file"};
  uint32_t len = 0;
  unsigned char b[4] = {0, 0, 0, 0};
  const int width = magic[6] == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(b), width)) throw UserError{path.string() + ": truncated .npy header"};
  for (int i = width - 1; i >= 0; --i) len = (len << 8) | b[i];
  std::string header(len, '\0');
  if (!in.read(header.data(), len)) throw UserError{path.string() + ": truncated .npy header"};
  Array a;
  a.descr = header_field(header, "descr", path.string());
  if (header_field(header, "fortran_order", path.string()) != "False")
    throw UserError{path.string() + ": Fortran-ordered arrays are not read (save it C-ordered)"};
  std::stringstream dims(header_field(header, "shape", path.string()));
  for (std::string d; std::getline(dims, d, ',');)
    if (d.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(d));
  size_t n = 1;
  for (int64_t d : a.shape) n *= static_cast<size_t>(d);
  size_t item = 0;
  for (const auto& [type, dt] : dtypes())
    if (a.descr == dt.descr) item = dt.size;
  if (!item) throw UserError{path.string() + ": dtype " + a.descr + " is not one a graph takes"};
  a.data.resize(n * item);
  if (!in.read(a.data.data(), static_cast<std::streamsize>(a.data.size()))) throw UserError{path.string() + ": truncated data"};
  return a;
}

void write_npy(const fs::path& path, const char* descr, const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  const fs::path tmp = path.string() + ".part";
  {
    std::ofstream out(tmp, std::ios::binary);
    const uint16_t len = static_cast<uint16_t>(header.size());
    out.write("\x93NUMPY\x01\x00", 8);
    const char le[2] = {static_cast<char>(len & 0xFF), static_cast<char>(len >> 8)};
    out.write(le, 2);
    out << header;
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw UserError{path.string() + ": cannot write (" + std::strerror(errno) + ")"};
  }
  fs::rename(tmp, path);
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> flags{{"--precision", "fp32"}, {"--threads", "0"}};
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::cout << "usage: dllm-graph-run --artifact DIR --role ROLE [--precision P] --inputs IN_DIR --outputs OUT_DIR "
                   "[--threads N]\n";
      return 0;
    }
    if (f != "--artifact" && f != "--role" && f != "--precision" && f != "--inputs" && f != "--outputs" && f != "--threads")
      throw UserError{"unrecognized argument: " + f};
    if (i + 1 >= argc) throw UserError{"argument " + f + ": expected one argument"};
    flags[f] = argv[++i];
  }
  for (const char* f : {"--artifact", "--role", "--inputs", "--outputs"})
    if (!flags.count(f)) throw UserError{std::string("the following argument is required: ") + f};
  const fs::path dir = flags["--artifact"];
  std::ifstream mf(dir / "manifest.json", std::ios::binary);
  if (!mf) throw UserError{(dir / "manifest.json").string() + ": cannot read the manifest"};
  const nlohmann::json m = nlohmann::json::parse(mf, nullptr, false);
  const std::string role = flags["--role"], precision = flags["--precision"];
  if (!m.is_object() || !m.contains("precisions") || !m["precisions"].is_object() || !m.contains("graphs"))
    throw UserError{(dir / "manifest.json").string() + ": corrupt manifest"};
  if (!m["precisions"].contains(precision)) throw UserError{"precision '" + precision + "' is not in this artifact"};
  const nlohmann::json& files = m["precisions"][precision];
  if (!files.contains(role) || !files[role].is_string() || !m["graphs"].contains(role)) {
    std::string roles;
    for (const auto& [k, v] : m["graphs"].items()) roles += (roles.empty() ? "" : ", ") + k;
    throw UserError{"no graph of role '" + role + "' (the artifact's: " + roles + ")"};
  }
  const fs::path graph = dir / files[role].get<std::string>();

  dllm::detail::ensure_onnxruntime_api();
  Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "dllm-graph-run");
  Ort::SessionOptions so;
  so.SetLogSeverityLevel(3);
  if (const int t = std::stoi(flags["--threads"]); t > 0) so.SetIntraOpNumThreads(t);
  Ort::Session session(env, graph.c_str(), so);
  Ort::AllocatorWithDefaultOptions alloc;
  const Ort::MemoryInfo mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<std::string> in_names, out_names;
  std::vector<Array> arrays;
  std::vector<Ort::Value> values;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    const std::string name = session.GetInputNameAllocated(i, alloc).get();
    const Ort::TypeInfo type = session.GetInputTypeInfo(i);   // owns what the view below reads
    const auto info = type.GetTensorTypeAndShapeInfo();
    const auto dt = dtypes().find(info.GetElementType());
    if (dt == dtypes().end()) throw UserError{graph.string() + ": input " + name + " has a dtype this tool does not feed"};
    arrays.push_back(read_npy(fs::path(flags["--inputs"]) / (name + ".npy")));
    const Array& a = arrays.back();
    if (a.descr != dt->second.descr)
      throw UserError{name + ".npy: dtype " + a.descr + ", the graph takes " + dt->second.descr};
    if (a.shape.size() != info.GetShape().size())
      throw UserError{name + ".npy: rank " + std::to_string(a.shape.size()) + ", the graph takes " +
                      std::to_string(info.GetShape().size())};
    in_names.push_back(name);
  }
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Ort::TypeInfo type = session.GetInputTypeInfo(i);
    values.push_back(Ort::Value::CreateTensor(mem, arrays[i].data.data(), arrays[i].data.size(), arrays[i].shape.data(),
                                              arrays[i].shape.size(), type.GetTensorTypeAndShapeInfo().GetElementType()));
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) out_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
  std::vector<const char*> in_c, out_c;
  for (const auto& n : in_names) in_c.push_back(n.c_str());
  for (const auto& n : out_names) out_c.push_back(n.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Ort::Value> outs = session.Run(Ort::RunOptions{nullptr}, in_c.data(), values.data(), values.size(),
                                             out_c.data(), out_c.size());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fs::create_directories(flags["--outputs"]);
  nlohmann::json report{{"role", role}, {"graph", files[role]}, {"precision", precision}, {"seconds", seconds}};
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto info = outs[i].GetTensorTypeAndShapeInfo();
    const auto dt = dtypes().find(info.GetElementType());
    if (dt == dtypes().end()) throw UserError{graph.string() + ": output " + out_names[i] + " has a dtype this tool does not write"};
    write_npy(fs::path(flags["--outputs"]) / (out_names[i] + ".npy"), dt->second.descr, info.GetShape(),
              outs[i].GetTensorRawData(), info.GetElementCount() * dt->second.size);
    report["outputs"][out_names[i]] = info.GetShape();
  }
  std::cout << report.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UserError& e) {
    std::cerr << "dllm-graph-run: error: " << e.message << "\n";
    return 2;
  } catch (const Ort::Exception& e) {
    const std::string what = e.what();
    std::cerr << "dllm-graph-run: error: ONNX Runtime: " << what.substr(0, what.find('\n')) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dllm-graph-run: error: " << e.what() << "\n";
    return 2;
  }
}
