// The C ABI (dllm.h) over the runtime: argument checks, and every exception turned into a
// dllm_error object. Nothing throws across this file's functions.
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "decoder.hpp"
#include "dllm_deploy/dllm.h"
#include "error.hpp"
#include "options.hpp"
#include "ort_backend.hpp"
#include "tokenizer.hpp"
#include "uniform_diffusion.hpp"

#ifndef DLLM_VERSION
#define DLLM_VERSION "0.0.0"
#endif

struct dllm_error {
  dllm_code code;
  std::string message;
  std::string key;  // the decode option of an option error
};

struct dllm_options {
  dllm::detail::DecodeOptions options;
  bool gen_length_set = false;  // unset, gen_length defaults to max_tokens (docs/streaming.md)
};

struct dllm_runtime {
  std::unique_ptr<dllm::detail::Runtime> runtime;         // the masked and self-speculative families
  std::unique_ptr<dllm::detail::UniformRuntime> uniform;  // or a uniform-noise diffusion model
};

struct dllm_result {
  dllm::detail::RowResult row;
  std::string json;
};

namespace {

using dllm::detail::Failure;

// Returned when even the error object cannot be allocated; dllm_error_free ignores it.
dllm_error g_out_of_memory{DLLM_ERROR_OUT_OF_MEMORY, std::string(), std::string()};

// A message is one line of valid UTF-8 even when it quotes a corrupt manifest's bytes: invalid
// UTF-8 becomes U+FFFD, control characters (a newline in a key) become \xNN.
std::string one_line(const char* message) {
  std::string out;
  for (char c : dllm::detail::utf8_replace_invalid(message)) {
    if (static_cast<unsigned char>(c) >= 0x20) {
      out += c;
      continue;
    }
    static const char* hex = "0123456789abcdef";
    out += "\\x";
    out += hex[(c >> 4) & 0xF];
    out += hex[c & 0xF];
  }
  return out;
}

dllm_error* make_error(dllm_code code, const char* message, const std::string& key = std::string()) noexcept {
  try {
    return new dllm_error{code, one_line(message), key};
  } catch (...) {
    return &g_out_of_memory;
  }
}

template <class F>
dllm_error* guarded(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Failure& e) {
    return make_error(e.code, e.what(), e.key);
  } catch (const std::bad_alloc&) {
    return make_error(DLLM_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_error(DLLM_ERROR_INTERNAL, e.what());
  } catch (...) {
    return make_error(DLLM_ERROR_INTERNAL, "unknown internal error");
  }
}

std::string or_default(const char* s, const char* fallback) { return s ? std::string(s) : std::string(fallback); }

// The declared default of option `name` as text (static storage: the generated table's).
const char* default_text(const char* name) {
  for (size_t i = 0; i < dllm::detail::option_count(); ++i)
    if (std::strcmp(dllm::detail::option_at(i).name, name) == 0) return dllm::detail::option_at(i).default_text;
  return "";
}

[[noreturn]] void not_for_uniform(const dllm_runtime& rt) {
  dllm::detail::user_error("a " + rt.uniform->family() + " model decodes by uniform-noise diffusion "
                           "(dllm_uniform_generate; dllm-generate reads its flags); the masked and self-speculative "
                           "strategies do not apply");
}

// The prompts as strings (a NULL prompt is refused, naming `fn`).
std::vector<std::string> prompt_texts(const char* fn, const char* const* prompts, size_t n) {
  if (!prompts || n == 0) dllm::detail::user_error(std::string(fn) + ": no prompt given");
  std::vector<std::string> texts;
  for (size_t i = 0; i < n; ++i) {
    if (!prompts[i]) dllm::detail::user_error(std::string(fn) + ": prompt " + std::to_string(i) + " is NULL");
    texts.emplace_back(prompts[i]);
  }
  return texts;
}

// The rows' results into out[0..rows) (each owned by the caller), or none when one cannot be made.
void deliver(std::vector<dllm::detail::RowResult> rows, dllm_result** out) {
  std::vector<std::unique_ptr<dllm_result>> results;
  for (dllm::detail::RowResult& row : rows) {
    results.push_back(std::make_unique<dllm_result>());
    results.back()->json = row.to_json();
    results.back()->row = std::move(row);
  }
  for (size_t i = 0; i < results.size(); ++i) out[i] = results[i].release();
}

// n prompts decoded as one batch into out[0..n) (all NULL on failure).
dllm_error* generate_with(dllm_runtime* rt, const char* const* prompts, size_t n, const dllm::detail::DecodeOptions& d,
                          dllm_result** out, const dllm::detail::ChunkSink& sink = dllm::detail::ChunkSink()) {
  return guarded([&] {
    if (!out) dllm::detail::user_error("dllm_runtime_generate: out is NULL");
    std::fill(out, out + n, nullptr);
    if (!rt) dllm::detail::user_error("dllm_runtime_generate: runtime is NULL");
    const std::vector<std::string> texts = prompt_texts("dllm_runtime_generate", prompts, n);
    if (rt->uniform) not_for_uniform(*rt);
    deliver(rt->runtime->generate(texts, d, sink), out);
  });
}

dllm_error* generate_with(dllm_runtime* rt, const char* prompt, const dllm::detail::DecodeOptions& d,
                          dllm_result** out, const dllm::detail::ChunkSink& sink = dllm::detail::ChunkSink()) {
  return generate_with(rt, &prompt, 1, d, out, sink);
}

// The options by name as the runtime takes them: gen_length, when not set, is max_tokens.
dllm::detail::DecodeOptions resolved(const dllm_options* opts) {
  if (!opts) return dllm::detail::DecodeOptions();
  dllm::detail::DecodeOptions d = opts->options;
  if (d.max_tokens && !opts->gen_length_set) d.gen_length = *d.max_tokens;
  return d;
}

// A chunk as the C callback sees it; valid during the call only.
dllm_chunk c_chunk(size_t index, const dllm::detail::Chunk& c, const std::string& json) {
  dllm_chunk out;
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  out.index = static_cast<int32_t>(index);
  out.delta = c.delta.c_str();
  out.delta_size = c.delta.size();
  out.token_ids = c.token_ids.data();
  out.token_count = c.token_ids.size();
  out.forwards = c.forwards;
  out.tokens = c.tokens;
  out.finish_reason = c.finish_reason;
  out.json = json.c_str();
  return out;
}

}  // namespace

