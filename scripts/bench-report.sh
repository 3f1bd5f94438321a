#!/usr/bin/env bash
# One benchmark report: runs scripts/bench-hook.sh, scripts/bench-runtime.sh and
# scripts/bench-limiter.sh, and prints one markdown table of every figure as a ratio against its
# baseline measured in the same run, with the machine it ran on. GPU work runs on the TEST-ONLY
# simulated driver (and the real nvidia-cuda-mps-control).
# Needs root, runc, nvidia-cuda-mps-control, cc and nvidia-cuda-dev.
#   scripts/bench-report.sh [HOOK_ROUNDS [RUNTIME_ROUNDS [LIMITER_ROUNDS]]]   (defaults 201 41 101)
set -euo pipefail
cd "$(dirname "$0")/.."
hr=${1:-201} rr=${2:-41} lr=${3:-101}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cargo build --release --workspace >&2
echo "bench-report: hook ($hr rounds)" >&2
scripts/bench-hook.sh "$hr" >"$out/hook" 2>"$out/hook.err" || { cat "$out/hook.err" >&2; exit 1; }
echo "bench-report: runtime ($rr rounds)" >&2
scripts/bench-runtime.sh "$rr" >"$out/runtime" 2>"$out/runtime.err" || { cat "$out/runtime.err" >&2; exit 1; }
echo "bench-report: limiter ($lr rounds)" >&2
GPUSHARE_BENCH_TARGET_DIR=${GPUSHARE_BENCH_TARGET_DIR:-$PWD/target} \
    scripts/bench-limiter.sh "$lr" >"$out/limiter" 2>"$out/limiter.err" || { cat "$out/limiter.err" >&2; exit 1; }

num() { grep -m1 "$1" "$2" | grep -oE "$3" | grep -oE '[0-9]+(\.[0-9]+)?' | head -1; }
row() { # figure value unit baseline-label baseline-value
    awk -v f="$1" -v v="$2" -v u="$3" -v bl="$4" -v b="$5" 'BEGIN {
        if (v == "" || b == "" || b == 0) { printf "| %s | %s | %s | (not measured) | |\n", f, v, bl; exit }
        printf "| %s | %.3f %s | %s: %.3f %s | %.2fx |\n", f, v, u, bl, b, u, v / b }'
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
echo "## Benchmark report"
echo
echo "Machine: $cpu, $(nproc) CPUs, $mem, $(uname -sr); GPU: TEST-ONLY simulated driver;"
echo "runc $(runc --version | awk 'NR==1 {print $3}'); $(date -u +%Y-%m-%dT%H:%MZ)."
echo "Rounds: hook $hr, runtime $rr, limiter $lr. Each ratio is value / baseline, both measured in this run."
echo
echo "| figure | value | baseline (same run) | ratio |"
echo "|---|---|---|---|"
floor=$(num 'floor (read stdin' "$out/hook" '[0-9.]+ ms')
fast=$(num 'no-share fast path' "$out/hook" '[0-9.]+ ms')
warm=$(num 'mps acquire, daemon running' "$out/hook" '[0-9.]+ ms')
cold32=$(num 'concurrent acquires (cold' "$out/hook" '[0-9.]+ ms total')
warm32=$(num 'concurrent acquires (warm' "$out/hook" '[0-9.]+ ms total')
fast32=$(awk -v f="$fast" 'BEGIN {if (f != "") printf "%.3f", 32 * f}')
cat=$(num 'cat (the same stdin)' "$out/hook" '[0-9.]+ ms')
row "hook, no-share fast path" "$fast" ms "floor process" "$floor"
row "hook, no-share fast path, against cat" "$fast" ms "cat (the same stdin)" "$cat"
row "hook, warm MPS acquire" "$warm" ms "no-share fast path" "$fast"
row "hook, 32 concurrent MPS acquires, cold daemon (total)" "$cold32" ms "32 x no-share fast path" "$fast32"
row "hook, 32 concurrent MPS acquires, warm daemon (total)" "$warm32" ms "32 x no-share fast path" "$fast32"
dwarm=$(num 'mps acquire, 4 domains running' "$out/hook" '[0-9.]+ ms')
dcold32=$(num '4 domains, cold' "$out/hook" '[0-9.]+ ms total')
dwarm32=$(num '4 domains, warm' "$out/hook" '[0-9.]+ ms total')
row "hook, warm MPS acquire, 4 isolation domains on one GPU" "$dwarm" ms "no-share fast path" "$fast"
row "hook, 32 concurrent acquires over 4 domains, cold (total)" "$dcold32" ms "32 x no-share fast path" "$fast32"
row "hook, 32 concurrent acquires over 4 domains, warm (total)" "$dwarm32" ms "32 x no-share fast path" "$fast32"
while read -r label rest; do
    r=$(grep -oE 'runc create median +[0-9.]+' <<<"$rest" | grep -oE '[0-9.]+$')
    g=$(grep -oE 'gpushare-runtime create median +[0-9.]+' <<<"$rest" | grep -oE '[0-9.]+$')
    row "gpushare-runtime create, $label" "$g" ms "runc create" "$r"
