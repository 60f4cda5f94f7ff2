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
if [ ! -e "$out/lib/libonnxruntime.so" ]; then
  version="$("$python" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null)" \
    || die "the onnxruntime wheel is not installed in $python"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.11 \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64 \
    "onnxruntime==$version" -d "$tmp" >&2 || die "no aarch64 wheel of onnxruntime $version on the package index"
  "$python" - "$tmp"/onnxruntime-*.whl "$out/lib" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if os.path.basename(n).startswith("libonnxruntime.so.")]
    if not names:
        sys.exit(f"{wheel}: no libonnxruntime.so.*")
    name = os.path.basename(names[0])                   # libonnxruntime.so.1.32.0
    with z.open(names[0]) as src, open(os.path.join(dest, name + ".part"), "wb") as dst:
        dst.write(src.read())
    os.replace(os.path.join(dest, name + ".part"), os.path.join(dest, name))
    major = name[len("libonnxruntime.so."):].split(".")[0]
    for link in (f"libonnxruntime.so.{major}", "libonnxruntime.so"):
        if os.path.lexists(os.path.join(dest, link)):
            os.remove(os.path.join(dest, link))
        os.symlink(name, os.path.join(dest, link))
PY
fi
# onnxruntime-extensions: the same wheel platforms, the venv's Python
if [ ! -e "$out/lib/libortextensions.so" ] &&
   ext="$("$python" -c 'import onnxruntime_extensions as m; print(m.__version__)' 2>/dev/null)"; then
  pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  tmp2="$(mktemp -d)"
  trap 'rm -rf "${tmp:-}" "$tmp2"' EXIT
  if "$python" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$pyver" \
      --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64 \
      "onnxruntime-extensions==$ext" -d "$tmp2" >&2; then
    "$python" - "$tmp2"/onnxruntime_extensions-*.whl "$out/lib/libortextensions.so" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if os.path.basename(n).startswith("_extensions_pydll") and n.endswith(".so")]
    if not names:
        sys.exit(f"{wheel}: no _extensions_pydll*.so")
    with z.open(names[0]) as src, open(dest + ".part", "wb") as dst:
        dst.write(src.read())
    os.replace(dest + ".part", dest)
PY
  else
    echo "get_onnxruntime_aarch64: no aarch64 wheel of onnxruntime-extensions $ext: Hugging Face tokenizers need DLLM_ORTX_LIBRARY on the board" >&2
  fi
fi
echo "$out"
