/* dllm_deploy C ABI: load an exported artifact (manifest.json + prefill.onnx + verify.onnx) and
 * decode prompts with the same loop as the Python runtime (vanilla, threshold, spd), over
 * ONNX Runtime's CPU execution provider.
 *
 * Conventions
 *   - Opaque handles with create/destroy pairs: dllm_runtime, dllm_result.
 *   - Every fallible call returns a dllm_error*: NULL on success, otherwise an error object the
 *     caller reads (dllm_error_code, dllm_error_message) and frees (dllm_error_free).
 *     No C++ exception ever crosses this boundary.
 *   - Strings are UTF-8 and NUL-terminated. Strings and arrays returned by a getter live as long
 *     as the handle they came from.
 *   - Option structs are plain data: fill them with their *_init function (the Python defaults),
 *     then change fields. struct_size (set by *_init) lets later versions add fields at the end.
 *   - A dllm_runtime is not thread-safe: use one per thread (they may share nothing but the
 *     process-wide ONNX Runtime environment).
 */
#ifndef DLLM_DEPLOY_DLLM_H
#define DLLM_DEPLOY_DLLM_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define DLLM_API __declspec(dllexport)
#else
#define DLLM_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* 2: dllm_decode_config.steps takes DLLM_STEPS_UNSET for "unset" (0 is now refused, as in Python);
 *    DLLM_ERROR_OUT_OF_MEMORY.
 * 3: decode options by name (dllm_options_*, dllm_option_*, dllm_runtime_generate_options); option
 *    errors carry DLLM_ERROR_UNKNOWN_OPTION / DLLM_ERROR_BAD_OPTION / DLLM_ERROR_UNSUPPORTED and the
 *    option's name (dllm_error_key), so a bad option in dllm_decode_config no longer reports
 *    DLLM_ERROR_INVALID_ARGUMENT.
 * 4: sampling (temperature, top_k, top_p, seed: implemented; schema-3 artifacts), stop conditions
 *    (max_tokens, stop: each dllm_options_set(opts, "stop", s) appends, "" clears),
 *    dllm_result_finish_reason, dllm_result_time_to_first_token_s, streaming (dllm_generate_stream,
 *    dllm_chunk); the result's JSON gains finish_reason and time_to_first_token_s.
 * 5: batches (dllm_generate_batch): several prompts decoded together, one result each; a chunk's
 *    index is its prompt's position in the call.
 * 6: uniform-noise diffusion models (DiffusionGemma: dllm_uniform_generate); dllm_runtime_create
 *    loads their artifacts.
 * 7: decision traces (dllm_runtime_set_trace). */
#define DLLM_ABI_VERSION 7

/* dllm_decode_config.steps when no LLaDA step count is given (vanilla commits tokens_per_step per
 * step). Any other value below 1 is refused with an error that names `steps`. */
#define DLLM_STEPS_UNSET INT32_MIN

typedef enum dllm_code {
  DLLM_OK = 0,
  DLLM_ERROR_INVALID_ARGUMENT = 1, /* a bad option, prompt or flag (Python: UserError) */
  DLLM_ERROR_ARTIFACT = 2,         /* missing folder/file, corrupt manifest, sha256 mismatch */
  DLLM_ERROR_UNSUPPORTED = 3,      /* valid, but not in the C++ runtime yet (hf tokenizer, ...) */
  DLLM_ERROR_ONNXRUNTIME = 4,      /* ONNX Runtime refused: API version, graph load, run */
  DLLM_ERROR_INTERNAL = 5,         /* a bug */
  DLLM_ERROR_OUT_OF_MEMORY = 6,    /* the decode did not fit in memory: lower max_beam_width or gen_length */
  DLLM_ERROR_UNKNOWN_OPTION = 7,   /* a decode option name that is not declared */
  DLLM_ERROR_BAD_OPTION = 8        /* a decode option value of the wrong type, out of range, not a choice */
} dllm_code;

typedef struct dllm_error dllm_error;
typedef struct dllm_runtime dllm_runtime;
typedef struct dllm_result dllm_result;

DLLM_API dllm_code dllm_error_code(const dllm_error* err);       /* DLLM_OK for NULL */
DLLM_API const char* dllm_error_message(const dllm_error* err);     /* "" for NULL */
DLLM_API void dllm_error_free(dllm_error* err);                    /* NULL is a no-op */
/* The decode option an error is about ("steps"), for DLLM_ERROR_UNKNOWN_OPTION, DLLM_ERROR_BAD_OPTION
 * and DLLM_ERROR_UNSUPPORTED on an option (declared, not implemented yet); "" otherwise. */
