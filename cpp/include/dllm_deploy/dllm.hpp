// dllm_deploy C++17 wrapper: header-only RAII over the C ABI in dllm.h; failures throw dllm::Error.
//
//   dllm::Runtime rt("artifact/");                      // checks manifest + hashes, opens sessions
//   dllm::DecodeConfig cfg;  cfg.strategy = "spd";      // defaults are the Python ones
//   dllm::Result r = rt.generate("upper: air\n", cfg);
//   dllm::Options o;  o.set("beam_width", "8");         // or any declared option by name
//   dllm::Result r2 = rt.generate("upper: air\n", o);
//   std::cout << r.text() << " " << r.stats().tpf << "\n";
//   rt.generate_stream("upper: air\n", o, [](const dllm::Chunk& c) {  // on this thread, per chunk
//     std::cout << c.delta << std::flush;
//     return true;                                                    // false cancels
//   });
#ifndef DLLM_DEPLOY_DLLM_HPP
#define DLLM_DEPLOY_DLLM_HPP

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dllm.h"

namespace dllm {

class Error : public std::runtime_error {
 public:
  Error(dllm_code code, const std::string& message, const std::string& key = std::string())
      : std::runtime_error(message), code_(code), key_(key) {}
  dllm_code code() const noexcept { return code_; }
  const std::string& key() const noexcept { return key_; }  // the decode option of an option error

 private:
  dllm_code code_;
  std::string key_;
};

namespace detail {
inline void check(dllm_error* err) {
  if (err == nullptr) return;
  dllm_code code = dllm_error_code(err);
  std::string message = dllm_error_message(err);
  std::string key = dllm_error_key(err);
  dllm_error_free(err);
  throw Error(code, message, key);
}
struct RuntimeDeleter {
  void operator()(dllm_runtime* p) const noexcept { dllm_runtime_destroy(p); }
};
struct OptionsDeleter {
  void operator()(dllm_options* p) const noexcept { dllm_options_destroy(p); }
};
struct ResultDeleter {
  void operator()(dllm_result* p) const noexcept { dllm_result_destroy(p); }
};
}  // namespace detail

// Loading options; the defaults are dllm_runtime_options_init's.
struct RuntimeOptions {
  std::string precision = "fp32";  // artifact precision variant (fp32, int8, int4)
  int intra_op_threads = 0;        // ONNX Runtime intra-op threads; 0 = its default
  int max_beam_width = 0;          // user cap on W; 0 = only the manifest's cap
  bool verify_hashes = true;       // sha256 of every file the precision needs
  bool warnings_to_stderr = true;  // also print warnings on stderr
};

// Decoding options, one to one with dllm_decode_config (and Python's DecodeConfig).
struct DecodeConfig {
  std::string strategy, tree, select, base, cache;
  int gen_length, block_length, tokens_per_step, beam_width, schedule_end_tokens;
  int steps;  // DLLM_STEPS_UNSET (the default) or >= 1
  double threshold, draft_tau, schedule_init, schedule_decay, schedule_floor;

  DecodeConfig() {
    dllm_decode_config c;
    dllm_decode_config_init(&c);
    strategy = c.strategy, tree = c.tree, select = c.select, base = c.base, cache = c.cache;
    gen_length = c.gen_length, block_length = c.block_length, tokens_per_step = c.tokens_per_step;
    steps = c.steps, beam_width = c.beam_width, schedule_end_tokens = c.schedule_end_tokens;
    threshold = c.threshold, draft_tau = c.draft_tau, schedule_init = c.schedule_init;
    schedule_decay = c.schedule_decay, schedule_floor = c.schedule_floor;
  }

