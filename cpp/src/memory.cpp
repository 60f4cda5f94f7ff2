#include "memory.hpp"

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

namespace dllm::detail {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Saturating arithmetic on non-negative byte counts (Python's ints do not overflow).
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
int64_t mul(std::initializer_list<int64_t> xs) {
  int64_t r = 1;
  for (int64_t x : xs) r = mul(r, x);
  return r;
}

// memory.py BYTES / _act_bytes: weight bytes b and activation bytes a (fp32 for int8 and int4).
int64_t weight_bytes(const std::string& precision) { return precision == "fp16" || precision == "bf16" ? 2 : 4; }
int64_t act_bytes(const std::string& precision) { return precision == "fp16" || precision == "bf16" ? 2 : 4; }

// memory.py::weight_products: {K, N, count, kind} of every weight product: per layer q, k, v, o
// and the MLP (a mixture-of-experts layer: router, every expert, shared experts), then the LM head.
enum Kind : int64_t { kPlain = 0, kDown = 1, kRouter = 2 };
std::vector<std::array<int64_t, 4>> weight_products(const ModelConfig& m) {
  const int64_t c = m.hidden_size, h = m.num_heads, e = m.num_experts;
  std::vector<std::array<int64_t, 4>> out;
  for (size_t i = 0; i < m.kv_shapes.size(); ++i) {
    const int64_t hkv = m.kv_shapes[i].first, d = m.kv_shapes[i].second;
    for (const auto& s : {std::array<int64_t, 4>{c, h * d, 1, kPlain}, {c, hkv * d, 2, kPlain}, {h * d, c, 1, kPlain}})
      out.push_back(s);
    if (!e || static_cast<int64_t>(i) < m.dense_layers) {
      out.push_back({c, m.intermediate_size, 2, kPlain});
      out.push_back({m.intermediate_size, c, 1, kDown});
      continue;
    }
    const int64_t fe = m.expert_size, fs = m.shared_expert_size;
    for (const auto& s : {std::array<int64_t, 4>{c, e, 1, kRouter}, {c, fe, 2 * e, kPlain}, {fe, c, e, kDown}})
      out.push_back(s);
    if (fs) {
      out.push_back({c, fs, 2, kPlain});
      out.push_back({fs, c, 1, kDown});
    }
  }
  out.push_back({c, m.vocab_size, 1, kPlain});
  return out;
}

// memory.py::param_count: the products, norms, biases, router biases, the embedding.
int64_t param_count(const ModelConfig& m) {
  const int64_t c = m.hidden_size, v = m.vocab_size, h = m.num_heads;
  int64_t total = 0;
  for (const auto& s : weight_products(m)) total = add(total, mul({s[0], s[1], s[2]}));
  total -= c * v;  // the LM head: counted with the embedding below
  for (size_t i = 0; i < m.kv_shapes.size(); ++i) {
    const int64_t hkv = m.kv_shapes[i].first, d = m.kv_shapes[i].second;
    total = add(total, add(mul(2, c), add(m.qk_norm ? 2 * d : 0, m.qkv_bias ? mul(h + 2 * hkv, d) : 0)));
    if (m.num_experts && static_cast<int64_t>(i) >= m.dense_layers && m.router_bias) total = add(total, m.num_experts);
  }
  return add(add(total, mul({v, c, m.tie_word_embeddings ? 1 : 2})), c);
}

// memory.py::mlp_width: the SwiGLU width a token runs through in its widest layer (the active set).
int64_t mlp_width(const ModelConfig& m) {
  const int64_t dense = !m.num_experts || m.dense_layers ? m.intermediate_size : 0;
  const int64_t routed = m.num_experts ? add(mul(m.experts_per_token, m.expert_size), m.shared_expert_size) : 0;
  return std::max(dense, routed);
}

// tok(S): live activation bytes per new token attending `keys` keys (memory.py::_per_token).
int64_t per_token(const ModelConfig& m, int64_t keys, int64_t a) {
  const int64_t c = m.hidden_size, f = mlp_width(m), v = m.vocab_size;
  return add(add(mul({keys, m.num_heads, a, 2}), mul(add(mul(4, c), mul(3, f)), a)), mul(v, a + 4));
}

// Python's `total <= budget` for an int total and a float budget, exactly.
bool fits(int64_t total, double budget) {
  if (!(budget >= 0)) return false;  // totals are >= 0; a NaN budget fits nothing
  if (budget >= 9.2e18) return true;
  return total <= static_cast<int64_t>(std::floor(budget));
}

}  // namespace

MemoryBudget cpu_memory_budget() {
#if defined(__x86_64__) || defined(_M_X64)
  return {0.5, 1024};  // profiles/cpu-x86_64.yaml
#elif defined(__aarch64__)
  return {0.5, 512};  // profiles/cpu-arm64.yaml
#else
  return {0.4, 512};  // profiles/generic-cpu.yaml
#endif
}

// memory.py::weight_bytes: one copy of the weights. int4 (MatMulNBits, the exporter's default block
// of 32, symmetric): each MatMul weight (K,N) takes N * ceil(K/32) blocks of 16 bytes + a 4-byte
// scale. int8 (the exporter's defaults): K*N bytes + a 4-byte scale and a 1-byte zero point per
// output channel, the down-projections kept fp32. A mixture's routers stay fp32 in both. Every other
// parameter stays fp32.
static int64_t weights_once(const ModelConfig& m, const std::string& precision) {
  if (precision != "int4" && precision != "int8") return mul(param_count(m), weight_bytes(precision));
  constexpr int64_t kBlock = 32;
  const bool int8 = precision == "int8";
  int64_t quant = 0, matmul_params = 0;
  for (const auto& s : weight_products(m)) {
    if (s[3] == kRouter || (int8 && s[3] == kDown)) continue;  // counted with the fp32 parameters
    const int64_t blocks = (s[0] + kBlock - 1) / kBlock;
    quant = add(quant, int8 ? mul({s[2], s[1], add(s[0], 5)}) : mul({s[2], s[1], blocks, kBlock / 2 + 4}));
    matmul_params = add(matmul_params, mul({s[2], s[0], s[1]}));
  }
  return add(quant, mul(std::max<int64_t>(param_count(m) - matmul_params, 0), 4));
}

int64_t estimate_bytes(const ModelConfig& m, const std::string& precision, int beam_width, int64_t block_length,
                       int64_t max_seq) {
  const int64_t a = act_bytes(precision);
  const int64_t p = std::max<int64_t>(max_seq - block_length, 0), t = max_seq, n = mul(beam_width, block_length);
  int64_t kv_tok = 0;  // KV bytes per token, every layer's own Hkv and D
  for (const auto& [hkv, d] : m.kv_shapes) kv_tok = add(kv_tok, mul({2, hkv, d, a}));
  const int64_t weights = mul(2, weights_once(m, precision));  // RESIDENCY["ort"]: weights 2, prefill 1, verify 2
  const int64_t kv = mul(p, kv_tok);
  const int64_t prefill = mul(t, add(add(per_token(m, t, a), mul(m.vocab_size, 4)), kv_tok));
  const int64_t verify = mul({2, n, per_token(m, add(p, n), a)});
  return add(add(weights, kv), add(prefill, verify));
}

int beam_width_cap(const ModelConfig& m, int64_t free_bytes, const MemoryBudget& budget, const std::string& precision,
                   int limit) {
  const double avail = budget.fraction * static_cast<double>(free_bytes) - static_cast<double>(budget.reserve_mb * 1048576);
  int best = 1;
  for (int w = 1; w <= limit; ++w) {
    if (!fits(estimate_bytes(m, precision, w, m.block_size, m.max_seq), avail)) break;
    best = w;
  }
  return best;
}

int64_t free_memory_bytes() {
  // DLLM_DEPLOY_ROOT: a folder standing for / (another board's files), as Python's profile
  // detection and free-memory figure read it (dllm_deploy/profiles/memory.py::free_memory_bytes)
  const char* root = std::getenv("DLLM_DEPLOY_ROOT");
  std::ifstream in(root && *root ? std::string(root) + "/proc/meminfo" : std::string("/proc/meminfo"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    if (fields >> kib) return mul(kib, 1024);
  }
  return mul(sysconf(_SC_PAGESIZE), sysconf(_SC_AVPHYS_PAGES));
}

}  // namespace dllm::detail
