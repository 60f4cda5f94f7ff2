// Decision traces: each decision of the decode loop and how close it came to going the other way.
// A port of dllm_deploy/runtime/trace.py (its docstring defines the record and the margins); the
// records of both runtimes are equal on one machine (tests/integration/cpp/test_trace_cpp.py).
#include <algorithm>
#include <cmath>
#include <limits>

#include "json.hpp"
#include "policy.hpp"

namespace dllm::detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void append_margin(std::string& out, double m) { out += std::isinf(m) ? "null" : format_double(m); }

void append_margins(std::string& out, const char* key, const std::vector<double>& v) {
  out += ", \"";
  out += key;
  out += "\": [";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    append_margin(out, v[i]);
  }
  out += "]";
}

}  // namespace

std::string TraceRecord::json() const {
  std::string out = "{\"row\": " + std::to_string(row) + ", \"block\": " + std::to_string(block) +
                    ", \"step\": " + std::to_string(step) + ", \"forward\": " + std::to_string(forward) +
                    ", \"commit\": [";
  for (size_t i = 0; i < commit.size(); ++i)
    out += (i ? ", [" : "[") + std::to_string(commit[i].first) + ", " + std::to_string(commit[i].second) + "]";
  out += "], \"margin\": ";
  append_margin(out, margin);
  if (tree) append_margins(out, "drafts", drafts);
  if (accepted >= 0) {
    out += ", \"accepted\": " + std::to_string(accepted);
    if (tree) append_margins(out, "checks", checks);
  }
  return out + "}";
}

double Policy::margin(const Rule& rule, const int64_t* state, const float* probs, int k, int64_t step, double tau,
                      bool conservative) {
  for (int i = 0; i < L_; ++i) p1_[i] = probs[static_cast<size_t>(i) * k];
  const int n = rank_masked(state, p1_.data());
  if (n == 0) return kInf;
  // the j-th most confident masked position's probability minus the (j+1)-th's
  auto order = [&](size_t j) {
    return 0 < j && j < static_cast<size_t>(n) ? double(p1_[ranked_[j - 1]]) - double(p1_[ranked_[j]]) : kInf;
  };
  auto token = [&](int pos) {  // top-1 minus top-2 probability
    return k > 1 ? double(probs[static_cast<size_t>(pos) * k]) - double(probs[static_cast<size_t>(pos) * k + 1]) : kInf;
  };
  if (conservative) return std::min(order(1), token(ranked_[0]));
  take_positions(rule, state, p1_.data(), n, step, tau);
  double out = kInf;
  for (int pos : take_) out = std::min(out, token(pos));
  if (rule.vanilla) return std::min(out, order(take_.size()));
  // threshold: |p - bar| at each masked position (take_positions' bars)
  const Bars bar = bars(rule, state, tau);  // take_positions' own
  int first = -1;
  for (int pos = 0; pos < L_ && first < 0; ++pos)
    if (state[pos] == mask_) first = pos;
  auto dist = [&](int pos, float b) { return std::fabs(double(p1_[pos]) - double(b)); };
  bool none = true;
  if (!bar.has_far) {
    for (int pos = 0; pos < L_; ++pos)
      if (state[pos] == mask_) {
        out = std::min(out, dist(pos, bar.at(pos)));
        if (p1_[pos] >= bar.at(pos)) none = false;
      }
  } else {  // left to right up to the first position below its bar, past it at the far bar
    int gap = L_;
    for (int pos = 0; pos < L_ && gap == L_; ++pos)
      if (state[pos] == mask_ && p1_[pos] < bar.at(pos)) gap = pos;
    bool far_clears = false;
    for (int pos = 0; pos < L_; ++pos) {
      if (state[pos] != mask_) continue;
      if (pos <= gap) out = std::min(out, dist(pos, bar.at(pos)));
      if (pos >= gap) out = std::min(out, dist(pos, bar.far));
      far_clears |= p1_[pos] >= bar.far;
    }
    none = gap == first && !far_clears;
  }
  if (none) out = std::min(out, order(1));  // the most confident is taken
  return out;
}

void Policy::trace_plan(const int64_t* state, const float* top_probs, int k, int64_t step, const int64_t* nodes,
                        TraceRecord& rec) {
  rec.step = step;
  rec.commit.clear();
  for (int i = 0; i < L_; ++i)
    if (nodes[i] != state[i]) rec.commit.emplace_back(i, nodes[i]);
  if (lossy_) {  // node 0: a threshold at the scheduled tau
    Rule now = rule_;
    now.vanilla = false;
    now.tau = tau_now(step, state);
    rec.margin = margin(now, state, top_probs, k, step, now.tau);
  } else {
    rec.margin = margin(rule_, state, top_probs, k, step, rule_.tau);
  }
  rec.tree = spec_.width() > 1;
  rec.drafts.clear();
  const double draft_tau = has_draft_tau_ && cfg_.draft_tau ? *cfg_.draft_tau : rule_.tau;
  for (int i = 1; i < spec_.width(); ++i)
    rec.drafts.push_back(margin(rule_, nodes + static_cast<size_t>(spec_.parents[i]) * L_, top_probs, k,
                                step + depths_[i], draft_tau, spec_.kinds[i] == kConservative));
  rec.accepted = -1;
  rec.checks.clear();
}

void Policy::trace_checks(const int64_t* nodes, const float* f_probs, int k, int64_t step, int cur, TraceRecord& rec) {
  std::vector<int> path{cur};
  while (spec_.parents[path.back()] >= 0) path.push_back(spec_.parents[path.back()]);
  std::reverse(path.begin(), path.end());
  const size_t L = static_cast<size_t>(L_);
  for (size_t i = 0; i < path.size(); ++i) {
    const int at_node = path[i];
    const int64_t* node = nodes + at_node * L;
    if (children_[at_node].empty() || !has_mask(node)) break;
    const int64_t at = step + depths_[at_node] + 1;
    const float* fp = f_probs + at_node * L * k;
    if (!lossy_) {
      rec.checks.push_back(margin(rule_, node, fp, k, at, rule_.tau));
      continue;
    }
    const float tau = static_cast<float>(tau_now(at, node));
    // the children in select's order: more committed positions first (stable)
    std::vector<int> kids = children_[at_node];
    auto filled = [&](int c) { return std::count_if(nodes + c * L, nodes + (c + 1) * L, [&](int64_t t) { return t != mask_; }); };
    std::stable_sort(kids.begin(), kids.end(), [&](int a, int b) { return filled(a) > filled(b); });
    const int next = i + 1 < path.size() ? path[i + 1] : -1;
    for (int c : kids) {
      double m = kInf;
      bool any = false;
      for (size_t j = 0; j < L; ++j) {
        if (node[j] != mask_ || nodes[c * L + j] == mask_) continue;  // drafted by c
        any = true;
        m = std::min({m, std::fabs(double(fp[j * k]) - double(tau)),
                      k > 1 ? double(fp[j * k]) - double(fp[j * k + 1]) : kInf});
      }
      if (any) rec.checks.push_back(m);
      if (c == next) break;
    }
  }
}

}  // namespace dllm::detail
