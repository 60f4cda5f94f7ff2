#include "uniform_diffusion.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "error.hpp"
#include "noise.hpp"

namespace dllm::detail {

namespace {

constexpr uint64_t kInit = 1, kSample = 2, kRenoise = 3;  // uniform_diffusion.py's noise uses

// The artifact's tokenizer whose decode drops the ids that end a row and the pad id first
// (uniform_decoder.py's _decode): a finished canvas holds both.
class DroppingTokenizer : public Tokenizer {
 public:
  DroppingTokenizer(std::unique_ptr<Tokenizer> inner, std::vector<int64_t> drop)
      : inner_(std::move(inner)), drop_(std::move(drop)) {}
  std::vector<int64_t> encode(const std::string& text) const override { return inner_->encode(text); }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int64_t> kept;
    for (int64_t x : ids)
      if (std::find(drop_.begin(), drop_.end(), x) == drop_.end()) kept.push_back(x);
    return inner_->decode(kept);
  }

 private:
  std::unique_ptr<Tokenizer> inner_;
  std::vector<int64_t> drop_;
};

// rows of a (B, n) row-major array
template <class T>
std::vector<T> gather_rows(const std::vector<T>& x, size_t n, const std::vector<size_t>& idx) {
  std::vector<T> out;
  out.reserve(idx.size() * n);
  for (size_t i : idx) out.insert(out.end(), x.begin() + static_cast<long>(i * n), x.begin() + static_cast<long>((i + 1) * n));
  return out;
}

KV gather_kv(const KV& kv, const std::vector<size_t>& idx) {
  KV out;
  for (const Tensor& t : kv) {
    const size_t per_row = t.shape[0] ? t.data.size() / static_cast<size_t>(t.shape[0]) : 0;
    Tensor g{t.shape, gather_rows(t.data, per_row, idx)};
    g.shape[0] = static_cast<int64_t>(idx.size());
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

float uniform_temperature(int step, int steps, double t_min, double t_max) {
  const float frac = static_cast<float>(step) / static_cast<float>(steps);
  return static_cast<float>(t_min) + static_cast<float>(t_max - t_min) * frac;
}

void uniform_accept(const float* entropy, size_t n, float bound, uint8_t* out) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entropy[a] < entropy[b]; });
  float sum = 0.0f;  // np.cumsum in float32, then minus the entry itself
  for (size_t i : order) {
    sum += entropy[i];
    out[i] = sum - entropy[i] <= bound;
  }
}

