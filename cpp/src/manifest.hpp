// manifest.json, the one versioned contract between the exporter and the runtimes (DESIGN §3).
// Mirrors dllm_deploy/artifact/__init__.py::read_manifest: same checks, same messages.
#pragma once

#include <string>
#include <vector>

namespace dllm::detail {

// 3: the graphs sample (inputs sample_u, temperature, top_k, top_p; manifest "sampling");
// 2: the graphs exclude the mask token and a pad token distinct from EOS (DESIGN §8);
// 1 is still read: its graphs may emit them, and the backend demotes them on the host.
// An artifact without "sampling" decodes greedy only.
constexpr int kSchemaVersion = 3;
constexpr int kOldestSchemaVersion = 1;

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
  std::string attention;       // "block_causal" | "bidirectional"
  bool shift_logits = false;   // Dream: row i-1 predicts row i (the decoder keeps an anchor row)
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
  std::string folder;
  std::string precision;
  ModelConfig model;
  int topk = 0;              // K: ids/probabilities per position the graphs return
  int max_beam_width = 8;    // the largest W the export was checked for
  int sample_pool = 0;       // P of "sampling": the tokens a row samples among (0: none)
  bool graphs_sample = false;  // the graphs take the sampling inputs (schema 3); else greedy only
  std::string tokenizer_kind;
  std::string tokenizer_file, tokenizer_config;  // "hf": tokenizer.json and tokenizer_config.json ("" if none)
  GraphIO prefill, verify;
  std::string prefill_file, verify_file;  // paths inside the folder, for this precision
};

// Reads folder/manifest.json, checks schema_version and (verify) the sha256 of every file the
// precision needs. Throws Failure(DLLM_ERROR_ARTIFACT) with a one-line message.
Manifest read_manifest(const std::string& folder, const std::string& precision, bool verify);

}  // namespace dllm::detail