extern "C" {

dllm_code dllm_error_code(const dllm_error* err) { return err ? err->code : DLLM_OK; }
const char* dllm_error_message(const dllm_error* err) {
  if (!err) return "";
  return err == &g_out_of_memory ? "out of memory" : err->message.c_str();
}
void dllm_error_free(dllm_error* err) {
  if (err != &g_out_of_memory) delete err;
}
const char* dllm_error_key(const dllm_error* err) { return err ? err->key.c_str() : ""; }

const char* dllm_code_name(dllm_code code) {
  switch (code) {
    case DLLM_OK: return "ok";
    case DLLM_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case DLLM_ERROR_ARTIFACT: return "artifact";
    case DLLM_ERROR_UNSUPPORTED: return "unsupported";
    case DLLM_ERROR_ONNXRUNTIME: return "onnxruntime";
    case DLLM_ERROR_INTERNAL: return "internal";
    case DLLM_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    case DLLM_ERROR_UNKNOWN_OPTION: return "unknown_option";
    case DLLM_ERROR_BAD_OPTION: return "bad_option";
  }
  return "unknown";
}

const char* dllm_version(void) { return DLLM_VERSION; }
const char* dllm_onnxruntime_version(void) { return dllm::detail::onnxruntime_version(); }

void dllm_runtime_options_init(dllm_runtime_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->precision = "fp32";
  o->intra_op_threads = 0;
  o->max_beam_width = 0;
  o->verify_hashes = 1;
  o->warnings_to_stderr = 1;
}

dllm_error* dllm_runtime_create(const char* artifact_dir, const dllm_runtime_options* opts, dllm_runtime** out) {
  return guarded([&] {
    if (!out) dllm::detail::user_error("dllm_runtime_create: out is NULL");
    *out = nullptr;
    if (!artifact_dir) dllm::detail::user_error("dllm_runtime_create: artifact_dir is NULL");
    dllm_runtime_options o;
    dllm_runtime_options_init(&o);
    if (opts) {
      if (opts->struct_size < sizeof o)
        dllm::detail::user_error("dllm_runtime_options.struct_size is too small: fill it with dllm_runtime_options_init");
      o = *opts;
    }
    dllm::detail::RuntimeOptions e;
    e.precision = or_default(o.precision, "fp32");
    e.intra_op_threads = o.intra_op_threads;
    e.max_beam_width = o.max_beam_width;
    e.verify_hashes = o.verify_hashes != 0;
    e.warnings_to_stderr = o.warnings_to_stderr != 0;
    if (e.intra_op_threads < 0) dllm::detail::user_error("intra_op_threads must be >= 0");
    if (e.max_beam_width < 0) dllm::detail::user_error("max_beam_width must be >= 0 (0: no user cap)");
    auto rt = std::make_unique<dllm_runtime>();
    if (dllm::detail::is_uniform_artifact(artifact_dir))
      rt->uniform = std::make_unique<dllm::detail::UniformRuntime>(artifact_dir, e.precision, e.intra_op_threads);
    else
      rt->runtime = std::make_unique<dllm::detail::Runtime>(artifact_dir, e);
    *out = rt.release();
  });
}

void dllm_runtime_destroy(dllm_runtime* rt) { delete rt; }

int32_t dllm_runtime_max_seq(const dllm_runtime* rt) {
  return !rt ? 0 : rt->uniform ? rt->uniform->max_seq() : rt->runtime->max_seq();
}
int32_t dllm_runtime_max_beam_width(const dllm_runtime* rt) {
  return !rt ? 0 : rt->uniform ? 1 : rt->runtime->max_beam_width();
}

void dllm_runtime_set_trace(dllm_runtime* rt, dllm_trace_callback on_record, void* user_data) {
  if (!rt || !rt->runtime) return;
  if (!on_record) return rt->runtime->set_trace({});
  rt->runtime->set_trace([on_record, user_data](const std::string& line) { on_record(line.c_str(), line.size(), user_data); });
}

void dllm_decode_config_init(dllm_decode_config* c) {
  if (!c) return;
  const dllm::detail::DecodeOptions d;  // the declared defaults (decode_options.json)
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->strategy = default_text("strategy");
  c->gen_length = d.gen_length;
  c->block_length = d.block_length;
  c->tokens_per_step = d.tokens_per_step;
  c->steps = DLLM_STEPS_UNSET;
  c->threshold = d.threshold;
  c->beam_width = d.beam_width;
  c->tree = default_text("tree");
  c->select = default_text("select");
  c->base = default_text("base");
  c->draft_tau = d.draft_tau.value_or(0.0);
  c->schedule_init = d.schedule.init;
  c->schedule_decay = d.schedule.decay;
  c->schedule_floor = d.schedule.floor;
  c->schedule_end_tokens = d.schedule.end_tokens;
  c->cache = default_text("cache");
}

dllm_error* dllm_runtime_generate(dllm_runtime* rt, const char* prompt, const dllm_decode_config* cfg,
                                  dllm_result** out) {
  if (out) *out = nullptr;
  dllm::detail::DecodeOptions d;
  if (dllm_error* err = guarded([&] {
        dllm_decode_config c;
        dllm_decode_config_init(&c);
        if (cfg) {
          if (cfg->struct_size < sizeof c)
            dllm::detail::user_error("dllm_decode_config.struct_size is too small: fill it with dllm_decode_config_init");
          c = *cfg;
        }
        d.strategy = or_default(c.strategy, default_text("strategy"));
        d.gen_length = c.gen_length;
        d.block_length = c.block_length;
        d.tokens_per_step = c.tokens_per_step;
        if (c.steps != DLLM_STEPS_UNSET) d.steps = c.steps;
        d.threshold = c.threshold;
        d.beam_width = c.beam_width;
        d.tree = or_default(c.tree, default_text("tree"));
        d.select = or_default(c.select, default_text("select"));
        d.base = or_default(c.base, default_text("base"));
        if (c.draft_tau != 0.0) d.draft_tau = c.draft_tau;  // 0: unset (draft at the threshold)
        d.schedule.init = c.schedule_init;
        d.schedule.decay = c.schedule_decay;
        d.schedule.floor = c.schedule_floor;
        d.schedule.end_tokens = c.schedule_end_tokens;
        d.cache = or_default(c.cache, default_text("cache"));
      }))
    return err;
  return generate_with(rt, prompt, d, out);
}

dllm_options* dllm_options_create(void) { return new (std::nothrow) dllm_options(); }
void dllm_options_destroy(dllm_options* opts) { delete opts; }

dllm_error* dllm_options_set(dllm_options* opts, const char* name, const char* value) {
  return guarded([&] {
    if (!opts || !name || !value) dllm::detail::user_error("dllm_options_set: opts, name and value must not be NULL");
    dllm::detail::set_option(opts->options, name, value);
    if (std::strcmp(name, "gen_length") == 0) opts->gen_length_set = true;
  });
}

size_t dllm_option_count(void) { return dllm::detail::option_count(); }

const char* dllm_option_info(size_t index, const char* field) {
  if (index >= dllm::detail::option_count() || !field) return nullptr;
  const dllm::detail::OptionSpec& o = dllm::detail::option_at(index);
  static const char* const kTypes[] = {"int", "float", "str", "bool"};
  const std::string f = field;
  if (f == "name") return o.name;
  if (f == "flag") return o.flag;
  if (f == "type") return kTypes[static_cast<int>(o.type)];
  if (f == "default") return o.default_text;
  if (f == "choices") return o.choices;
  if (f == "help") return o.help;
  return nullptr;
}

dllm_error* dllm_runtime_generate_options(dllm_runtime* rt, const char* prompt, const dllm_options* opts,
                                          dllm_result** out) {
  return generate_with(rt, prompt, resolved(opts), out);
}

dllm_error* dllm_generate_stream(dllm_runtime* rt, const char* prompt, const dllm_options* opts,
                                 dllm_chunk_callback on_chunk, void* user_data, dllm_result** out) {
  return dllm_generate_batch(rt, &prompt, 1, opts, on_chunk, user_data, out);
}

namespace {

// The sink that hands chunks to a C callback (NULL callback: no sink); `json` keeps the chunk's
// JSON line alive during the callback.
dllm::detail::ChunkSink c_sink(dllm_chunk_callback on_chunk, void* user_data, std::string& json) {
  if (!on_chunk) return dllm::detail::ChunkSink();
  return [on_chunk, user_data, &json](size_t index, const dllm::detail::Chunk& c) {
    json = c.to_json(static_cast<int>(index));
    const dllm_chunk chunk = c_chunk(index, c, json);
    return on_chunk(&chunk, user_data) == 0;
  };
}

}  // namespace

dllm_error* dllm_generate_batch(dllm_runtime* rt, const char* const* prompts, size_t n, const dllm_options* opts,
                                dllm_chunk_callback on_chunk, void* user_data, dllm_result** out) {
  std::string json;
  return generate_with(rt, prompts, n, resolved(opts), out, c_sink(on_chunk, user_data, json));
}

void dllm_self_spec_config_init(dllm_self_spec_config* cfg) {
  if (!cfg) return;
  const dllm::detail::SelfSpecOptions d;
  std::memset(cfg, 0, sizeof *cfg);
  cfg->struct_size = sizeof *cfg;
  cfg->strategy = "tree-spec";
  cfg->beam_width = d.beam_width;
  cfg->block_size = d.block_size;
  cfg->max_new_tokens = d.max_new_tokens;
  cfg->temperature = d.temperature;
  cfg->seed = d.seed;
  cfg->threshold = d.threshold;
}

int32_t dllm_runtime_self_speculative(const dllm_runtime* rt) {
  return rt && rt->runtime && rt->runtime->self_speculative() ? 1 : 0;
}

void dllm_uniform_config_init(const dllm_runtime* rt, dllm_uniform_config* cfg) {
  if (!cfg) return;
  const dllm::detail::UniformOptions d = rt && rt->uniform ? rt->uniform->defaults() : dllm::detail::UniformOptions();
  std::memset(cfg, 0, sizeof *cfg);
  cfg->struct_size = sizeof *cfg;
  cfg->max_new_tokens = d.max_new_tokens;
  cfg->max_denoising_steps = d.max_denoising_steps;
  cfg->entropy_bound = d.entropy_bound;
  cfg->t_min = d.t_min, cfg->t_max = d.t_max;
  cfg->stability_threshold = d.stability_threshold;
  cfg->confidence_threshold = d.confidence_threshold;
  cfg->seed = d.seed;
}

int32_t dllm_runtime_uniform_diffusion(const dllm_runtime* rt) { return rt && rt->uniform ? 1 : 0; }

dllm_error* dllm_uniform_generate(dllm_runtime* rt, const char* const* prompts, size_t n, const dllm_uniform_config* cfg,
                                  dllm_chunk_callback on_chunk, void* user_data, dllm_result** out) {
  return guarded([&] {
    if (!out) dllm::detail::user_error("dllm_uniform_generate: out is NULL");
    std::fill(out, out + n, nullptr);
    if (!rt) dllm::detail::user_error("dllm_uniform_generate: runtime is NULL");
    if (cfg && cfg->struct_size < sizeof(dllm_uniform_config))
      dllm::detail::user_error("dllm_uniform_generate: cfg->struct_size is not set (dllm_uniform_config_init)");
    const std::vector<std::string> texts = prompt_texts("dllm_uniform_generate", prompts, n);
    if (!rt->uniform)
      dllm::detail::user_error("dllm_uniform_generate: this model does not decode by uniform-noise diffusion "
                               "(dllm_generate_batch, or dllm_self_spec_generate for a self-speculative one)");
    dllm::detail::UniformOptions o = rt->uniform->defaults();
    if (cfg) {
      o.max_new_tokens = cfg->max_new_tokens, o.max_denoising_steps = cfg->max_denoising_steps;
      o.entropy_bound = cfg->entropy_bound, o.t_min = cfg->t_min, o.t_max = cfg->t_max;
      o.stability_threshold = cfg->stability_threshold, o.confidence_threshold = cfg->confidence_threshold;
      o.seed = cfg->seed;
      if (cfg->stop_count && !cfg->stop) dllm::detail::user_error("dllm_uniform_generate: stop is NULL but stop_count is not 0");
      for (size_t i = 0; i < cfg->stop_count; ++i) {
        if (!cfg->stop[i] || !*cfg->stop[i]) dllm::detail::user_error("dllm_uniform_generate: stop string " + std::to_string(i) + " is empty");
        o.stop.emplace_back(cfg->stop[i]);
      }
    }
    std::string json;
    deliver(rt->uniform->generate(texts, o, c_sink(on_chunk, user_data, json)), out);
  });
}

dllm_error* dllm_self_spec_generate(dllm_runtime* rt, const char* const* prompts, size_t n,
                                    const dllm_self_spec_config* cfg, dllm_result** out) {
  return dllm_self_spec_generate_stream(rt, prompts, n, cfg, nullptr, nullptr, out);
}

dllm_error* dllm_self_spec_generate_stream(dllm_runtime* rt, const char* const* prompts, size_t n,
                                           const dllm_self_spec_config* cfg, dllm_chunk_callback on_chunk,
                                           void* user_data, dllm_result** out) {
  return guarded([&] {
    if (!out) dllm::detail::user_error("dllm_self_spec_generate: out is NULL");
    std::fill(out, out + n, nullptr);
    if (!rt) dllm::detail::user_error("dllm_self_spec_generate: runtime is NULL");
    // a caller built against the header before stop / stop_count passes the shorter struct
    if (cfg && cfg->struct_size < offsetof(dllm_self_spec_config, stop))
      dllm::detail::user_error("dllm_self_spec_generate: cfg->struct_size is not set (dllm_self_spec_config_init)");
    dllm::detail::SelfSpecOptions o;
    if (cfg) {
      o.strategy = or_default(cfg->strategy, "tree-spec");
      o.beam_width = cfg->beam_width, o.block_size = cfg->block_size, o.max_new_tokens = cfg->max_new_tokens;
      o.temperature = cfg->temperature, o.seed = cfg->seed, o.threshold = cfg->threshold;
      if (cfg->struct_size >= sizeof(dllm_self_spec_config) && cfg->stop_count) {
        if (!cfg->stop) dllm::detail::user_error("dllm_self_spec_generate: stop is NULL but stop_count is not 0");
        for (size_t i = 0; i < cfg->stop_count; ++i) {
          if (!cfg->stop[i] || !*cfg->stop[i]) dllm::detail::user_error("dllm_self_spec_generate: stop string " + std::to_string(i) + " is empty");
          o.stop.emplace_back(cfg->stop[i]);
        }
      }
    }
    const std::vector<std::string> texts = prompt_texts("dllm_self_spec_generate", prompts, n);
    if (rt->uniform) not_for_uniform(*rt);
    std::string json;
    deliver(rt->runtime->self_spec(texts, o, c_sink(on_chunk, user_data, json)), out);
  });
}

void dllm_result_destroy(dllm_result* res) { delete res; }

const char* dllm_result_text(const dllm_result* res) { return res ? res->row.text.c_str() : ""; }

const int64_t* dllm_result_token_ids(const dllm_result* res, size_t* count) {
  if (count) *count = res ? res->row.token_ids.size() : 0;
  return res ? res->row.token_ids.data() : nullptr;
}

void dllm_result_stats(const dllm_result* res, dllm_stats* s) {
  if (!s) return;
  std::memset(s, 0, sizeof *s);
  if (!res) return;
  const auto& r = res->row;
  s->forwards = r.forwards;
  s->tokens = r.tokens;
  s->tpf = r.tpf;
  s->wall_s = r.wall_s;
  s->tokens_per_s = r.tokens_per_s;
  s->backend_s = r.backend_s;
  s->beam_width_used = r.beam_width_used;
  s->beam_width_requested = r.beam_width_requested;
  s->finished = r.finished ? 1 : 0;
}

const int64_t* dllm_result_accepted_hist(const dllm_result* res, size_t* count) {
  if (count) *count = res ? res->row.accepted_hist.size() : 0;
  return res ? res->row.accepted_hist.data() : nullptr;
}

const char* dllm_result_warnings(const dllm_result* res) { return res ? res->row.warnings.c_str() : ""; }
const char* dllm_result_finish_reason(const dllm_result* res) { return res ? res->row.finish_reason.c_str() : ""; }
double dllm_result_time_to_first_token_s(const dllm_result* res) { return res ? res->row.time_to_first_token_s : -1.0; }
const char* dllm_result_json(const dllm_result* res) { return res ? res->json.c_str() : "{}"; }

}  // extern "C"
