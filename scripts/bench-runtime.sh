#!/usr/bin/env bash
# Benchmark: `gpushare-runtime create` against plain `runc create` on the same bundle,
# alternating, N rounds each; prints the median times and their ratio for a container that asks
# for nothing (target <= 1.05), for a limit one (runc run as a child, see container::runtime) and
# for an mps one (target <= 1.15; the MPS daemon is kept warm by a holder container, as on a host
# where sharing is in use).
#
# Usage: scripts/bench-runtime.sh [rounds]   (root; builds release binaries if missing;
#        BIN_DIR=<dir> to use other builds, e.g. target/debug)
set -euo pipefail
ROUNDS=${1:-41}
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${BIN_DIR:-$REPO/target/release}
if [ ! -x "$BIN_DIR/gpushare-runtime" ] || [ ! -e "$BIN_DIR/libgpushare_simdriver.so" ]; then
    (cd "$REPO" && cargo build --release --workspace >&2)
fi
export GS_HOOK=$BIN_DIR/gpushare-hook GS_RUNTIME=$BIN_DIR/gpushare-runtime GS_REPO=$REPO
export GS_SIMDRIVER=$BIN_DIR/libgpushare_simdriver.so GS_LIMITER=$BIN_DIR/libgpushare_limiter.so
source "$REPO/tests/engines/lib.sh"
need runc jq

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

one() { # runtime bundle id times-file: time one create (microseconds), then delete
    local t0 t1
    t0=$(now)
    "$1" create --bundle "$2" "$3" </dev/null >/dev/null 2>&1
    t1=$(now)
    echo $(((t1 - t0) / 1000)) >>"$4"
    runc delete -f "$3" >/dev/null 2>&1
}

bench() { # label annotations-json [pristine]
    local label=$1 b=$T/bench-$1 rb i t0 t1
    mkdir -p "$b" && cp -a "$T/rootfs" "$b/rootfs"
    make_bundle "$b" '["sleep","1000"]' '["NVIDIA_VISIBLE_DEVICES=0"]' "$2"
    # runc's bundle: the same one, or with "pristine" an unedited copy (a limit edit binds the
    # directory of the container it was made for, which is gone once that one is deleted).
    rb=$b
    if [ "${3:-}" = pristine ]; then
        rb=$T/bench-$1-runc
        cp -a "$b" "$rb"
    fi
    # Warm-up (and, for a share request, the one-time edit of config.json).
    "$RUNTIME" create --bundle "$b" "w$label$$" </dev/null >/dev/null 2>&1
    runc delete -f "w$label$$" >/dev/null 2>&1
    : >"$T/runc.$label"
    : >"$T/gs.$label"
    for i in $(seq "$ROUNDS"); do
        # ABBA order, so that drift and the order of the pair cancel out.
        if ((i % 2)); then
            one runc "$rb" "r$label$i" "$T/runc.$label"
            one "$GS_RUNTIME" "$b" "g$label$i" "$T/gs.$label"
        else
            one "$GS_RUNTIME" "$b" "g$label$i" "$T/gs.$label"
            one runc "$rb" "r$label$i" "$T/runc.$label"
        fi
    done
    [ -z "${BENCH_VERBOSE:-}" ] || { echo "runc: $(sort -n "$T/runc.$label" | tr "\n" " ")"; echo "gs:   $(sort -n "$T/gs.$label" | tr "\n" " ")"; }
    local r g
    r=$(median <"$T/runc.$label")
    g=$(median <"$T/gs.$label")
    # Paired: the median of the per-round differences (both runs of a round are adjacent in time).
    local d
    d=$(paste "$T/gs.$label" "$T/runc.$label" | awk '{print $1 - $2}' | median)
    awk -v l="$label" -v r="$r" -v g="$g" -v d="$d" 'BEGIN {
        printf "%-5s runc create median %6.1f ms, gpushare-runtime create median %6.1f ms: ratio %.3f; paired median difference %+.2f ms: ratio %.3f\n", l, r / 1000, g / 1000, g / r, d / 1000, (r + d) / r
    }'
}

make_rootfs "$T/rootfs"
# gpushare-runtime under test takes its policy from the env here (no engine in between).
export GPUSHARE_CONFIG=$CONFIG
echo "rounds: $ROUNDS, binaries: $BIN_DIR"
bench none '{}'
# limit: the edit makes the container's own directory, so gpushare-runtime runs runc as a child
# (to remove that directory when the create fails) instead of exec'ing it; runc creates the
# unedited bundle (no hook), so the ratio holds the whole cost of sharing.
bench limit '{"gpu.share":"limit","gpu.share.memory":"1Gi"}' pristine
# Keep the daemon warm: one mps container holds it for the whole mps run.
hb=$T/holder
mkdir -p "$hb" && cp -a "$T/rootfs" "$hb/rootfs"
make_bundle "$hb" '["sleep","1000"]' '["NVIDIA_VISIBLE_DEVICES=0"]' '{"gpu.share":"mps"}'
"$RUNTIME" create --bundle "$hb" "holder$$" </dev/null >/dev/null 2>&1
on_exit "runc delete -f holder$$"
bench mps '{"gpu.share":"mps"}'

# The wrapper's own fixed cost, free of runc's variance: the wrapper with `next = /bin/true`
# against /bin/true itself, on the no-share bundle.
printf 'state_dir = "%s"\n[runtime]\nnext = ["/bin/true"]\n' "$STATE" >"$T/true.toml"
loop() { # nanoseconds per call
    local i t0 t1; t0=$(now); for i in $(seq 200); do "$@"; done; t1=$(now); echo $(((t1 - t0) / 200)); }
w=$(GPUSHARE_CONFIG=$T/true.toml loop "$GS_RUNTIME" create --bundle "$T/bench-none" x)
p=$(loop /bin/true create --bundle "$T/bench-none" x)
r=$(median <"$T/runc.none")
awk -v w="$w" -v p="$p" -v r="$r" 'BEGIN {
    d = (w - p) / 1000
    printf "wrapper fixed cost (no share, exec of /bin/true): %.2f ms per call; against the runc create median: ratio %.3f\n", d / 1000, (r + d) / r
}'
