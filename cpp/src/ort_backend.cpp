#include "ort_backend.hpp"

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <new>
#include <vector>

#include "error.hpp"

namespace dllm::detail {

namespace {

const OrtApi* g_api = nullptr;

std::string first_line(const std::string& s, size_t limit = 200) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > limit ? line.substr(0, limit) : line;
}

// ONNX Runtime's allocators report a failed allocation as a run error with one of these texts.
bool out_of_memory(const std::string& what) {
  return what.find("Failed to allocate memory") != std::string::npos || what.find("bad_alloc") != std::string::npos ||
         what.find("bad allocation") != std::string::npos;
}

}  // namespace

const char* onnxruntime_version() { return OrtGetApiBase()->GetVersionString(); }

void ensure_onnxruntime_api() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (g_api) Ort::InitApi(g_api);
  });
  if (!g_api)
    fail(DLLM_ERROR_ONNXRUNTIME, std::string("ONNX Runtime ") + onnxruntime_version() + " does not provide C API version " +
                                     std::to_string(ORT_API_VERSION) + " (dllm_deploy was compiled with the headers of ONNX Runtime 1." +
                                     std::to_string(ORT_API_VERSION) + "); use a library at least as new as the headers");
}

namespace {

// What a graph input is fed from, by its name: the past tensors are the inputs without another
// role, in the manifest's order (k0, v0, k1, ...).
enum class Feed { kIds, kPos, kMask, kSampleU, kTemperature, kTopK, kTopP, kPast };

Feed feed_of(const std::string& name) {
  if (name == "input_ids") return Feed::kIds;
  if (name == "position_ids") return Feed::kPos;
  if (name == "attention_mask") return Feed::kMask;
  if (name == "sample_u") return Feed::kSampleU;
  if (name == "temperature") return Feed::kTemperature;
  if (name == "top_k") return Feed::kTopK;
  if (name == "top_p") return Feed::kTopP;
  return Feed::kPast;
}

ONNXTensorElementDataType element_type(Feed f) {
  switch (f) {
    case Feed::kIds: case Feed::kPos: case Feed::kTopK: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case Feed::kMask: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

}  // namespace

struct OrtBackend::Impl {
  int k = 0;
  std::vector<int64_t> hkv, d;         // per past / present buffer (2 per layer): the layer's Hkv and D
  std::vector<Feed> feeds;             // per graph input, in the manifest's order (both graphs alike)
  Ort::Env env{nullptr};
  Ort::Session prefill{nullptr}, verify{nullptr};
  Ort::MemoryInfo mem{nullptr};
  Ort::RunOptions run_options{nullptr};
  std::deque<std::string> name_store;  // stable addresses for the const char* lists
  std::vector<const char*> prefill_in, prefill_out, verify_in, verify_out;

  size_t rows = 1, cap_rows = 0, cap_tokens = 0, cap_past = 0, cap_present = 0, cache_len = 0;
  size_t pending = 0;                       // new tokens of the last prefill_run (their KV in present)
  bool kv_new = false;                      // kv_io "new": present is the new tokens' KV; past a buffer of `stride`
  size_t stride = 0;                        // kv_new: positions per (row, KV head) in past, the fed capacity
  std::vector<uint8_t> wide_mask;           // kv_new: (B,T,stride+T) the mask over the whole buffer
  std::vector<int64_t> ids, pos;            // (B,T)
  std::vector<uint8_t> mask;                // (B,T,P+T)
  std::vector<float> sample_u;              // (B,T)
  float temperature1 = 0.0f, top_p1 = 1.0f;  // every row's sampling parameters (greedy: 0, 0, 1)
  int64_t top_k1 = 0;
  std::vector<float> temperature, top_p_in; // (B,) fed: the above per row
  std::vector<int64_t> top_k;               // (B,)
  std::vector<std::vector<float>> past;     // 2 per layer: (B, Hkv, P, D), the layer's Hkv and D (kv_new: (B, Hkv, stride, D))
  std::vector<std::vector<float>> present;  // 2 per layer: (B, Hkv, P+T, D)
  std::vector<int64_t> top_i;               // (B,T,K)
  std::vector<float> top_p;                 // (B,T,K)
  std::vector<Ort::Value> in_values, out_values;
  std::vector<std::array<int64_t, 4>> past_shapes, present_shapes;  // per buffer, alive while a run uses them

  // The past a call reads: the cache's positions, or (kv_new) the whole buffer when some of it is
  // unwritten, with the mask widened so those positions are not attended.
  size_t fed_past() const { return kv_new && cache_len != 0 ? stride : cache_len; }

  uint8_t* fed_mask(size_t t) {
    if (fed_past() == cache_len) return mask.data();
    const size_t P = cache_len, S = stride + t;
    wide_mask.assign(rows * t * S, 0);
    for (size_t i = 0; i < rows * t; ++i) {
      const uint8_t* from = mask.data() + i * (P + t);
      std::copy_n(from, P, wide_mask.data() + i * S);
      std::copy_n(from + P, t, wide_mask.data() + i * S + stride);
    }
    return wide_mask.data();
  }

  void add_inputs(size_t t) {
    const int64_t B = static_cast<int64_t>(rows), P = static_cast<int64_t>(fed_past()), T = static_cast<int64_t>(t);
    const int64_t ids_shape[2] = {B, T}, row_shape[1] = {B};
    const int64_t mask_shape[4] = {B, 1, T, P + T};
    uint8_t* mask_data = fed_mask(t);
    std::vector<std::array<int64_t, 4>>& past_shape = past_shapes;
    past_shape.resize(past.size());
    for (size_t i = 0; i < past.size(); ++i) past_shape[i] = {B, hkv[i], P, d[i]};
    const size_t bt = rows * t;
    auto tensor = [&](void* data, size_t bytes, const int64_t* shape, size_t rank, Feed f) {
      in_values.push_back(Ort::Value::CreateTensor(mem, data, bytes, shape, rank, element_type(f)));
    };
    in_values.clear();
    size_t next_past = 0;
    for (Feed f : feeds) {
      switch (f) {
        case Feed::kIds: tensor(ids.data(), bt * sizeof(int64_t), ids_shape, 2, f); break;
        case Feed::kPos: tensor(pos.data(), bt * sizeof(int64_t), ids_shape, 2, f); break;
        case Feed::kMask: tensor(mask_data, static_cast<size_t>(B * T * (P + T)), mask_shape, 4, f); break;
        case Feed::kSampleU: tensor(sample_u.data(), bt * sizeof(float), ids_shape, 2, f); break;
        case Feed::kTemperature: tensor(temperature.data(), rows * sizeof(float), row_shape, 1, f); break;
        case Feed::kTopK: tensor(top_k.data(), rows * sizeof(int64_t), row_shape, 1, f); break;
        case Feed::kTopP: tensor(top_p_in.data(), rows * sizeof(float), row_shape, 1, f); break;
        case Feed::kPast: {
          const size_t i = next_past++;
          tensor(past[i].data(), static_cast<size_t>(B * hkv[i] * P * d[i]) * sizeof(float), past_shape[i].data(), 4, f);
          break;
        }
      }
    }
  }

  void add_top_outputs(size_t t) {
    const int64_t top_shape[3] = {static_cast<int64_t>(rows), static_cast<int64_t>(t), k};
    const size_t n = rows * t * static_cast<size_t>(k);
    out_values.clear();
    out_values.push_back(Ort::Value::CreateTensor(mem, top_i.data(), n * sizeof(int64_t), top_shape, 3,
                                                  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64));
    out_values.push_back(Ort::Value::CreateTensor(mem, top_p.data(), n * sizeof(float), top_shape, 3,
                                                  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  }

  // kv_new: the written positions of every (row, KV head) from a stride of `from` positions to
  // `stride` (larger), last row first so nothing is overwritten before it moves.
  void restride(size_t from) {
    for (size_t i = 0; i < past.size(); ++i) {
      const size_t dd = static_cast<size_t>(d[i]), heads = rows * static_cast<size_t>(hkv[i]);
      float* b = past[i].data();
      for (size_t h = heads; h-- > 1;) std::memmove(b + h * stride * dd, b + h * from * dd, cache_len * dd * sizeof(float));
    }
  }

  void run(Ort::Session& s, const std::vector<const char*>& in, const std::vector<const char*>& out, double& seconds) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      s.Run(run_options, in.data(), in_values.data(), in_values.size(), out.data(), out_values.data(),
            out_values.size());
    } catch (const Ort::Exception& e) {
      if (out_of_memory(e.what())) throw std::bad_alloc();  // the decoder reports it with the beam width
      fail(DLLM_ERROR_ONNXRUNTIME, "ONNX Runtime run failed: " + first_line(e.what()));
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

};

namespace {

// A fixed dimension of the graph (not a symbolic one, -1) that differs from the manifest's.
bool differs(int64_t graph_dim, int64_t manifest_dim) { return graph_dim >= 0 && graph_dim != manifest_dim; }

void check_io(Ort::Session& s, const std::string& graph, const GraphIO& io, bool want_kv_out, const std::string& file,
              const Manifest& m) {
  Ort::AllocatorWithDefaultOptions alloc;
  auto bad = [&](const std::string& what) { artifact_error(file + ": " + graph + " graph does not match the manifest (" + what + ")"); };
  if (s.GetInputCount() != io.inputs.size()) bad("input count");
  size_t past_seen = 0;
  for (size_t i = 0; i < io.inputs.size(); ++i) {
    if (s.GetInputNameAllocated(i, alloc).get() != io.inputs[i]) bad("input " + io.inputs[i]);
    const Feed feed = feed_of(io.inputs[i]);
    if (s.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetElementType() != element_type(feed)) {
      if (feed == Feed::kPast) fail(DLLM_ERROR_UNSUPPORTED, file + ": the KV cache is not float32; only fp32 KV (fp32, int8 variants) is supported in C++ yet");
      bad("type of " + io.inputs[i]);
    }
    if (feed == Feed::kPast) {  // past (batch, Hkv, P, D): the buffers are sized from the manifest's kv_shapes
      const std::vector<int64_t> shape = s.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetShape();
      const auto [hkv, d] = m.model.kv_shapes[past_seen++ / 2];
      if (shape.size() != 4 || differs(shape[1], hkv) || differs(shape[3], d))
        bad("shape of " + io.inputs[i] + " vs its layer's kv_shapes");
    }
  }
  if (s.GetOutputCount() != io.outputs.size()) bad("output count");
  for (size_t i = 0; i < io.outputs.size(); ++i)
    if (s.GetOutputNameAllocated(i, alloc).get() != io.outputs[i]) bad("output " + io.outputs[i]);
  // top_ids, top_probs are outputs 1, 2 of prefill and 0, 1 of verify
  const size_t first = want_kv_out ? 1 : 0;
  if (s.GetOutputTypeInfo(first).GetTensorTypeAndShapeInfo().GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64)
    bad("top_ids is not int64");
  const std::vector<int64_t> top = s.GetOutputTypeInfo(first).GetTensorTypeAndShapeInfo().GetShape();
  if (top.size() != 3 || differs(top[2], m.topk)) bad("shape of top_ids vs topk");
  if (s.GetOutputTypeInfo(first + 1).GetTensorTypeAndShapeInfo().GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    fail(DLLM_ERROR_UNSUPPORTED, file + ": top_probs is not float32; only fp32-output graphs are supported in C++ yet");
}

}  // namespace

OrtBackend::OrtBackend(const Manifest& m, int intra_op_threads) : impl_(new Impl) {
  ensure_onnxruntime_api();
  Impl& s = *impl_;
  s.k = m.topk;
  for (const auto& [hkv, d] : m.model.kv_shapes)
    for (int kind = 0; kind < 2; ++kind) s.hkv.push_back(hkv), s.d.push_back(d);
  for (const auto& n : m.prefill.inputs) s.feeds.push_back(feed_of(n));
  if (m.verify.inputs != m.prefill.inputs)
    artifact_error(m.folder + ": corrupt manifest (the prefill and verify graphs take different inputs)");
  namespace fs = std::filesystem;
  const std::string pfile = (fs::path(m.folder) / m.prefill_file).string();
  const std::string vfile = (fs::path(m.folder) / m.verify_file).string();
  try {
    s.env = Ort::Env(ORT_LOGGING_LEVEL_ERROR, "dllm_deploy");
    Ort::SessionOptions so;
    so.SetLogSeverityLevel(3);
    if (intra_op_threads > 0) so.SetIntraOpNumThreads(intra_op_threads);
    // The loop alternates the two sessions: a pool left spinning after its call takes the cores
    // the other one needs next (docs/profiles.md, "Threads"). Same setting as the Python backend.
    so.AddConfigEntry("session.intra_op.allow_spinning", "0");
    so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    s.prefill = Ort::Session(s.env, pfile.c_str(), so);
    s.verify = Ort::Session(s.env, vfile.c_str(), so);
    s.mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    s.run_options = Ort::RunOptions();
  } catch (const Ort::Exception& e) {
    fail(DLLM_ERROR_ONNXRUNTIME, m.folder + ": cannot load the ONNX graphs (" + first_line(e.what()) + ")");
  }
  try {
    check_io(s.prefill, "prefill", m.prefill, true, pfile, m);
    check_io(s.verify, "verify", m.verify, false, vfile, m);
  } catch (const Ort::Exception& e) {
    fail(DLLM_ERROR_ONNXRUNTIME, m.folder + ": cannot read the graphs' inputs (" + first_line(e.what()) + ")");
  }
  // names: prefill asks for top_ids, top_probs and present (not the full logits)
  auto keep = [&](const std::string& n) {
    s.name_store.push_back(n);
    return s.name_store.back().c_str();
  };
  for (const auto& n : m.prefill.inputs) s.prefill_in.push_back(keep(n));
  for (size_t i = 1; i < m.prefill.outputs.size(); ++i) s.prefill_out.push_back(keep(m.prefill.outputs[i]));
  for (const auto& n : m.verify.inputs) s.verify_in.push_back(keep(n));
  for (const auto& n : m.verify.outputs) s.verify_out.push_back(keep(n));
  s.past.resize(s.hkv.size());
  s.present.resize(s.hkv.size());
  s.kv_new = m.kv_new;
  s.in_values.reserve(m.prefill.inputs.size());
  s.out_values.reserve(m.prefill.outputs.size());
}

OrtBackend::~OrtBackend() = default;

void OrtBackend::reserve(size_t rows, size_t max_tokens, size_t max_past, size_t max_present) {
  Impl& s = *impl_;
  s.rows = rows;
  s.temperature.assign(rows, s.temperature1), s.top_k.assign(rows, s.top_k1), s.top_p_in.assign(rows, s.top_p1);
  size_t old_stride = s.stride;
  if (s.kv_new) {  // the buffer's positions per row: the call's need exactly on an empty cache, else
    // a quarter more at least (the written positions move to the new stride below)
    if (s.cache_len == 0) old_stride = 0, s.stride = max_past;
    else if (max_past > s.stride) s.stride = std::max(max_past, s.stride + std::max<size_t>(s.stride / 4, 1));
    max_past = s.stride;
  }
  if (rows <= s.cap_rows && max_tokens <= s.cap_tokens && max_past <= s.cap_past && max_present <= s.cap_present) {
    if (s.kv_new && old_stride && s.stride != old_stride) s.restride(old_stride);
    return;
  }
  s.cap_rows = std::max(s.cap_rows, rows);
  s.cap_tokens = std::max(s.cap_tokens, max_tokens);
  s.cap_past = std::max(s.cap_past, max_past);
  s.cap_present = std::max(s.cap_present, max_present);
  const size_t B = s.cap_rows, T = s.cap_tokens, P = s.cap_past;
  s.ids.resize(B * T);
  s.pos.resize(B * T);
  s.sample_u.resize(B * T);
  s.mask.resize(B * T * (P + T));
  s.top_i.resize(B * T * s.k);
  s.top_p.resize(B * T * s.k);
  for (size_t i = 0; i < s.past.size(); ++i) {
    const size_t row = static_cast<size_t>(s.hkv[i] * s.d[i]);  // one position of one row, (Hkv, D)
    s.past[i].resize(std::max<size_t>(1, B * row * P));
    s.present[i].resize(std::max<size_t>(1, B * row * s.cap_present));
  }
  if (s.kv_new && old_stride && s.stride != old_stride) s.restride(old_stride);
}

void OrtBackend::keep_rows(const std::vector<size_t>& idx) {
  Impl& s = *impl_;
  for (size_t i = 0; i < s.past.size(); ++i) {
    const size_t n = static_cast<size_t>(s.hkv[i] * s.d[i]) * (s.kv_new ? s.stride : s.cache_len);  // one row's cache, (Hkv, P, D)
    float* b = s.past[i].data();
    for (size_t j = 0; j < idx.size(); ++j)
      if (idx[j] != j) std::memmove(b + j * n, b + idx[j] * n, n * sizeof(float));
  }
  s.rows = idx.size();  // the rows share their sampling parameters
  s.temperature.resize(s.rows), s.top_k.resize(s.rows), s.top_p_in.resize(s.rows);
}

void OrtBackend::clear_cache(size_t capacity) {
  Impl& s = *impl_;
  s.cache_len = 0;
  if (s.kv_new && capacity) {
    if (capacity > s.cap_past) fail(DLLM_ERROR_INTERNAL, "a cache larger than the reserved buffers");
    s.stride = capacity;
  }
}

void OrtBackend::truncate(size_t n) {
  Impl& s = *impl_;
  if (n >= s.cache_len) return;
  if (s.kv_new) {  // the buffer keeps its layout; positions past n are written over later
    s.cache_len = n;
    return;
  }
  const size_t P = s.cache_len;
  for (size_t i = 0; i < s.past.size(); ++i) {  // (B*Hkv, P, D) -> (B*Hkv, n, D) in place, front to back
    const size_t d = static_cast<size_t>(s.d[i]), heads = s.rows * static_cast<size_t>(s.hkv[i]);
    float* b = s.past[i].data();
    for (size_t h = 1; h < heads; ++h) std::memmove(b + h * n * d, b + h * P * d, n * d * sizeof(float));
  }
  s.cache_len = n;
}
size_t OrtBackend::cache_length() const { return impl_->cache_len; }
size_t OrtBackend::rows() const { return impl_->rows; }
int OrtBackend::topk() const { return impl_->k; }
int64_t* OrtBackend::ids() { return impl_->ids.data(); }
int64_t* OrtBackend::pos() { return impl_->pos.data(); }
uint8_t* OrtBackend::mask() { return impl_->mask.data(); }
float* OrtBackend::sample_u() { return impl_->sample_u.data(); }
void OrtBackend::set_sampling(float temperature, int64_t top_k, float top_p) {
  Impl& s = *impl_;
  s.temperature1 = temperature, s.top_k1 = top_k, s.top_p1 = top_p;
  s.temperature.assign(s.rows, temperature), s.top_k.assign(s.rows, top_k), s.top_p_in.assign(s.rows, top_p);
}
const int64_t* OrtBackend::top_ids() const { return impl_->top_i.data(); }
const float* OrtBackend::top_probs() const { return impl_->top_p.data(); }

void OrtBackend::prefill(size_t t, size_t keep) {
  Impl& s = *impl_;
  const size_t P = s.cache_len, total = P + t, end = P + keep;
  if (end > (s.kv_new ? s.stride : s.cap_past)) fail(DLLM_ERROR_INTERNAL, "prefill larger than the reserved buffers");
  prefill_run(t);
  if (s.kv_new) {  // present (B, Hkv, T, D): its first `keep` positions after the cache's, in place
    for (size_t b = 0; b < s.past.size(); ++b) {
      const size_t d = static_cast<size_t>(s.d[b]), heads = s.rows * static_cast<size_t>(s.hkv[b]);
      for (size_t h = 0; h < heads; ++h)
        std::memcpy(s.past[b].data() + (h * s.stride + P) * d, s.present[b].data() + h * t * d, keep * d * sizeof(float));
    }
    s.cache_len = end;
    s.pending = 0;
    return;
  }
  // cache <- present[:, :, :end] per layer, (B, Hkv, end, D) contiguous
  for (size_t b = 0; b < s.past.size(); ++b) {
    const size_t d = static_cast<size_t>(s.d[b]), heads = s.rows * static_cast<size_t>(s.hkv[b]);
    for (size_t h = 0; h < heads; ++h)
      std::memcpy(s.past[b].data() + h * end * d, s.present[b].data() + h * total * d, end * d * sizeof(float));
  }
  s.cache_len = end;
  s.pending = 0;
}

void OrtBackend::prefill_run(size_t t) {
  Impl& s = *impl_;
  const size_t P = s.cache_len, total = P + t;
  if (t > s.cap_tokens || P > s.cap_past || total > s.cap_present)
    fail(DLLM_ERROR_INTERNAL, "prefill larger than the reserved buffers");
  s.add_inputs(t);
  s.add_top_outputs(t);
  s.present_shapes.resize(s.present.size());
  const size_t out_len = s.kv_new ? t : total;  // present: the new tokens' KV, or the cache's and theirs
  for (size_t i = 0; i < s.present.size(); ++i) {
    s.present_shapes[i] = {static_cast<int64_t>(s.rows), s.hkv[i], static_cast<int64_t>(out_len), s.d[i]};
    const size_t row = static_cast<size_t>(s.hkv[i] * s.d[i]);
    s.out_values.push_back(Ort::Value::CreateTensor(s.mem, s.present[i].data(), s.rows * row * out_len * sizeof(float),
                                                    s.present_shapes[i].data(), 4, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  }
  s.run(s.prefill, s.prefill_in, s.prefill_out, run_seconds);
  s.pending = t;
}

void OrtBackend::commit_selected(const std::vector<int64_t>& idx, size_t n) {
  Impl& s = *impl_;
  const size_t P = s.cache_len, t = s.pending, total = P + t, end = P + n;
  if (idx.size() != s.rows * n || end > (s.kv_new ? s.stride : s.cap_past))
    fail(DLLM_ERROR_INTERNAL, "commit larger than the reserved buffers");
  if (s.kv_new) {  // the chosen new positions of present (B, Hkv, T, D) after the cache's, in place
    for (size_t b = 0; b < s.past.size(); ++b) {
      const size_t d = static_cast<size_t>(s.d[b]), hkv = static_cast<size_t>(s.hkv[b]);
      for (size_t h = 0; h < s.rows * hkv; ++h)
        for (size_t j = 0; j < n; ++j)
          std::memcpy(s.past[b].data() + (h * s.stride + P + j) * d,
                      s.present[b].data() + (h * t + static_cast<size_t>(idx[h / hkv * n + j])) * d, d * sizeof(float));
    }
    s.cache_len = end;
    s.pending = 0;
    return;
  }
  // cache <- present[:, :, :P] + the chosen new positions, (B, Hkv, P+n, D) contiguous
  for (size_t b = 0; b < s.past.size(); ++b) {
    const size_t d = static_cast<size_t>(s.d[b]), hkv = static_cast<size_t>(s.hkv[b]);
    float* past = s.past[b].data();
    const float* present = s.present[b].data();
    for (size_t h = 0; h < s.rows * hkv; ++h) {
      const size_t row = h / hkv;
      std::memcpy(past + h * end * d, present + h * total * d, P * d * sizeof(float));
      for (size_t j = 0; j < n; ++j)
        std::memcpy(past + (h * end + P + j) * d, present + (h * total + P + static_cast<size_t>(idx[row * n + j])) * d,
                    d * sizeof(float));
    }
  }
  s.cache_len = end;
  s.pending = 0;
}

void OrtBackend::verify(size_t t) {
  Impl& s = *impl_;
  if (t > s.cap_tokens || s.cache_len > s.cap_past) fail(DLLM_ERROR_INTERNAL, "verify larger than the reserved buffers");
  s.add_inputs(t);
  s.add_top_outputs(t);
  s.run(s.verify, s.verify_in, s.verify_out, run_seconds);
}

}  // namespace dllm::detail
