// A uniform-noise diffusion artifact (DiffusionGemma, manifest format "diffusion_gemma/1") on ONNX
// Runtime: its manifest and its two graphs behind the calls runtime/uniform_diffusion.py makes of
// a backend. Port of dllm_deploy/runtime/backends/diffusion_gemma_ort.py (same masks, same feeds).
//   encode   the causal encoder over new tokens after the cache: writes the KV (returns it whole;
//            a sliding layer's holds its last W - 1 keys)
//   denoise  one step of the bidirectional decoder over a canvas: argmax, sampled ids (inverse CDF
//            of the fed uniforms over the whole vocabulary), per-position entropy and the next
//            step's soft embeddings; no (B,T,V) tensor leaves the graph
// KV per layer and kind: (B, Hkv_l, P_l, D_l), each layer its own shape (sliding / full).
//
// Dimension legend: B rows, T new tokens, P cache columns (keep's width), C hidden size, W window.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dllm::detail {

constexpr const char* kUniformFormat = "diffusion_gemma/1";

struct UniformManifest {
  std::string folder, family;
  int vocab_size = 0, hidden_size = 0, canvas_length = 0, sliding_window = 0, max_seq = 0;
  int eos_token_id = 0, pad_id = 0;
  std::vector<int64_t> eos_ids;                 // decoding.eos_ids: every id that ends a row
  std::vector<std::pair<int, int>> kv_shapes;   // (Hkv, D) per layer
  std::map<std::string, double> defaults;       // decoding.options: the checkpoint's rule defaults
  std::string tokenizer_kind;                   // "hf" (tokenizer.json) or "byte"
  std::string tokenizer_file, tokenizer_config;
  std::vector<std::string> encode_inputs, encode_outputs, denoise_inputs, denoise_outputs;
  std::string encode_file, denoise_file;
};

// Whether folder/manifest.json names the uniform-diffusion format (false when it cannot be read:
// the masked runtime's load then says why).
bool is_uniform_artifact(const std::string& folder);
// Reads and checks folder/manifest.json (Failure DLLM_ERROR_ARTIFACT, one line, on a bad one).
UniformManifest read_uniform_manifest(const std::string& folder, const std::string& precision);

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using KV = std::vector<Tensor>;  // 2 per layer: key, value

// One denoise step's outputs, (B,T) and (B,T,C).
struct DenoiseOut {
  std::vector<int64_t> argmax, sampled;
  std::vector<float> entropy, soft;
};

class UniformGraphs {
 public:
  UniformGraphs(const UniformManifest& m, int intra_op_threads);
  ~UniformGraphs();
  UniformGraphs(const UniformGraphs&) = delete;
  UniformGraphs& operator=(const UniformGraphs&) = delete;

  KV empty(size_t rows) const;
  // The KV after the encoder reads ids (B,T) at positions (B,T); keep (B,P+T): 0 at padding.
  KV encode(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, size_t rows,
            const std::vector<uint8_t>& keep, const KV& past);
  // One step over canvas (B,T) at positions (B,T) after the cache (keep (B,P)), conditioned on
  // soft (B,T,C) (zeros at a canvas's first step), at temperature (B,) with uniforms u (B,T).
  void denoise(const std::vector<int64_t>& canvas, const std::vector<int64_t>& pos, size_t rows,
               const std::vector<uint8_t>& keep, const KV& past, const std::vector<float>& soft,
               const std::vector<float>& temperature, const std::vector<float>& u, DenoiseOut& out);

  double run_seconds = 0.0;  // time inside OrtRun, accumulated

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The graphs' masks (models/masks.py), (B,1,T,width) row-major. Encoder: T new tokens after p
// cached columns, causal, keep (B,p+T); "sliding" over the last min(p, W-1) cached columns and
// the new ones, within W of the query. Decoder: a canvas of T after p columns, keep (B,p); every
// canvas token sees the whole canvas and the kept prefix ("sliding": its last min(p, W-1)).
void encoder_masks(const std::vector<uint8_t>& keep, size_t rows, size_t p, size_t t, size_t window,
                   std::vector<uint8_t>& full, std::vector<uint8_t>& sliding);
void decoder_masks(const std::vector<uint8_t>& keep, size_t rows, size_t p, size_t t, size_t window,
                   std::vector<uint8_t>& full, std::vector<uint8_t>& sliding);

}  // namespace dllm::detail
