#!/usr/bin/env bash
# Run a program of the aarch64 cross build (cpp/scripts/build.sh aarch64) on this x86-64 machine,
# emulating a board's CPU with qemu-user (Debian: apt-get install qemu-user):
#   cpp/scripts/qemu-run.sh build/cpp-aarch64/dllm-generate --artifact ART --prompt "..."
#   QEMU_CPU=cortex-a76 cpp/scripts/qemu-run.sh ...     # Raspberry Pi 5's core
# QEMU_CPU: neoverse-n1 (default: Jetson AGX Orin's / Graviton2's core) or cortex-a76. qemu's own
# "max" model offers instructions ONNX Runtime's int8 kernels take and the emulation gets wrong, and
# cortex-a72 stops on an illegal instruction (docs/cpp.md, "Cross-building for a board").
# ONNX Runtime's CPU detection reads /proc/cpuinfo, which under qemu 7.2 is the host's x86 file, and
# crashes on it: the program runs in a private mount namespace (unshare -m; root) where
# /proc/cpuinfo is the emulated core's. The target's libraries come from Debian's cross sysroot
# (/usr/aarch64-linux-gnu), ONNX Runtime from build/onnxruntime-aarch64. The sysroot's lib folder
# comes first in the library path: with Debian multiarch arm64 packages installed (the arm64
# libpython the Hugging Face tokenizer library needs), the host's loader cache names their libc,
# which the sysroot's loader hangs on.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cpu="${QEMU_CPU:-neoverse-n1}"
sysroot="${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}"

die() { echo "qemu-run: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: $0 PROGRAM [ARGS...]"
command -v qemu-aarch64 >/dev/null || die "no qemu-aarch64 (Debian: apt-get install qemu-user)"
[ -d "$sysroot/lib" ] || die "no aarch64 sysroot at $sysroot (Debian: apt-get install g++-aarch64-linux-gnu)"

case "$cpu" in    # the fields ONNX Runtime's cpuinfo reads: implementer, part, variant, revision, features
  neoverse-n1) part=0xd0c variant=0x3 features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
  cortex-a76) part=0xd0b variant=0x4 features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp" ;;
  *) die "QEMU_CPU=$cpu: one of neoverse-n1, cortex-a76" ;;
esac
cpuinfo="$(mktemp)"
trap 'rm -f "$cpuinfo"' EXIT
for p in $(seq 0 $(($(nproc) - 1))); do
  printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: 1\n\n' \
    "$p" "$features" "$variant" "$part" >> "$cpuinfo"
done
libs="$repo/build/cpp-aarch64:$repo/build/onnxruntime-aarch64/lib:$sysroot/lib"
unshare -m sh -c 'mount --bind "$1" /proc/cpuinfo && shift && exec "$@"' sh "$cpuinfo" \
  qemu-aarch64 -cpu "$cpu" -L "$sysroot" -E "LD_LIBRARY_PATH=$libs" "$@"
