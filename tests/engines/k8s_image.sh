#!/usr/bin/env bash
# The node installer's image: packaging/kubernetes/Containerfile built with podman, offline, from
# a local base (busybox and the glibc the binaries need, imported; no registry is reachable) with
# the binaries under test as PREBUILT; then the image's installer run as the DaemonSet runs it,
# against a scratch node root mounted at /host, must write exactly what install.sh run directly
# on this machine writes (tests/kubernetes.rs checks that file by file).
source "$(dirname "$0")/lib.sh"
need podman runc busybox
engine_version podman podman --version
P=(podman --root "$T/storage" --runroot "$T/runroot" --cgroup-manager cgroupfs)
RUN_FLAGS=(--runtime runc $PODMAN_ULIMITS --network none)

B=$T/base
mkdir -p "$B/bin" "$B/tmp" "$B/etc"
cp /bin/busybox "$B/bin/busybox"
for c in $(/bin/busybox --list); do [ "$c" = busybox ] || ln -sf busybox "$B/bin/$c"; done
for lib in $(ldd "$GS_HOOK" "$GS_RUNTIME" | grep -v ':$' | grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$B$(dirname "$lib")"
    cp -L "$lib" "$B$lib"
done
tar -C "$B" -cf "$T/base.tar" .
"${P[@]}" import "$T/base.tar" localhost/gpushare-test-base:1 >/dev/null || fail "podman import of the base"

# The build context laid out as the repository is, with its .containerignore: what the
# Containerfile copies, and the binaries where a release build leaves them (PREBUILT=target/release).
X=$T/ctx
mkdir -p "$X/target/release" "$X/target/debug" "$X/packaging/kubernetes"
cp "$GS_HOOK" "$GS_RUNTIME" "$GS_LIMITER" "$X/target/release/"
echo "not for the image" >"$X/target/debug/junk"
cp "$GS_REPO/.containerignore" "$X/"
cp "$GS_REPO/packaging/config.toml.example" "$X/packaging/"
cp "$GS_REPO/packaging/kubernetes/install.sh" "$X/packaging/kubernetes/"
echo "== podman build -f packaging/kubernetes/Containerfile (BUILDER=BASE=local busybox, PREBUILT=target/release, the repository's .containerignore)"
"${P[@]}" build "${RUN_FLAGS[@]}" --pull=never -f "$GS_REPO/packaging/kubernetes/Containerfile" \
    --build-arg BUILDER=localhost/gpushare-test-base:1 --build-arg BASE=localhost/gpushare-test-base:1 \
    --build-arg PREBUILT=target/release -t localhost/gpushare-node:test "$X" >"$T/build.log" 2>&1 ||
    { tail -20 "$T/build.log"; fail "podman build"; }
ok "image built"
"${P[@]}" run --rm -i "${RUN_FLAGS[@]}" localhost/gpushare-node:test sh -c \
    'cmp /opt/gpushare/bin/gpushare-hook /dev/stdin' <"$GS_HOOK" || fail "the image's gpushare-hook is not the one built"
ok "the image holds the binaries under test"

for engine in crio containerd; do
    echo "== the image's installer on a scratch $engine node"
    mkdir -p "$T/node-image-$engine/etc/$engine" "$T/node-host-$engine/etc/$engine"
    # The node's glibc, which the installer checks before copying: this machine's.
    libc=$(ldd "$GS_HOOK" | grep -o '/[^ ]*/libc\.so\.6' | head -n 1)
    for n in image host; do
        mkdir -p "$T/node-$n-$engine$(dirname "$libc")"
        cp -L "$libc" "$T/node-$n-$engine$libc"
    done
    "${P[@]}" run --rm "${RUN_FLAGS[@]}" -e HOST_ROOT=/host -v "$T/node-image-$engine:/host" \
        localhost/gpushare-node:test >"$T/out-$engine" 2>&1 || { cat "$T/out-$engine"; fail "the image's installer ($engine)"; }
    grep -q "gpushare-install: done" "$T/out-$engine" || { cat "$T/out-$engine"; fail "installer did not finish"; }
    # The same install run directly, from the same files laid out as in the image.
    S=$T/src
    mkdir -p "$S/bin" "$S/lib"
    cp "$GS_HOOK" "$GS_RUNTIME" "$S/bin/" && cp "$GS_LIMITER" "$S/lib/" && cp "$GS_REPO/packaging/config.toml.example" "$S/"
    SRC=$S HOST_ROOT=$T/node-host-$engine sh "$GS_REPO/packaging/kubernetes/install.sh" >/dev/null || fail "install.sh on the host ($engine)"
    diff -r "$T/node-image-$engine" "$T/node-host-$engine" || fail "the image's installer wrote something else than install.sh ($engine)"
    ok "$(find "$T/node-image-$engine" -type f | wc -l) files, identical to install.sh run directly"
done
