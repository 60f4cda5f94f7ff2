#include "decoder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>

#include "decode_options.gen.hpp"
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

BlockStatus block_status(const int64_t* tokens, size_t n, int64_t mask_id, int64_t eos_id) {
  const int64_t* end = tokens + n;
  const int64_t* eos = std::find(tokens, end, eos_id);
  if (std::find(tokens, eos, mask_id) == eos && eos != end) return {true, eos - tokens + 1};
  return {std::find(tokens, end, mask_id) == end, -1};
}

// Mode delayed is exact at block boundaries: the prompt's prefill and each commit.
CacheMode exact_at_boundary(CacheMode mode) { return mode == CacheMode::kDelayed ? CacheMode::kExact : mode; }

}  // namespace

namespace {

// kCacheMessages[key] with {mode} and {modes} filled in (decode_options.json "cache_messages").
std::string cache_message(const std::string& key, const std::string& mode, const std::string& modes) {
  std::string text;
  for (const auto& [k, v] : kCacheMessages)
    if (key == k) text = v;
  if (text.empty()) return cache_message(key.find(".unavailable") != std::string::npos ? "unavailable" : "unknown", mode, modes);
  for (const auto& [field, value] : {std::pair<std::string, std::string>{"{mode}", mode}, {"{modes}", modes}})
    for (size_t at; (at = text.find(field)) != std::string::npos;) text.replace(at, field.size(), value);
  return text;
}

}  // namespace

CacheMode resolve_cache(const std::string& mode, const Capabilities& caps, int width) {
  static const char* const kModes[] = {"none", "prefix", "dual", "exact", "delayed", "auto"};  // decode_options.json's order
  std::string all, offered;
  bool known = false;
  for (const char* m : kModes) {
    known = known || mode == m;
    all += std::string(all.empty() ? "" : ", ") + m;
    if (caps.cache.count(m)) offered += std::string(offered.empty() ? "" : ", ") + m;
  }
  if (!known) user_error(cache_message("unknown", quoted(mode), all));
  const auto it = caps.cache.find(mode);
  if (it == caps.cache.end()) user_error(cache_message(mode + ".unavailable", quoted(mode), offered));
  if (width > 1 && std::find(caps.one_branch.begin(), caps.one_branch.end(), mode) != caps.one_branch.end())
    user_error(cache_message(mode + ".one_branch", quoted(mode), offered));
  return cache_mode_named(it->second);  // the manifest's reader checked the names
}

