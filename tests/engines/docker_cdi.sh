#!/usr/bin/env bash
# Docker 26 (Debian 13) with CDI (`features.cdi`) and NVIDIA's CDI spec (lib.sh nvidia_cdi_spec),
# on a daemon.json written by `gpushare-hook configure docker --default-runtime`: gpushare is the
# default runtime, so `docker run --device nvidia.com/gpu=0 --annotation gpu.share=mps` gets its
# share without `--runtime gpushare`, and a container that asks for nothing passes straight
# through. A private dockerd (own data-root, exec-root, socket, pidfile, CDI spec dir).
source "$(dirname "$0")/lib.sh"
need runc jq mknod
need_trixie usr/sbin/dockerd usr/bin/docker usr/bin/containerd usr/bin/containerd-shim-runc-v2
ENGINE_PATH=$TRIXIE/usr/bin:$TRIXIE/usr/sbin:$PATH
DOCKER=$TRIXIE/usr/bin/docker
make_rootfs "$T/rootfs"
D=$T/docker
mkdir -p "$D" "$T/cdi"
nvidia_cdi_spec >"$T/cdi/nvidia.yaml"
jq -n --arg dir "$T/cdi" '{features: {cdi: true}, "cdi-spec-dirs": [$dir]}' >"$D/daemon.json"
"$GS_HOOK" configure docker --config "$CONFIG" --default-runtime --path "$D/daemon.json" >"$D/configure.out" 2>&1 ||
    { cat "$D/configure.out"; fail "configure docker --default-runtime"; }
jq -e '."default-runtime" == "gpushare" and .features.cdi == true and (.runtimes.gpushare.path | length > 0)' "$D/daemon.json" >/dev/null ||
    { cat "$D/daemon.json"; fail "configure docker --default-runtime did not write default-runtime (or lost features.cdi)"; }
ok "daemon.json: default-runtime gpushare, features.cdi kept"
X=$(mktemp -d /tmp/gsd-XXXX)
on_exit "rm -rf $X"
env PATH="$ENGINE_PATH" dockerd --config-file "$D/daemon.json" --data-root "$D/data" --exec-root "$X" -H "unix://$D/sock" --pidfile "$D/pid" \
    --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs >"$D/log" 2>&1 &
DPID=$!
on_exit "kill $DPID; wait $DPID"
docker_() { env PATH="$ENGINE_PATH" "$DOCKER" -H "unix://$D/sock" "$@"; }
wait_until 60 docker_ version >/dev/null 2>&1 || { tail -20 "$D/log"; fail "dockerd did not come up on the configured daemon.json (log above)"; }
echo "engine: dockerd $(docker_ version --format '{{.Server.Version}}')"
[ "$(docker_ info --format '{{.DefaultRuntime}}')" = gpushare ] || fail "dockerd's default runtime is not gpushare"
ok "dockerd reports default runtime gpushare"
tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
docker_ import "$T/rootfs.tar" gpushare-busybox:test >/dev/null || fail "docker import"
on_exit "docker_ rm -f ${NAME}p"

echo "== docker run --device nvidia.com/gpu=0 --annotation gpu.share=mps (no --runtime)"
mark_shm_when_ready
docker_ run --rm --network none --device nvidia.com/gpu=0 --annotation gpu.share=mps \
    gpushare-busybox:test sh -c "$INSIDE_CDI; $INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "docker run --device nvidia.com/gpu=0 (mps)"; }
check_cdi_output "$T/out1"
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"

echo "== gpushare's CDI device refined by annotations, through the default runtime's spec edit"
"$HOOK" cdi generate --output "$T/cdi" >"$T/gen" || { cat "$T/gen"; fail "cdi generate"; }
docker_ run --rm --network none --device nvidia.com/gpu=0 --device gpushare.io/share=mps \
    --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=40 \
    gpushare-busybox:test sh -c 'echo "atp:$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"; echo "pin:$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"; echo "mem:$CUDA_DEVICE_MEMORY_LIMIT_0"' \
    >"$T/outr" 2>"$T/errr" || { cat "$T/errr"; fail "docker run --device gpushare.io/share=mps with refining annotations"; }
has -x 'atp:40' "$T/outr" && has -x 'pin:0=1024M' "$T/outr" && has -x 'mem:1073741824' "$T/outr" ||
    { cat "$T/outr"; fail "the annotations did not refine the device's share"; }
ok "gpushare.io/share=mps with gpu.share.memory=1Gi and gpu.share.cores=40: served with both"
if docker_ run --rm --network none --device nvidia.com/gpu=0 --device gpushare.io/share=mps \
    --annotation gpu.share=limit gpushare-busybox:test true >"$T/outc" 2>"$T/errc"; then
    fail "an annotation contradicting the device ran"
fi
has -F 'but its CDI device gpushare.io/share=mps sets gpu.share=' "$T/errc" && has -F 'asks for gpu.share=' "$T/errc" ||
    { cat "$T/errc"; fail "the contradiction is not refused with gpushare's line naming both"; }
ok "a contradicting annotation is refused naming both: $(grep -o 'the container asks for[^;]*' "$T/errc" | head -1)"
released_all() { [ "$("$HOOK" status --json | jq '[.gpus[].clients[]] | length')" = 0 ]; }
wait_until 10 released_all || fail "a container is still listed after its run"

echo "== docker run --device nvidia.com/gpu=all --annotation gpu.share=limit (no --runtime)"
: >"$T/cdi-hook.log"
docker_ run --rm --network none --device nvidia.com/gpu=all --annotation gpu.share=limit \
    --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
    gpushare-busybox:test sh -c "$INSIDE_CDI; $INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "docker run --device nvidia.com/gpu=all (limit)"; }
check_cdi_output "$T/out2"
check_limit_output "$T/out2" yes

echo "== a container that asks for nothing passes straight through the default runtime"
docker_ run --name "${NAME}p" --network none gpushare-busybox:test sh -c 'echo plain; env | grep -c -e CUDA_ -e LD_PRELOAD; ls /usr/local/gpushare 2>&1 | head -1' >"$T/out3" 2>&1 ||
    { cat "$T/out3"; fail "plain docker run on the default runtime"; }
[ "$(docker_ inspect -f '{{.HostConfig.Runtime}}' "${NAME}p")" = gpushare ] || fail "the plain container did not run on gpushare"
grep -qx plain "$T/out3" && grep -qx 0 "$T/out3" && grep -q 'No such file' "$T/out3" || { cat "$T/out3"; fail "a container without a request was changed"; }
ok "a container without a request ran on gpushare, unchanged (no CUDA_/LD_PRELOAD env, no /usr/local/gpushare)"
! grep -q "${NAME}p\|$(docker_ inspect -f '{{.Id}}' "${NAME}p")" "$STATE"/containers/* 2>/dev/null || fail "gpushare recorded state for a container that asked for nothing"
docker_ rm -f "${NAME}p" >/dev/null
