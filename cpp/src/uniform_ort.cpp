#include "uniform_ort.hpp"

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "ort_backend.hpp"

namespace dllm::detail {

namespace fs = std::filesystem;

namespace {

using Json = nlohmann::json;

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) artifact_error(path + ": cannot read the manifest");
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) artifact_error(path + ": corrupt manifest (not a JSON object)");
  return j;
}

class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}
  const Json& at(const Json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) corrupt("no " + where + key);
    return obj.at(key);
  }
  int integer(const Json& obj, const std::string& key, const std::string& where = "") const {
    const Json& v = at(obj, key, where);
    if (!v.is_number_integer()) corrupt(where + key + " is not an integer");
    return v.get<int>();
  }
  std::vector<std::string> strings(const Json& obj, const std::string& key, const std::string& where) const {
    const Json& v = at(obj, key, where);
    std::vector<std::string> out;
    if (!v.is_array()) corrupt(where + key + " is not a list");
    for (const Json& x : v) {
      if (!x.is_string()) corrupt(where + key + " holds a non-string");
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  std::vector<int> ints(const Json& obj, const std::string& key, const std::string& where) const {
    const Json& v = at(obj, key, where);
    std::vector<int> out;
    if (!v.is_array()) corrupt(where + key + " is not a list");
    for (const Json& x : v) {
      if (!x.is_number_integer()) corrupt(where + key + " holds a non-integer");
      out.push_back(x.get<int>());
    }
    return out;
  }
  [[noreturn]] void corrupt(const std::string& what) const { artifact_error(path_ + ": corrupt manifest (" + what + ")"); }

 private:
  std::string path_;
};

}  // namespace

bool is_uniform_artifact(const std::string& folder) {
  std::ifstream in((fs::path(folder) / "manifest.json").string(), std::ios::binary);
  if (!in) return false;
  const Json m = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  return m.is_object() && m.contains("format") && m["format"].is_string() && m["format"].get<std::string>() == kUniformFormat;
}

UniformManifest read_uniform_manifest(const std::string& folder, const std::string& precision) {
  const std::string path = (fs::path(folder) / "manifest.json").string();
  const Json j = read_json(path);
  const Fields f(path);
  UniformManifest m;
  m.folder = folder;
  m.family = j.value("family", std::string("diffusion_gemma"));
  const Json& model = f.at(j, "model", "");
  m.vocab_size = f.integer(model, "vocab_size", "model.");
  m.hidden_size = f.integer(model, "hidden_size", "model.");
  m.canvas_length = f.integer(model, "canvas_length", "model.");
  m.sliding_window = f.integer(model, "sliding_window", "model.");
  m.max_seq = f.integer(model, "max_seq", "model.");
  m.eos_token_id = f.integer(model, "eos_token_id", "model.");
  const std::vector<int> heads = f.ints(model, "kv_heads", "model."), dims = f.ints(model, "head_dims", "model.");
  if (heads.size() != dims.size() || heads.empty()) f.corrupt("model.kv_heads and model.head_dims differ in length");
  for (size_t i = 0; i < heads.size(); ++i) m.kv_shapes.emplace_back(heads[i], dims[i]);
  if (m.vocab_size < 1 || m.hidden_size < 1 || m.canvas_length < 1 || m.sliding_window < 1)
    f.corrupt("model sizes must be >= 1");
  const Json& decoding = f.at(j, "decoding", "");
  m.pad_id = f.integer(decoding, "pad_id", "decoding.");
  for (int id : f.ints(decoding, "eos_ids", "decoding.")) m.eos_ids.push_back(id);
  if (m.eos_ids.empty()) f.corrupt("decoding.eos_ids is empty");
  if (decoding.contains("options") && decoding["options"].is_object())
    for (const auto& [k, v] : decoding["options"].items())
      if (v.is_number()) m.defaults[k] = v.get<double>();
  const Json& precisions = f.at(j, "precisions", "");
  if (!precisions.is_object() || !precisions.contains(precision)) {
    std::string have;
    if (precisions.is_object())
      for (const auto& [k, v] : precisions.items()) have += (have.empty() ? "" : ", ") + k;
    user_error(folder + ": precision " + quoted(precision) + " is not in this artifact (it has " + have + ")");
  }
  const Json& files = precisions[precision];
  const Json& graphs = f.at(j, "graphs", "");
  const Json& enc = f.at(graphs, "encode", "graphs."), &den = f.at(graphs, "denoise", "graphs.");
  m.encode_inputs = f.strings(enc, "inputs", "graphs.encode."), m.encode_outputs = f.strings(enc, "outputs", "graphs.encode.");
  m.denoise_inputs = f.strings(den, "inputs", "graphs.denoise."), m.denoise_outputs = f.strings(den, "outputs", "graphs.denoise.");
  auto file_of = [&](const char* role) {
    if (!files.is_object() || !files.contains(role) || !files[role].is_string())
      f.corrupt(std::string("precisions.") + precision + "." + role + " is not a file name");
    const std::string name = files[role].get<std::string>();
    if (!fs::is_regular_file(fs::path(folder) / name)) artifact_error(folder + ": missing file " + name + " (re-export the artifact)");
    return name;
  };
  m.encode_file = file_of("encode"), m.denoise_file = file_of("denoise");
  if (fs::is_regular_file(fs::path(folder) / "tokenizer.json")) {
    m.tokenizer_kind = "hf", m.tokenizer_file = "tokenizer.json";
    if (fs::is_regular_file(fs::path(folder) / "tokenizer_config.json")) m.tokenizer_config = "tokenizer_config.json";
  } else if (m.vocab_size >= 256) {
    m.tokenizer_kind = "byte";   // api.py::Runtime._load_uniform: the byte tokenizer (random checkpoints)
  } else {
    artifact_error(folder + ": no tokenizer.json, and its vocabulary (" + std::to_string(m.vocab_size) +
                   ") is too small for the byte tokenizer: text cannot be encoded");
  }
  return m;
}

