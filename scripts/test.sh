#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing (engines, busybox, the NVIDIA
# MPS daemon, CUDA headers), then the gates: rustfmt, clippy with warnings denied, and every test
# of the workspace (unit, simulated-driver, runc/podman/containerd/Docker end to end).
# Needs root. Tests that lack an engine fail under CI=true and print SKIPPED elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo build --workspace"
cargo build --workspace

echo "== cargo test --workspace"
# Engine tests start daemons and containers: keep their number at once modest on small machines.
cargo test --workspace -- --test-threads="${TEST_THREADS:-4}"
