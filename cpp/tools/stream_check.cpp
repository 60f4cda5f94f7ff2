// dllm-stream-check: streaming through the C++ wrapper (dllm::Runtime::generate_stream with a
// std::function), cancelled after N chunks, then a callback that throws, then the same runtime
// decoding the whole prompt again. tests/integration/cpp/test_stream_cpp.py runs it on the release and the
// AddressSanitizer builds and compares the lines with Python.
//   dllm-stream-check ARTIFACT PROMPT N [NAME=VALUE ...]      (decode options by name)
// Prints four JSON lines: the N chunks delivered (a list), the cancelled result, the message the
// throwing callback's exception carried out of generate_stream, and the full result.
#include <iostream>
#include <stdexcept>
#include <string>

#include "dllm_deploy/dllm.hpp"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: dllm-stream-check ARTIFACT PROMPT N [NAME=VALUE ...]\n";
    return 2;
  }
  try {
    dllm::Runtime rt(argv[1]);
    dllm::Options options;
    for (int i = 4; i < argc; ++i) {
      const std::string kv = argv[i];
      options.set(kv.substr(0, kv.find('=')), kv.substr(kv.find('=') + 1));
    }
    const int n = std::stoi(argv[3]);
    std::string chunks = "[";
    int seen = 0;
    dllm::Result cancelled = rt.generate_stream(argv[2], options, [&](const dllm::Chunk& c) {
      chunks += (seen ? ", " : "") + c.json;
      return ++seen < n;
    });
    std::cout << chunks << "]\n" << cancelled.json() << "\n";
    try {
      rt.generate_stream(argv[2], options, [](const dllm::Chunk&) -> bool { throw std::runtime_error("from the callback"); });
      std::cout << "\"not thrown\"\n";
    } catch (const std::runtime_error& e) {
      std::cout << "\"" << e.what() << "\"\n";
    }
    std::cout << rt.generate(argv[2], options).json() << "\n";
  } catch (const dllm::Error& e) {
    std::cerr << "dllm-stream-check: error: " << e.what() << "\n";
    return 2;
  }
}
