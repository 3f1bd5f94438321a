#!/usr/bin/env bash
# containerd: `ctr run --runc-binary gpushare-runtime --annotation gpu.share=mps` on an OCI image
# (busybox rootfs + nvidia-cuda-mps-control) built here as an image-layout tarball and imported.
source "$(dirname "$0")/lib.sh"
need containerd ctr runc jq gzip sha256sum
engine_version containerd containerd --version
make_rootfs "$T/rootfs"
make_oci_tar "$T/rootfs" "$T/image.tar"
C=$T/ctd
mkdir -p "$C"
cat >"$C/config.toml" <<EOF2
version = 2
root = "$C/root"
state = "$C/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$C/sock"
[ttrpc]
  address = "$C/sock.ttrpc"
EOF2
# Runs last: the namespace's parent cgroups that runc leaves behind (empty by then).
on_exit "rmdir /sys/fs/cgroup/*/gpushare-test /sys/fs/cgroup/gpushare-test"
containerd --config "$C/config.toml" >"$C/log" 2>&1 &
CPID=$!
on_exit "kill $CPID; wait $CPID"
ctr_() { ctr --address "$C/sock" -n gpushare-test "$@"; }
wait_until 20 ctr_ version >/dev/null 2>&1 || { tail -20 "$C/log"; skip "containerd did not come up (log above)"; }
on_exit "ctr_ tasks kill -s KILL ${NAME}m; ctr_ containers rm ${NAME}m ${NAME}l"
ctr_ image import --index-name gpushare/busybox:test "$T/image.tar" >/dev/null || fail "image import"

echo "== doctor asks the running containerd: this one runs without its CRI plugin"
env CONTAINERD_ADDRESS="$C/sock" "$GS_HOOK" doctor --json >"$T/doctor.json" 2>/dev/null || true
jq -e '.[] | select(.name == "containerd daemon" and .verdict == "fail" and (.detail | test("without a CRI plugin")))' "$T/doctor.json" >/dev/null ||
    { jq '.[] | select(.name == "containerd daemon")' "$T/doctor.json"; fail "doctor does not see that containerd runs without CRI"; }
ok "doctor: $(jq -r '.[] | select(.name == "containerd daemon") | .detail' "$T/doctor.json")"

echo "== ctr run --runc-binary gpushare-runtime --annotation gpu.share=mps"
mark_shm_when_ready
ctr_ run --rm --runc-binary "$RUNTIME" --annotation gpu.share=mps --env NVIDIA_VISIBLE_DEVICES=0 \
    gpushare/busybox:test "${NAME}m" sh -c "$INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "ctr run"; }
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"
ok "daemon gone after the container"

echo "== limit mode"
ctr_ run --rm --runc-binary "$RUNTIME" --annotation gpu.share=limit --annotation gpu.share.memory=1Gi \
    --annotation gpu.share.cores=30 --env NVIDIA_VISIBLE_DEVICES=0 \
    gpushare/busybox:test "${NAME}l" sh -c "$INSIDE_LIMIT" >"$T/out2" 2>"$T/err2" || { cat "$T/err2"; fail "ctr run"; }
check_limit_output "$T/out2" yes

echo "== refused request: the shim reports the wrapper's --log JSON line"
set +e
ctr_ run --rm --runc-binary "$RUNTIME" --annotation gpu.share=mps --annotation gpu.share.bogus=1 --env NVIDIA_VISIBLE_DEVICES=0 \
    gpushare/busybox:test "${NAME}x" true >"$T/out3" 2>"$T/err3"
rc=$?
set -e
[ $rc != 0 ] || fail "a refused request ran"
grep -q "gpu.share.bogus" "$T/err3" || { cat "$T/err3"; fail "ctr did not show the wrapper's message"; }
ok "refused, ctr shows: $(grep -o 'gpushare-runtime:.*' "$T/err3" | head -1 | cut -c1-160)"
