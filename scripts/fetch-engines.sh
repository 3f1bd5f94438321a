#!/usr/bin/env bash
# Fetches newer Debian engine packages (13 "trixie", and unstable for containerd 2) and unpacks
# them into a private prefix, without touching the machine's own packages: `apt-get download` with a separate sources list and
# package lists, then `dpkg -x`. Used by the engine tests for containerd 1.7 and Docker 26, and
# for the CRI api.proto. Idempotent: a suite whose prefix already holds its packages is left alone.
#
#   scripts/fetch-engines.sh [PREFIX]      default: $GS_ENGINES or /var/cache/gpushare-engines
#
# Afterwards PREFIX/trixie/root/usr/bin holds containerd 1.7, ctr, containerd-shim-runc-v2,
# docker, and usr/sbin dockerd 26; PREFIX/trixie/root/usr/share/gocode/src/k8s.io/cri-api holds
# the CRI protocol; PREFIX/sid/root/usr/bin holds containerd 2.x from Debian unstable. Their
# binaries need glibc 2.34, which Debian 12 has.
set -euo pipefail

PREFIX=${1:-${GS_ENGINES:-/var/cache/gpushare-engines}}

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

fetch() { # suite packages...
    local suite=$1 D=$PREFIX/$1 f
    shift
    if [ -f "$D/done" ] && [ "$(cat "$D/done")" = "$*" ]; then
        echo "fetch-engines: $D/root already unpacked"
        return 0
    fi
    rm -rf "$D.tmp"
    mkdir -p "$D.tmp/lists/partial" "$D.tmp/debs" "$D.tmp/root"
    echo "deb $mirror $suite main" >"$D.tmp/sources.list"
    local O=(-o "Dir::Etc::SourceList=$D.tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$D.tmp/lists" -o Dir::Cache=/nonexistent -o APT::Sandbox::User=root
        -o Dir::State::status=/dev/null) # candidates from $suite alone, not the machine's installed versions
    echo "fetch-engines: $suite package lists from $mirror"
    apt-get "${O[@]}" -qq update
    (cd "$D.tmp/debs" && apt-get "${O[@]}" -qq download "$@")
    for f in "$D.tmp/debs"/*.deb; do
        echo "fetch-engines: unpacking $(basename "$f")"
        dpkg -x "$f" "$D.tmp/root"
    done
    rm -rf "$D.tmp/lists"
    echo "$*" >"$D.tmp/done"
    rm -rf "$D"
    mv "$D.tmp" "$D"
    echo "fetch-engines: unpacked into $D/root"
}

# Debian 13: containerd 1.7, Docker 26, the CRI protocol.
fetch trixie containerd docker.io docker-cli golang-github-kubernetes-cri-api-dev
# Debian unstable: containerd 2.x (config version 3).
fetch sid containerd
# Debian 11 "bullseye" userland (glibc 2.31, as Ubuntu 20.04): the old-glibc rootfs of
# tests/engines/oldglibc.sh; musl (its loader) for the musl image there.
fetch bullseye libc6 libgcc-s1 busybox musl