float numpy_sum_f32(const float* x, size_t n) {
  if (n < 8) {
    float r = 0.0f;
    for (size_t i = 0; i < n; ++i) r += x[i];
    return r;
  }
  if (n <= 128) {
    float r[8];
    std::copy(x, x + 8, r);
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += x[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += x[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum_f32(x, n2) + numpy_sum_f32(x + n2, n - n2);
}

UniformRuntime::UniformRuntime(const std::string& artifact_dir, const std::string& precision, int intra_op_threads)
    : manifest_(read_uniform_manifest(artifact_dir, precision)) {
  std::vector<int64_t> drop = manifest_.eos_ids;
  drop.push_back(manifest_.pad_id);
  tokenizer_ = std::make_unique<DroppingTokenizer>(
      make_tokenizer(manifest_.folder, manifest_.tokenizer_kind, manifest_.tokenizer_file, manifest_.tokenizer_config,
                     manifest_.eos_token_id),
      drop);
  graphs_ = std::make_unique<UniformGraphs>(manifest_, intra_op_threads);
}

UniformRuntime::~UniformRuntime() = default;

UniformOptions UniformRuntime::defaults() const {
  UniformOptions o;
  for (const auto& [k, v] : manifest_.defaults) {
    if (k == "max_denoising_steps") o.max_denoising_steps = static_cast<int>(v);
    else if (k == "entropy_bound") o.entropy_bound = v;
    else if (k == "t_min") o.t_min = v;
    else if (k == "t_max") o.t_max = v;
    else if (k == "stability_threshold") o.stability_threshold = static_cast<int>(v);
    else if (k == "confidence_threshold") o.confidence_threshold = v;
  }
  return o;
}

namespace {

void check(const UniformOptions& o) {
  auto bad = [](const char* name, const std::string& want, double got) {
    char v[64];
    std::snprintf(v, sizeof v, "%g", got);
    user_error(std::string(name) + " must be " + want + ", got " + v);
  };
  if (o.max_new_tokens < 1) bad("max_new_tokens", ">= 1", o.max_new_tokens);
  if (o.max_denoising_steps < 1) bad("max_denoising_steps", ">= 1", o.max_denoising_steps);
  if (!(o.entropy_bound >= 0)) bad("entropy_bound", ">= 0", o.entropy_bound);
  if (!(o.t_min > 0 && o.t_min <= o.t_max)) bad("t_min", "in (0, t_max]", o.t_min);
  if (o.stability_threshold < 0) bad("stability_threshold", ">= 0", o.stability_threshold);
  if (!(o.confidence_threshold >= 0)) bad("confidence_threshold", ">= 0", o.confidence_threshold);
  for (const std::string& s : o.stop)
    if (s.empty()) user_error("a stop string is not empty");
}

}  // namespace

std::vector<RowResult> UniformRuntime::generate(const std::vector<std::string>& prompts, const UniformOptions& o,
                                                const ChunkSink& sink) {
  check(o);
  if (prompts.empty()) user_error("no prompt given");
  const UniformManifest& m = manifest_;
  const size_t L = static_cast<size_t>(m.canvas_length), C = static_cast<size_t>(m.hidden_size);
  const int per_row = (o.max_new_tokens + m.canvas_length - 1) / m.canvas_length;  // canvases a row may take
  const size_t n = prompts.size();
  std::vector<std::vector<int64_t>> encoded;
  size_t p0 = 0;
  for (const std::string& p : prompts) {
    encoded.push_back(tokenizer_->encode(p));
    if (encoded.back().empty()) user_error("empty prompt");
    const int64_t span = static_cast<int64_t>(per_row) * m.canvas_length;
    if (static_cast<int64_t>(encoded.back().size()) + span > m.max_seq)
      user_error("prompt of " + std::to_string(encoded.back().size()) + " tokens + " + std::to_string(span) +
                 " generated exceeds the model's max_seq " + std::to_string(m.max_seq));
    p0 = std::max(p0, encoded.back().size());
  }
  std::vector<RowResult> out(n);
  std::vector<RowStream> streams(n, RowStream(*tokenizer_, o.stop, o.max_new_tokens, m.eos_ids));
  std::vector<std::vector<int64_t>> final_ids(n);
  std::vector<uint8_t> finished(n, 0);
  std::vector<int64_t> forwards(n, 0), encodes(n, 0);
  const double backend0 = graphs_->run_seconds;
  const auto t0 = std::chrono::steady_clock::now();
  bool cancelled = false;
  Chunk chunk;

  // the batch (left-padded prompts; each row's positions count from its own first token)
  std::vector<size_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int64_t> offset(n), pending(n * p0, m.pad_id), made(n, 0);
  std::vector<uint8_t> keep(n * p0, 0);
  for (size_t b = 0; b < n; ++b) {
    offset[b] = static_cast<int64_t>(p0 - encoded[b].size());
    for (size_t j = 0; j < encoded[b].size(); ++j)
      pending[b * p0 + static_cast<size_t>(offset[b]) + j] = encoded[b][j], keep[b * p0 + static_cast<size_t>(offset[b]) + j] = 1;
  }
  size_t width = p0, start = 0;
  KV past = graphs_->empty(n);
  const size_t S = static_cast<size_t>(o.stability_threshold);
  const int steps = o.max_denoising_steps;
  const uint64_t request = 0;  // every row's request word (Python's RowOptions default)

  while (!rows.empty()) {
    const size_t B = rows.size(), T = width - start;
    std::vector<int64_t> epos(B * T);
    for (size_t b = 0; b < B; ++b)
      for (size_t j = 0; j < T; ++j) epos[b * T + j] = std::max<int64_t>(static_cast<int64_t>(start + j) - offset[b], 0);
    past = graphs_->encode(pending, epos, B, keep, past);
    for (size_t r : rows) encodes[r] += 1;
    const size_t cur = width;
    std::vector<int64_t> pos(B * L), canvas(B * L), argmax, fresh(B * L);
    for (size_t b = 0; b < B; ++b)
      for (size_t j = 0; j < L; ++j) {
        pos[b * L + j] = static_cast<int64_t>(cur + j) - offset[b];
        canvas[b * L + j] = uniform_token(o.seed, request, pos[b * L + j], 0, kInit, m.vocab_size);
      }
    argmax = canvas;
    std::vector<float> soft(B * L * C, 0.0f), u(B * L), entropy(B * L);
    std::vector<uint8_t> done(B, 0), chosen(B * L);
    std::vector<int64_t> history(S * B * L, -1), am(B * L), sampled(B * L);
    DenoiseOut step_out;
    for (int s = steps; s > 0; --s) {
      std::vector<size_t> live;
      for (size_t b = 0; b < B; ++b)
        if (!done[b] && !finished[rows[b]]) live.push_back(b), forwards[rows[b]] += 1;
      const float t = uniform_temperature(s, steps, o.t_min, o.t_max);
      for (size_t i = 0; i < B * L; ++i) u[i] = sample_uniform(o.seed, request, pos[i], s, kSample);
      am = canvas, sampled = canvas;
      std::fill(entropy.begin(), entropy.end(), 0.0f);
      if (!live.empty()) {  // the live rows only: a stopped row costs nothing more
        if (live.size() == B) {
          graphs_->denoise(canvas, pos, B, keep, past, soft, std::vector<float>(B, t), u, step_out);
        } else {
          graphs_->denoise(gather_rows(canvas, L, live), gather_rows(pos, L, live), live.size(),
                           gather_rows(keep, width, live), gather_kv(past, live), gather_rows(soft, L * C, live),
                           std::vector<float>(live.size(), t), gather_rows(u, L, live), step_out);
        }
        for (size_t i = 0; i < live.size(); ++i) {
          const size_t b = live[i];
          std::copy_n(step_out.argmax.begin() + static_cast<long>(i * L), L, am.begin() + static_cast<long>(b * L));
          std::copy_n(step_out.sampled.begin() + static_cast<long>(i * L), L, sampled.begin() + static_cast<long>(b * L));
          std::copy_n(step_out.entropy.begin() + static_cast<long>(i * L), L, entropy.begin() + static_cast<long>(b * L));
          std::copy_n(step_out.soft.begin() + static_cast<long>(i * L * C), L * C, soft.begin() + static_cast<long>(b * L * C));
        }
      }
      for (size_t b = 0; b < B; ++b) {
        if (!done[b])   // a stopped row's canvas stays: nothing to accept
          uniform_accept(entropy.data() + b * L, L, static_cast<float>(o.entropy_bound), chosen.data() + b * L);
        bool stable = true;
        for (size_t j = 0; j < L; ++j) {
          const size_t i = b * L + j;
          if (done[b]) {
            am[i] = argmax[i];  // a stopped row keeps its argmax and canvas
            continue;
          }
          canvas[i] = chosen[i] ? sampled[i] : uniform_token(o.seed, request, pos[i], s, kRenoise, m.vocab_size);
        }
        if (S) {
          for (size_t k = 0; k < S && stable; ++k)
            stable = std::equal(am.begin() + static_cast<long>(b * L), am.begin() + static_cast<long>((b + 1) * L),
                                history.begin() + static_cast<long>((k * B + b) * L));
          for (size_t k = 0; k + 1 < S; ++k)  // np.roll(history, -1, axis=0); history[-1] = am
            std::copy_n(history.begin() + static_cast<long>(((k + 1) * B + b) * L), L, history.begin() + static_cast<long>((k * B + b) * L));
          std::copy_n(am.begin() + static_cast<long>(b * L), L, history.begin() + static_cast<long>(((S - 1) * B + b) * L));
        }
        const float mean = numpy_sum_f32(entropy.data() + b * L, L) / static_cast<float>(L);
        if (stable && mean < static_cast<float>(o.confidence_threshold)) done[b] = 1;
      }
      argmax = am;
      bool all_done = true;
      for (size_t b = 0; b < B && all_done; ++b) all_done = done[b] || finished[rows[b]];
      if (all_done) break;
    }
    // the canvas joins the sequences: pad in rows that finished; after an EOS, pad
    for (size_t b = 0; b < B; ++b) {
      const size_t r = rows[b];
      made[b] += 1;
      bool has_eos = false;
      for (size_t j = 0; j < L && !has_eos; ++j)
        has_eos = std::find(m.eos_ids.begin(), m.eos_ids.end(), argmax[b * L + j]) != m.eos_ids.end();
      const bool ending = made[b] >= per_row || has_eos;
      bool seen = false;
      for (size_t j = 0; j < L; ++j) {
        int64_t& x = argmax[b * L + j];
        if (finished[r] || seen) x = m.pad_id;
        else seen = std::find(m.eos_ids.begin(), m.eos_ids.end(), x) != m.eos_ids.end();
      }
      finished[r] = finished[r] || ending;
      if (streams[r].finished() || cancelled) continue;
      // its tokens (pad is no token) up to an EOS, to its stream: one chunk per canvas
      bool end = false;
      for (size_t j = 0; j < L && !end; ++j) {
        const int64_t x = argmax[b * L + j];
        if (x == m.pad_id) continue;
        final_ids[r].push_back(x);
        end = std::find(m.eos_ids.begin(), m.eos_ids.end(), x) != m.eos_ids.end();
      }
      const int64_t cut = std::min<int64_t>(static_cast<int64_t>(final_ids[r].size()), streams[r].budget());
      if (finished[r] && !end) streams[r].set_budget(cut);  // the canvases ran out: what the row has is all
      if (streams[r].report(final_ids[r], forwards[r] + encodes[r], &chunk, /*always=*/true)) {
        if (out[r].time_to_first_token_s < 0 && !chunk.token_ids.empty())
          out[r].time_to_first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (sink && !sink(r, chunk) && !streams[r].finished()) cancelled = true;
      }
      if (streams[r].finished()) finished[r] = 1;
    }
    if (cancelled)
      for (size_t r : rows) finished[r] = 1;
    // the next canvas starts after this one; finished rows leave the batch
    std::vector<uint8_t> keep2;
    std::vector<size_t> alive;
    for (size_t b = 0; b < B; ++b)
      if (!finished[rows[b]]) alive.push_back(b);
    for (size_t b : alive) {
      keep2.insert(keep2.end(), keep.begin() + static_cast<long>(b * width), keep.begin() + static_cast<long>((b + 1) * width));
      keep2.insert(keep2.end(), L, 1);
    }
    pending = gather_rows(argmax, L, alive);
    keep.swap(keep2);
    start = cur, width = cur + L;
    if (alive.size() < B) {
      past = gather_kv(past, alive);
      std::vector<size_t> rows2;
      std::vector<int64_t> offset2, made2;
      for (size_t b : alive) rows2.push_back(rows[b]), offset2.push_back(offset[b]), made2.push_back(made[b]);
      rows.swap(rows2), offset.swap(offset2), made.swap(made2);
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < n; ++i) {
    out[i].forwards = forwards[i] + encodes[i];
    out[i].finish(streams[i], wall, graphs_->run_seconds - backend0);
  }
  return out;
}

}  // namespace dllm::detail
