#!/usr/bin/env bash
# Provide the nlohmann-json headers (header only) for the C++ build in $OUT (default
# build/nlohmann_json): $OUT/include/nlohmann/json.hpp, from Debian trixie's nlohmann-json3-dev
# unpacked by debian_package.sh (the host's apt configuration is never changed).
# Prints the NLOHMANN_JSON_ROOT to use on stdout (the last line).
#
# A user who has nlohmann-json already sets NLOHMANN_JSON_ROOT=/path (with include/nlohmann/):
# it is checked and used as is. Idempotent: a second run only checks and returns.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/build/nlohmann_json}"

die() { echo "get_nlohmann_json: $*" >&2; exit 2; }

if [ -n "${NLOHMANN_JSON_ROOT:-}" ]; then
  [ -f "$NLOHMANN_JSON_ROOT/include/nlohmann/json.hpp" ] || die "NLOHMANN_JSON_ROOT=$NLOHMANN_JSON_ROOT has no include/nlohmann/json.hpp"
  echo "$NLOHMANN_JSON_ROOT"
  exit 0
fi

if [ ! -f "$out/include/nlohmann/json.hpp" ]; then
  x="$out/.deb"
  rm -rf "$x"
  bash "$here/debian_package.sh" nlohmann-json3-dev "$x" || die "set NLOHMANN_JSON_ROOT to a folder with include/nlohmann/json.hpp"
  [ -f "$x/usr/include/nlohmann/json.hpp" ] || die "nlohmann-json3-dev has no nlohmann/json.hpp"
  mkdir -p "$out/include"
  cp -r "$x/usr/include/nlohmann" "$out/include/"
  rm -rf "$x"
fi

echo "$out"
