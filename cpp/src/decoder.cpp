#include "decoder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "error.hpp"
#include "json.hpp"

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

std::string resolve_cache(const std::string& mode, const std::string& attention) {
  if (mode != "none" && mode != "prefix" && mode != "dual" && mode != "exact" && mode != "auto")
    user_error("unknown cache mode " + quoted(mode) + " (expected one of none, prefix, dual, exact, auto)");
  if (mode == "auto") return attention == "block_causal" ? "exact" : "prefix";
  if (mode == "exact" && attention != "block_causal")
    user_error("cache mode 'exact' needs a block-causal model; use 'prefix' or 'none' for a bidirectional one");
  if (mode == "dual")
    fail(DLLM_ERROR_UNSUPPORTED, "cache mode 'dual' is not implemented yet; use 'prefix' (or 'auto')");
  if (mode == "none")
    fail(DLLM_ERROR_UNSUPPORTED, "cache mode 'none' is not supported in C++ yet; use 'auto', 'exact' or 'prefix'");
  if (mode == "prefix" && attention == "block_causal") return "exact";
  return mode;
}

}  // namespace

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
  cap_ = manifest_.max_beam_width;
  if (options.max_beam_width > 0) cap_ = std::min(cap_, options.max_beam_width);
  cap_ = std::max(cap_, 1);
  backend_ = std::make_unique<OrtBackend>(manifest_, options.intra_op_threads);
}

RowResult Engine::generate(const std::string& prompt, const DecodeOptions& cfg_in) {
  validate(cfg_in);
  const ModelConfig& mc = manifest_.model;
  RowResult out;
  DecodeOptions cfg = cfg_in;
  const int requested = cfg.strategy == "spd" ? cfg.beam_width : 1;
  int width = requested;
  if (width > cap_) {
    width = cap_;
    const bool artifact_cap = cap_ == manifest_.max_beam_width;
    out.warnings = "beam width " + std::to_string(requested) + " lowered to " + std::to_string(width) +
                   (artifact_cap ? " (cap from the artifact's max_beam_width)" : " (cap from the max_beam_width option)");
    if (options_.warnings_to_stderr) std::fprintf(stderr, "dllm: warning: %s\n", out.warnings.c_str());
  }
  cfg.beam_width = width;
  resolve_cache(cfg.cache, mc.attention);  // exact and prefix run the same mechanics here
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
  run(encoded, cfg, policy, n_blocks, out);
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

void Engine::run(const std::vector<int64_t>& prompt, const DecodeOptions& cfg, Policy& policy, int n_blocks,
                 RowResult& out) {
  const int64_t m = manifest_.model.mask_token_id, eos = manifest_.model.eos_token_id;
  const size_t L = static_cast<size_t>(cfg.block_length), W = static_cast<size_t>(policy.width());
  const size_t p = prompt.size();
  OrtBackend& be = *backend_;
  const size_t K = static_cast<size_t>(be.topk());

  // every buffer sized once: the largest call is the fused prefill (p+L), a verification (W*L)
  // or a commit (2L); the cache never holds more than the prompt and the committed blocks
  be.reserve(std::max({p + L, W * L, 2 * L}), p + static_cast<size_t>(n_blocks) * L);
  state_.resize(L);
  nodes_.resize(W * L);
  fi_.resize(L * K);
  fp_.resize(L * K);
  out.accepted_hist.assign(W + 2, 0);
  out.token_ids.reserve(static_cast<size_t>(n_blocks) * L);
  be.clear_cache();
  int64_t* ids = be.ids();
  int64_t* pos = be.pos();
  uint8_t* mask = be.mask();

  // prefill fused with the first block's all-mask forward: [prompt | L masks]
  // mask (T,T): the prompt attends the prompt; the block attends everything
  size_t T = p + L;
  for (size_t i = 0; i < p; ++i) ids[i] = prompt[i], pos[i] = static_cast<int64_t>(i);
  for (size_t j = 0; j < L; ++j) ids[p + j] = m, pos[p + j] = static_cast<int64_t>(p + j);
  for (size_t r = 0; r < T; ++r)
    for (size_t c = 0; c < T; ++c) mask[r * T + c] = r >= p || c < p;
  be.prefill(T, p);
  std::copy(be.top_ids() + p * K, be.top_ids() + T * K, fi_.begin());
  std::copy(be.top_probs() + p * K, be.top_probs() + T * K, fp_.begin());
  out.forwards = 1;
  std::fill(state_.begin(), state_.end(), m);

  const int n = static_cast<int>(L);
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int64_t base = static_cast<int64_t>(p) + static_cast<int64_t>(blk) * n;  // first position of the block
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
      // verify: W branches at positions base..base+L-1; each attends the prefix and its own L
      const size_t P = be.cache_length();
      T = W * L;
      const size_t cols = P + T;
      for (size_t i = 0; i < T; ++i) ids[i] = nodes_[i], pos[i] = base + static_cast<int64_t>(i % L);
      for (size_t r = 0; r < T; ++r) {
        uint8_t* row = mask + r * cols;
        std::fill(row, row + P, 1);
        for (size_t c = 0; c < T; ++c) row[P + c] = r / L == c / L;
      }
      be.verify(T);
      int64_t steps = 0;
      const int cur = policy.select(nodes_.data(), be.top_ids(), be.top_probs(), static_cast<int>(K), step, &steps);
      out.forwards += 1;
      out.accepted_hist[static_cast<size_t>(steps)] += 1;
      std::copy(nodes_.begin() + cur * n, nodes_.begin() + (cur + 1) * n, state_.begin());
      std::copy(be.top_ids() + cur * L * K, be.top_ids() + (cur + 1) * L * K, fi_.begin());
      std::copy(be.top_probs() + cur * L * K, be.top_probs() + (cur + 1) * L * K, fp_.begin());
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

    // commit the full block fused with the next block's all-mask forward: [block | L masks]
    // mask (2L, P+2L): the prefix, then block-causal between the two blocks
    const size_t P = be.cache_length();
    T = 2 * L;
    const size_t cols = P + T;
    for (size_t i = 0; i < T; ++i) {
      ids[i] = i < L ? state_[i] : m;
      pos[i] = base + static_cast<int64_t>(i);
    }
    for (size_t r = 0; r < T; ++r) {
      uint8_t* row = mask + r * cols;
      std::fill(row, row + P, 1);
      for (size_t c = 0; c < T; ++c) row[P + c] = c / L <= r / L;
    }
    be.prefill(T, L);
    std::copy(be.top_ids() + L * K, be.top_ids() + T * K, fi_.begin());
    std::copy(be.top_probs() + L * K, be.top_probs() + T * K, fp_.begin());
    out.forwards += 1;
    std::fill(state_.begin(), state_.end(), m);
  }
  while (out.accepted_hist.size() > 1 && out.accepted_hist.back() == 0) out.accepted_hist.pop_back();
}

}  // namespace dllm::detail
