#!/usr/bin/env bash
# Install what the aarch64 check needs (tests/integration/cpp/test_aarch64.py): Debian's g++-aarch64-linux-gnu
# (the cross compiler and the target's sysroot, /usr/aarch64-linux-gnu), qemu-user, and the arm64
# libpython of the venv's Python (multiarch: the Hugging Face tokenizer library of the aarch64
# onnxruntime-extensions wheel is a Python extension module and needs its symbols), when they are
# missing and this runs as root with apt-get; otherwise say why not and leave the tests to skip.
# Never fails the caller. ~20 s on a fresh machine (+ ~25 s for libpython), nothing when present.
set -uo pipefail
python="${PYTHON:-$(dirname "$0")/../../.venv/bin/python}"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || echo 3.11)"
missing=()
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
[ -e "/usr/lib/aarch64-linux-gnu/libpython$pyver.so.1.0" ] || missing+=("libpython$pyver:arm64")
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "get_cross_tools: ${missing[*]} missing and no root apt-get here: the aarch64 checks will skip" >&2
  exit 0
fi
case " ${missing[*]} " in *:arm64*) dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64 && apt-get update -q >/dev/null 2>&1; } ;; esac
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }
# a fresh machine may have no package lists yet: update them once and retry
install || { apt-get update -q >/dev/null 2>&1 && install; } ||
  echo "get_cross_tools: apt-get install ${missing[*]} failed: the aarch64 checks will skip" >&2
exit 0