void RowResult::finish(const RowStream& stream, double wall, double backend) {
  text = stream.text();
  token_ids = stream.ids();
  finish_reason = stream.finished() ? stream.finish_reason() : "cancelled";
  tokens = static_cast<int64_t>(token_ids.size());
  finished = finish_reason == "eos" || finish_reason == "stop";
  tpf = static_cast<double>(tokens) / static_cast<double>(std::max<int64_t>(forwards, 1));
  wall_s = wall;
  tokens_per_s = wall > 0 ? static_cast<double>(tokens) / wall : 0.0;
  backend_s = backend;
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

Runtime::Runtime(const std::string& artifact_dir, const RuntimeOptions& options)
    : manifest_(read_manifest(artifact_dir, options.precision, options.verify_hashes)), options_(options) {
  tokenizer_ = make_tokenizer(manifest_.folder, manifest_.tokenizer_kind, manifest_.tokenizer_file,
                              manifest_.tokenizer_config, manifest_.model.eos_token_id);
  backend_ = std::make_unique<OrtBackend>(manifest_, options.intra_op_threads);
  set_beam_width_cap();
}

// The W cap (api.py::Runtime.load): the manifest's max_beam_width, the user's, then the
// free-memory estimate of the built-in CPU profile, whichever is lowest.
void Runtime::set_beam_width_cap() {
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

RowResult Runtime::generate(const std::string& prompt, const DecodeOptions& cfg, const ChunkSink& sink) {
  return std::move(generate(std::vector<std::string>{prompt}, cfg, sink).front());
}

std::vector<RowResult> Runtime::generate(const std::vector<std::string>& prompts, const DecodeOptions& cfg_in,
                                        const ChunkSink& sink) {
  if (prompts.empty()) user_error("no prompt given");
  if (self_speculative())
    user_error("a " + manifest_.family + " model decodes self-speculatively (ar, linear-spec, tree-spec: "
               "dllm_self_spec_generate, dllm-generate --strategy linear-spec); the masked strategies do not apply");
  validate(cfg_in);
  check_rules(cfg_in);  // decode_options.json "rules": max_tokens vs gen_length, far / lead vs threshold
  const ModelConfig& mc = manifest_.model;
  std::string lowered;
  DecodeOptions cfg = cfg_in;
  const int requested = cfg.strategy == "spd" ? cfg.beam_width : 1;
  int width = requested;
  if (width > cap_) {
    width = cap_;
    lowered = "beam width " + std::to_string(requested) + " lowered to " + std::to_string(width) + " (" + cap_reason_ + ")";
    if (options_.warnings_to_stderr) std::fprintf(stderr, "dllm: warning: %s\n", lowered.c_str());
  }
  cfg.beam_width = width;
  const CacheMode mode = resolve_cache(cfg.cache, manifest_.caps, width);  // width = the Policy's
  const int L = cfg.block_length;
  const int n_blocks = static_cast<int>((static_cast<int64_t>(cfg.gen_length) + L - 1) / L);
  const int64_t budget = static_cast<int64_t>(n_blocks) * L;
  std::vector<std::vector<int64_t>> encoded;
  size_t longest = 0;
  for (const std::string& prompt : prompts) {
    encoded.push_back(tokenizer_->encode(prompt));
    if (encoded.back().empty()) user_error("empty prompt");
    if (static_cast<int64_t>(encoded.back().size()) + budget > mc.max_seq)
      user_error("prompt of " + std::to_string(encoded.back().size()) + " tokens + " + std::to_string(budget) +
                 " generated exceeds the model's max_seq " + std::to_string(mc.max_seq));
    longest = std::max(longest, encoded.back().size());
  }
  Policy policy(cfg, mc.mask_token_id);  // after the length check: it sizes its scratch by L
  set_sampling(cfg);

  std::vector<RowResult> out(prompts.size());
  for (RowResult& r : out) r.warnings = lowered;
  const double backend0 = backend_->run_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  streams_.assign(prompts.size(),
                  RowStream(*tokenizer_, cfg.stop, std::min<int64_t>(budget, cfg.max_tokens.value_or(budget)), mc.eos_token_id));
  sink_ = sink ? &sink : nullptr, cancelled_ = false, t0_ = t0;
  try {
    run(encoded, cfg, policy, n_blocks, mode, out);
  } catch (const std::bad_alloc&) {
    fail(DLLM_ERROR_OUT_OF_MEMORY, "out of memory decoding at beam width " + std::to_string(width) + " (" +
                                       (prompts.size() > 1 ? std::to_string(prompts.size()) + " prompts of up to " : "prompt of ") +
                                       std::to_string(longest) + " tokens + " + std::to_string(budget) + " generated)");
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].finish(streams_[i], wall, backend_->run_seconds - backend0);
    out[i].beam_width_used = policy.width();
    out[i].beam_width_requested = requested;
  }
  return out;
}

// The row's sampling parameters into the backend (greedy: 0, 0, 1); top_k is at most the
// artifact's sampling pool.
void Runtime::set_sampling(const DecodeOptions& cfg) {
  sampling_ = cfg.temperature > 0;
  if (cfg.top_k > manifest_.sample_pool)
    user_error("top k " + std::to_string(cfg.top_k) + " is over the " + std::to_string(manifest_.sample_pool) +
               " tokens " + manifest_.folder + " samples from (its sampling pool; export --sample-pool sets it)");
  seed_ = static_cast<uint64_t>(cfg.seed), request_ = 0;
  backend_->set_sampling(static_cast<float>(cfg.temperature), cfg.top_k, static_cast<float>(cfg.top_p));
}

// The decode loop (loop.py::_Run.decode): the first block, then each block decoded until every
// live row's block is full or ends, the rows' tokens kept, the finished rows dropped and the
// next block started (commit or refresh) for the others.
void Runtime::run(const std::vector<std::vector<int64_t>>& prompts, const DecodeOptions& cfg, Policy& policy,
                 int n_blocks, CacheMode mode, std::vector<RowResult>& out) {
  const ModelConfig& mc = manifest_.model;
  mode_ = mode, L_ = static_cast<size_t>(cfg.block_length), n_blocks_ = static_cast<size_t>(n_blocks);
  mask_id_ = mc.mask_token_id, eos_id_ = mc.eos_token_id;
  bidi_ = !manifest_.caps.block_causal();
  anchor_ = manifest_.caps.shift_logits;  // canvas.cpp keeps it out of mode none
  size_buffers(prompts, n_blocks_, mode, static_cast<size_t>(policy.width()));
  depths_ = node_depths(policy.spec());
  for (RowResult& o : out) o.accepted_hist.assign(W_ + 2, 0), o.forwards = 1;
  first_block();
  for (size_t k = 0;; ++k) {
    decode_block(k, policy, out);
    if (cancelled_ || !finish_block(k)) break;
    next_block(k);
    for (size_t row : rows_) out[row].forwards += 1;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!streams_[i].finished() && !cancelled_)  // the canvas's last report reaches the budget
      fail(DLLM_ERROR_INTERNAL, "internal error: the decode ended without a finish reason");
    std::vector<int64_t>& hist = out[i].accepted_hist;
    while (hist.size() > 1 && hist.back() == 0) hist.pop_back();
  }
}

