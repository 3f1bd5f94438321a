#!/usr/bin/env bash
# Builds the .rpm with cargo-generate-rpm (metadata in Cargo.toml) into $TARGET/generate-rpm/
# and prints its path. Needs cargo-generate-rpm (scripts/install-deps.sh installs it).
set -euo pipefail
source "$(dirname "$0")/../build-prep.sh"
# cargo-generate-rpm does not strip: strip the copies it packs.
strip --strip-unneeded "$TARGET/release/gpushare-hook" "$TARGET/release/gpushare-runtime" "$TARGET/release/gpushare-dra" "$TARGET/release/libgpushare_limiter.so"
cargo generate-rpm -p . --target-dir "$TARGET" ${GPUSHARE_PACK_FAST:+--payload-compress gzip}
ls -t "$TARGET"/generate-rpm/*.rpm | head -1
