#!/usr/bin/env bash
# The limiter's per-call cost as built now (linked for glibc 2.17 by zig, .cargo/config.toml)
# against the same source linked by the host's cc against the host's glibc (the build before
# the glibc 2.17 baseline), in the same run: limiter/benches/overhead.c on the TEST-ONLY
# simulated driver, each build run alternately, and the ratio now / host-linked of each
# call's added cost (the limiter's cost over the driver's own call, measured within one process
# by overhead.c; target: <= 1.10). The "with limiter" totals also carry the driver's cost,
# which varies from process to process on a busy machine.
# Usage: scripts/bench-limiter-glibc.sh [ROUNDS] [REPEATS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${GPUSHARE_BENCH_TARGET_DIR:-$root/target/bench}
rounds=${1:-101}
repeats=${2:-3}
cargo build --release --quiet -p gpushare-limiter -p gpushare-simdriver --manifest-path "$root/Cargo.toml" --target-dir "$target"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=cc \
    cargo build --release --quiet -p gpushare-limiter --manifest-path "$root/Cargo.toml" --target-dir "$target/hostlink"
rel=$target/release
sim=$target/simlib
sh "$root/simdriver/install-sim.sh" "$sim" "$rel/libgpushare_simdriver.so" >/dev/null
cc -O2 -Wall -o "$target/overhead" "$root/limiter/benches/overhead.c" -ldl
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
run() { # limiter.so
    env -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT \
        LD_LIBRARY_PATH="$sim" \
        GPUSHARE_SIM_STATE="$state/sim" GPUSHARE_SIM_KERNEL_US=0 \
        GPUSHARE_LIMITS_FILE="$state/none" \
        CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_SM_LIMIT=50 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$state/cache" \
        "$target/overhead" "$1" "$rounds"
}
: >"$state/now"
: >"$state/host"
for ((i = 0; i < repeats; i++)); do
    run "$rel/libgpushare_limiter.so" >>"$state/now"
    run "$target/hostlink/release/libgpushare_limiter.so" >>"$state/host"
done
# Median over the repeats of each call's "with limiter" ns.
med() { # file pattern field
    grep "$2" "$1" | grep -oE "$3 -?[0-9.]+" | grep -oE -- '-?[0-9.]+$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
echo "per call, median of $repeats runs of $rounds rounds; 'added' is over the driver's own call"
printf '%-31s %11s %11s %6s   %13s %13s\n' call "added 2.17" "added host" ratio "with lim 2.17" "with lim host"
for p in "cuLaunchKernel" "cuMemAlloc+cuMemFree" "cuMemAllocAsync+cuMemFreeAsync"; do
    a=$(med "$state/now" "^$p " "with limiter")
    b=$(med "$state/host" "^$p " "with limiter")
    da=$(med "$state/now" "^$p " "added")
    db=$(med "$state/host" "^$p " "added")
    printf '%-31s %8s ns %8s ns %6s   %10s ns %10s ns\n' "$p" "$da" "$db" \
        "$(awk -v a="$da" -v b="$db" 'BEGIN {printf "%.3f", a / b}')" "$a" "$b"
done