// The report after a forward (docs/streaming.md; loop.py::_Run.report): each live row's final ids
// (its finished blocks, then its block's committed left-to-right prefix) into its stream, a chunk
// to the sink when one is due; a row whose stream finished stops. True when the sink cancelled.
bool Runtime::report(std::vector<RowResult>& out) {
  for (size_t r = 0; r < B(); ++r) {
    const size_t row = rows_[r];
    if (streams_[row].finished()) continue;  // its ids stay as they were: no chunk is due
    const int64_t* block = state_.data() + r * L_;
    final_ = done_[row];
    final_.insert(final_.end(), block, std::find(block, block + L_, mask_id_));
    if (!streams_[row].report(final_, out[row].forwards, &chunk_)) continue;
    if (out[row].time_to_first_token_s < 0 && !chunk_.token_ids.empty())
      out[row].time_to_first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (streams_[row].finished()) stopped_[row] = 1;
    if (sink_ && !(*sink_)(row, chunk_) && !streams_[row].finished()) return cancelled_ = true;
  }
  return false;
}

// Every buffer sized once (max_tokens new tokens over max_past cached, prefills within
// max_present, per row). Block-causal: the fused prefill (p+L), a verification (W*L) or a commit
// (2L), over a cache of at most the prompt and the committed blocks (none: that prefix comes in
// front of the new tokens, nothing is cached). Bidirectional: the canvas N per refresh (none: per
// step), prefix-mode branches W*(L+S) with S up to (n_blocks-1)*L, dual ones W*L, over a cache of
// at most N-L (the prefix, dual: and the suffix); an anchor adds one token per branch.
void Runtime::size_buffers(const std::vector<std::vector<int64_t>>& prompts, size_t n_blocks, CacheMode mode,
                          size_t W) {
  OrtBackend& be = *backend_;
  be.clear_cache();  // before reserve: a kv_io "new" buffer is laid out for this call's cache
  prefix_ = Prefix::of_prompts(prompts, manifest_.model.pad_token_id);
  const size_t L = L_, p = prefix_.length, N = p + n_blocks * L, b = prompts.size();
  const bool none = mode == CacheMode::kNone;
  W_ = W, K_ = static_cast<size_t>(be.topk());
  if (bidi_)
    be.reserve(b, std::max(N, W * ((anchor_ && !none ? 1 : 0) + (mode == CacheMode::kPrefix ? n_blocks * L : L))),
               none ? 0 : N - L, none ? 0 : N);
  else if (none)
    be.reserve(b, N - L + std::max(W * L, 2 * L), 0, 0);
  else if (mode == CacheMode::kDelayed)  // held keys: at most L per step of the block, each a batch's widest
    be.reserve(b, std::max(p + L, 2 * L), N + std::min(b, L) * L, N + std::min(b, L) * L + 2 * L);
  else
    be.reserve(b, std::max({p + L, W * L, 2 * L}), N, N);
  rows_.resize(b);
  for (size_t r = 0; r < b; ++r) rows_[r] = r;
  done_.assign(b, {});
  stopped_.assign(b, 0);
  state_.resize(b * L);
  nodes_.resize(b * W * L);
  fi_.resize(b * L * K_);
  fp_.resize(b * L * K_);
  vi_.resize(b * W * L * K_);
  vp_.resize(b * W * L * K_);
  branch_steps_.resize(b * W);
  records_.resize(b);
  recorded_.assign(b, 0);
  step_.resize(b);
  full_.resize(b);
  cached_.resize(b * L);
  fresh_.resize(b * L);
  held_.clear(), held_len_ = 0;
  be.clear_cache();
}