DLLM_API const char* dllm_error_key(const dllm_error* err);
/* The code's name, shared with Python's OptionError.code: "unknown_option", "bad_option",
 * "unsupported", "invalid_argument", "artifact", "onnxruntime", "internal", "out_of_memory", "ok". */
DLLM_API const char* dllm_code_name(dllm_code code);

/* The library's version ("0.1.0") and the ONNX Runtime it runs on ("1.32.0"). */
DLLM_API const char* dllm_version(void);
DLLM_API const char* dllm_onnxruntime_version(void);

/* ---- runtime ------------------------------------------------------------------------------ */

typedef struct dllm_runtime_options {
  uint32_t struct_size;      /* sizeof(dllm_runtime_options), set by dllm_runtime_options_init */
  const char* precision;     /* artifact precision variant: "fp32" (NULL = "fp32"), "int8" */
  int32_t intra_op_threads;  /* ONNX Runtime intra-op threads; 0 = ONNX Runtime's default */
  int32_t max_beam_width;    /* user cap on W (0 = none); the manifest's max_beam_width and the
                                free-memory estimate (docs/cpp.md) apply too */
  int32_t verify_hashes;     /* 1 (default): check the sha256 of every file the precision needs */
  int32_t warnings_to_stderr;/* 1 (default): also print warnings (W lowered, ...) on stderr */
} dllm_runtime_options;

DLLM_API void dllm_runtime_options_init(dllm_runtime_options* opts);

/* Reads and checks manifest.json (schema_version, hashes), the tokenizer, and opens the two
 * ONNX Runtime sessions. opts may be NULL (defaults). On success *out owns a new runtime. */
DLLM_API dllm_error* dllm_runtime_create(const char* artifact_dir, const dllm_runtime_options* opts,
                                         dllm_runtime** out);
DLLM_API void dllm_runtime_destroy(dllm_runtime* rt); /* NULL is a no-op */

/* Facts from the manifest: the model's longest prompt + generation, and the W cap in force
 * (the manifest's, the user's and the free-memory estimate's, whichever is lowest). */
DLLM_API int32_t dllm_runtime_max_seq(const dllm_runtime* rt);
DLLM_API int32_t dllm_runtime_max_beam_width(const dllm_runtime* rt);

/* ---- decoding ----------------------------------------------------------------------------- */

typedef struct dllm_decode_config {
  uint32_t struct_size;    /* sizeof(dllm_decode_config), set by dllm_decode_config_init */
  const char* strategy;    /* "vanilla" | "threshold" | "spd" */
  int32_t gen_length;      /* token budget per prompt, rounded up to whole blocks (256) */
  int32_t block_length;    /* L: positions denoised together (32) */
  int32_t tokens_per_step; /* vanilla: k tokens committed per step (1) */
  int32_t steps;           /* vanilla: LLaDA steps over gen_length, >= 1; DLLM_STEPS_UNSET (the
                              default) = unset: tokens_per_step per step */
  double threshold;        /* threshold rule tau, and the spd threshold base (0.9) */
  int32_t beam_width;      /* spd: W drafted block states verified per forward (4) */
  const char* tree;        /* spd tree preset: "fork" (default) | "chain" | "binary" | "wide" */
  const char* select;      /* spd: "lossless" | "threshold" (lossy, dynamic tau) */
  const char* base;        /* spd lossless: the rule it reproduces, "vanilla" | "threshold" */
  double draft_tau;        /* spd: threshold that chain drafts use (0: the threshold, default) */
  double schedule_init;    /* lossy mode tau: starts at init (0.93), */
  double schedule_decay;   /*   multiplied by decay per step (0.97), */
  double schedule_floor;   /*   never below floor (0.85), */
  int32_t schedule_end_tokens; /* and init again with <= end_tokens masked positions left (2) */
  const char* cache;       /* "auto" | "none" | "exact" | "prefix" | "dual" (auto: exact for a
                              block-causal model, prefix for a bidirectional one) */
} dllm_decode_config;

/* The options of ABI 2 as a struct. Options declared since (temperature, top_k, top_p, seed,
 * max_tokens, stop) are set by name only (dllm_options_set, below); both paths check values the
 * same way. */
DLLM_API void dllm_decode_config_init(dllm_decode_config* cfg);

/* Decodes one prompt (batch 1): NUL-terminated UTF-8; invalid UTF-8 bytes are read as U+FFFD (one
 * per maximal invalid subsequence, as Python's errors="replace"). On success *out owns a new result. */
DLLM_API dllm_error* dllm_runtime_generate(dllm_runtime* rt, const char* prompt, const dllm_decode_config* cfg,
                                           dllm_result** out);

