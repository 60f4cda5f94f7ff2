// The C ABI (dllm.h) over the engine: argument checks, and every exception turned into a
// dllm_error object. Nothing throws across this file's functions.
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "decoder.hpp"
#include "dllm_deploy/dllm.h"
#include "error.hpp"
#include "ort_backend.hpp"
#include "tokenizer.hpp"

#ifndef DLLM_VERSION
#define DLLM_VERSION "0.0.0"
#endif

struct dllm_error {
  dllm_code code;
  std::string message;
};

struct dllm_runtime {
  std::unique_ptr<dllm::detail::Engine> engine;
};

struct dllm_result {
  dllm::detail::RowResult row;
  std::string json;
};

namespace {

using dllm::detail::Failure;

// Returned when even the error object cannot be allocated; dllm_error_free ignores it.
dllm_error g_out_of_memory{DLLM_ERROR_OUT_OF_MEMORY, std::string()};

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

dllm_error* make_error(dllm_code code, const char* message) noexcept {
  try {
    return new dllm_error{code, one_line(message)};
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
    return make_error(e.code, e.what());
  } catch (const std::bad_alloc&) {
    return make_error(DLLM_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_error(DLLM_ERROR_INTERNAL, e.what());
  } catch (...) {
    return make_error(DLLM_ERROR_INTERNAL, "unknown internal error");
  }
}

std::string or_default(const char* s, const char* fallback) { return s ? std::string(s) : std::string(fallback); }

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
    dllm::detail::EngineOptions e;
    e.precision = or_default(o.precision, "fp32");
    e.intra_op_threads = o.intra_op_threads;
    e.max_beam_width = o.max_beam_width;
    e.verify_hashes = o.verify_hashes != 0;
    e.warnings_to_stderr = o.warnings_to_stderr != 0;
    if (e.intra_op_threads < 0) dllm::detail::user_error("intra_op_threads must be >= 0");
    if (e.max_beam_width < 0) dllm::detail::user_error("max_beam_width must be >= 0 (0: no user cap)");
    auto rt = std::make_unique<dllm_runtime>();
    rt->engine = std::make_unique<dllm::detail::Engine>(artifact_dir, e);
    *out = rt.release();
  });
}

void dllm_runtime_destroy(dllm_runtime* rt) { delete rt; }

int32_t dllm_runtime_max_seq(const dllm_runtime* rt) { return rt ? rt->engine->max_seq() : 0; }
int32_t dllm_runtime_max_beam_width(const dllm_runtime* rt) { return rt ? rt->engine->max_beam_width() : 0; }

void dllm_decode_config_init(dllm_decode_config* c) {
  if (!c) return;
  const dllm::detail::DecodeOptions d;  // the Python DecodeConfig defaults live there
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->strategy = "vanilla";
  c->gen_length = d.gen_length;
  c->block_length = d.block_length;
  c->tokens_per_step = d.tokens_per_step;
  c->steps = DLLM_STEPS_UNSET;
  c->threshold = d.threshold;
  c->beam_width = d.beam_width;
  c->tree = "fork";
  c->select = "lossless";
  c->base = "vanilla";
  c->draft_tau = d.draft_tau;
  c->schedule_init = d.schedule.init;
  c->schedule_decay = d.schedule.decay;
  c->schedule_floor = d.schedule.floor;
  c->schedule_end_tokens = d.schedule.end_tokens;
  c->cache = "auto";
}

dllm_error* dllm_runtime_generate(dllm_runtime* rt, const char* prompt, const dllm_decode_config* cfg,
                                  dllm_result** out) {
  return guarded([&] {
    if (!out) dllm::detail::user_error("dllm_runtime_generate: out is NULL");
    *out = nullptr;
    if (!rt) dllm::detail::user_error("dllm_runtime_generate: runtime is NULL");
    if (!prompt) dllm::detail::user_error("dllm_runtime_generate: prompt is NULL");
    dllm_decode_config c;
    dllm_decode_config_init(&c);
    if (cfg) {
      if (cfg->struct_size < sizeof c)
        dllm::detail::user_error("dllm_decode_config.struct_size is too small: fill it with dllm_decode_config_init");
      c = *cfg;
    }
    dllm::detail::DecodeOptions d;
    d.strategy = or_default(c.strategy, "vanilla");
    d.gen_length = c.gen_length;
    d.block_length = c.block_length;
    d.tokens_per_step = c.tokens_per_step;
    if (c.steps != DLLM_STEPS_UNSET) d.steps = c.steps;
    d.threshold = c.threshold;
    d.beam_width = c.beam_width;
    d.tree = or_default(c.tree, "fork");
    d.select = or_default(c.select, "lossless");
    d.base = or_default(c.base, "vanilla");
    d.draft_tau = c.draft_tau;
    d.schedule.init = c.schedule_init;
    d.schedule.decay = c.schedule_decay;
    d.schedule.floor = c.schedule_floor;
    d.schedule.end_tokens = c.schedule_end_tokens;
    d.cache = or_default(c.cache, "auto");
    auto res = std::make_unique<dllm_result>();
    res->row = rt->engine->generate(prompt, d);
    res->json = res->row.to_json();
    *out = res.release();
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
const char* dllm_result_json(const dllm_result* res) { return res ? res->json.c_str() : "{}"; }

}  // extern "C"
