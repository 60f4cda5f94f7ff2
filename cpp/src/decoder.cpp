#include "decoder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>

#include "error.hpp"
#include "json.hpp"
#include "memory.hpp"

namespace dllm::detail {

namespace {

// Index just past the first EOS if every position before it is committed, else -1
// (loop.py::_finished_at).
int64_t finished_at(const int64_t* tokens, int n, int64_t mask_id, int64_t eos_id) {
  for (int i = 0; i < n; ++i) {
    if (tokens[i] == eos_id) return i + 1;
    if (tokens[i] == mask_id) return -1;  // a masked position before the first EOS
  }
  return -1;
}

bool any_mask(const int64_t* tokens, int n, int64_t mask_id) {
  return std::find(tokens, tokens + n, mask_id) != tokens + n;
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

RowResult Engine::generate(const std::string& prompt, const DecodeOptions& cfg_in) {
  validate(cfg_in);
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

  const double backend0 = backend_->run_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run(encoded, cfg, policy, n_blocks, mode, out);
  } catch (const std::bad_alloc&) {
    fail(DLLM_ERROR_OUT_OF_MEMORY, "out of memory decoding at beam width " + std::to_string(width) + " (prompt of " +
                                       std::to_string(encoded.size()) + " tokens + " + std::to_string(budget) +
                                       " generated)");
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  out.text = tokenizer_.decode(out.token_ids);
  out.tokens = static_cast<int64_t>(out.token_ids.size());
  out.tpf = static_cast<double>(out.tokens) / static_cast<double>(std::max<int64_t>(out.forwards, 1));
  out.wall_s = wall;
  out.tokens_per_s = wall > 0 ? static_cast<double>(out.tokens) / wall : 0.0;
  out.backend_s = backend_->run_seconds - backend0;
  out.beam_width_used = policy.width();
  out.beam_width_requested = requested;
  return out;
}

// One forward over the whole canvas (loop.py::_Batch.refresh): [prefix | block | suffix], or
// [prefix | suffix | block] in mode dual, every token attending every token. none: the verify
// graph over an empty cache; prefix / dual: a fresh cache keeps the KV of the prefix (and the
// suffix). With an anchor (shifted logits) the prefix's last token stays out of the cache: dual
// orders the canvas [prefix minus it | suffix | it | block]. fi/fp (L,K) <- f(block).
void Engine::refresh(const int64_t* block, int64_t block_base, size_t suffix_len, int64_t* fi, float* fp) {
  OrtBackend& be = *backend_;
  const size_t P = prefix_.size(), L = L_, S = suffix_len, N = P + L + S, K = K_, A = anchor_ ? 1 : 0;
  const bool dual = mode_ == CacheMode::kDual;
  int64_t* ids = be.ids();
  int64_t* pos = be.pos();
  const size_t head = dual ? P - A : P;  // prefix tokens in front of everything else
  for (size_t i = 0; i < head; ++i) ids[i] = prefix_[i], pos[i] = static_cast<int64_t>(i);
  if (dual && A) ids[P - 1 + S] = prefix_[P - 1], pos[P - 1 + S] = static_cast<int64_t>(P - 1);
  const size_t at = dual ? P + S : P, suffix_at = dual ? head : P + L;  // where the block / suffix sit
  for (size_t j = 0; j < L; ++j) ids[at + j] = block[j], pos[at + j] = block_base + static_cast<int64_t>(j);
  for (size_t j = 0; j < S; ++j)
    ids[suffix_at + j] = mask_id_, pos[suffix_at + j] = block_base + static_cast<int64_t>(L + j);
  be.clear_cache();
  std::fill(be.mask(), be.mask() + N * N, uint8_t{1});  // batch 1: no padding, every key is valid
  if (mode_ == CacheMode::kNone)
    be.verify(N);
  else
    be.prefill(N, P - A + (dual ? S : 0));  // dual: the cache is [prefix | suffix]
  std::copy(be.top_ids() + at * K, be.top_ids() + (at + L) * K, fi);
  std::copy(be.top_probs() + at * K, be.top_probs() + (at + L) * K, fp);
}

// f(node) for the W drafted block states of a bidirectional model in one forward
// (loop.py::_Batch.verify_canvas): prefix mode, each branch = [node | suffix] over the prefix
// cache; dual, each branch = [node] over the prefix + suffix cache; none (W = 1), the whole canvas.
// With an anchor each branch starts with the prefix's last token. vi_/vp_ <- (W,L,K).
void Engine::verify_canvas(int64_t block_base, size_t suffix_len) {
  OrtBackend& be = *backend_;
  const size_t L = L_, W = W_, K = K_;
  if (mode_ == CacheMode::kNone) {  // resolve_cache allows W = 1 only
    refresh(nodes_.data(), block_base, suffix_len, vi_.data(), vp_.data());
    return;
  }
  const size_t A = anchor_ ? 1 : 0, S = mode_ == CacheMode::kDual ? 0 : suffix_len, G = A + L + S, T = W * G;
  const size_t P = be.cache_length(), cols = P + T;
  int64_t* ids = be.ids();
  int64_t* pos = be.pos();
  uint8_t* mask = be.mask();
  for (size_t w = 0; w < W; ++w) {
    if (A) ids[w * G] = prefix_.back(), pos[w * G] = static_cast<int64_t>(prefix_.size() - 1);
    for (size_t j = 0; j < L + S; ++j) {
      ids[w * G + A + j] = j < L ? nodes_[w * L + j] : mask_id_;
      pos[w * G + A + j] = block_base + static_cast<int64_t>(j);  // the suffix follows the block
    }
  }
  for (size_t r = 0; r < T; ++r) {
    uint8_t* row = mask + r * cols;
    std::fill(row, row + P, uint8_t{1});  // the cached prefix (and, dual, suffix)
    for (size_t c = 0; c < T; ++c) row[P + c] = r / G == c / G;
  }
  be.verify(T);
  for (size_t w = 0; w < W; ++w) {
    std::copy(be.top_ids() + (w * G + A) * K, be.top_ids() + (w * G + A + L) * K, vi_.begin() + w * L * K);
    std::copy(be.top_probs() + (w * G + A) * K, be.top_probs() + (w * G + A + L) * K, vp_.begin() + w * L * K);
  }
}

// A block-causal forward over the new tokens the caller put at ids/pos [off, off+t) with their
// mask rows [off, off+t) (columns: the prefix, then the t new tokens). exact: they follow the
// cache (off = 0), prefill keeps the KV of the first `keep`, verify (keep = 0) keeps nothing.
// none (loop.py::_Batch.forward without a cache): the prefix is recomputed in front of them
// (off = its length) with the verify graph: it attends itself block-causally (a block attends
// its own and earlier blocks) and never the new tokens. top_ids/top_probs rows [off, off+t).
void Engine::forward_block_causal(size_t t, size_t keep) {
  OrtBackend& be = *backend_;
  if (mode_ != CacheMode::kNone) {
    if (keep)
      be.prefill(t, keep);
    else
      be.verify(t);
    return;
  }
  const size_t off = blk_.size(), cols = off + t;
  int64_t* ids = be.ids();
  int64_t* pos = be.pos();
  uint8_t* mask = be.mask();
  for (size_t i = 0; i < off; ++i) ids[i] = prefix_[i], pos[i] = static_cast<int64_t>(i);
  for (size_t r = 0; r < off; ++r) {
    uint8_t* row = mask + r * cols;
    for (size_t c = 0; c < off; ++c) row[c] = blk_[c] <= blk_[r] || c == r;
    std::fill(row + off, row + cols, uint8_t{0});
  }
  be.verify(cols);
}

void Engine::run(const std::vector<int64_t>& prompt, const DecodeOptions& cfg, Policy& policy, int n_blocks,
                 CacheMode mode, RowResult& out) {
  const int64_t m = manifest_.model.mask_token_id, eos = manifest_.model.eos_token_id;
  const size_t L = static_cast<size_t>(cfg.block_length), W = static_cast<size_t>(policy.width());
  const size_t p = prompt.size(), nb = static_cast<size_t>(n_blocks), N = p + nb * L;
  const bool bidi = manifest_.model.attention != "block_causal";  // the canvas carries the suffix
  const bool none = mode == CacheMode::kNone;
  OrtBackend& be = *backend_;
  const size_t K = static_cast<size_t>(be.topk());
  mode_ = mode, L_ = L, W_ = W, K_ = K, mask_id_ = m;
  anchor_ = bidi && manifest_.model.shift_logits && !none;  // loop.py::_Batch anchor

  // every buffer sized once (max_tokens new tokens over max_past cached, prefills within
  // max_present). Block-causal: the fused prefill (p+L), a verification (W*L) or a commit (2L),
  // over a cache of at most the prompt and the committed blocks (none: that prefix comes in front
  // of the new tokens, nothing is cached). Bidirectional: the canvas N per refresh (none: per
  // step), prefix-mode branches W*(L+S) with S up to (n_blocks-1)*L, dual ones W*L, over a cache
  // of at most N-L (the prefix, dual: and the suffix); an anchor adds one token per branch.
  if (bidi)
    be.reserve(std::max(N, W * ((anchor_ ? 1 : 0) + (mode == CacheMode::kPrefix ? nb * L : L))), none ? 0 : N - L,
               none ? 0 : N);
  else if (none)
    be.reserve(N - L + std::max(W * L, 2 * L), 0, 0);
  else
    be.reserve(std::max({p + L, W * L, 2 * L}), N, N);
  state_.resize(L);
  nodes_.resize(W * L);
  fi_.resize(L * K);
  fp_.resize(L * K);
  vi_.resize(W * L * K);
  vp_.resize(W * L * K);
  prefix_.assign(prompt.begin(), prompt.end());
  prefix_.reserve(N);  // grows by a block per commit: reserved, so the loop allocates nothing
  blk_.clear();
  blk_.reserve(N);
  out.accepted_hist.assign(W + 2, 0);
  out.token_ids.reserve(nb * L);
  be.clear_cache();
  int64_t* ids = be.ids();
  int64_t* pos = be.pos();
  uint8_t* mask = be.mask();
  std::fill(state_.begin(), state_.end(), m);

  if (bidi) {  // one forward over the canvas [prompt | L masks | suffix of masks]
    refresh(state_.data(), static_cast<int64_t>(p), (nb - 1) * L, fi_.data(), fp_.data());
  } else {
    // prefill fused with the first block's all-mask forward: [prompt | L masks]
    // mask (T,T): the prompt attends the prompt; the block attends everything
    const size_t T = p + L;
    for (size_t i = 0; i < p; ++i) ids[i] = prompt[i], pos[i] = static_cast<int64_t>(i);
    for (size_t j = 0; j < L; ++j) ids[p + j] = m, pos[p + j] = static_cast<int64_t>(p + j);
    for (size_t r = 0; r < T; ++r)
      for (size_t c = 0; c < T; ++c) mask[r * T + c] = r >= p || c < p;
    forward_block_causal(T, p);  // none: no prefix yet, so the same inputs through verify
    std::copy(be.top_ids() + p * K, be.top_ids() + T * K, fi_.begin());
    std::copy(be.top_probs() + p * K, be.top_probs() + T * K, fp_.begin());
    if (none) blk_.assign(p, 0);  // the prompt is block 0 of the prefix
  }
  out.forwards = 1;

  const int n = static_cast<int>(L);
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int64_t base = static_cast<int64_t>(p) + static_cast<int64_t>(blk) * n;  // first position of the block
    const size_t suffix = bidi ? (nb - static_cast<size_t>(blk) - 1) * L : 0;    // masks after the block
    int64_t step = 0;                                                             // rule steps taken
    bool ended = false;                                                           // EOS reached
    for (;;) {
      policy.plan(state_.data(), fi_.data(), fp_.data(), static_cast<int>(K), step, nodes_.data());
      std::copy(nodes_.begin(), nodes_.begin() + n, state_.begin());  // node 0 is known exactly
      if (finished_at(state_.data(), n, m, eos) >= 0) {
        ended = true;
        break;
      }
      if (!any_mask(state_.data(), n, m)) break;
      const int64_t* vi;
      const float* vp;
      if (bidi) {
        verify_canvas(base, suffix);
        vi = vi_.data(), vp = vp_.data();
      } else {
        // verify: W branches at positions base..base+L-1; each attends the prefix and its own L
        const size_t off = none ? blk_.size() : 0, P = none ? off : be.cache_length();
        const size_t T = W * L, cols = P + T;
        for (size_t i = 0; i < T; ++i) ids[off + i] = nodes_[i], pos[off + i] = base + static_cast<int64_t>(i % L);
        for (size_t r = 0; r < T; ++r) {
          uint8_t* row = mask + (off + r) * cols;
          std::fill(row, row + P, uint8_t{1});
          for (size_t c = 0; c < T; ++c) row[P + c] = r / L == c / L;
        }
        forward_block_causal(T, 0);
        vi = be.top_ids() + off * K, vp = be.top_probs() + off * K;
      }
      int64_t steps = 0;
      const int cur = policy.select(nodes_.data(), vi, vp, static_cast<int>(K), step, &steps);
      out.forwards += 1;
      out.accepted_hist[static_cast<size_t>(steps)] += 1;
      std::copy(nodes_.begin() + cur * n, nodes_.begin() + (cur + 1) * n, state_.begin());
      std::copy(vi + cur * L * K, vi + (cur + 1) * L * K, fi_.begin());
      std::copy(vp + cur * L * K, vp + (cur + 1) * L * K, fp_.begin());
      step += steps;
      if (finished_at(state_.data(), n, m, eos) >= 0) {
        ended = true;
        break;
      }
      if (!any_mask(state_.data(), n, m)) break;
    }
    const int64_t stop = finished_at(state_.data(), n, m, eos);
    out.token_ids.insert(out.token_ids.end(), state_.begin(), state_.begin() + (stop >= 0 ? stop : n));
    if (stop >= 0) out.finished = true;
    if (blk == n_blocks - 1 || ended) break;

    if (bidi) {
      // the finished block joins the prefix; one forward over the canvas refreshes the cache
      prefix_.insert(prefix_.end(), state_.begin(), state_.end());
      std::fill(state_.begin(), state_.end(), m);
      refresh(state_.data(), base + n, suffix - L, fi_.data(), fp_.data());
      out.forwards += 1;
      continue;
    }
    // commit the full block fused with the next block's all-mask forward: [block | L masks]
    // mask (2L, P+2L): the prefix, then block-causal between the two blocks
    const size_t off = none ? blk_.size() : 0, P = none ? off : be.cache_length();
    const size_t T = 2 * L, cols = P + T;
    for (size_t i = 0; i < T; ++i) {
      ids[off + i] = i < L ? state_[i] : m;
      pos[off + i] = base + static_cast<int64_t>(i);
    }
    for (size_t r = 0; r < T; ++r) {
      uint8_t* row = mask + (off + r) * cols;
      std::fill(row, row + P, uint8_t{1});
      for (size_t c = 0; c < T; ++c) row[P + c] = c / L <= r / L;
    }
    forward_block_causal(T, L);
    std::copy(be.top_ids() + (off + L) * K, be.top_ids() + (off + T) * K, fi_.begin());
    std::copy(be.top_probs() + (off + L) * K, be.top_probs() + (off + T) * K, fp_.begin());
    if (none) {  // the block joins the prefix as block blk+1 (the prompt is block 0)
      prefix_.insert(prefix_.end(), state_.begin(), state_.end());
      blk_.insert(blk_.end(), L, static_cast<int64_t>(blk) + 1);
    }
    out.forwards += 1;
    std::fill(state_.begin(), state_.end(), m);
  }
  while (out.accepted_hist.size() > 1 && out.accepted_hist.back() == 0) out.accepted_hist.pop_back();
}

}  // namespace dllm::detail
