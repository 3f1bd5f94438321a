#!/usr/bin/env bash
# podman with the repo's hooks dirs: hooks only (annotation), hooks + precreate (env), limit
# mode, and the MPS daemon's lifecycle across two containers.
source "$(dirname "$0")/lib.sh"
need podman runc jq
engine_version podman podman --version
engine_version runc runc --version
make_rootfs "$T/rootfs"
make_hooks_dirs "$T/hooks"
on_exit "podman_ rm -af -t 0"

# After the last MPS container: no MPS directory or mount, no reservation, no pending dir.
no_mps_leftovers() { # what
    local left
    left=$(ls -A "$STATE/mps" 2>/dev/null || true)
    [ -z "$left" ] || fail "$1: MPS directories left: $left"
    ! grep -q " $STATE/" /proc/self/mountinfo || fail "$1: mounts left: $(grep " $STATE/" /proc/self/mountinfo)"
    ! ls "$STATE/containers" 2>/dev/null | has '^pending-' || fail "$1: pending dirs left: $(ls "$STATE/containers")"
    ! grep -qs 'pending-' "$STATE"/gpus/*.json || fail "$1: reservation left: $(cat "$STATE"/gpus/*.json)"
    ok "$1: no MPS directory, mount, pending dir or reservation left"
}

run_in() { # hooks-args... -- podman-run-args...
    local hooks=()
    while [ "$1" != "--" ]; do hooks+=("$1"); shift; done
    shift
    podman_ --runtime runc "${hooks[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 "$@"
}

echo "== hooks.d only, --annotation gpu.share=mps"
mark_shm_when_ready
run_in --hooks-dir "$T/hooks/oci" -- --annotation gpu.share=mps --rootfs "$T/rootfs" sh -c "$INSIDE_MPS" >"$T/out1" 2>"$T/err1" ||
    { cat "$T/err1"; fail "podman run (hooks only) failed"; }
check_mps_output "$T/out1" no
wait_until 10 daemon_gone || fail "daemon still running after the container"
ok "daemon stopped after the last container"

echo "== hooks.d + precreate: env injected"
mark_shm_when_ready
run_in --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --annotation gpu.share=mps --rootfs "$T/rootfs" sh -c "$INSIDE_MPS" >"$T/out2" 2>"$T/err2" ||
    { cat "$T/err2"; fail "podman run (precreate) failed"; }
check_mps_output "$T/out2" yes
wait_until 10 daemon_gone || fail "daemon still running after the precreate container"
no_mps_leftovers "hooks.d + precreate"

echo "== precreate with the env fallback GPU_SHARE=mps (no annotation)"
mark_shm_when_ready
run_in --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- -e GPU_SHARE=mps --rootfs "$T/rootfs" sh -c "$INSIDE_MPS" >"$T/out3" 2>"$T/err3" ||
    { cat "$T/err3"; fail "podman run (env fallback) failed"; }
check_mps_output "$T/out3" yes
wait_until 10 daemon_gone || fail "daemon still running after the env-fallback container"
no_mps_leftovers "precreate with the env fallback"

echo "== limit mode, hooks only and with precreate"
run_in --hooks-dir "$T/hooks/oci" -- --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    --rootfs "$T/rootfs" sh -c "$INSIDE_LIMIT" >"$T/out4" 2>"$T/err4" || { cat "$T/err4"; fail "podman run (limit, hooks only) failed"; }
check_limit_output "$T/out4" no
run_in --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    --rootfs "$T/rootfs" sh -c "$INSIDE_LIMIT" >"$T/out5" 2>"$T/err5" || { cat "$T/err5"; fail "podman run (limit, precreate) failed"; }
check_limit_output "$T/out5" yes
[ -z "$(ls -A "$STATE/containers" 2>/dev/null)" ] || { ls -la "$STATE/containers"; fail "per-container files left behind"; }
ok "poststop removed the per-container files"

echo "== lifecycle: the daemon outlives the first container while a second runs"
H=(--runtime runc --hooks-dir "$T/hooks/oci")
podman_ "${H[@]}" run -d --name "${NAME}a" $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sleep 3600 >/dev/null || fail "first container"
mark_shm_when_ready
# The second waits for SIGUSR1 (sent once the first is gone) before it uses MPS.
podman_ "${H[@]}" run -d --name "${NAME}b" $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sh -c "trap 'go=1' USR1; echo waiting; while [ -z \"\$go\" ]; do sleep 0.1; done; $INSIDE_MPS" >/dev/null ||
    fail "second container"
b_waits() { podman_ logs "${NAME}b" 2>&1 | has -qx waiting; }
wait_until 20 b_waits || fail "the second container did not reach its wait within 20s"
A_ID=$(podman_ inspect -f '{{.Id}}' "${NAME}a")
released "$A_ID" && fail "the first container is not a client of the GPU"
podman_ rm -f -t 0 "${NAME}a" >/dev/null
wait_until 10 released "$A_ID" || { "$HOOK" status; fail "the first container was not released within 10s of its removal"; }
[ "$(podman_ inspect -f '{{.State.Running}}' "${NAME}b")" = true ] || fail "second container is not running"
daemon_running || fail "daemon stopped although the second container still runs"
ok "daemon still running after the first container ended, while the second runs"
podman_ kill --signal USR1 "${NAME}b" >/dev/null
podman_ wait "${NAME}b" >/dev/null
podman_ logs "${NAME}b" >"$T/out6" 2>&1
check_mps_output "$T/out6" no
podman_ rm "${NAME}b" >/dev/null
wait_until 10 daemon_gone || fail "daemon still running after the last container"
ok "daemon gone after the last container"

echo "== an image from podman's storage (podman import), hooks + precreate, mps and limit"
tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
podman_ import "$T/rootfs.tar" gpushare-test/busybox:latest >/dev/null || fail "podman import"
mark_shm_when_ready
run_in --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --annotation gpu.share=mps \
    gpushare-test/busybox:latest sh -c "$INSIDE_MPS" >"$T/out7" 2>"$T/err7" || { cat "$T/err7"; fail "podman run (image, mps) failed"; }
check_mps_output "$T/out7" yes
run_in --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    gpushare-test/busybox:latest sh -c "$INSIDE_LIMIT" >"$T/out8" 2>"$T/err8" || { cat "$T/err8"; fail "podman run (image, limit) failed"; }
check_limit_output "$T/out8" yes
ok "an image from podman's storage (overlay rootfs) gets the same injection"
wait_until 10 daemon_gone || fail "daemon still running after the image containers"
