#include "self_spec.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>

#include "decoder.hpp"
#include "error.hpp"
#include "noise.hpp"

namespace dllm::detail {

std::vector<std::vector<int64_t>> best_sequences(const int64_t* ids, const float* probs, size_t n, size_t k,
                                                 size_t width) {
  // (cost, sequence): cost = -sum log p, ties broken by the sequence (Python's tuple order)
  std::vector<std::pair<double, std::vector<int64_t>>> beam{{0.0, {}}}, cand;
  for (size_t d = 0; d < n; ++d) {
    cand.clear();
    for (const auto& [cost, seq] : beam)
      for (size_t j = 0; j < k; ++j) {
        std::vector<int64_t> next = seq;
        next.push_back(ids[d * k + j]);
        cand.emplace_back(cost - std::log(std::max(static_cast<double>(probs[d * k + j]), 1e-30)), std::move(next));
      }
    const size_t keep = std::min(width, cand.size());
    std::partial_sort(cand.begin(), cand.begin() + static_cast<long>(keep), cand.end());
    cand.resize(keep);
    beam.swap(cand);
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& [cost, seq] : beam) out.push_back(std::move(seq));
  return out;
}

Trie build_trie(int64_t seed, const int64_t* ids, const float* probs, size_t n, size_t k, size_t width) {
  Trie t{{seed}, {-1}, {0}};
  std::map<std::pair<int64_t, int64_t>, int64_t> child;
  for (const std::vector<int64_t>& seq : best_sequences(ids, probs, n, k, width)) {
    int64_t at = 0;
    for (size_t d = 0; d < seq.size(); ++d) {
      auto it = child.find({at, seq[d]});
      if (it == child.end()) {
        const int64_t node = static_cast<int64_t>(t.tokens.size());
        it = child.emplace(std::make_pair(at, seq[d]), node).first;
        t.tokens.push_back(seq[d]), t.parent.push_back(at), t.depth.push_back(static_cast<int64_t>(d) + 1);
      }
      at = it->second;
    }
  }
  return t;
}

std::vector<size_t> accepted_path(const Trie& trie, const int64_t* predicted, size_t stride) {
  std::vector<size_t> path{0};
  for (bool moved = true; moved;) {
    moved = false;
    const size_t at = path.back();
    for (size_t i = at + 1; i < trie.tokens.size(); ++i)
      if (trie.parent[i] == static_cast<int64_t>(at) && trie.tokens[i] == predicted[at * stride]) {
        path.push_back(i), moved = true;
        break;
      }
  }
  return path;
}

namespace {

// The decode state of one self-speculative call (runtime/self_spec.py::_Batch).
struct SpecRun {
  OrtBackend& be;
  const SelfSpecOptions& o;
  int64_t mask_id, eos_id;
  size_t L, width, K;
  std::vector<size_t> rows;              // live row -> its prompt
  std::vector<std::vector<uint8_t>> valid;  // per live row: the cache columns it attends
  std::vector<int64_t> next_pos, seed;   // per live row
  std::vector<RowResult>& out;
  std::vector<RowStream>& streams;       // per prompt: its released text and ids (stream.hpp)
  const ChunkSink* sink;                 // NULL: no chunks delivered
  std::chrono::steady_clock::time_point t0;
  bool cancelled = false;                // the sink asked to stop
  Chunk chunk{};

  size_t B() const { return rows.size(); }
  size_t P() const { return be.cache_length(); }

  // ids/pos/mask of a call of T tokens: the valid cache columns, then `inner` (B,T,T) among the new ones
  // (`sample`: the causal calls draw with each position's uniform; the draft takes its top-K greedily)
  void feed(size_t T, const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, const std::vector<uint8_t>& inner,
            bool sample = true) {
    be.set_sampling(sample ? o.temperature : 0.0f, 0, 1.0f);
    be.reserve(B(), T, P() + T, P() + T);
    const size_t S = P() + T;
    std::copy(ids.begin(), ids.end(), be.ids());
    std::copy(pos.begin(), pos.end(), be.pos());
    uint8_t* m = be.mask();
    for (size_t r = 0; r < B(); ++r)
      for (size_t i = 0; i < T; ++i) {
        std::copy(valid[r].begin(), valid[r].end(), m + (r * T + i) * S);
        std::copy_n(inner.begin() + static_cast<long>((r * T + i) * T), T, m + (r * T + i) * S + P());
      }
    float* u = be.sample_u();
    for (size_t r = 0; r < B(); ++r)
      for (size_t i = 0; i < T; ++i)
        u[r * T + i] = sample && o.temperature > 0 ? sample_uniform(o.seed, rows[r], pos[r * T + i] + 1, 0) : 0.0f;
  }

