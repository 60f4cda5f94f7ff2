#include "decoder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>

#include "error.hpp"
#include "json.hpp"
#include "memory.hpp"
#include "noise.hpp"

namespace dllm::detail {

namespace {

// (done, stop) of a block state (L,) (loop.py::block_status): stop is the index just past the
// first EOS when every position before it is committed (the row ends), else -1; done when it
// ends or is full.
struct BlockStatus {
  bool done;
  int64_t stop;
};

BlockStatus block_status(const std::vector<int64_t>& tokens, int64_t mask_id, int64_t eos_id) {
  const auto eos = std::find(tokens.begin(), tokens.end(), eos_id);
  if (std::find(tokens.begin(), eos, mask_id) == eos && eos != tokens.end())
    return {true, eos - tokens.begin() + 1};
  return {std::find(tokens.begin(), tokens.end(), mask_id) == tokens.end(), -1};
}

}  // namespace

CacheMode resolve_cache(const std::string& mode, const std::string& attention, int width) {
  if (mode != "none" && mode != "prefix" && mode != "dual" && mode != "exact" && mode != "auto")
    user_error("unknown cache mode " + quoted(mode) + " (expected one of none, prefix, dual, exact, auto)");
  const bool block_causal = attention == "block_causal";
  if (mode == "auto") return block_causal ? CacheMode::kExact : CacheMode::kPrefix;
  if (mode == "exact" && !block_causal)
    user_error("cache mode 'exact' needs a block-causal model; use 'prefix' or 'none' for a bidirectional one");
  if (mode == "none" && !block_causal && width > 1)
    user_error("cache mode 'none' on a bidirectional model verifies one branch per forward: use beam width 1, "
               "'prefix' or 'dual'");
  // for a block-causal model the prefix cache is exact and there is no suffix to cache
  if ((mode == "prefix" || mode == "dual") && block_causal) return CacheMode::kExact;
  if (mode == "none") return CacheMode::kNone;
  if (mode == "exact") return CacheMode::kExact;
  return mode == "prefix" ? CacheMode::kPrefix : CacheMode::kDual;
}

std::string RowResult::to_json() const {
  std::string o = "{\"text\": ";
  append_json_string(o, text);
  o += ", \"token_ids\": [";
  for (size_t i = 0; i < token_ids.size(); ++i) o += (i ? ", " : "") + std::to_string(token_ids[i]);
  o += "], \"forwards\": " + std::to_string(forwards);
  o += ", \"tokens\": " + std::to_string(tokens);
  o += ", \"tpf\": " + format_double(tpf);
  o += ", \"wall_s\": " + format_double(wall_s);
  o += ", \"tokens_per_s\": " + format_double(tokens_per_s);
  o += ", \"beam_width_used\": " + std::to_string(beam_width_used);
  o += ", \"accepted_hist\": {";
  bool first = true;
  for (size_t s = 0; s < accepted_hist.size(); ++s) {
    if (!accepted_hist[s]) continue;
    o += (first ? "\"" : ", \"") + std::to_string(s) + "\": " + std::to_string(accepted_hist[s]);
    first = false;
  }
  o += "}, \"finished\": ";
  o += finished ? "true" : "false";
  o += ", \"finish_reason\": ";
  append_json_string(o, finish_reason);
  o += ", \"time_to_first_token_s\": " + (time_to_first_token_s < 0 ? "null" : format_double(time_to_first_token_s));
  o += ", \"beam_width_requested\": " + std::to_string(beam_width_requested);
  o += ", \"backend_s\": " + format_double(backend_s);
  o += "}";
  return o;
}

Engine::Engine(const std::string& artifact_dir, const EngineOptions& options)
    : manifest_(read_manifest(artifact_dir, options.precision, options.verify_hashes)), options_(options) {
  if (manifest_.tokenizer_kind == "hf")
    fail(DLLM_ERROR_UNSUPPORTED, manifest_.folder + ": tokenizer kind 'hf' (tokenizer.json) is not supported in C++ yet; "
                                 "only the byte tokenizer is");
  if (manifest_.tokenizer_kind != "byte")
    artifact_error(manifest_.folder + ": unknown tokenizer kind " + quoted(manifest_.tokenizer_kind) + " in the manifest");
  if (manifest_.schema_version < 2) {  // ort_backend.cpp demotes the excluded ids on the host
    load_warning_ = manifest_.folder + ": a schema-1 artifact: its graphs may emit the mask token; the runtime "
                    "skips it on the host (re-export the artifact to fix this)";
    if (options.warnings_to_stderr) std::fprintf(stderr, "dllm: warning: %s\n", load_warning_.c_str());
  }
  backend_ = std::make_unique<OrtBackend>(manifest_, options.intra_op_threads);
  set_beam_width_cap();
}

// The W cap (api.py::Runtime.load): the manifest's max_beam_width, the user's, then the
// free-memory estimate of the built-in CPU profile, whichever is lowest.
void Engine::set_beam_width_cap() {
  cap_ = std::max(manifest_.max_beam_width, 1);
  cap_reason_ = "cap from the artifact's max_beam_width";
  if (options_.max_beam_width > 0 && options_.max_beam_width < cap_) {
    cap_ = options_.max_beam_width;
    cap_reason_ = "cap from the max_beam_width option";
  }
  const int64_t free = free_memory_bytes();
  const int mem_cap = beam_width_cap(manifest_.model, free, cpu_memory_budget(), manifest_.precision, cap_);
  if (mem_cap < cap_) {
    cap_ = mem_cap;
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(free) / (1 << 30));
    cap_reason_ = std::string("cap from the free-memory estimate, ") + gib + " GiB free";
  }
}

