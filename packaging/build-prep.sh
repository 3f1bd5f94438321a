#!/usr/bin/env bash
# Shared first steps of the .deb and .rpm builds: the release build of the workspace (binaries
# and the limiter, the DRA driver apart), then man pages and shell completions generated from
# the CLI definition (`xtask docs`) into $TARGET/release/gen. Sourced; sets REPO and TARGET.
#
# GPUSHARE_PREBUILT=DIR packs binaries already built instead (DIR holds gpushare-hook,
# gpushare-runtime, gpushare-dra, the two libraries and xtask, as `cargo build --workspace`
# leaves them in target/debug): they are copied into $TARGET/release and nothing is compiled.
# The test suite packs the one build it tests this way (scripts/test.sh).
#
# GPUSHARE_PACK_FAST=1 compresses quickly (read by deb/build.sh and rpm/build.sh): the .deb with
# xz at a low level, the .rpm with a gzip payload (cargo-generate-rpm's zstd has no level).
# scripts/test.sh sets it: with the defaults, packing the suite's unoptimised binaries took 36 s
# of the package test, against 6 s. A package to ship keeps the default compression.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
cd "$REPO"
if [ -n "${GPUSHARE_PREBUILT:-}" ]; then
    mkdir -p "$TARGET/release"
    for f in gpushare-hook gpushare-runtime gpushare-dra libgpushare_limiter.so libgpushare_simdriver.so xtask; do
        [ -f "$GPUSHARE_PREBUILT/$f" ] || { echo "GPUSHARE_PREBUILT: no $f in $GPUSHARE_PREBUILT (cargo build --workspace first)" >&2; exit 1; }
        cp "$GPUSHARE_PREBUILT/$f" "$TARGET/release/$f.tmp" && mv "$TARGET/release/$f.tmp" "$TARGET/release/$f"
    done
    xtask=("$TARGET/release/xtask")
else
    # The node binaries apart from the DRA driver: built together, cargo would give their
    # dependencies the driver's features too (hyper's client and HTTP/2, tokio's multi-thread
    # runtime, regex's Unicode tables), and the hook every container runs would be 190 KB
    # larger, load libm too, and let a container that asks for nothing through about 20% slower.
    cargo build --release -p gpushare -p gpushare-limiter -p gpushare-simdriver
    cargo build --release -p gpushare-dra
    xtask=(cargo run --release -q -p xtask --)
fi
rm -rf "$TARGET/release/gen"
"${xtask[@]}" docs "$TARGET/release/gen" >/dev/null
gzip -9n "$TARGET"/release/gen/man/*.1 "$TARGET"/release/gen/man/*.5