void encoder_masks(const std::vector<uint8_t>& keep, size_t rows, size_t p, size_t t, size_t window,
                   std::vector<uint8_t>& full, std::vector<uint8_t>& sliding) {
  const size_t width = p + t, ps = std::min(p, window - 1), sw = ps + t;
  full.assign(rows * t * width, 0), sliding.assign(rows * t * sw, 0);
  for (size_t b = 0; b < rows; ++b)
    for (size_t i = 0; i < t; ++i) {
      const size_t q = p + i;
      for (size_t k = 0; k <= q; ++k) {
        const uint8_t on = keep[b * width + k];
        full[(b * t + i) * width + k] = on;
        if (k >= p - ps && q - k < window) sliding[(b * t + i) * sw + (k - (p - ps))] = on;
      }
    }
}

void decoder_masks(const std::vector<uint8_t>& keep, size_t rows, size_t p, size_t t, size_t window,
                   std::vector<uint8_t>& full, std::vector<uint8_t>& sliding) {
  const size_t width = p + t, ps = std::min(p, window - 1), sw = ps + t;
  full.assign(rows * t * width, 1), sliding.assign(rows * t * sw, 1);
  for (size_t b = 0; b < rows; ++b)
    for (size_t i = 0; i < t; ++i)
      for (size_t k = 0; k < p; ++k) {
        full[(b * t + i) * width + k] = keep[b * p + k];
        if (k >= p - ps) sliding[(b * t + i) * sw + (k - (p - ps))] = keep[b * p + k];
      }
}

struct UniformGraphs::Impl {
  Ort::Env env{nullptr};
  Ort::Session encode{nullptr}, denoise{nullptr};
  Ort::MemoryInfo mem{nullptr};
  std::vector<std::string> enc_in, enc_out, den_in, den_out;
  std::vector<std::pair<int, int>> kv_shapes;
  size_t window = 0, hidden = 0;
  float none = 0.0f;  // the data pointer of an empty tensor

