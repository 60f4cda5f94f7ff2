#!/usr/bin/env bash
# Build the C++ runtime (library, dllm-generate, dllm-embed):
#   cpp/scripts/build.sh           -> build/cpp        (Release)
#   cpp/scripts/build.sh asan      -> build/cpp-asan   (AddressSanitizer + UBSan, -Og -g1: about 40 s to
#                                  build against 106 s at -O1 -g on 2 cores, with line numbers in reports)
#   cpp/scripts/build.sh aarch64   -> build/cpp-aarch64 (Release, cross-compiled for 64-bit Arm Linux with
#                                  Debian's g++-aarch64-linux-gnu against PyPI's aarch64 ONNX Runtime:
#                                  libdllm_deploy.so, dllm-generate, dllm-graph-run, dllm-tokenize, and
#                                  onnxruntime-extensions' aarch64 libortextensions.so; docs/cpp.md)
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
  aarch64)
    command -v aarch64-linux-gnu-g++ >/dev/null ||
      { echo "build.sh aarch64: no aarch64-linux-gnu-g++ (Debian: apt-get install g++-aarch64-linux-gnu)" >&2; exit 2; }
    dir="$repo/build/cpp-aarch64"
    # the tokenizer library from the venv Python's wheel wants that Python's libpython on the board
    pylib="$("${PYTHON:-$repo/.venv/bin/python}" -c 'import sys; print(f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0")')"
    flags=(-DCMAKE_BUILD_TYPE=Release -DDLLM_ASAN=OFF -DCMAKE_TOOLCHAIN_FILE="$repo/cpp/cmake/aarch64-linux-gnu.cmake"
           -DDLLM_TARGET_PYTHON_LIBRARY="$pylib")
    [ ${#targets[@]} -gt 0 ] || targets=(--target dllm_deploy --target dllm-generate --target dllm-graph-run --target dllm-tokenize) ;;
  *) echo "usage: $0 [release|asan|aarch64]" >&2; exit 2 ;;
esac

if [ "$kind" = aarch64 ]; then
  ort="$(bash "$here/get_onnxruntime_aarch64.sh" | tail -n 1)"
else
  ort="$(bash "$here/get_onnxruntime.sh" | tail -n 1)"
fi
json="$(bash "$here/get_nlohmann_json.sh" | tail -n 1)"
cmake -S "$repo/cpp" -B "$dir" -DONNXRUNTIME_ROOT="$ort" -DNLOHMANN_JSON_ROOT="$json" "${flags[@]}" >/dev/null
nice -n 5 cmake --build "$dir" -j "${JOBS:-2}" "${targets[@]}"
# the aarch64 tokenizer library beside libdllm_deploy.so, where the runtime looks first (a copy: the
# folder is what goes to the board)
if [ "$kind" = aarch64 ] && [ -e "$ort/lib/libortextensions.so" ] && ! cmp -s "$ort/lib/libortextensions.so" "$dir/libortextensions.so"; then
  cp "$ort/lib/libortextensions.so" "$dir/libortextensions.so"
fi
