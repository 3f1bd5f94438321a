#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing (engines, busybox, the NVIDIA
# MPS daemon, CUDA headers), then the gates: rustfmt, the module graph (no import circles in any
# crate of the workspace, the layer order of src/), clippy with warnings denied, and every test
# of the workspace (unit, simulated-driver, runc/podman/containerd/Docker end to end).
# Needs root. Tests that lack an engine fail under CI=true and print SKIPPED elsewhere.
#
# The workspace is built once (`cargo build --workspace` of every target the tests run: the
# binaries and the limiter's and the simulated driver's cdylibs, which the limiter tests take from
# there instead of building their own, and which the package test packs instead of a release
# build, and the test targets, so that the dependencies' features are the tests' ones and nothing
# is compiled twice); the tests then run with
# cargo-nextest, each in its own process and the test binaries side by side
# (.config/nextest.toml; the engine scripts two at a time, holding one host-wide lock shared, or
# alone where they change what every engine sees). Without cargo-nextest they run with
# `cargo test`, one binary after another.
# TEST_THREADS (default 4) is how many tests run at once. Afterwards no mount the tests made may
# be left under the temp dir.
# Incremental compilation is off where this checkout's build has no incremental cache yet (a
# fresh checkout, where it would only be written, never read; the build of the workspace's crates
# and test targets took 52 s instead of 73 s without it), unless CARGO_INCREMENTAL says otherwise.
# Where a cache is there, it stays on: switching it off or on rebuilds the workspace's crates.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CARGO_INCREMENTAL+set}" ] && [ -z "$(ls -A "${CARGO_TARGET_DIR:-target}/debug/incremental" 2>/dev/null)" ]; then
    export CARGO_INCREMENTAL=0
fi

scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== module graph (no import circles in the workspace; src/ layers)"
python3 scripts/module-graph.py --self-test
python3 scripts/module-graph.py

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo build --workspace --lib --bins --tests --examples"
# The targets `cargo test` builds: with the tests' dev-dependencies in the build, cargo gives the
# dependencies the same features as for the tests, and the test run compiles nothing again (a
# plain `cargo build --workspace` built nix, kube-client and the workspace's crates a second
# time, with other features).
cargo build --workspace --lib --bins --tests --examples
export GPUSHARE_TEST_CDYLIBS=${CARGO_TARGET_DIR:-$PWD/target}/debug
# The package test packs this same build (packaging/build-prep.sh) instead of compiling the
# workspace a second time in the release profile.
export GPUSHARE_PREBUILT=$GPUSHARE_TEST_CDYLIBS
# ... and compresses it quickly: the test checks what is packed, not how small
# (packaging/build-prep.sh).
export GPUSHARE_PACK_FAST=1

# Mounts under the temp dir before the tests: every one the tests add must be gone after them
# (a leaked mount keeps a test's temp dir, and makes every later read of the mount table slower).
tmp=${TMPDIR:-/tmp}
mounts_in_tmp() { awk -v t="$tmp/" 'index($5, t) == 1 {print $5}' /proc/self/mountinfo | sort; }
before=$(mktemp)
trap 'rm -f "$before"' EXIT
mounts_in_tmp >"$before"

threads=${TEST_THREADS:-4}
rc=0
if cargo nextest --version >/dev/null 2>&1; then
    echo "== cargo nextest run --workspace"
    cargo nextest run --workspace --no-fail-fast --test-threads="$threads" || rc=$?
else
    echo "== cargo test --workspace (cargo-nextest not installed: one test binary at a time)"
    cargo test --workspace --no-fail-fast -- --test-threads="$threads" || rc=$?
fi

echo "== no mount left under $tmp by the tests"
leaked=$(mounts_in_tmp | comm -13 "$before" -)
if [ -n "$leaked" ]; then
    echo "the tests left $(wc -l <<<"$leaked") mount(s) under $tmp (a test's clean-up is missing):" >&2
    head -20 <<<"$leaked" >&2
    rc=1
fi
exit "$rc"
