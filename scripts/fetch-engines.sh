#!/usr/bin/env bash
# Fetches Debian 13 (trixie) engine packages and unpacks them into a private prefix, without
# touching the machine's own packages: `apt-get download` with a separate sources list and
# package lists, then `dpkg -x`. Used by the engine tests for containerd 1.7 and Docker 26, and
# for the CRI api.proto. Idempotent: a prefix that already holds every package is left alone.
#
#   scripts/fetch-engines.sh [PREFIX]      default: $GS_ENGINES or /var/cache/gpushare-engines
#
# Afterwards PREFIX/trixie/root/usr/bin holds containerd, ctr, containerd-shim-runc-v2, dockerd,
# docker; PREFIX/trixie/root/usr/share/gocode/src/k8s.io/cri-api holds the CRI protocol.
set -euo pipefail

PREFIX=${1:-${GS_ENGINES:-/var/cache/gpushare-engines}}
D=$PREFIX/trixie
ROOT=$D/root
PKGS=(containerd docker.io docker-cli golang-github-kubernetes-cri-api-dev)

if [ -f "$D/done" ] && [ "$(cat "$D/done")" = "${PKGS[*]}" ]; then
    echo "fetch-engines: $ROOT already unpacked"
    exit 0
fi

# The mirror the machine already uses (deb822 or one-line sources), so no other host is named.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f")
    [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "fetch-engines: no Debian mirror found in the apt sources" >&2; exit 1; }

rm -rf "$D.tmp"
mkdir -p "$D.tmp/lists/partial" "$D.tmp/debs" "$D.tmp/root"
echo "deb $mirror trixie main" >"$D.tmp/sources.list"
O=(-o "Dir::Etc::SourceList=$D.tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$D.tmp/lists" -o Dir::Cache=/nonexistent -o APT::Sandbox::User=root)
echo "fetch-engines: trixie package lists from $mirror"
apt-get "${O[@]}" -qq update
(cd "$D.tmp/debs" && apt-get "${O[@]}" -qq download "${PKGS[@]}")
for f in "$D.tmp/debs"/*.deb; do
    echo "fetch-engines: unpacking $(basename "$f")"
    dpkg -x "$f" "$D.tmp/root"
done
rm -rf "$D.tmp/lists"
echo "${PKGS[*]}" >"$D.tmp/done"
rm -rf "$D"
mv "$D.tmp" "$D"
echo "fetch-engines: unpacked into $ROOT"
