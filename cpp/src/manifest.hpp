// manifest.json, the one versioned contract between the exporter and the runtimes (DESIGN §3).
// Mirrors dllm_deploy/artifact/__init__.py::read_manifest: same checks, same messages.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dllm::detail {

// 4: the model's family and capabilities, kv_shapes ([Hkv, D] per layer), graphs keyed by role;
// the graphs exclude the mask token and a pad token distinct from EOS (DESIGN §8) and sample
// (inputs sample_u, temperature, top_k, top_p; manifest "sampling"). Schemas 1-3 are refused
// with a request to re-export (CHANGELOG.md).
// 5: schema 4 with "kv_io": "new": prefill's present outputs hold only the new tokens' keys and
// values (B,Hkv,T,D); the cache is a buffer the runtime writes in place (export/graphs.py).
constexpr int kSchemaVersion = 4;
constexpr int kSchemaKvNew = 5;

struct ModelConfig {
  int vocab_size = 0;         // V
  int hidden_size = 0;        // C
  int intermediate_size = 0;  // F (SwiGLU width)
  int num_layers = 0;         // transformer blocks
  int num_heads = 0;          // H
  int num_kv_heads = 0;       // Hkv
  int head_dim = 0;           // D
  int block_size = 0;         // the block length the model was trained with
  bool tie_word_embeddings = false;
  int mask_token_id = 0;
  int eos_token_id = 0;
  int pad_token_id = 0;
  int max_seq = 0;             // longest prompt + generation (tokens)
  std::vector<std::pair<int, int>> kv_shapes;  // (Hkv, D) per layer (the manifest's kv_shapes)
  bool qk_norm = false;        // per-head q/k norms (D parameters each)
  bool qkv_bias = false;       // q/k/v biases
  // mixture of experts (models/moe.py; 0 experts: dense): what the memory model counts
  int num_experts = 0;         // E routed experts per MoE layer, all resident
  int experts_per_token = 0;   // k, the active set
  int expert_size = 0;         // one expert's SwiGLU width
  int shared_expert_size = 0;  // the shared experts' width (0: none)
  int dense_layers = 0;        // the first layers keep a dense MLP
  bool router_bias = false;    // a sigmoid router's per-expert bias (E parameters)
};

// What the model's family can do (models/capabilities.py): asked instead of its name.
struct Capabilities {
  std::string attention;                     // "block_causal" (exact KV per block) | "bidirectional"
  bool shift_logits = false;                 // row i-1 predicts row i (Dream): the decoder keeps an anchor row
  bool joins = false;                        // rows may join at block boundaries under an exact cache
  std::map<std::string, std::string> cache;  // requested cache mode -> the mode that runs (absent: refused)
  std::vector<std::string> one_branch;       // cache modes that verify one branch per forward
  std::vector<std::string> graphs;           // the roles of the artifact's graphs
  bool block_causal() const { return attention == "block_causal"; }
};

// The graphs' sampling inputs (schema 3), fed by name: sample_u (1,T) f32, temperature (1,) f32,
// top_k (1,) i64, top_p (1,) f32.
inline const char* const kSamplingInputs[] = {"sample_u", "temperature", "top_k", "top_p"};

struct GraphIO {
  std::vector<std::string> inputs;   // input_ids, position_ids, attention_mask, past (k0, v0, k1, ...),
                                     // and (schema 3) the sampling inputs, wherever the list puts them
  std::vector<std::string> outputs;  // prefill: logits, top_ids, top_probs, present...; verify: top_ids, top_probs
};

struct Manifest {
  int schema_version = kSchemaVersion;
  std::string family;        // the model family (models/registry.py), for messages only
  Capabilities caps;
  std::string folder;
  std::string precision;
  ModelConfig model;
  int topk = 0;              // K: ids/probabilities per position the graphs return
  int max_beam_width = 8;    // the largest W the export was checked for
  int sample_pool = 0;       // P of "sampling": the tokens a row samples among (0: none)
  std::string tokenizer_kind;
  std::string tokenizer_file, tokenizer_config;  // "hf": tokenizer.json and tokenizer_config.json ("" if none)
  GraphIO prefill, verify;                // the graphs of roles "prefill" and "verify"
  std::string prefill_file, verify_file;  // paths inside the folder, for this precision
  bool kv_new = false;                    // kv_io "new" (schema 5): present is the new tokens' KV only
};

// Reads folder/manifest.json, checks schema_version and (verify) the sha256 of every file the
// precision needs. Throws Failure(DLLM_ERROR_ARTIFACT) with a one-line message.
Manifest read_manifest(const std::string& folder, const std::string& precision, bool verify);

}  // namespace dllm::detail