  // The rows' emitted tokens to their results (cut at EOS and the budget) and their streams (a
  // chunk to the sink when one is due: a round's tokens are final); the finished rows leave.
  void advance(const std::vector<std::vector<int64_t>>& emitted, bool first) {
    std::vector<size_t> alive;
    for (size_t r = 0; r < B(); ++r) {
      const size_t row = rows[r];
      RowResult& res = out[row];
      if (!first) {
        const size_t n = emitted[r].size();
        if (res.accepted_hist.size() <= n) res.accepted_hist.resize(n + 1, 0);
        res.accepted_hist[n] += 1;
      }
      bool eos = false;
      for (int64_t x : emitted[r]) {
        if (x == eos_id) {
          eos = true;
          break;
        }
        if (static_cast<int>(res.token_ids.size()) >= o.max_new_tokens) break;
        res.token_ids.push_back(x);
      }
      if (eos) res.token_ids.push_back(eos_id);  // the stream cuts just after it and ends the row ("eos")
      if (!cancelled && streams[row].report(res.token_ids, res.forwards, &chunk)) {
        if (res.time_to_first_token_s < 0 && !chunk.token_ids.empty())
          res.time_to_first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (sink && !(*sink)(row, chunk) && !streams[row].finished()) cancelled = true;
      }
      if (!streams[row].finished() && !eos && static_cast<int>(res.token_ids.size()) < o.max_new_tokens) alive.push_back(r);
    }
    if (cancelled) alive.clear();
    if (alive.size() == B()) return;
    be.keep_rows(alive);
    std::vector<size_t> rows2;
    std::vector<std::vector<uint8_t>> valid2;
    std::vector<int64_t> pos2, seed2;
    for (size_t r : alive)
      rows2.push_back(rows[r]), valid2.push_back(std::move(valid[r])), pos2.push_back(next_pos[r]), seed2.push_back(seed[r]);
    rows.swap(rows2), valid.swap(valid2), next_pos.swap(pos2), seed.swap(seed2);
  }

  void prefill(const std::vector<std::vector<int64_t>>& prompts) {
    size_t lp = 0;
    for (const auto& p : prompts) lp = std::max(lp, p.size());
    std::vector<int64_t> ids(B() * lp, eos_id), pos(B() * lp, 0);
    std::vector<uint8_t> inner(B() * lp * lp, 0);
    for (size_t r = 0; r < B(); ++r) {
      const size_t off = lp - prompts[r].size();
      valid[r].assign(lp, 0);
      for (size_t j = 0; j < lp; ++j) {
        if (j >= off) ids[r * lp + j] = prompts[r][j - off], pos[r * lp + j] = static_cast<int64_t>(j - off), valid[r][j] = 1;
        for (size_t c = 0; c <= j; ++c) inner[(r * lp + j) * lp + c] = c == j || (c >= off);
      }
      next_pos[r] = static_cast<int64_t>(prompts[r].size());
    }
    std::vector<std::vector<uint8_t>> none(B());
    std::swap(valid, none);                           // the prompt's forward attends no cache
    feed(lp, ids, pos, inner);
    std::swap(valid, none);
    be.prefill(lp, lp);
    std::vector<std::vector<int64_t>> emitted(B());
    for (size_t r = 0; r < B(); ++r) {
      seed[r] = be.top_ids()[(r * lp + lp - 1) * K];
      emitted[r] = {seed[r]};
      out[rows[r]].forwards = 1;
    }
    advance(emitted, true);
  }

  std::vector<Trie> draft() {
    std::vector<Trie> tries(B());
    if (width == 0) {
      for (size_t r = 0; r < B(); ++r) tries[r] = Trie{{seed[r]}, {-1}, {0}};
      return tries;
    }
    std::vector<int64_t> ids(B() * L, mask_id), pos(B() * L);
    for (size_t r = 0; r < B(); ++r) {
      ids[r * L] = seed[r];
      for (size_t i = 0; i < L; ++i) pos[r * L + i] = next_pos[r] + static_cast<int64_t>(i);
      out[rows[r]].forwards += 1;
    }
    feed(L, ids, pos, std::vector<uint8_t>(B() * L * L, 1), false);
    be.verify(L);
    for (size_t r = 0; r < B(); ++r)
      tries[r] = build_trie(seed[r], be.top_ids() + (r * L + 1) * K, be.top_probs() + (r * L + 1) * K, L - 1, K, width);
    return tries;
  }