RowResult Engine::generate(const std::string& prompt, const DecodeOptions& cfg_in, const ChunkSink& sink) {
  validate(cfg_in);
  if (cfg_in.max_tokens && *cfg_in.max_tokens > cfg_in.gen_length)
    option_error(DLLM_ERROR_BAD_OPTION, "max_tokens",
                 "max tokens (" + std::to_string(*cfg_in.max_tokens) + ") exceeds gen length (" +
                     std::to_string(cfg_in.gen_length) + "): raise --gen-length or leave it out (it defaults to --max-tokens)");
  const ModelConfig& mc = manifest_.model;
  RowResult out;
  out.warnings.swap(load_warning_);  // the load's warning rides on the first result only
  DecodeOptions cfg = cfg_in;
  const int requested = cfg.strategy == "spd" ? cfg.beam_width : 1;
  int width = requested;
  if (width > cap_) {
    width = cap_;
    const std::string lowered = "beam width " + std::to_string(requested) + " lowered to " + std::to_string(width) +
                                " (" + cap_reason_ + ")";
    out.warnings += (out.warnings.empty() ? "" : "; ") + lowered;
    if (options_.warnings_to_stderr) std::fprintf(stderr, "dllm: warning: %s\n", lowered.c_str());
  }
  cfg.beam_width = width;
  const CacheMode mode = resolve_cache(cfg.cache, mc.attention, width);  // width = the Policy's
  const int L = cfg.block_length;
  const int n_blocks = static_cast<int>((static_cast<int64_t>(cfg.gen_length) + L - 1) / L);
  std::vector<int64_t> encoded = tokenizer_.encode(prompt);
  if (encoded.empty()) user_error("empty prompt");
  const int64_t budget = static_cast<int64_t>(n_blocks) * L;
  if (static_cast<int64_t>(encoded.size()) + budget > mc.max_seq)
    user_error("prompt of " + std::to_string(encoded.size()) + " tokens + " + std::to_string(budget) +
               " generated exceeds the model's max_seq " + std::to_string(mc.max_seq));
  Policy policy(cfg, mc.mask_token_id);  // after the length check: it sizes its scratch by L
  set_sampling(cfg);

  const double backend0 = backend_->run_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  stream_.emplace(cfg.stop, std::min<int64_t>(budget, cfg.max_tokens.value_or(budget)), mc.eos_token_id);
  sink_ = sink ? &sink : nullptr, cancelled_ = false, t0_ = t0;
  try {
    run(encoded, cfg, policy, n_blocks, mode, out);
  } catch (const std::bad_alloc&) {
    fail(DLLM_ERROR_OUT_OF_MEMORY, "out of memory decoding at beam width " + std::to_string(width) + " (prompt of " +
                                       std::to_string(encoded.size()) + " tokens + " + std::to_string(budget) +
                                       " generated)");
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  out.text = stream_->text();
  out.token_ids = stream_->ids();
  out.finish_reason = cancelled_ ? "cancelled" : stream_->finish_reason();
  out.finished = out.finish_reason == "eos" || out.finish_reason == "stop";
  out.tokens = static_cast<int64_t>(out.token_ids.size());
  out.tpf = static_cast<double>(out.tokens) / static_cast<double>(std::max<int64_t>(out.forwards, 1));
  out.wall_s = wall;
  out.tokens_per_s = wall > 0 ? static_cast<double>(out.tokens) / wall : 0.0;
  out.backend_s = backend_->run_seconds - backend0;
  out.beam_width_used = policy.width();
  out.beam_width_requested = requested;
  return out;
}

// The row's sampling parameters into the backend (greedy: 0, 0, 1 on a sampling artifact). A
// schema-2 artifact's graphs cannot sample; top_k is at most the artifact's sampling pool.
void Engine::set_sampling(const DecodeOptions& cfg) {
  sampling_ = cfg.temperature > 0;
  if (sampling_ && !backend_->samples())
    user_error(manifest_.folder + ": this artifact was exported without sampling (schema " +
               std::to_string(manifest_.schema_version) + "); re-export it to sample (temperature > 0)");
  if (backend_->samples() && cfg.top_k > manifest_.sample_pool)
    user_error("top k " + std::to_string(cfg.top_k) + " is over the " + std::to_string(manifest_.sample_pool) +
               " tokens " + manifest_.folder + " samples from (its sampling pool; export --sample-pool sets it)");
  seed_ = static_cast<uint64_t>(cfg.seed), request_ = 0;
  if (backend_->samples())
    backend_->set_sampling(static_cast<float>(cfg.temperature), cfg.top_k, static_cast<float>(cfg.top_p));
}

// The decode loop (loop.py::_Run.decode): the first block, then each block decoded until it is
// full or ends, its tokens kept, and the next block started (commit or refresh).
void Engine::run(const std::vector<int64_t>& prompt, const DecodeOptions& cfg, Policy& policy, int n_blocks,
                 CacheMode mode, RowResult& out) {
  const ModelConfig& mc = manifest_.model;
  mode_ = mode, L_ = static_cast<size_t>(cfg.block_length), n_blocks_ = static_cast<size_t>(n_blocks);
  mask_id_ = mc.mask_token_id, eos_id_ = mc.eos_token_id;
  bidi_ = mc.attention != "block_causal";
  anchor_ = mc.shift_logits;  // canvas.cpp keeps it out of mode none
  size_buffers(prompt, n_blocks_, mode, static_cast<size_t>(policy.width()));
  depths_ = node_depths(policy.spec());
  out.accepted_hist.assign(W_ + 2, 0);
  done_.clear();
  first_block();
  out.forwards = 1;
  for (size_t k = 0; k < n_blocks_; ++k) {
    if (decode_block(k, policy, out) || k == n_blocks_ - 1) break;
    done_.insert(done_.end(), state_.begin(), state_.end());  // no EOS: it would have finished the row
    next_block(k);
    out.forwards += 1;
  }
  if (!stream_->finished() && !cancelled_)  // the canvas's last report reaches the budget
    fail(DLLM_ERROR_INTERNAL, "internal error: the decode ended without a finish reason");
  while (out.accepted_hist.size() > 1 && out.accepted_hist.back() == 0) out.accepted_hist.pop_back();
}

// The report after a forward (docs/streaming.md): the row's final ids (the finished blocks, then
// the current block's committed left-to-right prefix) into the stream, a chunk to the sink when
// one is due. True when decoding stops here: the row finished, or the sink cancelled.
bool Engine::report(RowResult& out) {
  final_ = done_;
  final_.insert(final_.end(), state_.begin(), std::find(state_.begin(), state_.end(), mask_id_));
  if (!stream_->report(final_, out.forwards, &chunk_)) return false;
  if (out.time_to_first_token_s < 0 && !chunk_.token_ids.empty())
    out.time_to_first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (sink_ && !(*sink_)(chunk_) && !stream_->finished()) cancelled_ = true;
  return cancelled_ || stream_->finished();
}

// Every buffer sized once (max_tokens new tokens over max_past cached, prefills within
// max_present). Block-causal: the fused prefill (p+L), a verification (W*L) or a commit (2L), over
// a cache of at most the prompt and the committed blocks (none: that prefix comes in front of the
// new tokens, nothing is cached). Bidirectional: the canvas N per refresh (none: per step),
// prefix-mode branches W*(L+S) with S up to (n_blocks-1)*L, dual ones W*L, over a cache of at
// most N-L (the prefix, dual: and the suffix); an anchor adds one token per branch.
void Engine::size_buffers(const std::vector<int64_t>& prompt, size_t n_blocks, CacheMode mode, size_t W) {
  OrtBackend& be = *backend_;
  const size_t L = L_, p = prompt.size(), N = p + n_blocks * L;
  const bool none = mode == CacheMode::kNone;
  W_ = W, K_ = static_cast<size_t>(be.topk());
  if (bidi_)
    be.reserve(std::max(N, W * ((anchor_ && !none ? 1 : 0) + (mode == CacheMode::kPrefix ? n_blocks * L : L))),
               none ? 0 : N - L, none ? 0 : N);
  else if (none)
    be.reserve(N - L + std::max(W * L, 2 * L), 0, 0);
  else
    be.reserve(std::max({p + L, W * L, 2 * L}), N, N);
  state_.resize(L);
  nodes_.resize(W * L);
  fi_.resize(L * K_);
  fp_.resize(L * K_);
  vi_.resize(W * L * K_);
  vp_.resize(W * L * K_);
  branch_steps_.resize(W);
  prefix_ = Prefix::of_prompt(prompt);
  be.clear_cache();
}

// The first block's state, all masks, and f of it (loop.py::_Run.first_block): the prompt is
// prefilled here, fused with the block (block-causal) or as the canvas's prefix (bidirectional).
void Engine::first_block() {
  std::fill(state_.begin(), state_.end(), mask_id_);
  const Plan plan = bidi_ ? refresh(prefix_, state_.data(), L_, suffix_len(0), mask_id_, mode_, anchor_)
                          : detail::first_block(prefix_, state_.data(), L_, mode_);
  run_plan(plan, nullptr, fi_.data(), fp_.data());
}

// Fills block k's state S until it is full or ends (loop.py::_Run.decode_block): W drafts, one
// verify forward over them, then the selection as deep as verification allows. Each forward's
// report follows the base rule's next step (node 0, which every selection reaches); true when a
// report stopped decoding (the row finished or was cancelled).
bool Engine::decode_block(size_t k, Policy& policy, RowResult& out) {
  const size_t L = L_, K = K_;
  int64_t step = 0;  // rule steps taken
  auto take_node0 = [&] {
    policy.plan(state_.data(), fi_.data(), fp_.data(), static_cast<int>(K), step, nodes_.data());
    std::copy(nodes_.begin(), nodes_.begin() + static_cast<long>(L), state_.begin());  // node 0 is known exactly
  };
  take_node0();
  for (;;) {
    if (report(out)) return true;
    if (block_status(state_, mask_id_, eos_id_).done) return false;
    for (size_t w = 0; w < W_; ++w) branch_steps_[w] = step + depths_[w] + 1;
    run_plan(verify_plan(k), branch_steps_.data(), vi_.data(), vp_.data());
    int64_t steps = 0;
    const size_t cur = static_cast<size_t>(policy.select(nodes_.data(), vi_.data(), vp_.data(), static_cast<int>(K),
                                                         step, &steps));
    out.forwards += 1;
    out.accepted_hist[static_cast<size_t>(steps)] += 1;
    std::copy(nodes_.begin() + static_cast<long>(cur * L), nodes_.begin() + static_cast<long>((cur + 1) * L),
              state_.begin());
    std::copy(vi_.begin() + static_cast<long>(cur * L * K), vi_.begin() + static_cast<long>((cur + 1) * L * K),
              fi_.begin());
    std::copy(vp_.begin() + static_cast<long>(cur * L * K), vp_.begin() + static_cast<long>((cur + 1) * L * K),
              fp_.begin());
    step += steps;
    if (!block_status(state_, mask_id_, eos_id_).done) take_node0();
  }
}

// The verify forward of block k's W drafted states (nodes_): a tree over the cache
// (block-causal) or W branches of the canvas (bidirectional).
Plan Engine::verify_plan(size_t k) const {
  if (bidi_) return canvas_verify(prefix_, nodes_.data(), W_, L_, suffix_len(k), mask_id_, mode_, anchor_);
  return tree_verify(prefix_, nodes_.data(), W_, L_, mode_);
}

// Block k joins the prefix; the next block's state (all masks) and f of it (loop.py::
// _Run.next_block): one fused forward commits the block's KV (block-causal), or one forward over
// the canvas refreshes the cache (bidirectional).
void Engine::next_block(size_t k) {
  const std::vector<int64_t> nxt(L_, mask_id_);
  Plan plan;
  if (bidi_) {
    prefix_.extend(state_.data(), L_);
    plan = refresh(prefix_, nxt.data(), L_, suffix_len(k + 1), mask_id_, mode_, anchor_);
  } else {
    plan = commit_next(prefix_, state_.data(), nxt.data(), L_, mode_);
    prefix_.extend(state_.data(), L_);
  }
  state_ = nxt;
  run_plan(plan, nullptr, fi_.data(), fp_.data());
}

// One engine call (prefix.py::PrefixState.run): the plan's tokens, positions and mask into the
// backend, a prefill (keep > 0) or a verify over the cache it names; top ids/probs (W,L,K) at the
// plan's read columns into top_ids/top_probs.
void Engine::run_plan(const Plan& plan, const int64_t* steps, int64_t* top_ids, float* top_probs) {
  OrtBackend& be = *backend_;
  if (plan.cache != PlanCache::kReuse) be.clear_cache();
  if (plan.rows != 1 || plan.cached != be.cache_length())
    fail(DLLM_ERROR_INTERNAL, "a plan over " + std::to_string(plan.cached) + " cached positions met a cache of " +
                                  std::to_string(be.cache_length()));
  std::copy(plan.ids.begin(), plan.ids.end(), be.ids());
  std::copy(plan.positions.begin(), plan.positions.end(), be.pos());
  std::copy(plan.mask.begin(), plan.mask.end(), be.mask());
  if (be.samples()) fill_noise(plan, steps);
  if (plan.keep)
    be.prefill(plan.tokens, plan.keep);
  else
    be.verify(plan.tokens);
  const size_t K = K_;
  for (size_t i = 0; i < plan.read.size(); ++i) {
    const size_t col = static_cast<size_t>(plan.read[i]);
    std::copy(be.top_ids() + col * K, be.top_ids() + (col + 1) * K, top_ids + i * K);
    std::copy(be.top_probs() + col * K, be.top_probs() + (col + 1) * K, top_probs + i * K);
  }
}

// sample_u of one call (prefix.py::PrefixState.run): a read column serves its branch's step
// (steps[w]; a block-start forward: 0), a column not read back step 0; the uniform of a column is
// that of its position id at its step. Greedy rows feed zeros (the graph takes the top-1).
void Engine::fill_noise(const Plan& plan, const int64_t* steps) {
  float* u = backend_->sample_u();
  if (!sampling_) return std::fill(u, u + plan.tokens, 0.0f);
  col_steps_.assign(plan.tokens, 0);
  if (steps)
    for (size_t w = 0; w < plan.branches; ++w)
      for (size_t l = 0; l < plan.length; ++l) col_steps_[static_cast<size_t>(plan.read[w * plan.length + l])] = steps[w];
  for (size_t t = 0; t < plan.tokens; ++t) u[t] = sample_uniform(seed_, request_, plan.positions[t], col_steps_[t]);
}

}  // namespace dllm::detail