  // The C view; valid while *this is alive and unchanged.
  dllm_decode_config c_config() const {
    dllm_decode_config c;
    dllm_decode_config_init(&c);
    c.strategy = strategy.c_str(), c.tree = tree.c_str(), c.select = select.c_str();
    c.base = base.c_str(), c.cache = cache.c_str();
    c.gen_length = gen_length, c.block_length = block_length, c.tokens_per_step = tokens_per_step;
    c.steps = steps, c.beam_width = beam_width, c.schedule_end_tokens = schedule_end_tokens;
    c.threshold = threshold, c.draft_tau = draft_tau, c.schedule_init = schedule_init;
    c.schedule_decay = schedule_decay, c.schedule_floor = schedule_floor;
    return c;
  }
};

// Decoding options by name (dllm_options_set): every declared option, at its default until set.
class Options {
 public:
  Options() : h_(dllm_options_create()) {
    if (!h_) throw Error(DLLM_ERROR_OUT_OF_MEMORY, "out of memory");
  }
  Options& set(const std::string& name, const std::string& value) {
    detail::check(dllm_options_set(h_.get(), name.c_str(), value.c_str()));
    return *this;
  }
  const dllm_options* get() const noexcept { return h_.get(); }

 private:
  std::unique_ptr<dllm_options, detail::OptionsDeleter> h_;
};

using Stats = dllm_stats;

// One streamed chunk (dllm_chunk, copied).
struct Chunk {
  int index = 0;
  std::string delta;               // new text
  std::vector<int64_t> token_ids;  // new final ids
  int64_t forwards = 0, tokens = 0;
  std::string finish_reason;       // "" except on the last chunk: "eos" | "stop" | "length"
  std::string json;                // the chunk as one JSON object

  explicit Chunk(const dllm_chunk& c)
      : index(c.index), delta(c.delta, c.delta_size), token_ids(c.token_ids, c.token_ids + c.token_count),
        forwards(c.forwards), tokens(c.tokens), finish_reason(c.finish_reason ? c.finish_reason : ""),
        json(c.json) {}
};

// Called with each chunk on the calling thread; return false to cancel the generation. An
// exception it throws cancels the generation and is rethrown by generate_stream.
using ChunkCallback = std::function<bool(const Chunk&)>;

class Result {
 public:
  explicit Result(dllm_result* handle) : h_(handle) {}
  std::string text() const { return dllm_result_text(h_.get()); }
  std::vector<int64_t> token_ids() const {
    size_t n = 0;
    const int64_t* p = dllm_result_token_ids(h_.get(), &n);
    return std::vector<int64_t>(p, p + n);
  }
  Stats stats() const {
    Stats s;
    dllm_result_stats(h_.get(), &s);
    return s;
  }
  // steps accepted per verification -> how many verifications accepted that many
  std::map<int, int64_t> accepted_hist() const {
    size_t n = 0;
    const int64_t* p = dllm_result_accepted_hist(h_.get(), &n);
    std::map<int, int64_t> out;
    for (size_t i = 0; i < n; ++i)
      if (p[i] != 0) out[static_cast<int>(i)] = p[i];
    return out;
  }
  std::string warnings() const { return dllm_result_warnings(h_.get()); }
  std::string finish_reason() const { return dllm_result_finish_reason(h_.get()); }  // eos|stop|length|cancelled
  // seconds to the first chunk with token ids; std::nullopt when there was none
  std::optional<double> time_to_first_token_s() const {
    const double s = dllm_result_time_to_first_token_s(h_.get());
    return s < 0 ? std::nullopt : std::optional<double>(s);
  }
  std::string json() const { return dllm_result_json(h_.get()); }
  const dllm_result* get() const noexcept { return h_.get(); }

