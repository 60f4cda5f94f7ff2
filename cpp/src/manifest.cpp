#include "manifest.hpp"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "json.hpp"
#include "sha256.hpp"

namespace dllm::detail {

namespace fs = std::filesystem;

namespace {

// Objects keep the file's key order, so checks run (and report) in the order Python's do.
using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 200;  // deeper documents are refused, not walked
struct TooDeep {};

// obj[key], or nullptr if obj is not an object or has no such key.
const Json* find(const Json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// A JSON library error in one line: where it is and what is wrong, without the bytes it last
// read (they may be long, or not text).
std::string syntax_error(const std::string& what) {
  std::string s = what;
  const size_t at = s.find("parse error at ");
  if (at != std::string::npos) s = s.substr(at + 15);
  const size_t last = s.find("; last read: ");
  if (last != std::string::npos) {
    const size_t expected = s.rfind("; expected ");
    s = s.substr(0, last) + (expected != std::string::npos && expected > last ? s.substr(expected) : "");
  }
  return s;
}

Json parse_manifest(const std::string& text, const std::string& path) {
  const Json::parser_callback_t depth_limit = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxDepth) throw TooDeep{};
    return true;
  };
  try {
    return Json::parse(text, depth_limit);
  } catch (const TooDeep&) {
    artifact_error(path + ": corrupt manifest (nested too deeply)");
  } catch (const Json::parse_error& e) {
    artifact_error(path + ": corrupt manifest (not JSON at " + syntax_error(e.what()) + ")");
  } catch (const Json::exception&) {  // out_of_range: a number beyond a double's range
    artifact_error(path + ": corrupt manifest (a number out of range)");
  }
}

// A JSON integer that fits an int.
bool is_int(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() < (1ULL << 31);
  return v.is_number_integer() && v.get<int64_t>() >= -(1LL << 31) && v.get<int64_t>() < (1LL << 31);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void corrupt(const std::string& what) const { artifact_error(path_ + ": corrupt manifest (" + what + ")"); }

  const Json& field(const Json& obj, const char* key, const std::string& where) const {
    const Json* v = find(obj, key);
    if (!v) corrupt("no '" + where + "'");
    return *v;
  }
  int integer(const Json& obj, const char* key, const std::string& where) const {
    const Json& v = field(obj, key, where);
    if (!is_int(v)) corrupt("'" + where + "' is not an integer");
    return v.get<int>();
  }
  std::string string(const Json& obj, const char* key, const std::string& where) const {
    const Json& v = field(obj, key, where);
    if (!v.is_string()) corrupt("'" + where + "' is not a string");
    return v.get<std::string>();
  }
  std::vector<std::string> strings(const Json& obj, const char* key, const std::string& where) const {
    const Json& v = field(obj, key, where);
    if (!v.is_array()) corrupt("'" + where + "' is not a list");
    std::vector<std::string> out;
    for (const Json& x : v) {
      if (!x.is_string()) corrupt("'" + where + "' holds a non-string");
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  // An optional true/false key (absent: false).
  bool flag(const Json& obj, const char* key, const std::string& where) const {
    const Json* v = find(obj, key);
    if (v && !v->is_boolean()) corrupt("'" + where + "' is not true/false");
    return v && v->get<bool>();
  }
  const Json& object(const Json& obj, const char* key, const std::string& where) const {
    const Json& v = field(obj, key, where);
    if (!v.is_object()) corrupt("'" + where + "' is not an object");
    return v;
  }

 private:
  std::string path_;
};

// A path that exists but cannot be read: say why (permission denied), never "missing".
[[noreturn]] void unreadable(const std::string& path, const std::error_code& ec) {
  if (ec == std::errc::permission_denied) artifact_error(path + ": permission denied");
  artifact_error(path + ": cannot be read (" + ec.message() + ")");
}

std::string describe(const Json& v) {
  if (v.is_string()) return quoted(v.get<std::string>());
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return format_double(v.get<double>());
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  return "<non-scalar>";
}

// How many of the four sampling inputs a graph lists.
size_t sampling_inputs(const GraphIO& g) {
  size_t n = 0;
  for (const char* name : kSamplingInputs) n += std::count(g.inputs.begin(), g.inputs.end(), name) == 1;
  return n;
}

// "sampling": {"pool": P, "noise": "philox4x64-10/v1"}: P >= 1 tokens sampled among, with the
// noise of noise.hpp. The same checks as artifact/__init__.py::_check_shape (then K <= P, and a
// noise this runtime draws).
void read_sampling(const Reader& r, const Json& m, Manifest& out) {
  const Json* s = find(m, "sampling");
  if (!s) return;
  const Json* pool = find(*s, "pool");
  if (!pool || !is_int(*pool) || pool->get<int>() < 1) r.corrupt("'sampling' has no positive integer 'pool'");
  out.sample_pool = pool->get<int>();
  if (out.topk > out.sample_pool) r.corrupt("'topk' is larger than 'sampling.pool'");
  const Json* noise = find(*s, "noise");
  if (noise && !(noise->is_string() && noise->get<std::string>() == "philox4x64-10/v1"))
    fail(DLLM_ERROR_UNSUPPORTED, out.folder + ": sampling noise " + describe(*noise) +
                                     " is not supported (this runtime draws 'philox4x64-10/v1')");
}

// "capabilities" (models/capabilities.py::Capabilities.from_dict: the same checks).
void read_capabilities(const Reader& r, const Json& c, Capabilities& out) {
  out.attention = r.string(c, "attention", "capabilities.attention");
  r.string(c, "noise", "capabilities.noise");
  out.shift_logits = r.flag(c, "shift_logits", "capabilities.shift_logits");
  out.joins = r.flag(c, "joins", "capabilities.joins");
  const Json& cache = r.object(c, "cache", "capabilities.cache");
  const std::set<std::string> modes = {"none", "prefix", "dual", "exact", "delayed", "auto"};  // decode_options.json
  for (const auto& kv : cache.items()) {
    const bool runs = kv.value().is_string() && modes.count(kv.value().get<std::string>()) && kv.value() != "auto";
    if (!modes.count(kv.key()) || !runs) r.corrupt("'capabilities.cache' must map cache modes onto the modes that run");
    out.cache[kv.key()] = kv.value().get<std::string>();
  }
  if (!out.cache.count("auto")) r.corrupt("'capabilities.cache' has no 'auto'");
  out.one_branch = find(c, "one_branch") ? r.strings(c, "one_branch", "capabilities.one_branch") : std::vector<std::string>{};
  out.graphs = r.strings(c, "graphs", "capabilities.graphs");
}

// "kv_shapes": [[Hkv, D], ...], one per layer, each positive.
void read_kv_shapes(const Reader& r, const Json& m, Manifest& out) {
  const Json& kv = r.field(m, "kv_shapes", "kv_shapes");
  if (!kv.is_array() || kv.size() != static_cast<size_t>(out.model.num_layers))
    r.corrupt("'kv_shapes' is not a list of [kv heads, head dim] per layer");
  for (const Json& s : kv) {
    if (!s.is_array() || s.size() != 2 || !is_int(s[0]) || !is_int(s[1]) || s[0].get<int>() < 1 || s[1].get<int>() < 1)
      r.corrupt("'kv_shapes' is not a list of [kv heads, head dim] per layer");
    out.model.kv_shapes.emplace_back(s[0].get<int>(), s[1].get<int>());
  }
}

}  // namespace

Manifest read_manifest(const std::string& folder_in, const std::string& precision, bool verify) {
  std::string folder = fs::path(folder_in).lexically_normal().string();
  if (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  std::error_code ec;
  const fs::file_status st = fs::status(folder, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) unreadable(folder, ec);
  if (!fs::exists(st)) artifact_error(folder + ": no such artifact folder");
  if (!fs::is_directory(st)) artifact_error(folder + ": not a folder (an artifact is the folder that holds manifest.json)");
  const std::string path = (fs::path(folder) / "manifest.json").string();
  const bool listed = fs::exists(path, ec);
  if (ec) unreadable(folder, ec);
  if (!listed) artifact_error(folder + ": not an artifact (no manifest.json)");
  std::ifstream in(path, std::ios::binary);
  if (!in) unreadable(path, std::error_code(errno, std::generic_category()));
  std::stringstream ss;
  ss << in.rdbuf();
  const Json m = parse_manifest(ss.str(), path);
  Reader r(path);
  const Json* schema = find(m, "schema_version");
  if (!schema) r.corrupt("no schema_version");
  const Json& sv = *schema;
  const double version = sv.is_number() ? sv.get<double>() : 0.0;
  const std::string reads = " (this runtime reads " + std::to_string(kSchemaVersion) + ", " + std::to_string(kSchemaKvNew);
  if (is_int(sv) && version >= 1 && version < kSchemaVersion)
    artifact_error(path + ": schema_version " + describe(sv) + " was written by an older dllm-deploy; re-export the model" +
                   reads + "; CHANGELOG.md)");
  if (!is_int(sv) || (version != kSchemaVersion && version != kSchemaKvNew))
    artifact_error(path + ": unknown schema_version " + describe(sv) + reads + ")");
  const Json* kv_io = find(m, "kv_io");
  const bool kv_new = kv_io && kv_io->is_string() && kv_io->get<std::string>() == "new";
  if ((version == kSchemaKvNew) != kv_new)
    r.corrupt("schema_version " + describe(sv) + " with kv_io " + (kv_io ? describe(*kv_io) : std::string("None")));
  for (const char* key : {"model", "precisions", "files", "graphs", "tokenizer", "capabilities", "sampling"})
    if (!find(m, key)) r.corrupt(std::string("no '") + key + "'");

  const Json& precisions = r.object(m, "precisions", "precisions");
  const Json* files_of = find(precisions, precision);
  if (!files_of) {
    std::set<std::string> have;
    for (const auto& kv : precisions.items()) have.insert(kv.key());
    std::string list;
    for (const auto& h : have) list += (list.empty() ? "" : ", ") + h;
    artifact_error(folder + ": the artifact has no " + quoted(precision) + " variant (it has " + list + ")");
  }
  if (!files_of->is_object()) r.corrupt("'precisions." + precision + "' is not an object");

  const Json& files = r.object(m, "files", "files");
  if (verify) {
    std::set<std::string> need;
    for (const Json& file : *files_of)
      if (file.is_string()) need.insert(file.get<std::string>());
    for (const auto& kv : files.items()) {
      const std::string& rel = kv.key();
      if (!need.count(rel) && (ends_with(rel, ".onnx") || ends_with(rel, ".bin"))) continue;
      if (!kv.value().is_string()) r.corrupt("'files." + rel + "' is not a sha256 string");
      const std::string f = (fs::path(folder) / rel).string();
      if (!fs::exists(f, ec)) {
        if (ec) unreadable(f, ec);
        artifact_error(f + ": missing (listed in the manifest)");
      }
      std::string digest;
      if (!sha256_file(f, digest)) unreadable(f, std::error_code(errno, std::generic_category()));
      if (digest != kv.value().get<std::string>()) artifact_error(f + ": sha256 mismatch (the file changed after export)");
    }
  }

  Manifest out;
  out.schema_version = static_cast<int>(version);
  out.kv_new = kv_new;
  out.folder = folder;
  out.precision = precision;
  const Json& model = r.object(m, "model", "model");
  out.model.vocab_size = r.integer(model, "vocab_size", "model.vocab_size");
  out.model.num_layers = r.integer(model, "num_layers", "model.num_layers");
  out.model.num_kv_heads = r.integer(model, "num_kv_heads", "model.num_kv_heads");
  out.model.head_dim = r.integer(model, "head_dim", "model.head_dim");
  out.model.mask_token_id = r.integer(model, "mask_token_id", "model.mask_token_id");
  out.model.eos_token_id = r.integer(model, "eos_token_id", "model.eos_token_id");
  out.model.pad_token_id = r.integer(model, "pad_token_id", "model.pad_token_id");
  out.model.max_seq = r.integer(model, "max_seq", "model.max_seq");
  out.model.hidden_size = r.integer(model, "hidden_size", "model.hidden_size");
  out.model.intermediate_size = r.integer(model, "intermediate_size", "model.intermediate_size");
  out.model.num_heads = r.integer(model, "num_heads", "model.num_heads");
  out.model.block_size = r.integer(model, "block_size", "model.block_size");
  out.model.tie_word_embeddings = r.flag(model, "tie_word_embeddings", "model.tie_word_embeddings");
  for (auto [key, field] : {std::pair{"qk_norm", &out.model.qk_norm}, std::pair{"qkv_bias", &out.model.qkv_bias}})
    if (find(model, key)) *field = r.flag(model, key, std::string("model.") + key);
  for (auto [key, field] : {std::pair{"num_experts", &out.model.num_experts},
                            std::pair{"experts_per_token", &out.model.experts_per_token},
                            std::pair{"expert_size", &out.model.expert_size},
                            std::pair{"shared_expert_size", &out.model.shared_expert_size},
                            std::pair{"dense_layers", &out.model.dense_layers}}) {
    if (!find(model, key)) continue;
    *field = r.integer(model, key, std::string("model.") + key);
    if (*field < 0) r.corrupt(std::string("'model.") + key + "' must be >= 0");
  }
  if (out.model.num_experts && (out.model.experts_per_token < 1 || out.model.expert_size < 1))
    r.corrupt("a mixture-of-experts model needs experts_per_token and expert_size >= 1");
  if (const Json* router = find(model, "router")) out.model.router_bias = router->is_string() && *router == "sigmoid";
  for (int dim : {out.model.vocab_size, out.model.hidden_size, out.model.intermediate_size, out.model.num_layers,
                  out.model.num_heads, out.model.num_kv_heads, out.model.head_dim, out.model.block_size,
                  out.model.max_seq})
    if (dim < 1) r.corrupt("model dimensions must be >= 1");
  out.topk = r.integer(m, "topk", "topk");
  if (out.topk < 1) r.corrupt("'topk' must be >= 1");
  read_sampling(r, m, out);
  if (find(m, "max_beam_width")) out.max_beam_width = r.integer(m, "max_beam_width", "max_beam_width");
  const Json& tok = r.object(m, "tokenizer", "tokenizer");
  const Json* kind = find(tok, "kind");
  out.tokenizer_kind = kind && kind->is_string() ? kind->get<std::string>() : "";
  for (auto [key, field] : {std::pair{"file", &out.tokenizer_file}, std::pair{"config", &out.tokenizer_config}}) {
    const Json* v = find(tok, key);
    if (v && (!v->is_string() || v->get<std::string>().find('/') != std::string::npos || *v == ".."))
      r.corrupt(std::string("'tokenizer.") + key + "' must be a file name inside the artifact");
    *field = v ? v->get<std::string>() : "";
  }
  out.family = r.string(m, "family", "family");
  read_capabilities(r, r.object(m, "capabilities", "capabilities"), out.caps);
  read_kv_shapes(r, m, out);
  const Json& graphs = r.object(m, "graphs", "graphs");
  for (const std::string& role : out.caps.graphs)
    if (!find(graphs, role)) r.corrupt("no graph of role " + dllm::detail::quoted(role));
  for (const char* role : {"prefill", "verify"})
    if (std::find(out.caps.graphs.begin(), out.caps.graphs.end(), role) == out.caps.graphs.end())
      fail(DLLM_ERROR_UNSUPPORTED, folder + ": family " + dllm::detail::quoted(out.family) + " has no " + dllm::detail::quoted(role) +
                                       " graph; this runtime decodes families whose graphs are prefill and verify");
  const Json& gp = r.object(graphs, "prefill", "graphs.prefill");
  const Json& gv = r.object(graphs, "verify", "graphs.verify");
  out.prefill.inputs = r.strings(gp, "inputs", "graphs.prefill.inputs");
  out.prefill.outputs = r.strings(gp, "outputs", "graphs.prefill.outputs");
  out.verify.inputs = r.strings(gv, "inputs", "graphs.verify.inputs");
  out.verify.outputs = r.strings(gv, "outputs", "graphs.verify.outputs");
  // input_ids, position_ids, attention_mask, 2 past tensors per layer and the 4 sampling inputs
  const size_t n_in = 3 + 2 * static_cast<size_t>(out.model.num_layers) + 4;
  for (const GraphIO* g : {&out.prefill, &out.verify})
    if (g->inputs.size() != n_in || sampling_inputs(*g) != 4)
      r.corrupt("graph inputs are not input_ids, position_ids, attention_mask, 2 past tensors per layer "
                "and sample_u, temperature, top_k, top_p");
  if (out.prefill.outputs.size() != 3 + 2 * static_cast<size_t>(out.model.num_layers) || out.verify.outputs.size() != 2)
    r.corrupt("graph outputs are not (logits, top_ids, top_probs, present...) and (top_ids, top_probs)");
  out.prefill_file = r.string(*files_of, "prefill", "precisions." + precision + ".prefill");
  out.verify_file = r.string(*files_of, "verify", "precisions." + precision + ".verify");
  return out;
}

}  // namespace dllm::detail
