#!/usr/bin/env bash
# Builds the .deb with cargo-deb (metadata in Cargo.toml: assets, conffiles, maintainer scripts
# from packaging/deb/maintainer-scripts, stripped binaries) into $TARGET/debian/ and prints its
# path. Needs cargo-deb (scripts/install-deps.sh installs it).
set -euo pipefail
source "$(dirname "$0")/../build-prep.sh"
cargo deb --no-build ${GPUSHARE_PACK_FAST:+--fast} -p gpushare --output "$TARGET/debian/" | tail -1
