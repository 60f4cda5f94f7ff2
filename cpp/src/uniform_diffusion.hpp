// Uniform-noise block diffusion (DiffusionGemma): a port of dllm_deploy/runtime/uniform_diffusion.py
// (UniformRun, own positions) and uniform_decoder.py's chunks, token-identical to them, counters
// included. The canvas starts as random ids; each of up to N steps (counting down, s = N .. 1) runs
// the decoder over the live rows at T = t_min + (t_max - t_min) * s / N (fp32), accepts the
// lowest-entropy positions whose entropies summed before each stay within entropy_bound (their
// sampled ids stay, every other position takes a fresh random id), and stops a row once its
// argmax equals the previous stability_threshold steps' and its mean entropy is below
// confidence_threshold. The canvas (its last argmax) then joins the sequence through the encoder.
// A row ends with a canvas holding an EOS (every id after it: pad), after ceil(max_new_tokens / L)
// canvases, or at a stop string; it leaves the batch at the canvas boundary. Noise is
// counter-based (noise.hpp): (seed, request 0, the row's own position, step, use) with use INIT
// (a canvas's first ids, step 0), SAMPLE (a position's draw at step s), RENOISE.
//
// Dimension legend: B live rows, L canvas length, P cache columns, C hidden size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "decoder.hpp"
#include "uniform_ort.hpp"

namespace dllm::detail {

// transformers 5.23's DiffusionGemmaGenerationConfig defaults (the artifact's own override them:
// UniformRuntime::defaults).
struct UniformOptions {
  int max_new_tokens = 256;
  int max_denoising_steps = 48;
  double entropy_bound = 0.1;
  double t_min = 0.4;
  double t_max = 0.8;
  int stability_threshold = 1;
  double confidence_threshold = 0.005;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings: a row's text ends before the first one found
};

// T at step `step` of `steps`, in fp32 arithmetic as transformers computes it.
float uniform_temperature(int step, int steps, double t_min, double t_max);
// Per position of one row's entropies (n): accepted (1) or not, as uniform_diffusion.py::accept.
void uniform_accept(const float* entropy, size_t n, float bound, uint8_t* out);
// numpy's float32 sum of n contiguous values (pairwise summation, its blocks of 8 and 128), so a
// mean compares with a threshold exactly as np.mean does.
float numpy_sum_f32(const float* x, size_t n);

class UniformRuntime {
 public:
  UniformRuntime(const std::string& artifact_dir, const std::string& precision, int intra_op_threads);
  ~UniformRuntime();

  // The artifact's defaults (its generation_config.json) over transformers'.
  UniformOptions defaults() const;
  // The prompts decoded together (one batch, each row's positions its own); one result per
  // prompt: token ids up to and including an EOS (pad ids are no tokens), forwards = decoder
  // steps + encoder forwards of the row; a chunk per row and canvas to the sink (false cancels
  // every unfinished row: "cancelled").
  std::vector<RowResult> generate(const std::vector<std::string>& prompts, const UniformOptions& options,
                                  const ChunkSink& sink = ChunkSink());
  int max_seq() const { return manifest_.max_seq; }
  const std::string& family() const { return manifest_.family; }

 private:
  UniformManifest manifest_;
  std::unique_ptr<Tokenizer> tokenizer_;  // decode drops the EOS and pad ids first (uniform_decoder.py)
  std::unique_ptr<UniformGraphs> graphs_;
};

}  // namespace dllm::detail
