#!/bin/bash
# llama.cpp's llama-diffusion-cli against dllm-deploy on the same random LLaDA- or Dream-layout checkpoint
# (lab tier, not in make test). llama.cpp is the copy vendored in llama-cpp-python 0.3.36's sdist
# (PyPI; pinned), built here with CMake (CPU, GGML_NATIVE, targets llama-diffusion-cli and
# llama-quantize, for the q4_K files of docs/peers.md; ~10 min on 2 cores). The checkpoint (lab/peers/checkpoint.py) is converted with llama.cpp's own
# convert_hf_to_gguf.py (its tokenizer is new, so its pre-tokenizer hash is unknown to the
# converter: it is declared GPT-2's, the same byte-level regex) and exported by dllm-deploy.
# LAYOUT=llada (default) or dream; SIZE=30m (default) or 300m. Writes build/peers/ and
# lab/peers/llama_cpp-SIZE.json (LLaDA) or llama_cpp-dream-SIZE.json; prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
SIZE=${SIZE:-30m}; LAYOUT=${LAYOUT:-llada}; REPEATS=${REPEATS:-3}; W=build/peers
case $LAYOUT in llada) NAME=$SIZE ;; dream) NAME=dream-$SIZE ;; *) echo "LAYOUT: llada or dream" >&2; exit 2 ;; esac
LLAMA=$W/llama_cpp_python-0.3.36/vendor/llama.cpp
mkdir -p $W
if [ ! -x $LLAMA/build/bin/llama-diffusion-cli ]; then
  (cd $W && $PY -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz)
  cmake -S $LLAMA -B $LLAMA/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=Release > $W/cmake.log
  cmake --build $LLAMA/build --target llama-diffusion-cli llama-quantize -j"$(nproc)" > $W/build.log
fi
C=$W/ckpt-$NAME
test -f $C/config.json || $PY lab/peers/checkpoint.py $C --layout $LAYOUT --size $SIZE
test -f $C-f32.gguf || (cd $LLAMA && "$OLDPWD/$PY" "$OLDPWD/lab/peers/convert_llama_cpp.py" "$PWD" "$OLDPWD/$C" --outtype f32 \
  --outfile "$OLDPWD/$C-f32.gguf" > "$OLDPWD/$W/convert.log" 2>&1)
test -f $C-art/manifest.json || $PY -m dllm_deploy.cli export --model $C --out $C-art --precision fp32 --block-length 32
$PY lab/peers/run_llama_cpp.py --llama $LLAMA/build/bin/llama-diffusion-cli --gguf $C-f32.gguf --artifact $C-art \
  --repeats $REPEATS --json lab/peers/llama_cpp-$NAME.json
