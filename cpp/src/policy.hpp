// Decoding strategies over one block row: base rules, SPD trees, drafting, selection.
// A port of dllm_deploy/runtime/{rules,tree,strategies}.py that must stay token-identical:
//   - masked positions are ranked by probability with a STABLE order (lower position wins ties);
//   - probabilities are float32 and every tau is compared as float32 (numpy's NEP 50 casts the
//     Python float to the array's dtype): p >= (float)tau;
//   - the dynamic schedule computes tau in double: max(floor, init * decay**step).
// Nothing here allocates after construction: scratch buffers are sized for the block once.
//
// Dimension legend: L block length, W beam width (tree nodes), K top-k per position.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decode_options.gen.hpp"

namespace dllm::detail {

struct Schedule {           // SPD's lossy-mode tau ("confidence game", DESIGN §2)
  double init = 0.93;       // tau at the start of a block and at its tail
  double decay = 0.97;      // multiplied per rule step
  double floor = 0.85;      // never lower than this
  int end_tokens = 2;       // tau = init again with <= end_tokens masked positions left
  double tau(int64_t step, int64_t masked_left) const;
};

// = Python's DecodeConfig (runtime/strategies.py): the declared options (decode_options.gen.hpp,
// generated from dllm_deploy/decode_options.json; checked by validate in options.hpp) + the schedule.
struct DecodeOptions : DecodeOptionFields {
  Schedule schedule;  // spd lossy mode tau
};

// One row's decisions in one iteration of the decode loop (trace.cpp, runtime/trace.py).
struct TraceRecord {
  size_t row = 0, block = 0;
  int64_t step = 0, forward = 0;
  std::vector<std::pair<int64_t, int64_t>> commit;  // node 0's [position, id], ascending position
  double margin = 0;                                // infinity: null
  std::vector<double> drafts;                       // W > 1: nodes 1..W-1
  int64_t accepted = -1;                            // -1: no verify forward followed
  std::vector<double> checks;                       // W > 1, after a verify forward
  bool tree = false;                                // W > 1: drafts and checks are written
  std::string json() const;                         // one line, as Python's json.dumps
};

enum NodeKind { kChain = 0, kRunnerUp = 1, kConservative = 2, kAltPosition = 3 };

struct TreeSpec {
  std::vector<int> parents;  // parents[i]: node i's parent (-1: the current block state S)
  std::vector<int> kinds;    // NodeKind: how node i is drafted from its parent
  int width() const { return static_cast<int>(parents.size()); }
};

TreeSpec make_tree(const std::string& preset, int width);  // chain | binary | wide | fork
std::vector<int> node_depths(const TreeSpec& spec);

// Vanilla (k most confident per step, or LLaDA's steps schedule) or Threshold (every p >= tau,
// at least one; with `far`, left to right while p >= tau, past the first masked p < tau only at far).
struct Rule {
  bool vanilla = true;
  int tokens_per_step = 1;
  int steps = 0;       // per block; 0 = None (tokens_per_step every step)
  double tau = 0.9;
  std::optional<double> far;   // rules.Threshold.far
  std::optional<double> lead;  // rules.Threshold.lead
  int64_t count(int64_t block_len, int64_t step) const;
};

// A threshold rule's bars at tau (rules.Threshold.bars): tau, the leftmost masked position's
// min(lead, tau), and the far bar; float32, as the probabilities they are compared with.
struct Bars {
  int lead_pos = -1;  // the leftmost masked position when the rule has a lead bar, else -1
  float lead = 0, tau = 0, far = 0;
  bool has_far = false;
  float at(int pos) const { return pos == lead_pos ? lead : tau; }
};

class Policy {
 public:
  Policy(const DecodeOptions& cfg, int64_t mask_id);
  int width() const { return spec_.width(); }
  const TreeSpec& spec() const { return spec_; }

  // nodes (W,L) <- W drafted states from S = state (L) and f(S) = top_ids/top_probs (L,K).
  void plan(const int64_t* state, const int64_t* top_ids, const float* top_probs, int k, int64_t step,
            int64_t* nodes);
  // f_ids/f_probs (W,L,K) = f(node). Returns the chosen node; *steps = rule steps it represents.
  int select(const int64_t* nodes, const int64_t* f_ids, const float* f_probs, int k, int64_t step,
             int64_t* steps);

  // Decision traces (trace.cpp; = dllm_deploy/runtime/trace.py): after plan(state, ...) gave nodes,
  // node 0's commit, its margin and each draft's margin into rec; after select(...) reached cur, the
  // margin of each check it made on the way (into rec.checks).
  void trace_plan(const int64_t* state, const float* top_probs, int k, int64_t step, const int64_t* nodes,
                  TraceRecord& rec);
  void trace_checks(const int64_t* nodes, const float* f_probs, int k, int64_t step, int cur, TraceRecord& rec);

 private:
  // out <- rule(state, ids, probs); returns how many positions it committed.
  void apply(const Rule& rule, const int64_t* state, const int64_t* ids, const float* probs, int64_t step,
             int64_t* out);
  int rank_masked(const int64_t* state, const float* probs);  // into ranked_, most confident first
  // rules.Vanilla/Threshold.positions: the positions `rule` commits at `step` (a threshold rule at
  // `tau`) into take_, most confident first, after rank_masked(state, probs) returned n_masked > 0.
  void take_positions(const Rule& rule, const int64_t* state, const float* probs, int n_masked, int64_t step,
                      double tau);
  double tau_now(int64_t step, const int64_t* state) const;
  Bars bars(const Rule& rule, const int64_t* state, double tau) const;
  // The margin of `rule`'s decision on state given f = probs (L,K) at tau (a threshold rule's);
  // conservative: the most confident position alone (a kConservative draft). Infinity: no mask.
  double margin(const Rule& rule, const int64_t* state, const float* probs, int k, int64_t step, double tau,
                bool conservative = false);
  bool has_mask(const int64_t* state) const;
  void check_progress(const int64_t* state, const int64_t* step0) const;  // throws when step0 commits nothing

  DecodeOptions cfg_;
  int64_t mask_;
  int L_;
  Rule rule_;
  bool lossy_;
  bool has_draft_tau_;
  TreeSpec spec_;
  std::vector<int> depths_;
  std::vector<std::vector<int>> children_;
  // scratch (sized once)
  std::vector<int> ranked_, take_;
  std::vector<int64_t> ids1_, truth_;
  std::vector<float> p1_;
  std::vector<int> kids_;
  std::vector<int64_t> filled_;
};

}  // namespace dllm::detail
