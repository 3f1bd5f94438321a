#!/usr/bin/env bash
# podman 4.3 with NVIDIA's CDI spec (lib.sh nvidia_cdi_spec): `--device nvidia.com/gpu=0`
# (by index, UUID and all) and a share annotation, mps and limit, with the repo's hooks dirs.
# The spec's common NVIDIA_VISIBLE_DEVICES=void must not hide the GPU the spec gave.
source "$(dirname "$0")/lib.sh"
need podman runc jq mknod
engine_version podman podman --version
make_rootfs "$T/rootfs"
make_hooks_dirs "$T/hooks"
on_exit "podman_ rm -af -t 0"
# podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi.
cdi_lock
SPEC=/var/run/cdi/nvidia-gpushare-test-$$.yaml
mkdir -p /var/run/cdi
on_exit "rm -f $SPEC"
nvidia_cdi_spec >"$SPEC"
HOOKS=(--hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate")
run_cdi() { # podman-run-args...
    podman_ --runtime runc "${HOOKS[@]}" run --rm $PODMAN_ULIMITS "$@"
}

echo "== --device nvidia.com/gpu=0 --annotation gpu.share=mps (no NVIDIA_VISIBLE_DEVICES of our own)"
mark_shm_when_ready
run_cdi --device nvidia.com/gpu=0 --annotation gpu.share=mps --rootfs "$T/rootfs" sh -c "$INSIDE_CDI; $INSIDE_MPS" >"$T/out1" 2>"$T/err1" ||
    { cat "$T/err1"; fail "podman run --device nvidia.com/gpu=0 with gpu.share=mps failed"; }
check_cdi_output "$T/out1"
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon still running after the container"

echo "== --device nvidia.com/gpu=<UUID> -e NVIDIA_VISIBLE_DEVICES=0 (CDI appends void after it), limit"
: >"$T/cdi-hook.log"
run_cdi --device nvidia.com/gpu=GPU-5a1e0000-0000-4000-8000-000000000000 -e NVIDIA_VISIBLE_DEVICES=0 \
    --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    --rootfs "$T/rootfs" sh -c "$INSIDE_CDI; $INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "podman run (CDI by UUID, limit) failed"; }
check_cdi_output "$T/out2"
check_limit_output "$T/out2" yes

echo "== --device nvidia.com/gpu=all, limit"
: >"$T/cdi-hook.log"
run_cdi --device nvidia.com/gpu=all --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    --rootfs "$T/rootfs" sh -c "$INSIDE_CDI; $INSIDE_LIMIT" >"$T/out3" 2>"$T/err3" || { cat "$T/err3"; fail "podman run (CDI all, limit) failed"; }
check_cdi_output "$T/out3"
check_limit_output "$T/out3" yes

echo "== the same spec without a GPU device: still refused as having no GPU"
if run_cdi --annotation gpu.share=mps -e NVIDIA_VISIBLE_DEVICES=void --rootfs "$T/rootfs" true >"$T/out4" 2>"$T/err4"; then
    fail "a share request without a GPU was started"
fi
has 'was given no GPU' "$T/err4" || { cat "$T/err4"; fail "the refusal does not say the container has no GPU"; }
ok "NVIDIA_VISIBLE_DEVICES=void and no device node: refused, naming the missing GPU"