  // fastdiffuser: the rows' blocks [seed, MASK x (L-1)] denoised by draft forwards (self_spec.py::_diffuse)
  std::vector<int64_t> diffuse() {
    std::vector<int64_t> block(B() * L, mask_id), pos(B() * L);
    for (size_t r = 0; r < B(); ++r) {
      block[r * L] = seed[r];
      for (size_t i = 0; i < L; ++i) pos[r * L + i] = next_pos[r] + static_cast<int64_t>(i);
    }
    const std::vector<uint8_t> both(B() * L * L, 1);
    for (bool masked = true; masked;) {
      feed(L, block, pos, both, false);
      be.verify(L);
      masked = false;
      for (size_t r = 0; r < B(); ++r) {
        const int64_t* ids = be.top_ids() + r * L * K;
        const float* probs = be.top_probs() + r * L * K;
        size_t best = L;
        for (size_t i = 0; i < L; ++i)   // the first most confident masked position (numpy's argmax)
          if (block[r * L + i] == mask_id && (best == L || probs[i * K] > probs[best * K])) best = i;
        if (best == L) continue;
        out[rows[r]].forwards += 1;
        std::vector<size_t> take{best};
        for (size_t i = 0; i < L; ++i)
          if (i != best && block[r * L + i] == mask_id && static_cast<double>(probs[i * K]) >= o.threshold) take.push_back(i);
        for (size_t i : take) block[r * L + i] = ids[i * K];
        for (size_t i = 0; i < L && !masked; ++i) masked = block[r * L + i] == mask_id;
      }
    }
    return block;
  }

  // fastdiffuser: one causal forward over the finished blocks: their KV and the next seeds (_commit_block)
  void commit_block(const std::vector<int64_t>& block) {
    std::vector<int64_t> pos(B() * L);
    std::vector<uint8_t> causal(B() * L * L, 0);
    for (size_t r = 0; r < B(); ++r)
      for (size_t i = 0; i < L; ++i) {
        pos[r * L + i] = next_pos[r] + static_cast<int64_t>(i);
        for (size_t j = 0; j <= i; ++j) causal[(r * L + i) * L + j] = 1;
      }
    feed(L, block, pos, causal);
    be.prefill(L, L);
    std::vector<std::vector<int64_t>> emitted(B());
    for (size_t r = 0; r < B(); ++r) {
      out[rows[r]].forwards += 1;
      valid[r].insert(valid[r].end(), L, 1);
      seed[r] = be.top_ids()[(r * L + L - 1) * K];
      emitted[r].assign(block.begin() + static_cast<long>(r * L + 1), block.begin() + static_cast<long>((r + 1) * L));
      emitted[r].push_back(seed[r]);
      next_pos[r] += static_cast<int64_t>(L);
    }
    advance(emitted, false);
  }

