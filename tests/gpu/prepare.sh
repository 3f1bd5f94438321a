#!/usr/bin/env bash
# Builds, on a machine with cargo, what tests/gpu/run-all.sh needs on a GPU machine that has no
# Rust toolchain, into .gpu-carry/ (git-ignored; carry it to the GPU machine):
#   gpushare-hook, gpushare-runtime, libgpushare_limiter.so   release builds (glibc 2.17 baseline)
#   guesses-sim.out   tests/gpu/guesses.c run here on the TEST-ONLY simulated driver (the
#                     "simulated" column of run-all.sh's table: measured, not written by hand)
#   mps/              this machine's nvidia-cuda-mps-control and -server, used there only when
#                     the GPU machine has none (their driver version is in mps/VERSION)
#   MANIFEST          commit, build time, sizes and sha256 of every file
# Usage: tests/gpu/prepare.sh [DIR]   (default: .gpu-carry at the repo root)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:-$ROOT/.gpu-carry}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cd "$ROOT"

cargo build --release -p gpushare -p gpushare-limiter -p gpushare-simdriver
rel=$TARGET/release

rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/mps"
for f in gpushare-hook gpushare-runtime libgpushare_limiter.so; do
    cp "$rel/$f" "$OUTDIR/$f"
    strip --strip-debug "$OUTDIR/$f" 2>/dev/null || true
done
chmod 755 "$OUTDIR/gpushare-hook" "$OUTDIR/gpushare-runtime"
chmod 644 "$OUTDIR/libgpushare_limiter.so"

# The simulated driver's answers to tests/gpu/guesses.c (80 GiB device, like an H100).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
simdir=$("$ROOT/simdriver/install-sim.sh" "$tmp/sim" "$rel/libgpushare_simdriver.so")
inc=
for d in /usr/local/cuda/include /usr/include; do [ -f "$d/cuda.h" ] && { inc=$d; break; }; done
if [ -n "$inc" ]; then
    cc -O2 -I"$inc" -o "$tmp/guesses" tests/gpu/guesses.c -L"$simdir" -lcuda
    mkdir -p "$tmp/state"
    LD_LIBRARY_PATH=$simdir GPUSHARE_SIM_DEVICES=81920 GPUSHARE_SIM_STATE=$tmp/state \
        "$tmp/guesses" guesses >"$OUTDIR/guesses-sim.out"
    echo "simulated driver's answers: $(wc -l <"$OUTDIR/guesses-sim.out") lines in $OUTDIR/guesses-sim.out"
else
    echo "prepare.sh: no cuda.h here (Debian: nvidia-cuda-dev); guesses-sim.out not made" >&2
fi

# MPS programs, for a GPU machine that has none (used there only then).
ctl=$(command -v nvidia-cuda-mps-control || true)
srv=$(PATH=$PATH:/usr/sbin:/sbin command -v nvidia-cuda-mps-server || true)
if [ -n "$ctl" ] && [ -n "$srv" ]; then
    cp "$ctl" "$srv" "$OUTDIR/mps/"
    { dpkg-query -W -f '${Package} ${Version}\n' nvidia-cuda-mps 2>/dev/null || echo unknown; } >"$OUTDIR/mps/VERSION"
else
    rmdir "$OUTDIR/mps"
fi

{
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu-carry' || echo '-dirty'), built $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m)"
    (cd "$OUTDIR" && find . -type f ! -name MANIFEST | sort | while read -r f; do
        printf '%10s  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "$f"
    done)
} >"$OUTDIR/MANIFEST"
cat "$OUTDIR/MANIFEST"
size=$(du -sm "$OUTDIR" | cut -f1)
echo "$OUTDIR: $size MiB"
[ "$size" -lt 60 ] || { echo "prepare.sh: $OUTDIR is $size MiB, over the 60 MiB carry budget" >&2; exit 1; }