// The first block's states, all masks, and f of them (loop.py::_Run.first_block): the prompts are
// prefilled here, fused with the block (block-causal) or as the canvas's prefix (bidirectional).
void Runtime::first_block() {
  std::fill(state_.begin(), state_.end(), mask_id_);
  const Plan plan = bidi_ ? refresh(prefix_, state_.data(), L_, suffix_len(0), mask_id_, mode_, anchor_)
                          : detail::first_block(prefix_, state_.data(), L_, exact_at_boundary(mode_));
  run_plan(plan, nullptr, fi_.data(), fp_.data());
}

// Fills block k of every live row until each is full or ends (loop.py::_Run.decode_block): W
// drafts per row, one verify forward over them all, then each row's selection as deep as
// verification allows. A row that waits (its block done, or the row stopped) still rides in the
// forward, as in Python, but its results are ignored and it is not charged. Each forward's report
// follows the base rule's next step (node 0, which every selection reaches).
void Runtime::decode_block(size_t k, Policy& policy, std::vector<RowResult>& out) {
  const size_t L = L_, K = K_, W = W_, b = B();
  const int k_int = static_cast<int>(K);
  std::fill_n(step_.begin(), b, 0);
  std::fill_n(full_.begin(), b, 0);
  std::fill_n(cached_.begin(), b * L, 0);
  for (;;) {
    for (size_t r = 0; r < b; ++r) {
      int64_t* block = state_.data() + r * L;
      policy.plan(block, fi_.data() + r * L * K, fp_.data() + r * L * K, k_int, step_[r], nodes_.data() + r * W * L);
      if (full_[r]) continue;
      if (trace_) {
        TraceRecord& rec = records_[r];
        policy.trace_plan(block, fp_.data() + r * L * K, k_int, step_[r], nodes_.data() + r * W * L, rec);
        rec.row = rows_[r], rec.block = k, rec.forward = out[rows_[r]].forwards, recorded_[r] = 1;
      }
      std::copy_n(nodes_.begin() + static_cast<long>(r * W * L), L, block);  // node 0 is known exactly
      full_[r] = block_status(block, L, mask_id_, eos_id_).done;
    }
    if (report(out)) return;
    bool waiting = true;
    for (size_t r = 0; r < b; ++r) full_[r] |= stopped_[rows_[r]], waiting &= full_[r] != 0;
    if (waiting) {
      flush_trace();
      return drop_held();
    }
    for (size_t r = 0; r < b; ++r)
      for (size_t w = 0; w < W; ++w) branch_steps_[r * W + w] = step_[r] + depths_[w] + 1;
    if (mode_ == CacheMode::kDelayed)
      held_verify_run(branch_steps_.data());
    else
      run_plan(verify_plan(k), branch_steps_.data(), vi_.data(), vp_.data());
    for (size_t r = 0; r < b; ++r) {
      if (full_[r]) continue;
      int64_t steps = 0;
      const size_t cur = static_cast<size_t>(policy.select(nodes_.data() + r * W * L, vi_.data() + r * W * L * K,
                                                           vp_.data() + r * W * L * K, k_int, step_[r], &steps));
      if (trace_) {
        records_[r].accepted = steps;
        policy.trace_checks(nodes_.data() + r * W * L, vp_.data() + r * W * L * K, k_int, step_[r],
                            static_cast<int>(cur), records_[r]);
      }
      RowResult& o = out[rows_[r]];
      o.forwards += 1;
      o.accepted_hist[static_cast<size_t>(steps)] += 1;
      std::copy_n(nodes_.begin() + static_cast<long>((r * W + cur) * L), L, state_.begin() + static_cast<long>(r * L));
      std::copy_n(vi_.begin() + static_cast<long>((r * W + cur) * L * K), L * K, fi_.begin() + static_cast<long>(r * L * K));
      std::copy_n(vp_.begin() + static_cast<long>((r * W + cur) * L * K), L * K, fp_.begin() + static_cast<long>(r * L * K));
      step_[r] += steps;
      full_[r] = block_status(state_.data() + r * L, L, mask_id_, eos_id_).done;
    }
    flush_trace();
  }
}

