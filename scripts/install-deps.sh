#!/usr/bin/env bash
# Installs what the test suite and the demo need, when missing: container engines, busybox,
# the NVIDIA MPS control daemon and CUDA headers (Debian contrib/non-free), C toolchain bits.
# Idempotent; prints what it does. Needs root and the machine's package sources.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
pkg_for() { # command package
    have "$1" || need+=("$2")
}
pkg_for runc runc
pkg_for busybox busybox-static
pkg_for podman podman
pkg_for containerd containerd
pkg_for dockerd docker.io
pkg_for nvidia-cuda-mps-control nvidia-cuda-mps
pkg_for nvidia-smi nvidia-smi
pkg_for gcc gcc
pkg_for jq jq
pkg_for nsenter util-linux
pkg_for pgrep procps          # engine tests find MPS daemons
pkg_for gzip gzip             # engine tests build an OCI image tarball
pkg_for capsh libcap2-bin      # a test drops CAP_SYS_ADMIN
[ -e /usr/include/cuda.h ] || need+=(nvidia-cuda-dev)
ls /usr/lib/*/libnvidia-ml.so.1 >/dev/null 2>&1 || need+=(libnvidia-ml1)

if [ ${#need[@]} -eq 0 ]; then
    echo "install-deps: everything present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${need[*]}; run as root to install them" >&2
    exit 1
fi

# The NVIDIA packages live in Debian's contrib and non-free components: add them to the
# existing sources (deb822 or one-line format) if they are not there yet.
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    if grep -q '^Components:' "$f" && ! grep -q '^Components:.*non-free' "$f"; then
        sed -i -E 's/^(Components:.*\bmain\b.*)$/\1 contrib non-free/' "$f"
        echo "install-deps: enabled contrib non-free in $f"
    fi
done
if [ -f /etc/apt/sources.list ] && grep -qE '^deb .* main' /etc/apt/sources.list \
    && ! grep -qE '^deb .*non-free' /etc/apt/sources.list; then
    sed -i -E 's/^(deb .* main)(.*)$/\1\2 contrib non-free/' /etc/apt/sources.list
fi

echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "install-deps: done"
