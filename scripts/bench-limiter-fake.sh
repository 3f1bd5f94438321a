#!/usr/bin/env bash
# The limiter's own cost per call, on an independent fake driver (limiter/benches/fakecuda.c: no
# shared state, files or locks, so the driver's own call costs a few ns and what the limiter adds
# is not lost in its noise), against the same fake driver without the limiter, in the same
# process and run (limiter/benches/overhead.c, alternating rounds; "added" is the median of the
# per-round differences). Two configurations, each run REPEATS times (median of the runs shown):
#   limit mode: memory cap and SM cap (CUDA_DEVICE_MEMORY_LIMIT=64g, CUDA_DEVICE_SM_LIMIT=50);
#   memory cap only (as in mps mode): launches pass no SM gate.
# Targets: cuMemAlloc+cuMemFree <= +35 ns added; cuLaunchKernel <= +2 ns added.
# GPUSHARE_BENCH_BASELINE_SO=/path/to/another/libgpushare_limiter.so runs that build alternately
# with this one (e.g. the build before a change), for before/after figures from one run.
# Usage: scripts/bench-limiter-fake.sh [ROUNDS] [REPEATS]     (needs cargo, cc, nvidia-cuda-dev)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${GPUSHARE_BENCH_TARGET_DIR:-$root/target/bench}
rounds=${1:-101}
repeats=${2:-5}
cargo build --release --quiet -p gpushare-limiter --manifest-path "$root/Cargo.toml" --target-dir "$target"
fake=$target/fakecuda
mkdir -p "$fake"
cc -O2 -Wall -shared -fPIC -o "$fake/libcuda.so.1" "$root/limiter/benches/fakecuda.c"
ln -sfn libcuda.so.1 "$fake/libcuda.so"
cc -O2 -Wall -o "$target/overhead" "$root/limiter/benches/overhead.c" -ldl
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
builds=("now=$target/release/libgpushare_limiter.so")
[ -n "${GPUSHARE_BENCH_BASELINE_SO:-}" ] && builds+=("baseline=$GPUSHARE_BENCH_BASELINE_SO")
run() { # config limiter.so
    local caps=(CUDA_DEVICE_MEMORY_LIMIT=64g)
    [ "$1" = limit ] && caps+=(CUDA_DEVICE_SM_LIMIT=50)
    rm -rf "$state/cache"
    env -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT \
        LD_LIBRARY_PATH="$fake" GPUSHARE_LIMITS_FILE="$state/none" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$state/cache" "${caps[@]}" \
        "$target/overhead" "$2" "$rounds" 200000 20000 2>/dev/null
}
for ((i = 0; i < repeats; i++)); do
    for config in limit memonly; do
        for b in "${builds[@]}"; do
            run "$config" "${b#*=}" >>"$state/${b%%=*}.$config"
        done
    done
done
med() { # file pattern field
    grep "$2" "$1" | grep -oE "$3 -?[0-9.]+" | grep -oE -- '-?[0-9.]+$' | sort -n |
        awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
echo "limiter on the independent fake driver (limiter/benches/fakecuda.c), per call, median of $repeats runs of $rounds rounds"
printf '%-9s %-16s %-31s %10s %12s %9s %7s  %s\n' build config call "fake alone" "with limiter" added ratio target
for b in "${builds[@]}"; do
    name=${b%%=*}
    for config in limit memonly; do
        f=$state/$name.$config
        label=$([ "$config" = limit ] && echo "mem+SM cap" || echo "mem cap only")
        for p in "cuLaunchKernel" "cuMemAlloc+cuMemFree" "cuMemAllocAsync+cuMemFreeAsync"; do
            d=$(med "$f" "^$p " "driver")
            l=$(med "$f" "^$p " "with limiter")
            a=$(med "$f" "^$p " "added")
            case $p in
                cuLaunchKernel) goal=2 ;;
                cuMemAlloc+cuMemFree) goal=35 ;;
                *) goal= ;;
            esac
            verdict=
            [ -n "$goal" ] && verdict=$(awk -v a="$a" -v g="$goal" 'BEGIN {printf "<= +%d ns: %s", g, (a <= g ? "met" : "NOT met")}')
            printf '%-9s %-16s %-31s %7s ns %9s ns %+6.1f ns %6.2fx  %s\n' "$name" "$label" "$p" "$d" "$l" "$a" \
                "$(awk -v l="$l" -v d="$d" 'BEGIN {printf "%.2f", l / d}')" "$verdict"
        done
    done
done
