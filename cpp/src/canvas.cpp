#include "canvas.hpp"

#include <algorithm>
#include <stdexcept>

namespace dllm::detail {

CacheMode cache_mode_named(const std::string& name) {
  if (name == "none") return CacheMode::kNone;
  if (name == "exact") return CacheMode::kExact;
  if (name == "prefix") return CacheMode::kPrefix;
  if (name == "dual") return CacheMode::kDual;
  if (name == "delayed") return CacheMode::kDelayed;
  throw std::invalid_argument("unknown cache mode " + name);
}

namespace {

// (B,S,S) among S fed tokens: a token attends the valid tokens of its block and of earlier blocks
// (one block id everywhere: bidirectional); a pad attends itself (canvas.py::_attend).
std::vector<uint8_t> attend(const std::vector<uint8_t>& valid, const std::vector<int64_t>& blocks, size_t b, size_t s) {
  std::vector<uint8_t> m(b * s * s);
  for (size_t r = 0; r < b; ++r)
    for (size_t i = 0; i < s; ++i)
      for (size_t j = 0; j < s; ++j)
        m[(r * s + i) * s + j] = (valid[r * s + j] && blocks[r * s + j] <= blocks[r * s + i]) || i == j;
  return m;
}

// (B,T,C+T): every fed token attends the valid cached keys (B,C); `fresh` (T,T) among the fed.
std::vector<uint8_t> over_cache(const std::vector<uint8_t>& cached_valid, size_t b, size_t c,
                                const std::vector<uint8_t>& fresh, size_t t) {
  std::vector<uint8_t> m(b * t * (c + t));
  for (size_t r = 0; r < b; ++r)
    for (size_t i = 0; i < t; ++i) {
      uint8_t* row = &m[(r * t + i) * (c + t)];
      for (size_t j = 0; j < c; ++j) row[j] = cached_valid[r * c + j];
      for (size_t j = 0; j < t; ++j) row[c + j] = fresh[i * t + j];
    }
  return m;
}

// (T,T), T = W*G: token i attends token j when block(j) `rel` block(i), blocks of g tokens
// (tree: ==, each branch itself only; block-causal: <=).
template <class Rel>
std::vector<uint8_t> blockwise(size_t t, size_t g, Rel rel) {
  std::vector<uint8_t> m(t * t);
  for (size_t i = 0; i < t; ++i)
    for (size_t j = 0; j < t; ++j) m[i * t + j] = rel(j / g, i / g);
  return m;
}

// (W,L) read columns: branch w position j at base + w * stride + j.
std::vector<int64_t> columns(size_t w, size_t n, size_t base, size_t stride) {
  std::vector<int64_t> read(w * n);
  for (size_t k = 0; k < w; ++k)
    for (size_t j = 0; j < n; ++j) read[k * n + j] = int64_t(base + k * stride + j);
  return read;
}

// (B,T) the n positions after the prefix, row by row, tiled w times.
std::vector<int64_t> next_positions(const Prefix& prefix, size_t n, size_t w = 1) {
  std::vector<int64_t> pos;
  pos.reserve(prefix.rows * n * w);
  for (size_t r = 0; r < prefix.rows; ++r)
    for (size_t k = 0; k < w; ++k)
      for (size_t i = 0; i < n; ++i) pos.push_back(prefix.next_position(r, i));
  return pos;
}

// Row-wise concatenation of (B,x) and (B,y).
template <class T>
std::vector<T> concat(const std::vector<T>& a, size_t x, const T* b, size_t y, size_t rows) {
  std::vector<T> out;
  out.reserve(rows * (x + y));
  for (size_t r = 0; r < rows; ++r) {
    out.insert(out.end(), a.begin() + long(r * x), a.begin() + long((r + 1) * x));
    out.insert(out.end(), b + r * y, b + (r + 1) * y);
  }
  return out;
}

Plan make(size_t rows, size_t tokens, size_t cached, std::vector<int64_t> ids, std::vector<int64_t> positions,
          std::vector<uint8_t> mask, size_t keep, PlanCache cache, size_t w, size_t n, std::vector<int64_t> read) {
  return Plan{rows, tokens, cached, std::move(ids), std::move(positions), std::move(mask), keep, cache, w, n,
              std::move(read)};
}

// Mode none of a block-causal model: the prefix rides in front of `plan` (whose mask already has
// the prefix as its cached keys) in a scratch cache, attending itself block-causally.
Plan recomputed(const Prefix& prefix, const Plan& plan) {
  const size_t b = prefix.rows, p = prefix.length, t = plan.tokens, cols = p + t;
  const std::vector<uint8_t> top = attend(prefix.valid, prefix.blocks, b, p);
  std::vector<uint8_t> mask(b * cols * cols, 0);
  for (size_t r = 0; r < b; ++r) {
    uint8_t* m = &mask[r * cols * cols];
    for (size_t i = 0; i < p; ++i)
      for (size_t j = 0; j < p; ++j) m[i * cols + j] = top[(r * p + i) * p + j];
    std::copy(plan.mask.begin() + long(r * t * cols), plan.mask.begin() + long((r + 1) * t * cols), m + p * cols);
  }
  std::vector<int64_t> read(plan.read);
  for (int64_t& c : read) c += int64_t(p);
  return make(b, cols, 0, concat(prefix.ids, p, plan.ids.data(), t, b),
              concat(prefix.positions, p, plan.positions.data(), t, b), std::move(mask), 0, PlanCache::kScratch,
              plan.branches, plan.length, std::move(read));
}

void block_causal(CacheMode mode) {
  if (mode != CacheMode::kExact && mode != CacheMode::kNone)
    throw std::invalid_argument("cache mode is not one of a block-causal model's (exact, none)");
}

// 1 when the prefix's last token rides in the call rather than in the cache (Dream, cached).
size_t anchored(bool anchor, CacheMode mode) {
  if (mode == CacheMode::kExact)
    throw std::invalid_argument("cache mode is not one of a bidirectional model's (none, prefix, dual)");
  return anchor && mode != CacheMode::kNone ? 1 : 0;
}

}  // namespace

Prefix Prefix::of_prompt(const std::vector<int64_t>& prompt) { return of_prompts({prompt}, 0); }

Prefix Prefix::of_prompts(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id) {
  Prefix p;
  p.rows = prompts.size();
  for (const auto& x : prompts) p.length = std::max(p.length, x.size());
  p.ids.assign(p.rows * p.length, pad_id);
  p.positions.assign(p.rows * p.length, 0);
  p.valid.assign(p.rows * p.length, 0);
  p.blocks.assign(p.rows * p.length, 0);
  for (size_t r = 0; r < p.rows; ++r) {
    const size_t pad = p.length - prompts[r].size();
    for (size_t i = 0; i < prompts[r].size(); ++i) {
      p.ids[r * p.length + pad + i] = prompts[r][i];
      p.positions[r * p.length + pad + i] = int64_t(i);
      p.valid[r * p.length + pad + i] = 1;
    }
  }
  return p;
}

void Prefix::take(const std::vector<size_t>& keep) {
  auto rows_of = [&](auto& v) {
    for (size_t j = 0; j < keep.size(); ++j)
      std::copy_n(v.begin() + long(keep[j] * length), length, v.begin() + long(j * length));
    v.resize(keep.size() * length);
  };
  rows_of(ids), rows_of(positions), rows_of(valid), rows_of(blocks);
  rows = keep.size();
}

void Prefix::extend(const int64_t* block, size_t n) {
  const size_t b = rows, p = length;
  std::vector<int64_t> pos = detail::next_positions(*this, n), blk(b * n);
  for (size_t r = 0; r < b; ++r)
    for (size_t i = 0; i < n; ++i) blk[r * n + i] = blocks[r * p + p - 1] + 1;
  const std::vector<uint8_t> ones(b * n, 1);
  ids = concat(ids, p, block, n, b);
  positions = concat(positions, p, pos.data(), n, b);
  valid = concat(valid, p, ones.data(), n, b);
  blocks = concat(blocks, p, blk.data(), n, b);
  length = p + n;
}

Plan first_block(const Prefix& prefix, const int64_t* block, size_t n, CacheMode mode) {
  block_causal(mode);
  const size_t b = prefix.rows, p = prefix.length, t = p + n;
  const std::vector<uint8_t> ones(b * n, 1);
  std::vector<int64_t> zeros(b * p, 0), one_ids(b * n, 1);
  const std::vector<int64_t> pos = next_positions(prefix, n);
  Plan plan = make(b, t, 0, concat(prefix.ids, p, block, n, b), concat(prefix.positions, p, pos.data(), n, b),
                   attend(concat(prefix.valid, p, ones.data(), n, b), concat(zeros, p, one_ids.data(), n, b), b, t),
                   p, PlanCache::kReuse, 1, n, columns(1, n, p, 0));
  if (mode == CacheMode::kNone) plan.keep = 0, plan.cache = PlanCache::kScratch;
  return plan;
}

Plan tree_verify(const Prefix& prefix, const int64_t* nodes, size_t w, size_t n, CacheMode mode) {
  block_causal(mode);
  const size_t b = prefix.rows, t = w * n;
  Plan plan = make(b, t, prefix.length, std::vector<int64_t>(nodes, nodes + b * t), next_positions(prefix, n, w),
                   over_cache(prefix.valid, b, prefix.length, blockwise(t, n, [](size_t k, size_t q) { return k == q; }), t),
                   0, PlanCache::kReuse, w, n, columns(w, n, 0, n));
  return mode == CacheMode::kExact ? plan : recomputed(prefix, plan);
}

Plan commit_next(const Prefix& prefix, const int64_t* block, const int64_t* nxt, size_t n, CacheMode mode) {
  block_causal(mode);
  const size_t b = prefix.rows, t = 2 * n;
  std::vector<int64_t> blk(block, block + b * n);
  Plan plan = make(b, t, prefix.length, concat(blk, n, nxt, n, b), next_positions(prefix, t),
                   over_cache(prefix.valid, b, prefix.length, blockwise(t, n, [](size_t k, size_t q) { return k <= q; }), t),
                   n, PlanCache::kReuse, 1, n, columns(1, n, n, 0));
  return mode == CacheMode::kExact ? plan : recomputed(prefix, plan);
}

Plan held_verify(const Prefix& prefix, const std::vector<uint8_t>& held, size_t e, const int64_t* block,
                 const uint8_t* fresh, size_t n, int64_t mask_id, int64_t pad_id) {
  const size_t b = prefix.rows, p = prefix.length;
  size_t f = 0, m = 0;  // the batch's most fresh and most masked positions
  for (size_t r = 0; r < b; ++r) {
    size_t fr = 0, mr = 0;
    for (size_t i = 0; i < n; ++i) fr += fresh[r * n + i] != 0, mr += block[r * n + i] == mask_id;
    f = std::max(f, fr), m = std::max(m, mr);
  }
  const size_t t = f + m, c = p + e;
  std::vector<int64_t> ids(b * t, pad_id), pos(b * t), read(b * n, 0);
  std::vector<uint8_t> real(b * t, 0), mask(b * t * (c + t), 0);
  for (size_t r = 0; r < b; ++r) {
    size_t at = 0, am = f;
    const int64_t first = prefix.next_position(r, 0);
    for (size_t i = 0; i < t; ++i) pos[r * t + i] = first;  // a pad sits at the block's start
    for (size_t i = 0; i < n; ++i) {
      const bool is_fresh = fresh[r * n + i] != 0, masked = block[r * n + i] == mask_id;
      if (!is_fresh && !masked) continue;
      const size_t col = is_fresh ? at++ : am++;
      ids[r * t + col] = block[r * n + i], pos[r * t + col] = prefix.next_position(r, i), real[r * t + col] = 1;
      if (masked) read[r * n + i] = int64_t(col);
    }
    for (size_t i = 0; i < t; ++i) {
      uint8_t* row = &mask[(r * t + i) * (c + t)];
      const bool ri = real[r * t + i] != 0;
      for (size_t j = 0; j < p; ++j) row[j] = ri && prefix.valid[r * p + j];
      for (size_t j = 0; j < e; ++j) row[p + j] = ri && held[r * e + j];
      for (size_t j = 0; j < t; ++j) row[c + j] = (ri && real[r * t + j]) || i == j;
    }
  }
  Plan plan = make(b, t, c, std::move(ids), std::move(pos), std::move(mask), f, PlanCache::kReuse, 1, n, std::move(read));
  plan.per_row = true;
  return plan;
}

Plan refresh(const Prefix& prefix, const int64_t* block, size_t n, size_t suffix_len, int64_t mask_id,
             CacheMode mode, bool anchor) {
  const size_t a = anchored(anchor, mode), b = prefix.rows, p = prefix.length, s = suffix_len, t = p + n + s;
  const bool dual = mode == CacheMode::kDual;
  std::vector<size_t> order(t);  // canvas column of each fed token
  for (size_t i = 0; i < t; ++i) order[i] = i;
  if (dual) {  // [prefix (less the anchor) | suffix | anchor | block]
    for (size_t i = 0; i < s; ++i) order[p - a + i] = p + n + i;
    for (size_t i = 0; i < a + n; ++i) order[p - a + s + i] = p - a + i;
  }
  std::vector<int64_t> ids(b * t), pos(b * t);
  const std::vector<int64_t> next = next_positions(prefix, n + s);
  for (size_t r = 0; r < b; ++r)
    for (size_t i = 0; i < t; ++i) {
      const size_t k = order[i];  // canvas column [prefix | block | suffix]
      ids[r * t + i] = k < p ? prefix.ids[r * p + k] : k < p + n ? block[r * n + k - p] : mask_id;
      pos[r * t + i] = k < p ? prefix.positions[r * p + k] : next[r * (n + s) + k - p];
    }
  std::vector<uint8_t> valid(b * t, 1);
  for (size_t r = 0; r < b; ++r)
    for (size_t i = 0; i < t; ++i)
      if (order[i] < p) valid[r * t + i] = prefix.valid[r * p + order[i]];
  const size_t keep = mode == CacheMode::kNone ? 0 : p - a + (dual ? s : 0);
  return make(b, t, 0, std::move(ids), std::move(pos), attend(valid, std::vector<int64_t>(b * t, 0), b, t), keep,
              mode == CacheMode::kNone ? PlanCache::kScratch : PlanCache::kNew, 1, n, columns(1, n, dual ? p + s : p, 0));
}

Plan canvas_verify(const Prefix& prefix, const int64_t* nodes, size_t w, size_t n, size_t suffix_len,
                   int64_t mask_id, CacheMode mode, bool anchor) {
  const size_t a = anchored(anchor, mode), b = prefix.rows, p = prefix.length;
  if (mode == CacheMode::kNone) {  // the whole canvas of node 0 (W = 1)
    std::vector<int64_t> first;
    for (size_t r = 0; r < b; ++r) first.insert(first.end(), nodes + r * w * n, nodes + r * w * n + n);
    return refresh(prefix, first.data(), n, suffix_len, mask_id, mode, anchor);
  }
  const size_t fed = mode == CacheMode::kDual ? 0 : suffix_len;  // suffix positions in each branch
  const size_t g = a + n + fed, t = w * g, c = p - a + suffix_len - fed;
  std::vector<int64_t> ids, pos;
  const std::vector<int64_t> next = next_positions(prefix, n + fed);
  std::vector<uint8_t> cached;
  for (size_t r = 0; r < b; ++r) {
    for (size_t k = 0; k < w; ++k) {
      if (a) ids.push_back(prefix.ids[r * p + p - 1]);
      ids.insert(ids.end(), nodes + (r * w + k) * n, nodes + (r * w + k + 1) * n);
      ids.insert(ids.end(), fed, mask_id);
      if (a) pos.push_back(prefix.positions[r * p + p - 1]);
      pos.insert(pos.end(), next.begin() + long(r * (n + fed)), next.begin() + long((r + 1) * (n + fed)));
    }
    cached.insert(cached.end(), prefix.valid.begin() + long(r * p), prefix.valid.begin() + long(r * p + p - a));
    cached.insert(cached.end(), suffix_len - fed, 1);
  }
  return make(b, t, c, std::move(ids), std::move(pos),
              over_cache(cached, b, c, blockwise(t, g, [](size_t k, size_t q) { return k == q; }), t), 0,
              PlanCache::kReuse, w, n, columns(w, n, a, g));
}

}  // namespace dllm::detail