 private:
  std::unique_ptr<dllm_result, detail::ResultDeleter> h_;
};

// dllm_self_spec_config as a value type (its defaults).
struct SelfSpecConfig {
  std::string strategy = "tree-spec";  // ar | linear-spec | tree-spec | fastdiffuser
  int beam_width = 4;
  int block_size = 0;                  // 0: the model's
  int max_new_tokens = 64;
  float temperature = 0.0f;
  uint64_t seed = 0;
  double threshold = 0.9;              // fastdiffuser
  std::vector<std::string> stop;       // stop strings (finish reason "stop")
};

// dllm_uniform_config as a value type; its numbers default to the runtime's (Runtime::uniform_config).
struct UniformConfig {
  int max_new_tokens = 256;
  int max_denoising_steps = 48;
  double entropy_bound = 0.1;
  double t_min = 0.4, t_max = 0.8;
  int stability_threshold = 1;
  double confidence_threshold = 0.005;
  uint64_t seed = 0;
  std::vector<std::string> stop;       // stop strings (finish reason "stop")
};

class Runtime {
 public:
  explicit Runtime(const std::string& artifact_dir, const RuntimeOptions& options = RuntimeOptions()) {
    dllm_runtime_options o;
    dllm_runtime_options_init(&o);
    o.precision = options.precision.c_str();
    o.intra_op_threads = options.intra_op_threads;
    o.max_beam_width = options.max_beam_width;
    o.verify_hashes = options.verify_hashes ? 1 : 0;
    o.warnings_to_stderr = options.warnings_to_stderr ? 1 : 0;
    dllm_runtime* h = nullptr;
    detail::check(dllm_runtime_create(artifact_dir.c_str(), &o, &h));
    h_.reset(h);
  }

  Result generate(const std::string& prompt, const DecodeConfig& config = DecodeConfig()) {
    dllm_decode_config c = config.c_config();
    dllm_result* r = nullptr;
    detail::check(dllm_runtime_generate(h_.get(), prompt.c_str(), &c, &r));
    return Result(r);
  }

  Result generate(const std::string& prompt, const Options& options) {
    dllm_result* r = nullptr;
    detail::check(dllm_runtime_generate_options(h_.get(), prompt.c_str(), options.get(), &r));
    return Result(r);
  }

  // generate, with on_chunk called as text becomes final (dllm_generate_stream).
  Result generate_stream(const std::string& prompt, const Options& options, const ChunkCallback& on_chunk) {
    return std::move(generate_batch({prompt}, options, on_chunk).front());
  }

  // The prompts decoded together as one batch, one result each (dllm_generate_batch); on_chunk
  // (optional) sees every row's chunks, Chunk::index naming the prompt.
  std::vector<Result> generate_batch(const std::vector<std::string>& prompts, const Options& options,
                                     const ChunkCallback& on_chunk = ChunkCallback()) {
    const std::vector<const char*> texts = c_strings(prompts);
    return chunked(prompts.size(), on_chunk, [&](dllm_chunk_callback cb, void* data, dllm_result** raw) {
      return dllm_generate_batch(h_.get(), texts.data(), texts.size(), options.get(), cb, data, raw);
    });
  }

  // A self-speculative model (docs/self_speculation.md): the prompts decoded together, one result
  // each (dllm_self_spec_generate).
  bool self_speculative() const { return dllm_runtime_self_speculative(h_.get()) != 0; }
  // on_chunk (optional) sees each round's final text as chunks (dllm_self_spec_generate_stream).
  std::vector<Result> self_spec_generate(const std::vector<std::string>& prompts, const SelfSpecConfig& config,
                                         const ChunkCallback& on_chunk = ChunkCallback()) {
    dllm_self_spec_config c;
    dllm_self_spec_config_init(&c);
    c.strategy = config.strategy.c_str();
    c.beam_width = config.beam_width, c.block_size = config.block_size, c.max_new_tokens = config.max_new_tokens;
    c.temperature = config.temperature, c.seed = config.seed, c.threshold = config.threshold;
    const std::vector<const char*> stop = c_strings(config.stop);
    c.stop = stop.data(), c.stop_count = stop.size();
    const std::vector<const char*> texts = c_strings(prompts);
    return chunked(prompts.size(), on_chunk, [&](dllm_chunk_callback cb, void* data, dllm_result** raw) {
      return dllm_self_spec_generate_stream(h_.get(), texts.data(), texts.size(), &c, cb, data, raw);
    });
  }

