#!/usr/bin/env bash
# Provide ONNX Runtime for the aarch64 cross build in $OUT (default build/onnxruntime-aarch64):
#   $OUT/lib/libonnxruntime.so*   from PyPI's aarch64 wheel of the venv's onnxruntime version
#                                 (pip download: the wheel is read, nothing is installed)
#   $OUT/lib/libortextensions.so  onnxruntime-extensions' library (Hugging Face tokenizers) from its
#                                 aarch64 wheel for the venv's version and Python, when the venv has
#                                 the package: a Python extension module, it needs that Python's
#                                 libpython on the board (docs/cpp.md)
#   $OUT/include                  the host build's headers (get_onnxruntime.sh): the same C API
# Prints the ONNXRUNTIME_ROOT to use on stdout (the last line). Idempotent.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/build/onnxruntime-aarch64}"
python="${PYTHON:-$repo/.venv/bin/python}"

die() { echo "get_onnxruntime_aarch64: $*" >&2; exit 2; }

host="$(OUT= bash "$here/get_onnxruntime.sh" | tail -n 1)"
mkdir -p "$out/lib"
ln -sfn "$host/include" "$out/include"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# aarch64_wheel PACKAGE==VERSION: its aarch64 wheel for the venv's Python into $tmp (nothing installed)
aarch64_wheel() {
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$pyver" \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64 \
    "$1" -d "$tmp" >&2
}

# extract WHEEL PREFIX DEST: the wheel's first file whose name starts with PREFIX, written whole to DEST
extract() {
  "$python" - "$@" <<'PY'
import os, sys, zipfile
wheel, prefix, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if os.path.basename(n).startswith(prefix) and ".so" in os.path.basename(n)]
    if not names:
        sys.exit(f"{wheel}: no {prefix}*")
    with z.open(names[0]) as src, open(dest + ".part", "wb") as dst:
        dst.write(src.read())
    os.replace(dest + ".part", dest)
    print(os.path.basename(names[0]))
PY
}

if [ ! -e "$out/lib/libonnxruntime.so" ]; then
  version="$("$python" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null)" \
    || die "the onnxruntime wheel is not installed in $python"
  aarch64_wheel "onnxruntime==$version" || die "no aarch64 wheel of onnxruntime $version on the package index"
  name="$(extract "$tmp"/onnxruntime-*.whl libonnxruntime.so. "$out/lib/.libonnxruntime.new")"    # libonnxruntime.so.1.32.0
  mv "$out/lib/.libonnxruntime.new" "$out/lib/$name"
  major="${name#libonnxruntime.so.}"
  ln -sfn "$name" "$out/lib/libonnxruntime.so.${major%%.*}"
  ln -sfn "$name" "$out/lib/libonnxruntime.so"
fi
# onnxruntime-extensions, when the venv has it
if [ ! -e "$out/lib/libortextensions.so" ] &&
   ext="$("$python" -c 'import onnxruntime_extensions as m; print(m.__version__)' 2>/dev/null)"; then
  if aarch64_wheel "onnxruntime-extensions==$ext"; then
    extract "$tmp"/onnxruntime_extensions-*.whl _extensions_pydll "$out/lib/libortextensions.so" >/dev/null
  else
    echo "get_onnxruntime_aarch64: no aarch64 wheel of onnxruntime-extensions $ext: Hugging Face tokenizers need DLLM_ORTX_LIBRARY on the board" >&2
  fi
fi
echo "$out"
