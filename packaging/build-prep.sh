#!/usr/bin/env bash
# Shared first steps of the .deb and .rpm builds: the release build of the workspace (binaries
# and the limiter), then man pages and shell completions generated from the CLI definition
# (`xtask docs`) into $TARGET/release/gen. Sourced; sets REPO and TARGET.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
cd "$REPO"
cargo build --release --workspace --exclude xtask
rm -rf "$TARGET/release/gen"
cargo run --release -q -p xtask -- docs "$TARGET/release/gen" >/dev/null
gzip -9n "$TARGET"/release/gen/man/*.1 "$TARGET"/release/gen/man/*.5