  // A uniform-noise diffusion model (DiffusionGemma, docs/diffusion_gemma.md).
  bool uniform_diffusion() const { return dllm_runtime_uniform_diffusion(h_.get()) != 0; }
  // Its defaults (the artifact's generation defaults over transformers').
  UniformConfig uniform_config() const {
    dllm_uniform_config c;
    dllm_uniform_config_init(h_.get(), &c);
    UniformConfig out;
    out.max_new_tokens = c.max_new_tokens, out.max_denoising_steps = c.max_denoising_steps;
    out.entropy_bound = c.entropy_bound, out.t_min = c.t_min, out.t_max = c.t_max;
    out.stability_threshold = c.stability_threshold, out.confidence_threshold = c.confidence_threshold;
    out.seed = c.seed;
    return out;
  }
  // The prompts decoded together, one result each (dllm_uniform_generate); on_chunk (optional)
  // sees one chunk per row and canvas.
  std::vector<Result> uniform_generate(const std::vector<std::string>& prompts, const UniformConfig& config,
                                       const ChunkCallback& on_chunk = ChunkCallback()) {
    dllm_uniform_config c;
    dllm_uniform_config_init(h_.get(), &c);
    c.max_new_tokens = config.max_new_tokens, c.max_denoising_steps = config.max_denoising_steps;
    c.entropy_bound = config.entropy_bound, c.t_min = config.t_min, c.t_max = config.t_max;
    c.stability_threshold = config.stability_threshold, c.confidence_threshold = config.confidence_threshold;
    c.seed = config.seed;
    const std::vector<const char*> stop = c_strings(config.stop);
    c.stop = stop.data(), c.stop_count = stop.size();
    const std::vector<const char*> texts = c_strings(prompts);
    return chunked(prompts.size(), on_chunk, [&](dllm_chunk_callback cb, void* data, dllm_result** raw) {
      return dllm_uniform_generate(h_.get(), texts.data(), texts.size(), &c, cb, data, raw);
    });
  }

  // Each decision record of the masked decodes that follow, one JSON object (dllm_runtime_set_trace;
  // docs/cpp.md); an empty function turns tracing off. An exception it throws is dropped.
  void set_trace(std::function<void(const std::string& json)> on_record) {
    if (!on_record) {
      dllm_runtime_set_trace(h_.get(), nullptr, nullptr);
      trace_.reset();
      return;
    }
    trace_ = std::make_unique<std::function<void(const std::string&)>>(std::move(on_record));
    dllm_runtime_set_trace(h_.get(), [](const char* json, size_t size, void* data) {
      try {
        (*static_cast<std::function<void(const std::string&)>*>(data))(std::string(json, size));
      } catch (...) {
      }
    }, trace_.get());
  }

  int max_seq() const { return dllm_runtime_max_seq(h_.get()); }
  int max_beam_width() const { return dllm_runtime_max_beam_width(h_.get()); }
  dllm_runtime* get() noexcept { return h_.get(); }

 private:
  static std::vector<const char*> c_strings(const std::vector<std::string>& strings) {
    std::vector<const char*> out;
    for (const std::string& s : strings) out.push_back(s.c_str());
    return out;
  }

  // `call(callback, user_data, raw)` with on_chunk behind a C trampoline (an exception it throws
  // cancels the generation and is rethrown here): one Result per prompt.
  template <class Call>
  static std::vector<Result> chunked(size_t n, const ChunkCallback& on_chunk, Call call) {
    struct State {
      const ChunkCallback& fn;
      std::exception_ptr error;
    } state{on_chunk, nullptr};
    auto trampoline = [](const dllm_chunk* c, void* data) -> int {
      State& self = *static_cast<State*>(data);
      try {
        return self.fn(Chunk(*c)) ? 0 : 1;
      } catch (...) {
        self.error = std::current_exception();
        return 1;
      }
    };
    std::vector<dllm_result*> raw(n, nullptr);
    detail::check(call(on_chunk ? dllm_chunk_callback(trampoline) : nullptr, &state, raw.data()));
    std::vector<Result> results;
    for (dllm_result* r : raw) results.emplace_back(r);
    if (state.error) std::rethrow_exception(state.error);
    return results;
  }

  std::unique_ptr<dllm_runtime, detail::RuntimeDeleter> h_;
  std::unique_ptr<std::function<void(const std::string&)>> trace_;  // set_trace's, behind the C callback
};

inline std::string version() { return dllm_version(); }
inline std::string onnxruntime_version() { return dllm_onnxruntime_version(); }

}  // namespace dllm

#endif  // DLLM_DEPLOY_DLLM_HPP