/* ---- decode options by name ---------------------------------------------------------------
 * Every decode option is declared once (dllm_deploy/decode_options.json; the build generates the
 * C++ table from it), so a new option needs no ABI change: set it by name, as text.
 *   dllm_options* o = dllm_options_create();             every option at its default
 *   err = dllm_options_set(o, "beam_width", "8");          NULL, or an option error naming the key
 *   err = dllm_runtime_generate_options(rt, prompt, o, &res);
 * A value is parsed by the option's type (int, float, str, bool: true/false) and checked against
 * its range or choices; "null" unsets a nullable option (steps, draft_tau, threshold_far, max_tokens). An option
 * declared but not implemented yet accepts its default only.
 *   Sampling: temperature (0: greedy, the default), top_k (0: off; at most the artifact's sampling
 *   pool), top_p (1: off), seed (0 .. 2**64-1). The same seed gives the same tokens as Python's
 *   runtime; temperature > 0 needs an artifact exported with sampling (manifest schema 3).
 *   Stopping (docs/streaming.md): max_tokens (the row's first N tokens; gen_length, when not set,
 *   defaults to it; max_tokens > gen_length is DLLM_ERROR_BAD_OPTION at generate), stop (each
 *   dllm_options_set(opts, "stop", s) appends one stop string, an empty s clears them: the text
 *   ends before the earliest occurrence of any). */

typedef struct dllm_options dllm_options;

DLLM_API dllm_options* dllm_options_create(void);          /* NULL when out of memory */
DLLM_API void dllm_options_destroy(dllm_options* opts);    /* NULL is a no-op */
DLLM_API dllm_error* dllm_options_set(dllm_options* opts, const char* name, const char* value);

/* The declared options, for building flags and help: index < dllm_option_count(); field is one of
 * "name", "flag" (the CLI flag, "" if none), "type", "default", "choices" ("a|b|c", "" if any),
 * "help". NULL for an index or field out of range. */
DLLM_API size_t dllm_option_count(void);
DLLM_API const char* dllm_option_info(size_t index, const char* field);

/* dllm_runtime_generate with options set by name; opts may be NULL (the defaults). */
DLLM_API dllm_error* dllm_runtime_generate_options(dllm_runtime* rt, const char* prompt, const dllm_options* opts,
                                                   dllm_result** out);

/* ---- streaming ----------------------------------------------------------------------------
 * dllm_generate_stream decodes like dllm_runtime_generate_options and calls on_chunk on the calling
 * thread, inside the call, each time text becomes final (docs/streaming.md: after every forward,
 * the tokens committed left to right; an incomplete UTF-8 character and a possible start of a stop
 * string are held back). The deltas joined are the result's text, the chunks' token ids its
 * token_ids. A non-zero return from on_chunk cancels: the call returns DLLM_OK and a result with
 * what was delivered so far, finish_reason "cancelled"; the runtime stays usable. on_chunk may be
 * NULL (= dllm_runtime_generate_options). The chunk and its pointers live during the callback only;
 * on_chunk must not call into the same runtime. */

typedef struct dllm_chunk {
  uint32_t struct_size;         /* sizeof(dllm_chunk): later versions add fields at the end */
  int32_t index;                /* the prompt's position in the call (0 for one prompt) */
  const char* delta;            /* new text, UTF-8, NUL-terminated (delta_size bytes before the NUL) */
  size_t delta_size;
  const int64_t* token_ids;     /* new final token ids (token_count; the last chunk may have none) */
  size_t token_count;
  int64_t forwards;             /* the row's model calls so far */
  int64_t tokens;               /* its token ids delivered so far (the chunks' token_ids joined) */
  const char* finish_reason;    /* NULL, except on the row's last chunk: "eos" | "stop" | "length" */
  const char* json;             /* the chunk as one JSON object: a line of dllm-generate --stream --json */
} dllm_chunk;

typedef int (*dllm_chunk_callback)(const dllm_chunk* chunk, void* user_data);

DLLM_API dllm_error* dllm_generate_stream(dllm_runtime* rt, const char* prompt, const dllm_options* opts,
                                          dllm_chunk_callback on_chunk, void* user_data, dllm_result** out);

