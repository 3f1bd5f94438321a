#!/usr/bin/env bash
# Benchmark of gpushare-hook (fast path, warm MPS acquire, 32-way concurrency) against a floor
# process in the same run. Needs root and nvidia-cuda-mps-control; uses the TEST-ONLY simulated
# NVML. Usage: scripts/bench-hook.sh [rounds]
# BENCH_HOOK=<dir>/gpushare-hook times another build instead (its libgpushare_simdriver.so and
# libgpushare_limiter.so beside it): run it interleaved with this build's runs to compare two.
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_ROUNDS=${1:-201}
cargo build --release --workspace >&2
cargo bench --bench hook
