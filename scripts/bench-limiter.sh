#!/bin/sh
# Benchmark of libgpushare_limiter.so's added cost per call on the TEST-ONLY simulated driver:
# cuLaunchKernel under an SM cap (target <= 100 ns added, median) and a cuMemAlloc+cuMemFree
# pair and a cuMemAllocAsync+cuMemFreeAsync pair under a memory cap (target <= 1 us added,
# median). Driver vs limiter in the same run. Then the same as the limiter runs in `mps` mode
# with a container memory cap: memory cap only (no SM limit), as an MPS client
# (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT set, as the spec edit gives them).
# Last, the limiter's own cost on an independent fake driver (scripts/bench-limiter-fake.sh).
# Usage: scripts/bench-limiter.sh [ROUNDS]     (needs cargo, cc and Debian's nvidia-cuda-dev)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
target=${GPUSHARE_BENCH_TARGET_DIR:-$root/target/bench}
cargo build --release --quiet -p gpushare-limiter -p gpushare-simdriver --manifest-path "$root/Cargo.toml" --target-dir "$target"
rel=$target/release
sim=$target/simlib
sh "$root/simdriver/install-sim.sh" "$sim" "$rel/libgpushare_simdriver.so" >/dev/null
cc -O2 -Wall -o "$target/overhead" "$root/limiter/benches/overhead.c" -ldl
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
env -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT \
    LD_LIBRARY_PATH="$sim" \
    GPUSHARE_SIM_STATE="$state/sim" GPUSHARE_SIM_KERNEL_US=0 \
    GPUSHARE_LIMITS_FILE="$state/none" \
    CUDA_DEVICE_MEMORY_LIMIT=64g CUDA_DEVICE_SM_LIMIT=50 \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$state/cache" \
    "$target/overhead" "$rel/libgpushare_limiter.so" "${1:-101}"
echo "-- as in mps mode with a container memory cap (memory cap only, MPS client env):"
env -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT \
    LD_LIBRARY_PATH="$sim" \
    GPUSHARE_SIM_STATE="$state/sim" GPUSHARE_SIM_KERNEL_US=0 \
    GPUSHARE_LIMITS_FILE="$state/none" \
    CUDA_DEVICE_MEMORY_LIMIT_0=64g \
    CUDA_MPS_PIPE_DIRECTORY="$state/pipe" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=65536M \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$state/cache-mps" \
    "$target/overhead" "$rel/libgpushare_limiter.so" "${1:-101}"
echo "-- the limiter's own cost, on an independent fake driver (scripts/bench-limiter-fake.sh):"
bash "$root/scripts/bench-limiter-fake.sh" "${1:-101}" 3
