#!/usr/bin/env bash
# Installs what the test suite needs, when missing: container engines, busybox, the NVIDIA MPS
# control daemon and CUDA headers (Debian contrib/non-free), C toolchain bits, the package
# builders and the engines' extra versions.
#
#   scripts/install-deps.sh          everything the test suite needs (scripts/test.sh)
#   scripts/install-deps.sh --demo   only what scripts/demo.sh needs: runc, busybox-static,
#                                    nvidia-cuda-mps, jq, the C toolchain and the zig linker
#
# Idempotent; prints what it does. Needs root and the machine's package sources.
set -euo pipefail

DEMO=0
[ "${1:-}" = --demo ] && DEMO=1

need=()
have() { command -v "$1" >/dev/null 2>&1; }
pkg_for() { # command package
    have "$1" || need+=("$2")
}
# What the demo needs (and the tests too).
pkg_for runc runc
pkg_for busybox busybox-static
pkg_for nvidia-cuda-mps-control nvidia-cuda-mps
pkg_for gcc gcc
# gcc's C library headers and start files (a Recommends of gcc, which --no-install-recommends
# leaves out): rustc links with cc.
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
pkg_for jq jq
# The Rust toolchain comes from rustup (Debian 12's rustc is older than the workspace's
# rust-version); rustup-init is fetched with curl.
have_cargo() { have cargo || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; }
if ! have_cargo; then
    pkg_for curl curl
    [ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
fi
pkg_for() { # command package: the test suite only
    if [ "$DEMO" = 0 ] && ! have "$1"; then need+=("$2"); fi
}
pkg_for podman podman
pkg_for containerd containerd
pkg_for dockerd docker.io
pkg_for nvidia-smi nvidia-smi
pkg_for nsenter util-linux
pkg_for pgrep procps          # engine tests find MPS daemons
pkg_for gzip gzip             # engine tests build an OCI image tarball
pkg_for capsh libcap2-bin      # a test drops CAP_SYS_ADMIN
pkg_for rpm rpm                # the package test lists the .rpm's files
pkg_for readelf binutils       # cargo-deb strips; the package test checks it did
pkg_for dpkg-shlibdeps dpkg-dev # cargo-deb's Depends: $auto
pkg_for zsh zsh                # the generated zsh completion is syntax-checked
pkg_for fish fish              # the generated fish completion is syntax-checked

pkg_for promtool prometheus      # the metrics tests lint the exposition and scrape `serve`
# python3-venv: the zig venv (both), the CRI client and manifest validation (tests).
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ "$DEMO" = 0 ]; then
    [ -e /usr/include/cuda.h ] || need+=(nvidia-cuda-dev)
    ls /usr/lib/*/libnvidia-ml.so.1 >/dev/null 2>&1 || need+=(libnvidia-ml1)
fi

# Beyond the machine's packages (no system upgrade, nothing outside a private prefix):
#  - Debian 13 engines (containerd 1.7, Docker 26) and the CRI api.proto, unpacked by
#    scripts/fetch-engines.sh into $GS_ENGINES (default /var/cache/gpushare-engines);
#  - a Python venv there with grpcio-tools (the CRI test's client) and kubernetes-validate (the
#    Kubernetes manifests, validated offline against the schemas it ships).
ENGINES=${GS_ENGINES:-/var/cache/gpushare-engines}
VENV=$ENGINES/venv
PY_PKGS=(grpcio-tools kubernetes-validate)
extras() {
    bash "$(dirname "$0")/fetch-engines.sh" "$ENGINES"
    if "$VENV/bin/python" -c 'import grpc_tools, kubernetes_validate' 2>/dev/null; then
        echo "install-deps: $VENV has ${PY_PKGS[*]}"
    else
        echo "install-deps: $VENV: installing ${PY_PKGS[*]}"
        rm -rf "$VENV"
        /usr/bin/python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}"
    fi
}

# The linker of every build (.cargo/config.toml, scripts/link-glibc2.17): zig from PyPI's
# `ziglang` and cargo-zigbuild (its `zig cc` wrapper) from PyPI's `cargo-zigbuild` (the same
# release as crates.io's, prebuilt) in a venv under $GS_ZIG (default /var/cache/gpushare-zig), so
# that what is built needs only glibc 2.17. A cargo-zigbuild on PATH or in ~/.cargo/bin does too.
ZIGDIR=${GS_ZIG:-/var/cache/gpushare-zig}
have_zigbuild() {
    have cargo-zigbuild || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-zigbuild" ] \
        || [ -x "$ZIGDIR/venv/bin/cargo-zigbuild" ]
}
zig_tools() {
    local pkgs=()
    if [ -x "$ZIGDIR/venv/bin/zig" ] && "$ZIGDIR/venv/bin/zig" version >/dev/null 2>&1; then
        echo "install-deps: $ZIGDIR/venv has zig $("$ZIGDIR/venv/bin/zig" version)"
    else
        rm -rf "$ZIGDIR/venv"
        pkgs+=(ziglang)
    fi
    have_zigbuild || pkgs+=(cargo-zigbuild)
    [ ${#pkgs[@]} -gt 0 ] || return 0
    echo "install-deps: $ZIGDIR/venv: installing ${pkgs[*]}"
    if ! [ -x "$ZIGDIR/venv/bin/pip" ]; then
        mkdir -p "$ZIGDIR"
        /usr/bin/python3 -m venv "$ZIGDIR/venv"
    fi
    "$ZIGDIR/venv/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}"
    local py
    py=$(ls -d "$ZIGDIR"/venv/lib/python3*/site-packages/ziglang | head -1)
    ln -sfn "$py/zig" "$ZIGDIR/venv/bin/zig"
}