/* ---- batches ------------------------------------------------------------------------------
 * dllm_generate_batch decodes n prompts together, as Python's Runtime.generate(prompts, ...) does:
 * one batch of n rows (prompts left-padded to the longest) moving block by block in lockstep, every
 * row under opts; a row that finishes (EOS, a stop string, its budget) leaves the batch at the end
 * of its block. Each row's tokens and counters are those of Python's batch. On success out[i]
 * (the caller's array of n) owns prompt i's result; on failure every out[i] is NULL. on_chunk may
 * be NULL; otherwise it is called as in dllm_generate_stream, dllm_chunk.index naming the prompt,
 * and a non-zero return cancels every row that has not finished ("cancelled"). wall_s and
 * backend_s of each result are the whole call's. dllm_generate_stream(rt, p, ...) is
 * dllm_generate_batch(rt, &p, 1, ...). */

DLLM_API dllm_error* dllm_generate_batch(dllm_runtime* rt, const char* const* prompts, size_t n,
                                         const dllm_options* opts, dllm_chunk_callback on_chunk, void* user_data,
                                         dllm_result** out);

/* ---- decision traces ----------------------------------------------------------------------
 * With a trace callback set, every masked-diffusion decode on rt (dllm_runtime_generate*,
 * dllm_generate_stream, dllm_generate_batch) calls on_record once per row and iteration of the decode
 * loop, on the calling thread, with one JSON object (json_size bytes, NUL-terminated; valid during
 * the call): the row's step, node 0's commit and the margin of each decision (how far its
 * probabilities were from deciding otherwise), as Python's generate --trace writes them
 * (dllm_deploy/runtime/trace.py; docs/cpp.md "What 'the same model' means"). NULL turns it off.
 * Self-speculative and uniform-diffusion decodes do not trace. */
typedef void (*dllm_trace_callback)(const char* json, size_t json_size, void* user_data);
DLLM_API void dllm_runtime_set_trace(dllm_runtime* rt, dllm_trace_callback on_record, void* user_data);

/* ---- self-speculative models --------------------------------------------------------------
 * A model whose artifact records attention "causal" (Nemotron-Labs-Diffusion) drafts a block by
 * diffusion and verifies it causally; its output is its own autoregressive output
 * (docs/self_speculation.md). The generate functions above refuse it; this one decodes it. */

typedef struct dllm_self_spec_config {
  uint32_t struct_size;    /* sizeof(dllm_self_spec_config), set by dllm_self_spec_config_init */
  const char* strategy;    /* "ar" | "linear-spec" | "tree-spec" (default) | "fastdiffuser" (lossy) */
  int32_t beam_width;      /* tree-spec: W draft sequences verified per round (4) */
  int32_t block_size;      /* L: the draft block; 0 (default): the model's */
  int32_t max_new_tokens;  /* tokens per prompt (64) */
  float temperature;       /* 0 (default): greedy; else sampled with the seed's counter-based noise */
  uint64_t seed;           /* the sampler's key (0) */
  double threshold;        /* fastdiffuser: the confidence a masked position commits at (0.9) */
  const char* const* stop; /* stop_count stop strings (UTF-8, non-empty): a row's text ends before
                              the first one found, finish reason "stop" (NULL / 0: none) */
  size_t stop_count;
} dllm_self_spec_config;

DLLM_API void dllm_self_spec_config_init(dllm_self_spec_config* cfg);
/* 1 when the runtime's artifact decodes self-speculatively, else 0 (NULL: 0). */
DLLM_API int32_t dllm_runtime_self_speculative(const dllm_runtime* rt);
/* The n prompts decoded together; on success out[i] owns prompt i's result (token ids up to and
 * including an EOS, text, stats: forwards are the row's own, accepted_hist[k] = rounds that
 * emitted k tokens; finish reason "eos", "stop" or "length"); on failure every out[i] is NULL.
 * cfg NULL: the defaults. */
DLLM_API dllm_error* dllm_self_spec_generate(dllm_runtime* rt, const char* const* prompts, size_t n,
                                             const dllm_self_spec_config* cfg, dllm_result** out);
/* dllm_self_spec_generate with on_chunk called on the calling thread after every forward that
 * made text final (a round's tokens are final), as in dllm_generate_batch (dllm_chunk.index names
 * the prompt; a non-zero return cancels every unfinished row: finish reason "cancelled"). */
DLLM_API dllm_error* dllm_self_spec_generate_stream(dllm_runtime* rt, const char* const* prompts, size_t n,
                                                    const dllm_self_spec_config* cfg, dllm_chunk_callback on_chunk,
                                                    void* user_data, dllm_result** out);

/* ---- uniform-noise diffusion models --------------------------------------------------------
 * A DiffusionGemma artifact (manifest format "diffusion_gemma/1", docs/diffusion_gemma.md) decodes
 * canvases of random ids denoised step by step; its tokens are those of Python's Runtime.generate
 * for the same prompts and options. The generate functions above refuse it; this one decodes it.
 * dllm_runtime_create loads it (precision "fp32"; max_beam_width and verify_hashes do not apply). */

