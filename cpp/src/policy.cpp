#include "policy.hpp"

#include <algorithm>
#include <cmath>

#include "error.hpp"

namespace dllm::detail {

double Schedule::tau(int64_t step, int64_t masked_left) const {
  if (masked_left <= end_tokens) return init;
  return std::max(floor, init * std::pow(decay, static_cast<double>(step)));
}

TreeSpec make_tree(const std::string& preset, int width) {
  if (width < 1) user_error("beam width must be >= 1");
  TreeSpec t;
  t.parents = {-1};
  t.kinds = {kChain};
  auto add = [&](int parent, int kind) {
    t.parents.push_back(parent);
    t.kinds.push_back(kind);
  };
  if (preset == "chain") {
    for (int i = 1; i < width; ++i) add(i - 1, kChain);
  } else if (preset == "binary" || preset == "fork") {  // each chain node: a chain child and a leaf
    const int leaf = preset == "binary" ? kRunnerUp : kAltPosition;  // runner-up token / position
    int tip = 0;
    while (t.width() < width) {
      add(tip, kChain);
      int new_tip = t.width() - 1;
      if (t.width() < width) add(tip, leaf);
      tip = new_tip;
    }
  } else if (preset == "wide") {  // node 0: chain, runner-up and conservative children; then a chain
    for (int kind : {kChain, kRunnerUp, kConservative})
      if (t.width() < width) add(0, kind);
    int tip = 1;
    while (t.width() < width) {
      add(tip, kChain);
      tip = t.width() - 1;
    }
  } else {
    user_error("unknown tree preset " + quoted(preset) + " (expected one of chain, binary, wide, fork)");
  }
  return t;
}

std::vector<int> node_depths(const TreeSpec& spec) {
  std::vector<int> d;
  for (int p : spec.parents) d.push_back(p < 0 ? 0 : d[p] + 1);
  return d;
}

int64_t Rule::count(int64_t block_len, int64_t step) const {
  if (steps == 0) return tokens_per_step;
  int64_t base = block_len / steps, rem = block_len % steps;
  return base + (step < rem ? 1 : 0);
}

Policy::Policy(const DecodeOptions& cfg, int64_t mask_id) : cfg_(cfg), mask_(mask_id), L_(cfg.block_length) {
  const int64_t blocks = std::max<int64_t>(1, (cfg.gen_length + cfg.block_length - 1) / cfg.block_length);
  const bool spd = cfg.strategy == "spd";
  if (cfg.strategy == "vanilla" || (spd && cfg.base == "vanilla" && cfg.select == "lossless")) {
    rule_.vanilla = true;
    rule_.tokens_per_step = cfg.tokens_per_step;
    rule_.steps = cfg.steps ? static_cast<int>(std::max<int64_t>(1, *cfg.steps / blocks)) : 0;
  } else {
    rule_.vanilla = false;
    rule_.tau = cfg.threshold;
    rule_.far = cfg.threshold_far;
    rule_.lead = cfg.threshold_lead;
  }
  lossy_ = spd && cfg.select == "threshold";
  has_draft_tau_ = spd;
  spec_ = make_tree(spd ? cfg.tree : "chain", spd ? cfg.beam_width : 1);
  depths_ = node_depths(spec_);
  children_.assign(spec_.width(), {});
  for (int i = 0; i < spec_.width(); ++i)
    if (spec_.parents[i] >= 0) children_[spec_.parents[i]].push_back(i);
  ranked_.resize(L_);
  take_.reserve(L_);
  ids1_.resize(L_);
  truth_.resize(L_);
  p1_.resize(L_);
  kids_.reserve(spec_.width());
  filled_.resize(spec_.width());
}

bool Policy::has_mask(const int64_t* state) const {
  for (int i = 0; i < L_; ++i)
    if (state[i] == mask_) return true;
  return false;
}

double Policy::tau_now(int64_t step, const int64_t* state) const {
  int64_t masked = 0;
  for (int i = 0; i < L_; ++i) masked += state[i] == mask_;
  return cfg_.schedule.tau(step, masked);
}

int Policy::rank_masked(const int64_t* state, const float* probs) {
  // insertion sort by descending probability: stable, allocation-free (L is small)
  int n = 0;
  for (int pos = 0; pos < L_; ++pos) {
    if (state[pos] != mask_) continue;
    int j = n++;
    while (j > 0 && probs[ranked_[j - 1]] < probs[pos]) {
      ranked_[j] = ranked_[j - 1];
      --j;
    }
    ranked_[j] = pos;
  }
  return n;
}

void Policy::take_positions(const Rule& rule, const int64_t* state, const float* probs, int n_masked, int64_t step,
                            double tau) {
  take_.clear();
  if (rule.vanilla) {
    const int64_t n = std::min<int64_t>(std::max<int64_t>(1, rule.count(L_, step)), n_masked);
    take_.assign(ranked_.begin(), ranked_.begin() + n);
    return;
  }
  const Bars bar = bars(rule, state, tau);
  if (!bar.has_far) {
    for (int r = 0; r < n_masked; ++r)
      if (probs[ranked_[r]] >= bar.at(ranked_[r])) take_.push_back(ranked_[r]);
  } else {
    int gap = L_;  // the first masked position below its bar
    for (int pos = 0; pos < L_; ++pos)
      if (state[pos] == mask_ && probs[pos] < bar.at(pos)) {
        gap = pos;
        break;
      }
    for (int r = 0; r < n_masked; ++r) {
      const int pos = ranked_[r];
      if ((pos < gap && probs[pos] >= bar.at(pos)) || probs[pos] >= bar.far) take_.push_back(pos);
    }
  }
  if (take_.empty()) take_.push_back(ranked_[0]);
}

Bars Policy::bars(const Rule& rule, const int64_t* state, double tau) const {
  Bars b;
  b.tau = b.lead = static_cast<float>(tau);
  if (rule.lead) {
    for (int pos = 0; pos < L_ && b.lead_pos < 0; ++pos)
      if (state[pos] == mask_) b.lead_pos = pos;
    b.lead = static_cast<float>(std::min(*rule.lead, tau));
  }
  if (rule.far) b.has_far = true, b.far = static_cast<float>(std::max(*rule.far, tau));
  return b;
}

void Policy::apply(const Rule& rule, const int64_t* state, const int64_t* ids, const float* probs, int64_t step,
                   int64_t* out) {
  std::copy(state, state + L_, out);
  const int n_masked = rank_masked(state, probs);
  if (n_masked == 0) return;
  take_positions(rule, state, probs, n_masked, step, rule.tau);
  for (int pos : take_) out[pos] = ids[pos];
}

void Policy::plan(const int64_t* state, const int64_t* top_ids, const float* top_probs, int k, int64_t step,
                  int64_t* nodes) {
  for (int i = 0; i < L_; ++i) {
    ids1_[i] = top_ids[i * k];
    p1_[i] = top_probs[i * k];
  }
  // node 0: the base rule's true next state (lossy mode: Threshold at the scheduled tau)
  if (lossy_) {
    Rule now;
    now.vanilla = false;
    now.tau = tau_now(step, state);
    now.far = rule_.far;
    now.lead = rule_.lead;
    apply(now, state, ids1_.data(), p1_.data(), step, nodes);
  } else {
    apply(rule_, state, ids1_.data(), p1_.data(), step, nodes);
  }
  check_progress(state, nodes);
  // deeper nodes: the draft rule on the stale predictions f(S) (Drafter._step)
  for (int i = 1; i < spec_.width(); ++i) {
    const int64_t* parent = nodes + static_cast<size_t>(spec_.parents[i]) * L_;
    int64_t* child = nodes + static_cast<size_t>(i) * L_;
    const int64_t dstep = step + depths_[i];
    std::copy(parent, parent + L_, child);
    const int n_masked = rank_masked(parent, p1_.data());
    if (n_masked == 0) continue;
    if (spec_.kinds[i] == kConservative) {
      take_.assign(1, ranked_[0]);
    } else {
      take_positions(rule_, parent, p1_.data(), n_masked, dstep,
                     has_draft_tau_ && cfg_.draft_tau ? *cfg_.draft_tau : rule_.tau);
    }
    for (int pos : take_) child[pos] = ids1_[pos];
    if (spec_.kinds[i] == kAltPosition && static_cast<int>(take_.size()) < n_masked) {
      // the least confident taken position gives way to the most confident one not taken
      const int last = take_.back();
      child[last] = parent[last];
      for (int r = 0; r < n_masked; ++r)
        if (std::find(take_.begin(), take_.end(), ranked_[r]) == take_.end()) {
          child[ranked_[r]] = ids1_[ranked_[r]];
          break;
        }
    }
    if (spec_.kinds[i] == kRunnerUp && k > 1) child[take_[0]] = top_ids[take_[0] * k + 1];
  }
}

// strategies.py::Policy._check_progress: node 0 (the base rule's step, which every selection
// reaches at least) commits a real token while the block has a masked position, so a block of
// L positions fills in at most L steps; a stuck step is a bug, reported rather than looped on.
void Policy::check_progress(const int64_t* state, const int64_t* step0) const {
  int64_t left = 0, after = 0;
  for (int i = 0; i < L_; ++i) left += state[i] == mask_, after += step0[i] == mask_;
  if (left && after >= left)
    fail(DLLM_ERROR_INTERNAL, "internal error: a decode step committed no token (" + std::to_string(left) +
                                  " masked positions left; the predictions there are the mask token)");
}

int Policy::select(const int64_t* nodes, const int64_t* f_ids, const float* f_probs, int k, int64_t step,
                   int64_t* steps_out) {
  const size_t L = static_cast<size_t>(L_);
  int cur = 0;
  int64_t steps = 1;
  while (has_mask(nodes + cur * L)) {
    const std::vector<int>& kids = children_[cur];
    if (kids.empty()) break;
    const int64_t* node = nodes + cur * L;
    const int64_t* fi = f_ids + cur * L * k;   // f(node cur): (L,K)
    const float* fp = f_probs + cur * L * k;
    int next = -1;
    if (lossy_) {
      const float tau = static_cast<float>(tau_now(step + depths_[cur] + 1, node));
      // children with more committed positions first (stable: lower index wins ties)
      kids_.clear();
      for (int c : kids) {
        int64_t filled = 0;
        for (size_t i = 0; i < L; ++i) filled += nodes[c * L + i] != mask_;
        filled_[c] = filled;
        size_t j = kids_.size();
        kids_.push_back(c);
        while (j > 0 && filled_[kids_[j - 1]] < filled) {
          kids_[j] = kids_[j - 1];
          --j;
        }
        kids_[j] = c;
      }
      for (int c : kids_) {
        const int64_t* child = nodes + c * L;
        bool any = false, ok = true;
        for (size_t i = 0; i < L; ++i) {
          if (node[i] != mask_ || child[i] == mask_) continue;  // drafted: masked in node, filled in child
          any = true;
          if (fi[i * k] != child[i] || !(fp[i * k] >= tau)) ok = false;
        }
        if (any && ok) {
          next = c;
          break;
        }
      }
    } else {
      for (size_t i = 0; i < L; ++i) {
        ids1_[i] = fi[i * k];
        p1_[i] = fp[i * k];
      }
      apply(rule_, node, ids1_.data(), p1_.data(), step + depths_[cur] + 1, truth_.data());
      for (int c : kids) {
        if (std::equal(truth_.begin(), truth_.end(), nodes + c * L)) {
          next = c;
          break;
        }
      }
    }
    if (next < 0) break;
    cur = next;
    ++steps;
  }
  *steps_out = steps;
  return cur;
}

}  // namespace dllm::detail
