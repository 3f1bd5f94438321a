#!/usr/bin/env bash
# Docker: a private dockerd (own data-root, exec-root, socket) with
# `--add-runtime gpushare=gpushare-runtime`; `docker run --runtime gpushare -e GPU_SHARE=mps`
# (Docker 20.10 has no --annotation, hence the env fallback).
source "$(dirname "$0")/lib.sh"
need dockerd docker runc jq
make_rootfs "$T/rootfs"
D=$T/docker
mkdir -p "$D"
# Short exec-root: containerd's socket path must stay under 108 bytes.
X=$(mktemp -d /tmp/gsd-XXXX)
on_exit "rm -rf $X"
dockerd --data-root "$D/data" --exec-root "$X" -H "unix://$D/sock" --pidfile "$D/pid" \
    --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs \
    --add-runtime "gpushare=$RUNTIME" >"$D/log" 2>&1 &
DPID=$!
on_exit "kill $DPID; wait $DPID"
docker_() { docker -H "unix://$D/sock" "$@"; }
wait_until 60 docker_ version >/dev/null 2>&1 || { tail -20 "$D/log"; skip "dockerd did not come up (log above)"; }
tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
docker_ import "$T/rootfs.tar" gpushare-busybox:test >/dev/null || fail "docker import"

echo "== docker run --runtime gpushare -e GPU_SHARE=mps"
mark_shm_when_ready
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=mps \
    gpushare-busybox:test sh -c "$INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "docker run"; }
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"
ok "daemon gone after the container"

echo "== docker run --runtime gpushare -e GPU_SHARE=limit"
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=limit \
    -e GPU_SHARE_MEMORY=1Gi -e GPU_SHARE_CORES=30 \
    gpushare-busybox:test sh -c "$INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "docker run"; }
check_limit_output "$T/out2" yes

echo "== no share through the gpushare runtime"
docker_ run --rm --runtime gpushare --network none gpushare-busybox:test sh -c 'echo plain' >"$T/out3" 2>&1 || { cat "$T/out3"; fail "plain run"; }
grep -qx plain "$T/out3" || fail "plain container output"
ok "a container without a request runs unchanged"
