// Embed the dLLM runtime in a C++ program (docs/cpp.md shows this file; CI compiles it).
#include <iostream>

#include "dllm_deploy/dllm.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed ARTIFACT_DIR\n";
    return 2;
  }
  try {
    dllm::Runtime rt(argv[1]);                 // checks manifest.json + sha256, opens ONNX Runtime
    dllm::DecodeConfig cfg;                    // Python's defaults
    cfg.strategy = "spd";                      // speculative parallel decoding,
    cfg.beam_width = 4;                        // 4 drafted block states per forward
    cfg.gen_length = 64;
    dllm::Result r = rt.generate("upper: air war\n", cfg);
    dllm::Stats s = r.stats();
    std::cout << r.text() << "\n" << s.tokens << " tokens, " << s.forwards << " forwards\n";
  } catch (const dllm::Error& e) {             // every failure: a code and a one-line message
    std::cerr << "error " << e.code() << ": " << e.what() << "\n";
    return 2;
  }
}
