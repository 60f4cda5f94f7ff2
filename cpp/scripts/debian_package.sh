#!/usr/bin/env bash
# Unpack one Debian trixie package into a folder, without installing it:
#   cpp/scripts/debian_package.sh PACKAGE DIR     -> DIR/usr/... (the package's files)
# The apt state lives in a private folder (DIR/.apt, removed at the end): the host's apt
# configuration is read (the Debian mirror's URIs) but never changed. Used for build-time
# headers the host's Debian may lack (ONNX Runtime's, nlohmann-json's).
set -euo pipefail

pkg="${1:?usage: debian_package.sh PACKAGE DIR}"
dir="${2:?usage: debian_package.sh PACKAGE DIR}"

die() { echo "debian_package: $*" >&2; exit 2; }

command -v apt-get >/dev/null || die "no apt-get to fetch $pkg"
src=/etc/apt/sources.list.d/debian.sources
uri=""
[ -f "$src" ] && uri="$(awk '/^URIs:/ {print $2; exit}' "$src")"
[ -n "$uri" ] || die "no Debian mirror (URIs:) in $src to fetch $pkg from"
apt="$dir/.apt"
mkdir -p "$apt/parts" "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/deb"
cat > "$apt/parts/trixie.sources" <<SRC
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt/parts"
      -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Debug::NoLocking=1
      -o APT::Sandbox::User=root -q)
apt-get "${opts[@]}" update >&2 || die "apt-get update (trixie) failed"
(cd "$apt/deb" && apt-get "${opts[@]}" download "$pkg" >&2) || die "apt-get download $pkg failed"
deb="$(ls "$apt/deb/${pkg}"_*.deb | head -n 1)"
dpkg-deb -x "$deb" "$dir"
rm -rf "$apt"