  void verify(const std::vector<Trie>& tries) {
    size_t T = 0;
    for (const Trie& t : tries) T = std::max(T, t.tokens.size());
    std::vector<int64_t> ids(B() * T, eos_id), pos(B() * T);
    std::vector<uint8_t> inner(B() * T * T, 0);
    for (size_t r = 0; r < B(); ++r) {
      const Trie& t = tries[r];
      for (size_t i = 0; i < T; ++i) {
        inner[(r * T + i) * T + i] = 1;  // a filler node attends itself
        if (i >= t.tokens.size()) {
          pos[r * T + i] = next_pos[r];
          continue;
        }
        ids[r * T + i] = t.tokens[i], pos[r * T + i] = next_pos[r] + t.depth[i];
        for (int64_t a = t.parent[i]; a >= 0; a = t.parent[static_cast<size_t>(a)]) inner[(r * T + i) * T + static_cast<size_t>(a)] = 1;
      }
      out[rows[r]].forwards += 1;
    }
    feed(T, ids, pos, inner);
    be.prefill_run(T);
    std::vector<std::vector<size_t>> paths(B());
    size_t n = 0;
    for (size_t r = 0; r < B(); ++r) {
      paths[r] = accepted_path(tries[r], be.top_ids() + r * T * K, K);
      n = std::max(n, paths[r].size());
    }
    std::vector<int64_t> keep(B() * n);
    std::vector<std::vector<int64_t>> emitted(B());
    for (size_t r = 0; r < B(); ++r) {
      const std::vector<size_t>& p = paths[r];
      for (size_t j = 0; j < n; ++j) keep[r * n + j] = static_cast<int64_t>(p[std::min(j, p.size() - 1)]);
      for (size_t j = 0; j < n; ++j) valid[r].push_back(j < p.size());
      for (size_t j = 1; j < p.size(); ++j) emitted[r].push_back(tries[r].tokens[p[j]]);
      seed[r] = be.top_ids()[(r * T + p.back()) * K];
      emitted[r].push_back(seed[r]);
      next_pos[r] += static_cast<int64_t>(p.size());
    }
    be.commit_selected(keep, n);
    advance(emitted, false);
  }
};

}  // namespace

std::vector<RowResult> Runtime::self_spec(const std::vector<std::string>& prompts, const SelfSpecOptions& o,
                                          const ChunkSink& sink) {
  if (!self_speculative()) user_error("strategy " + quoted(o.strategy) + " decodes self-speculative models only");
  const bool diffusion = o.strategy == "fastdiffuser";
  if (o.strategy != "ar" && o.strategy != "linear-spec" && o.strategy != "tree-spec" && !diffusion)
    user_error("unknown strategy " + quoted(o.strategy) +
               " for a self-speculative model (one of ar, linear-spec, tree-spec, fastdiffuser)");
  if (!(o.threshold > 0 && o.threshold <= 1)) user_error("threshold must be in (0, 1], got " + std::to_string(o.threshold));
  if (diffusion && o.temperature > 0) user_error("fastdiffuser decodes greedily (temperature 0)");
  if (o.beam_width < 1) user_error("beam_width must be >= 1, got " + std::to_string(o.beam_width));
  if (o.block_size < 0 || o.block_size == 1) user_error("block_size must be >= 2 (or 0: the model's), got " + std::to_string(o.block_size));
  if (o.max_new_tokens < 1) user_error("max_new_tokens must be >= 1, got " + std::to_string(o.max_new_tokens));
  if (!(o.temperature >= 0)) user_error("temperature must be >= 0");
  if (prompts.empty()) user_error("no prompt given");
  const ModelConfig& mc = manifest_.model;
  const size_t L = static_cast<size_t>(o.block_size ? o.block_size : mc.block_size);
  std::vector<std::vector<int64_t>> encoded;
  for (const std::string& p : prompts) {
    encoded.push_back(tokenizer_->encode(p));
    if (encoded.back().empty()) user_error("empty prompt");
    if (static_cast<int64_t>(encoded.back().size()) + o.max_new_tokens + static_cast<int64_t>(L) > mc.max_seq)
      user_error("prompt (" + std::to_string(encoded.back().size()) + " tokens) + max_new_tokens " +
                 std::to_string(o.max_new_tokens) + " + a block of " + std::to_string(L) + " exceeds the model's max_seq " +
                 std::to_string(mc.max_seq));
  }
  const size_t width = o.strategy == "ar" ? 0 : o.strategy == "tree-spec" ? static_cast<size_t>(o.beam_width) : 1;
  std::vector<RowResult> out(prompts.size());
  for (RowResult& r : out) r.accepted_hist.assign(1, 0);
  std::vector<RowStream> streams(prompts.size(), RowStream(*tokenizer_, o.stop, o.max_new_tokens, mc.eos_token_id));
  const double backend0 = backend_->run_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  backend_->clear_cache();
  backend_->reserve(prompts.size(), 1, 0, 1);
  SpecRun run{*backend_, o, mc.mask_token_id, mc.eos_token_id, L, width, static_cast<size_t>(backend_->topk()),
              {}, std::vector<std::vector<uint8_t>>(prompts.size()), std::vector<int64_t>(prompts.size()),
              std::vector<int64_t>(prompts.size()), out, streams, sink ? &sink : nullptr, t0};
  for (size_t i = 0; i < prompts.size(); ++i) run.rows.push_back(i);
  run.prefill(encoded);
  while (run.B()) {
    if (diffusion) run.commit_block(run.diffuse());
    else run.verify(run.draft());
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].finish(streams[i], wall, backend_->run_seconds - backend0);
    out[i].beam_width_used = out[i].beam_width_requested = static_cast<int>(std::max<size_t>(width, 1));
  }
  return out;
}

}  // namespace dllm::detail
