#!/usr/bin/env bash
# Minimal .deb recipe stub: installs the binaries, the limiter, the hooks and an example policy.
# No maintainer scripts, no engine configuration (see packaging/*/ for that).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
(cd "$REPO" && cargo build --release --workspace)
R=$(mktemp -d)
install -D -m 0755 "$REPO/target/release/gpushare-hook" "$R/usr/bin/gpushare-hook"
install -D -m 0755 "$REPO/target/release/gpushare-runtime" "$R/usr/bin/gpushare-runtime"
install -D -m 0644 "$REPO/target/release/libgpushare_limiter.so" "$R/usr/lib/gpushare/libgpushare_limiter.so"
install -D -m 0644 -t "$R/usr/share/containers/oci/hooks.d" "$REPO"/hooks/oci/*.json
install -D -m 0644 -t "$R/etc/containers/oci/hooks.d-podman" "$REPO"/hooks/podman-precreate/*.json
install -D -m 0644 "$REPO/packaging/config.toml.example" "$R/usr/share/doc/gpushare/config.toml.example"
mkdir -p "$R/DEBIAN"
cat >"$R/DEBIAN/control" <<EOT
Package: gpushare
Version: $VERSION
Architecture: amd64
Maintainer: gpushare maintainers
Depends: libc6
Recommends: runc, nvidia-cuda-mps
Description: share NVIDIA GPUs between OCI containers (MPS, time-slicing, preloaded limiter)
EOT
dpkg-deb --root-owner-group --build "$R" "$REPO/target/gpushare_${VERSION}_amd64.deb"
rm -rf "$R"
