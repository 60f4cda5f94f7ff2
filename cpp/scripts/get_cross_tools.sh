#!/usr/bin/env bash
# Install what the aarch64 check needs (tests/cpp/test_aarch64.py): Debian's g++-aarch64-linux-gnu
# (the cross compiler and the target's sysroot, /usr/aarch64-linux-gnu) and qemu-user, when they
# are missing and this runs as root with apt-get; otherwise say why not and leave the test to skip.
# Never fails the caller. ~20 s on a fresh machine, nothing when present.
set -uo pipefail
missing=()
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "get_cross_tools: ${missing[*]} missing and no root apt-get here: the aarch64 check will skip" >&2
  exit 0
fi
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }
# a fresh machine may have no package lists yet: update them once and retry
install || { apt-get update -q >/dev/null 2>&1 && install; } ||
  echo "get_cross_tools: apt-get install ${missing[*]} failed: the aarch64 check will skip" >&2
exit 0