typedef struct dllm_uniform_config {
  uint32_t struct_size;        /* sizeof(dllm_uniform_config), set by dllm_uniform_config_init */
  int32_t max_new_tokens;      /* tokens per prompt, decoded in whole canvases (256) */
  int32_t max_denoising_steps; /* decoder steps per canvas at most (48) */
  double entropy_bound;        /* a step keeps its lowest-entropy positions within this summed entropy (0.1) */
  double t_min, t_max;         /* the sampling temperature, t_max at the first step to t_min at the last (0.4, 0.8) */
  int32_t stability_threshold; /* a row stops once its argmax held this many steps (1) ... */
  double confidence_threshold; /* ... and its mean entropy is below this (0.005) */
  uint64_t seed;               /* the noise's key (0): the same seed, the same tokens */
  const char* const* stop;     /* stop_count stop strings (UTF-8, non-empty): a row's text ends
                                  before the first one found, finish reason "stop" (NULL / 0: none) */
  size_t stop_count;
} dllm_uniform_config;

/* The defaults: transformers' DiffusionGemma generation defaults, overridden by the artifact's
 * own (its generation_config.json) when rt is a uniform-diffusion runtime (rt may be NULL). */
DLLM_API void dllm_uniform_config_init(const dllm_runtime* rt, dllm_uniform_config* cfg);
/* 1 when the runtime's artifact decodes by uniform-noise diffusion, else 0 (NULL: 0). */
DLLM_API int32_t dllm_runtime_uniform_diffusion(const dllm_runtime* rt);
/* The n prompts decoded together (each row's positions its own); on success out[i] owns prompt i's
 * result (token ids up to and including an EOS, pad ids left out; forwards: the row's decoder steps
 * and encoder forwards; finish reason "eos", "stop" or "length"); on failure every out[i] is NULL.
 * on_chunk (may be NULL) is called on the calling thread once per row and canvas (a canvas's tokens
 * are final when its steps end), as in dllm_generate_batch: a non-zero return cancels every
 * unfinished row ("cancelled"). cfg NULL: dllm_uniform_config_init(rt, ...). */
DLLM_API dllm_error* dllm_uniform_generate(dllm_runtime* rt, const char* const* prompts, size_t n,
                                           const dllm_uniform_config* cfg, dllm_chunk_callback on_chunk,
                                           void* user_data, dllm_result** out);

/* ---- results ------------------------------------------------------------------------------ */

typedef struct dllm_stats {
  int64_t forwards;             /* model calls, prefill and commits included */
  int64_t tokens;               /* tokens returned (up to and including the first EOS; stop
                                   conditions cut them) */
  double tpf;                   /* tokens / forwards */
  double wall_s;                /* seconds in the decode loop (tokenization excluded) */
  double tokens_per_s;          /* tokens / wall_s */
  double backend_s;             /* seconds inside ONNX Runtime's Run calls */
  int32_t beam_width_used;      /* W after the caps */
  int32_t beam_width_requested; /* W asked for (1 unless spd) */
  int32_t finished;             /* 1: stopped at EOS or a stop string; 0: the token budget ran out
                                   (or cancelled): dllm_result_finish_reason says which */
} dllm_stats;

DLLM_API void dllm_result_destroy(dllm_result* res); /* NULL is a no-op */
DLLM_API const char* dllm_result_text(const dllm_result* res);
DLLM_API const int64_t* dllm_result_token_ids(const dllm_result* res, size_t* count);
DLLM_API void dllm_result_stats(const dllm_result* res, dllm_stats* out);
/* counts[s] = verification forwards that accepted s rule steps (counts[0] is always 0). */
DLLM_API const int64_t* dllm_result_accepted_hist(const dllm_result* res, size_t* count);
/* Warnings raised by this call ("beam width 8 lowered to 4 ..."), "\n"-separated; "" if none. */
DLLM_API const char* dllm_result_warnings(const dllm_result* res);
/* Why the row stopped: "eos" (EOS, every position before it committed), "stop" (a stop string),
 * "length" (max_tokens or the canvas spent), "cancelled" (a stream callback returned non-zero). */
DLLM_API const char* dllm_result_finish_reason(const dllm_result* res);
/* Seconds from the decode's start to the first chunk with token ids; -1 if there was none. */
DLLM_API double dllm_result_time_to_first_token_s(const dllm_result* res);
/* The result as one JSON object, the keys of `dllm-deploy generate --json` plus backend_s. */
DLLM_API const char* dllm_result_json(const dllm_result* res);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DLLM_DEPLOY_DLLM_H */