// This iteration's decision records, in batch order, to the trace sink.
void Runtime::flush_trace() {
  if (!trace_) return;
  for (size_t r = 0; r < B(); ++r)
    if (recorded_[r]) trace_(records_[r].json()), recorded_[r] = 0;
}

// Each row's block k joins its tokens (up to its EOS) (loop.py::_Run.finish_block); the rows that
// go on (no EOS, not stopped, blocks left) stay, the others leave the batch with their cache rows
// (PrefixState.keep). True when some row goes on.
bool Runtime::finish_block(size_t k) {
  std::vector<size_t> keep;
  for (size_t r = 0; r < B(); ++r) {
    const int64_t* block = state_.data() + r * L_;
    const BlockStatus st = block_status(block, L_, mask_id_, eos_id_);
    std::vector<int64_t>& done = done_[rows_[r]];
    done.insert(done.end(), block, block + (st.stop >= 0 ? st.stop : static_cast<int64_t>(L_)));
    if (st.stop < 0 && !stopped_[rows_[r]] && k + 1 < n_blocks_) keep.push_back(r);
  }
  if (keep.empty()) return false;
  if (keep.size() == B()) return true;
  for (size_t j = 0; j < keep.size(); ++j) {
    rows_[j] = rows_[keep[j]];
    std::copy_n(state_.begin() + static_cast<long>(keep[j] * L_), L_, state_.begin() + static_cast<long>(j * L_));
  }
  rows_.resize(keep.size());
  prefix_.take(keep);
  backend_->keep_rows(keep);
  return true;
}

// The verify forward of block k's drafted states (nodes_, W per row): a tree over the cache
// (block-causal) or W branches of the canvas (bidirectional).
Plan Runtime::verify_plan(size_t k) const {
  if (bidi_) return canvas_verify(prefix_, nodes_.data(), W_, L_, suffix_len(k), mask_id_, mode_, anchor_);
  return tree_verify(prefix_, nodes_.data(), W_, L_, mode_);
}

// Mode delayed (loop.py::_Run._held_verify): f(node 0) over the prefix and the block's held keys;
// the positions committed since the last call join the held keys.
void Runtime::held_verify_run(const int64_t* steps) {
  const size_t b = B(), L = L_;
  for (size_t i = 0; i < b * L; ++i) fresh_[i] = nodes_[i] != mask_id_ && !cached_[i];  // W = 1: nodes_ is (B,L)
  const Plan plan = held_verify(prefix_, held_, held_len_, nodes_.data(), fresh_.data(), L, mask_id_,
                                manifest_.model.pad_token_id);
  run_plan(plan, steps, vi_.data(), vp_.data());
  const size_t e = held_len_, f = plan.keep;
  std::vector<uint8_t> held(b * (e + f), 0);
  for (size_t r = 0; r < b; ++r) {
    std::copy_n(held_.begin() + long(r * e), e, held.begin() + long(r * (e + f)));
    size_t slot = 0;
    for (size_t i = 0; i < L; ++i)
      if (fresh_[r * L + i]) held[r * (e + f) + e + slot++] = 1, cached_[r * L + i] = 1;
  }
  held_.swap(held), held_len_ = e + f;
}

