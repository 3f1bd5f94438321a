#!/usr/bin/env bash
# Shares as CDI devices: `--device gpushare.io/share=<name>` beside a GPU device in the form
# NVIDIA's `nvidia-ctk cdi generate` writes (common env NVIDIA_VISIBLE_DEVICES=void, the GPU as
# a device node only), with no runtime wrapper, no hooks dir and no annotation.
#
#   CDI_ENGINE=podman     podman 4.3 (Debian 12): `podman run --device …`
#   CDI_ENGINE=docker26   Docker 26 (Debian 13, private dockerd with features.cdi): `docker run --device …`
#
# Both read specs from /etc/cdi and /var/run/cdi only (podman 4.3 has no setting for it), so
# the two specs go to /var/run/cdi under test-only names, removed on exit; the engine tests run
# one at a time (lib.sh's cdi_lock).
source "$(dirname "$0")/lib.sh"
need runc jq
cdi_lock
CDI_DIR=/var/run/cdi
mkdir -p "$CDI_DIR"
GPU_SPEC=$CDI_DIR/gpushare-test-nvidia-gpu.yaml
SHARE_SPEC=$CDI_DIR/gpushare.io-share.json
[ -e "$SHARE_SPEC" ] && skip "$SHARE_SPEC exists (a real gpushare install on this machine): not overwritten"
for f in "$CDI_DIR"/*.json /etc/cdi/*.json; do
    [ -e "$f" ] || continue
    [ "$f" = "$GPU_SPEC" ] && continue
    if jq -e '.kind == "nvidia.com/gpu"' "$f" >/dev/null 2>&1; then skip "$f already defines nvidia.com/gpu"; fi
done
for f in "$CDI_DIR"/*.yaml /etc/cdi/*.yaml; do
    [ -e "$f" ] && [ "$f" != "$GPU_SPEC" ] && has -x 'kind: nvidia.com/gpu' "$f" && skip "$f already defines nvidia.com/gpu"
done
on_exit "rm -f $GPU_SPEC $SHARE_SPEC"

# The GPU device, in the form nvidia-ctk writes (tests/fixtures/cdi/nvidia.yaml: devices by
# index, UUID and `all` with device nodes only; common NVIDIA_VISIBLE_DEVICES=void, control
# nodes, library mounts, nvidia-cdi-hook), rendered onto stand-in device nodes (lib.sh).
nvidia_cdi_spec >"$GPU_SPEC"
UUID=$(awk '/name: GPU-/ {print $3; exit}' "$GPU_SPEC")
[ -n "$UUID" ] || fail "no GPU UUID device in the NVIDIA-form spec"

# gpushare's own spec, as `gpushare-hook cdi generate` writes it, with a profile.
write_config '[profiles.small]
mode = "mps"
cores = 40'
"$HOOK" cdi generate --output "$CDI_DIR" >"$T/gen" || { cat "$T/gen"; fail "cdi generate"; }
has -F 'gpushare.io/share=small' "$T/gen" || { cat "$T/gen"; fail "cdi generate listed no small device"; }
ok "cdi generate wrote $(jq -r '[.devices[].name] | join(",")' "$SHARE_SPEC")"

make_rootfs "$T/rootfs"
INSIDE_DEV="$INSIDE_CDI"'; echo "profile:$GPUSHARE_PROFILE"; echo "atp:$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"'

case ${CDI_ENGINE:-podman} in
podman)
    need podman
    engine_version podman podman --version
    on_exit "podman_ rm -af -t 0"
    run_() { # engine-options... -- command...
        local o=()
        while [ "$1" != "--" ]; do o+=("$1"); shift; done
        shift
        podman_ --runtime runc run --rm $PODMAN_ULIMITS "${o[@]}" --rootfs "$T/rootfs" "$@"
    }
    ;;
docker26)
    need_trixie usr/sbin/dockerd usr/bin/docker usr/bin/containerd usr/bin/containerd-shim-runc-v2
    ENGINE_PATH=$TRIXIE/usr/bin:$TRIXIE/usr/sbin:$PATH
    D=$T/docker
    mkdir -p "$D"
    X=$(mktemp -d /tmp/gsd-XXXX)
    on_exit "rm -rf $X"
    echo '{"features": {"cdi": true}}' >"$D/daemon.json"
    env PATH="$ENGINE_PATH" dockerd --config-file "$D/daemon.json" --data-root "$D/data" --exec-root "$X" \
        -H "unix://$D/sock" --pidfile "$D/pid" --iptables=false --ip-masq=false --bridge=none \
        --storage-driver=vfs >"$D/log" 2>&1 &
    DPID=$!
    on_exit "kill $DPID; wait $DPID"
    docker_() { env PATH="$ENGINE_PATH" "$TRIXIE/usr/bin/docker" -H "unix://$D/sock" "$@"; }
    wait_until 60 docker_ version >/dev/null 2>&1 || { tail -20 "$D/log"; skip "dockerd did not come up (log above)"; }
    echo "engine: dockerd $(docker_ version --format '{{.Server.Version}}') with features.cdi"
    tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
    docker_ import "$T/rootfs.tar" gpushare-busybox:test >/dev/null || fail "docker import"
    run_() { # engine-options... -- command...
        local o=()
        while [ "$1" != "--" ]; do o+=("$1"); shift; done
        shift
        docker_ run --rm --network none "${o[@]}" gpushare-busybox:test "$@"
    }
    ;;
*) fail "CDI_ENGINE must be podman or docker26" ;;
esac

echo "== --device nvidia.com/gpu=0 --device gpushare.io/share=mps"
mark_shm_when_ready
run_ --device nvidia.com/gpu=0 --device gpushare.io/share=mps -- sh -c "$INSIDE_DEV; $INSIDE_MPS" >"$T/out1" 2>"$T/err1" ||
    { cat "$T/err1"; tail -5 "$T/gpushare.log"; fail "run with the mps device failed"; }
check_cdi_output "$T/out1"
check_mps_output "$T/out1" yes
has -x 'profile:mps' "$T/out1" || { cat "$T/out1"; fail "GPUSHARE_PROFILE not set by the device"; }
has 'acquired' "$T/gpushare.log" || fail "the hook logged no acquire"
wait_until 10 daemon_gone || fail "daemon still running after the container"
ok "share inside through CDI alone; daemon gone after the container"

echo "== a profile: --device gpushare.io/share=small (status lists it while it runs)"
mark_shm_when_ready
run_ --device "nvidia.com/gpu=$UUID" --device gpushare.io/share=small -- sh -c "$INSIDE_DEV; $INSIDE_MPS; sleep 1" >"$T/out2" 2>"$T/err2" &
RUN=$!
wait_until 20 sh -c "\"$HOOK\" status --json | jq -e '[.gpus[].clients[]] | length == 1' >/dev/null" ||
    { "$HOOK" status; fail "status did not list the profile's container"; }
CORES=$("$HOOK" status --json | jq -r '[.gpus[].clients[]][0].cores // empty')
wait $RUN || { cat "$T/err2"; fail "run with the small device failed"; }
[ "$CORES" = 40 ] || fail "status showed cores $CORES for the small profile, wanted 40"
has -x 'atp:40' "$T/out2" || { cat "$T/out2"; fail "the profile's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is not inside"; }
check_mps_output "$T/out2" yes
wait_until 10 daemon_gone || fail "daemon still running after the profile container"
ok "profile small: cores 40 in status and env"

echo "== --device gpushare.io/share=limit"
write_config '[profiles.small]
mode = "mps"
cores = 40
[profiles.capped]
mode = "limit"
memory = "1Gi"
cores = 30'
# `configure` with --path (not the node's own engine files) says what it would write to the
# node's spec and leaves it alone; with --cdi-dir it brings the spec there up to date.
before=$(sha256sum "$SHARE_SPEC")
"$HOOK" configure docker --path "$T/daemon-conf.json" >"$T/conf" 2>&1 || { cat "$T/conf"; fail "configure docker"; }
has -F "capped" "$T/conf" || { cat "$T/conf"; fail "configure --path did not say what it would write to the CDI spec"; }
[ "$(sha256sum "$SHARE_SPEC")" = "$before" ] || fail "configure --path changed the node's CDI spec"
"$HOOK" configure docker --path "$T/daemon-conf.json" --cdi-dir "$CDI_DIR" >"$T/conf" 2>&1 || { cat "$T/conf"; fail "configure docker --cdi-dir"; }
has -F "$SHARE_SPEC" "$T/conf" || { cat "$T/conf"; fail "configure --cdi-dir did not bring the CDI spec up to date"; }
jq -e '[.devices[].name] | index("capped")' "$SHARE_SPEC" >/dev/null || fail "the spec lacks the new profile after configure --cdi-dir"
ok "configure --path left the CDI spec alone and said so; --cdi-dir refreshed it with the new profile"
run_ --device nvidia.com/gpu=all --device gpushare.io/share=capped -- sh -c "$INSIDE_LIMIT" >"$T/out3" 2>"$T/err3" ||
    { cat "$T/err3"; fail "run with the limit profile failed"; }
check_limit_output "$T/out3" no

echo "== refusals: an annotation-free container with two gpushare devices"
if run_ --device nvidia.com/gpu=0 --device gpushare.io/share=mps --device gpushare.io/share=capped -- true >"$T/out4" 2>"$T/err4"; then
    fail "a container with two gpushare devices ran"
fi
has 'several gpushare devices' "$T/err4" "$T/gpushare.log" || { cat "$T/err4"; fail "not refused by gpushare's own line"; }
ok "two gpushare devices refused by gpushare"

echo "== after everything: nothing left"
left=$("$HOOK" status --json | jq '[.gpus[].clients[]] | length')
[ "$left" = 0 ] || { "$HOOK" status; fail "status still lists $left clients"; }
ls -A "$STATE/mps" 2>/dev/null | has . && fail "MPS directories left: $(ls -A "$STATE/mps")"
ok "status lists nothing, no MPS directory left"