  static std::vector<const char*> c_names(const std::vector<std::string>& names) {
    std::vector<const char*> out;
    for (const std::string& n : names) out.push_back(n.c_str());
    return out;
  }

  // The inputs both graphs start with: ids and positions (B,T), the full and sliding masks (B,1,T,*).
  void add_head(std::vector<Ort::Value>& in, const std::vector<int64_t>& ids, const std::vector<int64_t>& pos,
                size_t rows, std::vector<uint8_t>& full, std::vector<uint8_t>& sliding) {
    const int64_t B = static_cast<int64_t>(rows), T = static_cast<int64_t>(ids.size() / rows);
    const int64_t ids_shape[2] = {B, T};
    const int64_t full_shape[4] = {B, 1, T, static_cast<int64_t>(full.size()) / (B * T)};
    const int64_t sliding_shape[4] = {B, 1, T, static_cast<int64_t>(sliding.size()) / (B * T)};
    in.push_back(Ort::Value::CreateTensor<int64_t>(mem, const_cast<int64_t*>(ids.data()), ids.size(), ids_shape, 2));
    in.push_back(Ort::Value::CreateTensor<int64_t>(mem, const_cast<int64_t*>(pos.data()), pos.size(), ids_shape, 2));
    in.push_back(Ort::Value::CreateTensor(mem, full.data(), full.size(), full_shape, 4, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL));
    in.push_back(Ort::Value::CreateTensor(mem, sliding.data(), sliding.size(), sliding_shape, 4,
                                          ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL));
  }

  Ort::Value floats(const float* data, size_t n, const std::vector<int64_t>& shape) {
    return Ort::Value::CreateTensor<float>(mem, const_cast<float*>(n ? data : &none), n, shape.data(), shape.size());
  }

