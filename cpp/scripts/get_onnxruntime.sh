#!/usr/bin/env bash
# Provide ONNX Runtime headers + library for the C++ build in $OUT (default build/onnxruntime):
#   $OUT/include/onnxruntime_c_api.h ...   headers from Debian trixie's libonnxruntime-dev
#   $OUT/lib/libonnxruntime.so             symlink to the library of the venv's onnxruntime wheel
# Prints the ONNXRUNTIME_ROOT to use on stdout (the last line).
#
# A user who has ONNX Runtime already sets ONNXRUNTIME_ROOT=/path (with include/ and lib/):
# it is checked and used as is. Idempotent: a second run only checks and returns.
# The headers come from a Debian package unpacked by debian_package.sh (private apt state: the
# host's apt configuration is read but never changed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/build/onnxruntime}"
python="${PYTHON:-$repo/.venv/bin/python}"

die() { echo "get_onnxruntime: $*" >&2; exit 2; }

if [ -n "${ONNXRUNTIME_ROOT:-}" ]; then
  [ -f "$ONNXRUNTIME_ROOT/include/onnxruntime_c_api.h" ] || die "ONNXRUNTIME_ROOT=$ONNXRUNTIME_ROOT has no include/onnxruntime_c_api.h"
  ls "$ONNXRUNTIME_ROOT"/lib/libonnxruntime.so* >/dev/null 2>&1 || die "ONNXRUNTIME_ROOT=$ONNXRUNTIME_ROOT has no lib/libonnxruntime.so*"
  echo "$ONNXRUNTIME_ROOT"
  exit 0
fi

mkdir -p "$out/include" "$out/lib"

# 1. the library: the one the Python runtime uses, so both run the same kernels
if [ ! -e "$out/lib/libonnxruntime.so" ]; then
  [ -x "$python" ] || die "no Python at $python (run 'make test' once, or set PYTHON=...)"
  capi="$("$python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))' 2>/dev/null)" \
    || die "the onnxruntime wheel is not installed in $python"
  lib="$(ls "$capi"/libonnxruntime.so.* 2>/dev/null | head -n 1)"
  [ -n "$lib" ] || die "no libonnxruntime.so.* in $capi"
  name="$(basename "$lib")"                       # libonnxruntime.so.1.32.0
  major="${name#libonnxruntime.so.}"; major="${major%%.*}"
  rm -f "$out"/lib/libonnxruntime.so*
  # the link name, the SONAME the binaries record (libonnxruntime.so.1), and the full name
  for link in libonnxruntime.so "libonnxruntime.so.$major" "$name"; do ln -sfn "$lib" "$out/lib/$link"; done
fi

# 2. the headers: Debian trixie's libonnxruntime-dev (bookworm has none)
if [ ! -f "$out/include/onnxruntime_c_api.h" ]; then
  x="$out/.deb"
  rm -rf "$x"
  bash "$here/debian_package.sh" libonnxruntime-dev "$x" || die "set ONNXRUNTIME_ROOT to an ONNX Runtime with include/ and lib/"
  hdr="$(dirname "$(find "$x" -name onnxruntime_c_api.h | head -n 1)")"
  [ -f "$hdr/onnxruntime_c_api.h" ] || die "libonnxruntime-dev has no onnxruntime_c_api.h"
  cp -r "$hdr"/. "$out/include/"
  rm -rf "$x"
fi

echo "$out"