# The Rust toolchain, when cargo is missing: rustup's stable toolchain in ${CARGO_HOME:-~/.cargo}
# (rustup adds it to the login shells' PATH): for the demo its minimal profile (rustc, cargo,
# the standard library), for the tests the default one (with clippy and rustfmt).
RUSTUP_PROFILE=default
[ "$DEMO" = 1 ] && RUSTUP_PROFILE=minimal
RUSTUP_PROFILE=${GS_RUSTUP_PROFILE:-$RUSTUP_PROFILE}
rust_toolchain() {
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    if have cargo; then return; fi
    echo "install-deps: installing the Rust toolchain (rustup, stable, profile $RUSTUP_PROFILE)"
    # rustup-init itself, what https://sh.rustup.rs fetches.
    local init
    init=$(mktemp /tmp/rustup-init-XXXXXX)
    curl --proto '=https' --tlsv1.2 -sSf -o "$init" \
        "https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init"
    chmod +x "$init"
    "$init" -y -q --profile "$RUSTUP_PROFILE" --default-toolchain stable
    rm -f "$init"
}

# The package builders, from crates.io, when missing (the package test builds the .deb and .rpm).
cargo_tools() {
    local tool tools=(cargo-deb cargo-generate-rpm)
    [ "$DEMO" = 0 ] || return 0
    for tool in "${tools[@]}"; do
        if ! command -v "$tool" >/dev/null 2>&1 && ! [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/$tool" ]; then
            echo "install-deps: cargo install --locked $tool"
            # From /, so that this repository's linker (which needs cargo-zigbuild) is not used.
            (cd / && cargo install --locked --quiet "$tool")
        fi
    done
}

if [ ${#need[@]} -eq 0 ]; then
    echo "install-deps: every package present"
    if [ "$(id -u)" -eq 0 ] || [ -w "$(dirname "$ZIGDIR")" ]; then zig_tools; fi
    rust_toolchain
    cargo_tools
    if [ "$(id -u)" -eq 0 ] && [ "$DEMO" = 0 ]; then extras; fi
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
if [ "$DEMO" = 0 ]; then extras; fi
# The toolchain and the linker download at once.
rust_toolchain &
rust_pid=$!
zig_tools
wait "$rust_pid"
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
cargo_tools
echo "install-deps: done"
