#!/bin/sh
# GPU validation of libgpushare_limiter.so on a machine with a real NVIDIA GPU and driver.
# NOT run in CI (no GPU there); run by hand or through a GPU runner:
#   tests/gpu/validate-limiter.sh [LIMITER.so]
# (or GPUSHARE_BIN=.gpu-carry tests/gpu/validate-limiter.sh, with what tests/gpu/prepare.sh built)
# Needs: nvcc (Debian nvidia-cuda-toolkit), nvidia-smi, cargo (unless LIMITER.so is given).
# Checks, on GPU 0 (the one CUDA_VISIBLE_DEVICES=0 selects):
#   1. cudaMemGetInfo total = the 1 GiB cap; without the limiter it is the physical size
#   2. cudaMalloc stops at the cap (CUDA runtime -> cuGetProcAddress path)
#   3. nvidia-smi under the limiter reports memory.total = 1024 MiB
#   4. two processes share one cap
#   5. SM cap 30%: kernel throughput about 30% of the uncapped run (25-40% accepted)
#   6. without the limiter (tests/gpu/guesses.c): arrays take no more than the limiter's
#      conservative layout, deferred-mapping arrays nothing; the simulated driver's guesses
#      (simdriver/src/cuda/guesses.rs) reported as GUESS OK / GUESS DIFFERS
# Prints PASS/FAIL per check; exits 1 if any check fails.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'kill $holder 2>/dev/null; rm -rf "$work"' EXIT
holder=
lib=${1:-}
[ -z "$lib" ] && [ -n "${GPUSHARE_BIN:-}" ] && lib=$(cd "$GPUSHARE_BIN" && pwd)/libgpushare_limiter.so
if [ -z "$lib" ]; then
    cargo build --release --quiet -p gpushare-limiter --manifest-path "$root/Cargo.toml" --target-dir "$root/target/gpu" || exit 1
    lib=$root/target/gpu/release/libgpushare_limiter.so
fi
command -v nvcc >/dev/null || { echo "SKIPPED: nvcc not found (apt-get install nvidia-cuda-toolkit)"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "SKIPPED: nvidia-smi not found (no NVIDIA driver)"; exit 2; }
nvidia-smi -L || { echo "SKIPPED: nvidia-smi sees no GPU"; exit 2; }
nvcc -O2 -o "$work/check" "$root/tests/gpu/limiter_check.cu" || { echo "FAIL: nvcc"; exit 1; }

fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
val() { sed -n "s/^$1=//p"; }
GIB=1073741824
export CUDA_VISIBLE_DEVICES=0
limited() { env CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/cache" \
    GPUSHARE_LIMITS_FILE="$work/none" LD_PRELOAD="$lib" "$@"; }

phys=$("$work/check" meminfo | val MEMINFO_TOTAL)
tot=$(limited "$work/check" meminfo | val MEMINFO_TOTAL)
echo "physical total: $phys bytes; with the limiter: $tot bytes"
[ "$tot" = "$GIB" ] && pass "cudaMemGetInfo reports the 1 GiB cap" || fail "cudaMemGetInfo total $tot, expected $GIB"

got=$(limited "$work/check" fill 64 | val ALLOC_TOTAL)
echo "allocated under the cap: $got bytes"
if [ -n "$got" ] && [ "$got" -le "$GIB" ] && [ "$got" -ge $((GIB - 640 * 1048576)) ]; then
    pass "cudaMalloc stops at the cap (context footprint counted)"
else
    fail "cudaMalloc allocated $got bytes under a 1 GiB cap"
fi

smi=$(limited nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
echo "nvidia-smi memory.total under the limiter: $smi MiB"
[ "$smi" = "1024" ] && pass "nvidia-smi reports the cap" || fail "nvidia-smi memory.total $smi MiB"

limited "$work/check" hold 600 > "$work/hold.out" &
holder=$!
i=0; while ! grep -q HELD=1 "$work/hold.out" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
second=$(limited "$work/check" fill 64 | val ALLOC_TOTAL)
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; holder=
echo "second process allocated $second bytes while the first held 600 MiB"
if [ -n "$second" ] && [ "$second" -le $((GIB - 600 * 1048576)) ]; then
    pass "two processes share one cap"
else
    fail "second process got $second bytes"
fi
after=$(limited "$work/check" fill 64 | val ALLOC_TOTAL)
[ -n "$after" ] && [ "$after" -gt $((GIB / 2)) ] && pass "killed holder's memory came back ($after bytes)" || fail "after kill: $after bytes"

free_k=$("$work/check" spin 5 | val KERNELS)
capped_k=$(env CUDA_DEVICE_SM_LIMIT=30 GPUSHARE_LIMITS_FILE="$work/none" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/cache" \
    LD_PRELOAD="$lib" "$work/check" spin 5 | val KERNELS)
echo "kernels in 5 s: uncapped $free_k, SM cap 30%: $capped_k"
if [ -n "$free_k" ] && [ -n "$capped_k" ] && [ "$free_k" -gt 0 ]; then
    pct=$((capped_k * 100 / free_k))
    echo "capped/uncapped throughput: $pct%"
    [ $pct -ge 25 ] && [ $pct -le 40 ] && pass "SM cap 30% (throughput $pct%)" || fail "SM cap 30%: throughput $pct%"
else
    fail "spin runs printed nothing"
fi

# The simulated driver's guesses (simdriver/src/cuda/guesses.rs) and the limiter's array layout,
# measured without the limiter. A layout bigger than the limiter's estimate FAILS (the cap would
# not hold); a guess of the simulated driver that differs is reported (GUESS DIFFERS) for its
# model to be corrected.
if cc -O2 -o "$work/guesses" "$root/tests/gpu/guesses.c" -lcuda; then
    "$work/guesses" guesses > "$work/guesses.out" || fail "guesses probe"
    cat "$work/guesses.out"
    g() { val "$1" < "$work/guesses.out"; }
    guess() { if [ "$2" = 1 ]; then echo "GUESS OK: $1"; else echo "GUESS DIFFERS: $1"; fi; }
    for a in ROWS100 FLOAT4 BC1 BC7; do
        t=$(g ${a}_TAKEN); e=$(g ${a}_ESTIMATE)
        if [ "$(g ${a}_RC)" = 0 ] && [ -n "$t" ] && [ "$t" -le $((e + 2097152)) ]; then
            pass "array $a takes $t bytes, within the limiter's estimate $e (+2 MiB of measuring grain)"
        else
            fail "array $a takes $t bytes, more than the limiter's estimate $e"
        fi
        guess "cuArrayGetMemoryRequirements refuses a non-deferred array ($a: rc $(g ${a}_REQUIREMENTS_RC))" \
            "$([ "$(g ${a}_REQUIREMENTS_RC)" = 1 ] && echo 1)"
    done
    [ "$(g DEFERRED_TAKEN)" -le 2097152 ] && pass "a deferred-mapping array takes no memory" \
        || fail "a deferred-mapping array took $(g DEFERRED_TAKEN) bytes"
    guess "pitch of 1000-byte rows: $(g PITCH_OF_1000) (simulated: 1024 at 512-byte alignment)" "$([ "$(g PITCH_OF_1000)" = 1024 ] && echo 1)"
    guess "VMM granularity $(g VMM_GRANULARITY) (simulated: 2097152)" "$([ "$(g VMM_GRANULARITY)" = 2097152 ] && echo 1)"
    guess "memory released while mapped stays taken ($(g VMM_RELEASED_MAPPED_TAKEN) bytes)" \
        "$([ "$(g VMM_RELEASED_MAPPED_TAKEN)" -ge 268435456 ] && [ "$(g VMM_UNMAPPED_TAKEN)" -le 2097152 ] && echo 1)"
    guess "pool growth step $(g POOL_STEP) (simulated: 2097152)" "$([ "$(g POOL_STEP)" = 2097152 ] && echo 1)"
    guess "reuse off: no cross-stream reuse before a synchronisation (reserved $(g REUSE_OFF_RESERVED))" \
        "$([ "$(g REUSE_OFF_RESERVED)" -ge 536870912 ] && echo 1)"
    guess "graph memory kept after its free until a trim ($(g GRAPH_FREED_RESERVED) then $(g GRAPH_TRIMMED_RESERVED))" \
        "$([ "$(g GRAPH_FREED_RESERVED)" -ge 268435456 ] && [ "$(g GRAPH_TRIMMED_RESERVED)" = 0 ] && echo 1)"
else
    fail "cc tests/gpu/guesses.c -lcuda (needs Debian's nvidia-cuda-dev)"
fi

[ $fails -eq 0 ] && echo "ALL PASSED" || echo "$fails FAILED"
[ $fails -eq 0 ]