done < <(grep -E '^[a-z]+ +runc create median' "$out/runtime")
for mode in timeslice mps; do
    base=$(num "  $mode.*, uncapped " "$out/hook" '[0-9.]+ ms')
    for backend in limiter driver; do
        v=$(num "  $mode.*1Gi cap, $backend " "$out/hook" '[0-9.]+ ms')
        row "hook createRuntime, $mode with a 1Gi container cap, $backend backend" "$v" ms "$mode uncapped" "$base"
    done
done
idle=$(num 'timeslice, uncapped, idle GPU' "$out/hook" '[0-9.]+ ms')
back=$(num '  timeslice, uncapped ' "$out/hook" '[0-9.]+ ms')
row "hook createRuntime, timeslice on an idle GPU (50 ms after the last release)" "$idle" ms "timeslice back to back" "$back"
idle=$(num 'mps, uncapped, idle GPU' "$out/hook" '[0-9.]+ ms')
warm=$(num 'mps acquire, daemon running' "$out/hook" '[0-9.]+ ms')
row "hook createRuntime, mps on an idle GPU (50 ms after the last release: its daemon started anew)" "$idle" ms "a warm MPS join" "$warm"
join=$(num 'timeslice, uncapped, a join' "$out/hook" '[0-9.]+ ms')
first=$(num 'timeslice, uncapped, a join' "$out/hook" "first client [0-9.]+ ms")
row "hook createRuntime, timeslice joining a GPU that serves another timeslice container" "$join" ms "the GPU's first client" "$first"
section=
while IFS= read -r line; do
    if [[ $line == "-- as in mps mode"* ]]; then
        section="in mps mode (memory cap only, MPS client), "
        continue
    fi
    what=${line%%: driver*}
    d=$(grep -oE 'driver [0-9.]+ ns' <<<"$line" | grep -oE '[0-9.]+')
    l=$(grep -oE 'with limiter [0-9.]+ ns' <<<"$line" | grep -oE '[0-9.]+')
    row "limiter, $section$what" "$l" ns "no preload (driver alone)" "$d"
done < <(grep -E ': driver [0-9.]+ ns, with limiter [0-9.]+ ns|^-- as in mps mode' "$out/limiter")
if ! grep -qiE 'async|pool' "$out/limiter"; then
    echo "| limiter, async pool path | (not measured: scripts/bench-limiter.sh prints no async-pool figure) | | |"
fi
other=$(grep -vE ': driver [0-9.]+ ns, with limiter|^rounds:|^-- as in mps mode' "$out/limiter" || true)
if [ -n "$other" ]; then
    echo
    echo "Other limiter output (not in the table's form):"
    echo
    sed 's/^/    /' <<<"$other"
fi