void Runtime::drop_held() {
  if (!held_len_) return;
  backend_->truncate(backend_->cache_length() - held_len_);
  held_.clear(), held_len_ = 0;
}

// Block k joins the prefix; the next block's states (all masks) and f of them (loop.py::
// _Run.next_block): one fused forward commits the blocks' KV (block-causal), or one forward over
// the canvas refreshes the cache (bidirectional).
void Runtime::next_block(size_t k) {
  const std::vector<int64_t> nxt(B() * L_, mask_id_);
  Plan plan;
  if (bidi_) {
    prefix_.extend(state_.data(), L_);
    plan = refresh(prefix_, nxt.data(), L_, suffix_len(k + 1), mask_id_, mode_, anchor_);
  } else {
    plan = commit_next(prefix_, state_.data(), nxt.data(), L_, exact_at_boundary(mode_));
    prefix_.extend(state_.data(), L_);
  }
  std::copy(nxt.begin(), nxt.end(), state_.begin());
  run_plan(plan, nullptr, fi_.data(), fp_.data());
}

// One engine call (prefix.py::PrefixState.run): the plan's tokens, positions and mask into the
// backend, a prefill (keep > 0) or a verify over the cache it names; top ids/probs (B,W,L,K) at
// the plan's read columns into top_ids/top_probs.
void Runtime::run_plan(const Plan& plan, const int64_t* steps, int64_t* top_ids, float* top_probs) {
  OrtBackend& be = *backend_;
  if (plan.cache != PlanCache::kReuse) be.clear_cache(plan.keep);  // it holds this call's kept tokens
  if (plan.rows != B() || plan.rows != be.rows() || plan.cached != be.cache_length())
    fail(DLLM_ERROR_INTERNAL, "a plan over " + std::to_string(plan.rows) + " rows and " + std::to_string(plan.cached) +
                                  " cached positions met " + std::to_string(be.rows()) + " rows and a cache of " +
                                  std::to_string(be.cache_length()));
  std::copy(plan.ids.begin(), plan.ids.end(), be.ids());
  std::copy(plan.positions.begin(), plan.positions.end(), be.pos());
  std::copy(plan.mask.begin(), plan.mask.end(), be.mask());
  fill_noise(plan, steps);
  if (plan.keep)
    be.prefill(plan.tokens, plan.keep);
  else
    be.verify(plan.tokens);
  const size_t K = K_, T = plan.tokens, R = plan.branches * plan.length;
  for (size_t r = 0; r < plan.rows; ++r)
    for (size_t i = 0; i < R; ++i) {
      const size_t col = r * T + static_cast<size_t>(plan.read[(plan.per_row ? r * R : 0) + i]);
      std::copy_n(be.top_ids() + col * K, K, top_ids + (r * R + i) * K);
      std::copy_n(be.top_probs() + col * K, K, top_probs + (r * R + i) * K);
    }
}

// sample_u of one call (prefix.py::PrefixState.run): a read column serves its branch's step
// (steps[r*W+w] in row r; a block-start forward: 0), a column not read back step 0; the uniform of a column is
// that of its position id at its step. Greedy rows feed zeros (the graph takes the top-1).
void Runtime::fill_noise(const Plan& plan, const int64_t* steps) {
  float* u = backend_->sample_u();
  const size_t T = plan.tokens, n = plan.rows * T, W = plan.branches, G = plan.length;
  if (!sampling_) return std::fill(u, u + n, 0.0f);
  col_steps_.assign(n, 0);
  if (steps)
    for (size_t r = 0; r < plan.rows; ++r)
      for (size_t w = 0; w < W; ++w)
        for (size_t l = 0; l < G; ++l)
          col_steps_[r * T + static_cast<size_t>(plan.read[(plan.per_row ? r * W * G : 0) + w * G + l])] = steps[r * W + w];
  for (size_t i = 0; i < n; ++i) u[i] = sample_uniform(seed_, request_, plan.positions[i], col_steps_[i]);
}

}  // namespace dllm::detail
