// Self-speculative decoding (a port of dllm_deploy/runtime/self_spec.py, token-identical to it):
// a model whose capabilities' attention is "causal" (Nemotron-Labs-Diffusion) drafts a block by
// diffusion (the verify graph, bidirectional over [seed, MASK x (L-1)] after the prefix) and
// verifies causally (the prefill graph, under a tree mask), so its output is its own
// autoregressive output:
//     ar           one causal forward per token
//     linear-spec  draft, verify the drafted chain, accept the longest matching prefix + the bonus
//     tree-spec    verify the trie of the W best draft sequences (top-K per position) in the same
//                  one causal forward; accept the longest matching root path + the bonus
//     fastdiffuser the block-diffusion mode (lossy): draft forwards commit the masked positions
//                  whose confidence reaches the threshold (at least the most confident one), then
//                  one causal forward over the finished block writes its KV and gives the next seed
// Rows run in lock step; each keeps the KV of its accepted path only (cache columns another row
// accepted are masked out for it). Sampling: each causal prediction at position p draws with the
// uniform of (seed, request = the row's index, p, step 0).
//
// Dimension legend: B live rows, T fed tokens, P cached positions, L block, K top-k, W beam width.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dllm::detail {

struct SelfSpecOptions {
  std::string strategy = "tree-spec";  // ar | linear-spec | tree-spec | fastdiffuser
  int beam_width = 4;                  // tree-spec: W draft sequences verified together
  int block_size = 0;                  // L; 0: the model's
  int max_new_tokens = 64;
  float temperature = 0.0f;            // 0: greedy
  uint64_t seed = 0;
  double threshold = 0.9;              // fastdiffuser: the confidence a masked position commits at
  std::vector<std::string> stop;       // stop strings: a row's text ends before the first one found
};

// The verification tree of one row: node 0 the seed; parent[i] < i; depth[i] its offset after the seed.
struct Trie {
  std::vector<int64_t> tokens, parent, depth;
};

// The `width` most probable sequences under independent per-position choices among the (n,K)
// candidates ids/probs, best first (beam search: exact for a product distribution).
std::vector<std::vector<int64_t>> best_sequences(const int64_t* ids, const float* probs, size_t n, size_t k,
                                                 size_t width);
// The trie of the `width` best draft sequences after `seed` (ids/probs: (n,K), the block's positions after the seed).
Trie build_trie(int64_t seed, const int64_t* ids, const float* probs, size_t n, size_t k, size_t width);
// Node ids of the longest root path whose every node's token equals its parent's causal
// prediction (predicted[i]: the token the model predicts after node i).
std::vector<size_t> accepted_path(const Trie& trie, const int64_t* predicted, size_t stride);

}  // namespace dllm::detail
