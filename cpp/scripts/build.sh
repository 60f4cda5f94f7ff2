#!/usr/bin/env bash
# Build the C++ runtime (library, dllm-generate, dllm-embed):
#   cpp/scripts/build.sh           -> build/cpp        (Release)
#   cpp/scripts/build.sh asan      -> build/cpp-asan   (AddressSanitizer + UBSan, -Og -g1: about 40 s to
#                                  build against 106 s at -O1 -g on 2 cores, with line numbers in reports)
#   cpp/scripts/build.sh KIND TARGET...  only those targets (the sanitizer tests build two)
# ONNX Runtime comes from $ONNXRUNTIME_ROOT, else get_onnxruntime.sh provides build/onnxruntime;
# nlohmann-json from $NLOHMANN_JSON_ROOT, else get_nlohmann_json.sh provides build/nlohmann_json.
# JOBS (default 2) parallel compile jobs; compiles run at nice 5.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
kind="${1:-release}"
targets=()
for t in "${@:2}"; do targets+=(--target "$t"); done
case "$kind" in
  release) dir="$repo/build/cpp"; flags=(-DCMAKE_BUILD_TYPE=Release -DDLLM_ASAN=OFF) ;;
  asan) dir="$repo/build/cpp-asan"; flags=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-Og -g1" -DDLLM_ASAN=ON) ;;
  *) echo "usage: $0 [release|asan]" >&2; exit 2 ;;
esac

ort="$(bash "$here/get_onnxruntime.sh" | tail -n 1)"
json="$(bash "$here/get_nlohmann_json.sh" | tail -n 1)"
cmake -S "$repo/cpp" -B "$dir" -DONNXRUNTIME_ROOT="$ort" -DNLOHMANN_JSON_ROOT="$json" "${flags[@]}" >/dev/null
nice -n 5 cmake --build "$dir" -j "${JOBS:-2}" "${targets[@]}"