  std::vector<Ort::Value> run(Ort::Session& s, const std::vector<std::string>& in_names, std::vector<Ort::Value>& in,
                              const std::vector<std::string>& out_names, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<const char*> in_c = c_names(in_names), out_c = c_names(out_names);
    std::vector<Ort::Value> out;
    try {
      out = s.Run(Ort::RunOptions{nullptr}, in_c.data(), in.data(), in.size(), out_c.data(), out_c.size());
    } catch (const Ort::Exception& e) {
      const std::string what = e.what();
      if (what.find("Failed to allocate memory") != std::string::npos) throw std::bad_alloc();
      fail(DLLM_ERROR_ONNXRUNTIME, "ONNX Runtime run failed: " + what.substr(0, what.find('\n')));
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
};

UniformGraphs::UniformGraphs(const UniformManifest& m, int intra_op_threads) : impl_(new Impl) {
  ensure_onnxruntime_api();
  Impl& s = *impl_;
  s.enc_in = m.encode_inputs, s.enc_out = m.encode_outputs, s.den_in = m.denoise_inputs, s.den_out = m.denoise_outputs;
  s.kv_shapes = m.kv_shapes;
  s.window = static_cast<size_t>(m.sliding_window), s.hidden = static_cast<size_t>(m.hidden_size);
  const size_t past = 2 * m.kv_shapes.size();
  const std::vector<std::string> enc_head{"input_ids", "position_ids", "mask_full", "mask_sliding"};
  const std::vector<std::string> den_head{"canvas_ids", "position_ids", "mask_full", "mask_sliding", "soft", "temperature",
                                          "sample_u"};
  const std::vector<std::string> den_out{"argmax", "sampled", "entropy", "soft_next"};
  if (s.enc_in.size() != enc_head.size() + past || !std::equal(enc_head.begin(), enc_head.end(), s.enc_in.begin()) ||
      s.den_in.size() != den_head.size() + past || !std::equal(den_head.begin(), den_head.end(), s.den_in.begin()) ||
      s.enc_out.size() != past || s.den_out != den_out)
    artifact_error(m.folder + ": corrupt manifest (the graphs' inputs and outputs are not those of format " +
                   kUniformFormat + ")");
  try {
    s.env = Ort::Env(ORT_LOGGING_LEVEL_ERROR, "dllm_deploy");
    Ort::SessionOptions so;
    so.SetLogSeverityLevel(3);
    if (intra_op_threads > 0) so.SetIntraOpNumThreads(intra_op_threads);
    so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    s.encode = Ort::Session(s.env, (fs::path(m.folder) / m.encode_file).string().c_str(), so);
    s.denoise = Ort::Session(s.env, (fs::path(m.folder) / m.denoise_file).string().c_str(), so);
    s.mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  } catch (const Ort::Exception& e) {
    const std::string what = e.what();
    fail(DLLM_ERROR_ONNXRUNTIME, m.folder + ": cannot load the ONNX graphs (" + what.substr(0, what.find('\n')) + ")");
  }
}

UniformGraphs::~UniformGraphs() = default;

KV UniformGraphs::empty(size_t rows) const {
  KV out;
  for (const auto& [h, d] : impl_->kv_shapes)
    for (int kind = 0; kind < 2; ++kind)
      out.push_back(Tensor{{static_cast<int64_t>(rows), h, 0, d}, {}});
  return out;
}

namespace {

KV take_kv(std::vector<Ort::Value>& values, size_t first) {
  KV out;
  for (size_t i = first; i < values.size(); ++i) {
    const auto info = values[i].GetTensorTypeAndShapeInfo();
    const float* p = values[i].GetTensorData<float>();
    out.push_back(Tensor{info.GetShape(), std::vector<float>(p, p + info.GetElementCount())});
  }
  return out;
}

template <class T>
void copy_out(Ort::Value& v, std::vector<T>& out) {
  const T* p = v.GetTensorData<T>();
  out.assign(p, p + v.GetTensorTypeAndShapeInfo().GetElementCount());
}

}  // namespace

KV UniformGraphs::encode(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, size_t rows,
                         const std::vector<uint8_t>& keep, const KV& past) {
  Impl& s = *impl_;
  const size_t t = ids.size() / rows, width = keep.size() / rows, p = width - t;
  std::vector<uint8_t> full, sliding;
  encoder_masks(keep, rows, p, t, s.window, full, sliding);
  std::vector<Ort::Value> in;
  s.add_head(in, ids, pos, rows, full, sliding);
  for (const Tensor& x : past) in.push_back(s.floats(x.data.data(), x.data.size(), x.shape));
  std::vector<Ort::Value> out = s.run(s.encode, s.enc_in, in, s.enc_out, run_seconds);
  return take_kv(out, 0);
}

void UniformGraphs::denoise(const std::vector<int64_t>& canvas, const std::vector<int64_t>& pos, size_t rows,
                            const std::vector<uint8_t>& keep, const KV& past, const std::vector<float>& soft,
                            const std::vector<float>& temperature, const std::vector<float>& u, DenoiseOut& out) {
  Impl& s = *impl_;
  const size_t t = canvas.size() / rows, p = keep.size() / rows;
  std::vector<uint8_t> full, sliding;
  decoder_masks(keep, rows, p, t, s.window, full, sliding);
  const int64_t B = static_cast<int64_t>(rows), T = static_cast<int64_t>(t);
  const std::vector<int64_t> ids_shape{B, T}, soft_shape{B, T, static_cast<int64_t>(s.hidden)}, row_shape{B};
  std::vector<Ort::Value> in;
  s.add_head(in, canvas, pos, rows, full, sliding);
  in.push_back(s.floats(soft.data(), soft.size(), soft_shape));
  in.push_back(s.floats(temperature.data(), temperature.size(), row_shape));
  in.push_back(s.floats(u.data(), u.size(), ids_shape));
  for (const Tensor& x : past) in.push_back(s.floats(x.data.data(), x.data.size(), x.shape));
  std::vector<Ort::Value> res = s.run(s.denoise, s.den_in, in, s.den_out, run_seconds);
  copy_out(res[0], out.argmax), copy_out(res[1], out.sampled), copy_out(res[2], out.entropy), copy_out(res[3], out.soft);
}

}  // namespace dllm::detail
