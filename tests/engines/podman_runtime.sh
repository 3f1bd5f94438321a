#!/usr/bin/env bash
# podman --runtime gpushare-runtime: the wrapper edits the spec (env, mounts, hook entries) for
# an annotated container and for the env fallback; no hooks dir involved.
source "$(dirname "$0")/lib.sh"
need podman runc jq
engine_version podman podman --version
engine_version runc runc --version
make_rootfs "$T/rootfs"
on_exit "podman_ rm -af -t 0"
P=(--runtime "$RUNTIME")

echo "== podman --runtime gpushare-runtime --annotation gpu.share=mps"
mark_shm_when_ready
podman_ "${P[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sh -c "$INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "podman run"; }
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"
ok "daemon gone after the container"

echo "== env fallback -e GPU_SHARE=limit"
podman_ "${P[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=limit -e GPU_SHARE_MEMORY=1Gi -e GPU_SHARE_CORES=30 \
    --rootfs "$T/rootfs" sh -c "$INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "podman run"; }
check_limit_output "$T/out2" yes

echo "== refused request: podman reports the wrapper's one line"
set +e
podman_ "${P[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps --annotation gpu.share.cores=500 \
    --rootfs "$T/rootfs" true >"$T/out3" 2>"$T/err3"
rc=$?
set -e
[ $rc != 0 ] || fail "a refused request ran"
grep -q "gpu.share.cores" "$T/err3" || { cat "$T/err3"; fail "the refusal does not say what to change"; }
ok "refused with: $(grep -o 'gpushare-runtime:.*' "$T/err3" | head -1)"
