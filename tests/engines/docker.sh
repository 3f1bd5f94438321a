#!/usr/bin/env bash
# Docker: a private dockerd (own data-root, exec-root, socket, pidfile) with
# `--add-runtime gpushare=gpushare-runtime`; `docker run --runtime gpushare` with the env fallback
# (`-e GPU_SHARE=mps`), with `--annotation gpu.share=…` where the engine has it (Docker 24 and
# later), and `docker exec` into a share container.
#
#   DOCKER_ENGINE=system   this machine's dockerd (Debian 12: 20.10, no --annotation)
#   DOCKER_ENGINE=trixie   Docker 26 unpacked from Debian 13 (scripts/fetch-engines.sh)
source "$(dirname "$0")/lib.sh"
need runc jq
case ${DOCKER_ENGINE:-system} in
system)
    need dockerd docker
    ENGINE_PATH=$PATH
    DOCKER=docker
    ;;
trixie)
    need_trixie usr/sbin/dockerd usr/bin/docker usr/bin/containerd usr/bin/containerd-shim-runc-v2
    ENGINE_PATH=$TRIXIE/usr/bin:$TRIXIE/usr/sbin:$PATH
    DOCKER=$TRIXIE/usr/bin/docker
    ;;
*) fail "DOCKER_ENGINE must be system or trixie" ;;
esac
make_rootfs "$T/rootfs"
D=$T/docker
mkdir -p "$D"
# Short exec-root: containerd's socket path must stay under 108 bytes.
X=$(mktemp -d /tmp/gsd-XXXX)
on_exit "rm -rf $X"
env PATH="$ENGINE_PATH" dockerd --data-root "$D/data" --exec-root "$X" -H "unix://$D/sock" --pidfile "$D/pid" \
    --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs \
    --add-runtime "gpushare=$RUNTIME" >"$D/log" 2>&1 &
DPID=$!
on_exit "kill $DPID; wait $DPID"
docker_() { env PATH="$ENGINE_PATH" "$DOCKER" -H "unix://$D/sock" "$@"; }
wait_until 60 docker_ version >/dev/null 2>&1 || { tail -20 "$D/log"; skip "dockerd did not come up (log above)"; }
SERVER=$(docker_ version --format '{{.Server.Version}}')
echo "engine: dockerd $SERVER (client $(docker_ version --format '{{.Client.Version}}'), containerd $(env PATH="$ENGINE_PATH" containerd --version | awk '{print $3}'))"
echo "== doctor asks the running dockerd (not daemon.json) whether it loaded gpushare"
env DOCKER_HOST="unix://$D/sock" PATH="$ENGINE_PATH:$PATH" "$GS_HOOK" doctor --json >"$T/doctor.json" 2>/dev/null || true
jq -e '.[] | select(.name == "docker daemon" and .verdict == "ok" and (.detail | test("dockerd has loaded runtime \"gpushare\"")))' "$T/doctor.json" >/dev/null ||
    { jq '.[] | select(.name == "docker daemon")' "$T/doctor.json"; fail "doctor does not see the running dockerd's gpushare runtime"; }
ok "doctor: $(jq -r '.[] | select(.name == "docker daemon") | .detail' "$T/doctor.json")"
tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
docker_ import "$T/rootfs.tar" gpushare-busybox:test >/dev/null || fail "docker import"

echo "== docker run --runtime gpushare -e GPU_SHARE=mps"
mark_shm_when_ready
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=mps \
    gpushare-busybox:test sh -c "$INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "docker run"; }
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"
ok "daemon gone after the container"

echo "== docker run --runtime gpushare, a capped mps share: its writable mounts run nothing"
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=mps \
    -e GPU_SHARE_MEMORY=1Gi gpushare-busybox:test sh -c "$INSIDE_NOEXEC" >"$T/outx" 2>"$T/errx" || { cat "$T/errx"; fail "docker run"; }
check_noexec "$T/outx" "Docker (gpushare-runtime)"

echo "== docker run --runtime gpushare -e GPU_SHARE=limit"
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=limit \
    -e GPU_SHARE_MEMORY=1Gi -e GPU_SHARE_CORES=30 \
    gpushare-busybox:test sh -c "$INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "docker run"; }
check_limit_output "$T/out2" yes

# `docker run --annotation` needs Docker 24 or later on the daemon's side (API 1.43).
if [ "${SERVER%%.*}" -ge 24 ] 2>/dev/null; then
    echo "== docker run --runtime gpushare --annotation gpu.share=mps"
    mark_shm_when_ready
    docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
        gpushare-busybox:test sh -c "$INSIDE_MPS" >"$T/out4" 2>"$T/err4" || { cat "$T/err4"; fail "docker run --annotation"; }
    check_mps_output "$T/out4" yes
    wait_until 10 daemon_gone || fail "daemon left running"
    ok "daemon gone after the container"

    echo "== docker run --runtime gpushare --annotation gpu.share=limit"
    docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=limit \
        --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
        gpushare-busybox:test sh -c "$INSIDE_LIMIT" >"$T/out5" 2>"$T/err5" || { cat "$T/err5"; fail "docker run --annotation"; }
    check_limit_output "$T/out5" yes
    SHARE_FLAGS=(--annotation gpu.share=mps)
elif [ "${DOCKER_ENGINE:-system}" = trixie ]; then
    fail "Docker $SERVER has no docker run --annotation"
else
    echo "(Docker $SERVER has no --annotation: env fallback only)"
    SHARE_FLAGS=(-e GPU_SHARE=mps)
fi

echo "== docker exec into a share container gets the share's env"
docker_ run -d --name "${NAME}e" --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 "${SHARE_FLAGS[@]}" \
    gpushare-busybox:test sleep 3600 >/dev/null 2>"$T/err6" || { cat "$T/err6"; fail "docker run -d"; }
on_exit "docker_ rm -f ${NAME}e"
docker_ exec "${NAME}e" sh -c 'echo "env:$CUDA_MPS_PIPE_DIRECTORY"; echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 && echo control:answers' \
    >"$T/out6" 2>&1 || { cat "$T/out6"; fail "docker exec"; }
grep -qx 'env:/tmp/nvidia-mps' "$T/out6" && grep -qx 'control:answers' "$T/out6" || { cat "$T/out6"; fail "docker exec: no share env or no daemon"; }
ok "exec'd process has CUDA_MPS_PIPE_DIRECTORY and reaches the daemon"
docker_ rm -f "${NAME}e" >/dev/null
wait_until 10 daemon_gone || fail "daemon left running"

echo "== no share through the gpushare runtime"
docker_ run --rm --runtime gpushare --network none gpushare-busybox:test sh -c 'echo plain' >"$T/out3" 2>&1 || { cat "$T/out3"; fail "plain run"; }
grep -qx plain "$T/out3" || fail "plain container output"
ok "a container without a request runs unchanged"
