#!/usr/bin/env bash
# containerd's CRI with CDI and NVIDIA's CDI spec (lib.sh nvidia_cdi_spec), as the kubelet asks
# for a device plugin's CDI devices: CreateContainer with `CDI_devices: [nvidia.com/gpu=0]`, no
# NVIDIA_VISIBLE_DEVICES of the pod's own, on the `gpushare` handler written by `gpushare-hook
# configure containerd`; mps and limit. A private containerd (own root, state, socket, config).
#
#   CRI_CONTAINERD=trixie   containerd 1.7 (Debian 13): enable_cdi = true, config version 2
#   CRI_CONTAINERD=sid      containerd 2.x (Debian unstable): CDI on by default, config version 3
source "$(dirname "$0")/lib.sh"
need runc jq gzip sha256sum mknod
need_containerd trixie "trixie sid"
cri_client

C=$T/ctd
mkdir -p "$C/cni/bin" "$C/cni/conf" "$C/logs" "$T/cdi"
nvidia_cdi_spec >"$T/cdi/nvidia.yaml"
CGROUP_PARENT=/gpushare-cdi-$$
if [ "${CRI_CONTAINERD:-trixie}" = sid ]; then
    cat >"$C/config.toml" <<EOF2
version = 3
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/sock"
[ttrpc]
  address = "$C/sock.ttrpc"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "gpushare.test/pause:1"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["$T/cdi"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$C/cni/bin"]
    conf_dir = "$C/cni/conf"
EOF2
else
    cat >"$C/config.toml" <<EOF2
version = 2
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/sock"
[ttrpc]
  address = "$C/sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "gpushare.test/pause:1"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["$T/cdi"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$C/cni/bin"
    conf_dir = "$C/cni/conf"
EOF2
fi
"$GS_HOOK" configure containerd --config "$CONFIG" --path "$C/config.toml" >/dev/null || fail "gpushare-hook configure containerd"

on_exit "rmdir /sys/fs/cgroup/*$CGROUP_PARENT /sys/fs/cgroup$CGROUP_PARENT"
env PATH="$CTD_PATH" containerd --config "$C/config.toml" >"$C/log" 2>&1 &
CPID=$!
on_exit "kill $CPID; wait $CPID"
cri() { "$PYTHON" "$GS_REPO/tests/cri/cri.py" call "$C/sock" "$@"; }
wait_until 30 cri Version '{}' >/dev/null 2>&1 || { tail -30 "$C/log"; fail "containerd's CRI did not come up (log above)"; }
remove_all_pods() {
    local p
    for p in $(cri ListPodSandbox '{}' | jq -r '.items[]?.id'); do
        cri StopPodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
        cri RemovePodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
    done
}
on_exit remove_all_pods
cri Status '{"verbose":true}' | jq -r .info.config | jq -e '[.. | objects | select(has("enableCDI")) | .enableCDI][0] == true' >/dev/null ||
    fail "the running containerd does not have CDI enabled"
ok "the running containerd has CDI enabled"

mkdir -p "$T/pause/bin"
cp /bin/busybox "$T/pause/bin/" && ln -s busybox "$T/pause/bin/sleep"
make_oci_tar "$T/pause" "$T/pause.tar" '["/bin/sleep","2147483647"]'
make_rootfs "$T/rootfs"
make_oci_tar "$T/rootfs" "$T/image.tar"
ctr_() { env PATH="$CTD_PATH" ctr --address "$C/sock" -n k8s.io "$@"; }
ctr_ images import --index-name gpushare.test/pause:1 "$T/pause.tar" >/dev/null || fail "pause image import"
ctr_ images import --index-name gpushare.test/busybox:1 "$T/image.tar" >/dev/null || fail "image import"

pod_config() { # name annotations-json
    jq -cn --arg n "$1" --argjson a "$2" --arg logs "$C/logs/$1" --arg cg "$CGROUP_PARENT" '{
        metadata: {name: $n, uid: ("uid-" + $n), namespace: "gpushare-test", attempt: 0},
        log_directory: $logs, annotations: $a,
        linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: "NODE"}}}}'
}
run_cdi_pod() { # name annotations-json cdi-device command marker -> output in $C/out-NAME
    local p req cid
    mkdir -p "$C/logs/$1"
    p=$(cri RunPodSandbox "{\"config\":$(pod_config "$1" "$2"),\"runtime_handler\":\"gpushare\"}" | jq -r .pod_sandbox_id) ||
        { tail -20 "$C/log"; fail "$1: RunPodSandbox"; }
    req=$(jq -cn --arg p "$p" --argjson pc "$(pod_config "$1" "$2")" --arg dev "$3" --arg cmd "$4; exec sleep 3600" '{
        pod_sandbox_id: $p, sandbox_config: $pc,
        config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
                 command: ["sh", "-c", $cmd], CDI_devices: [{name: $dev}],
                 log_path: "work.log", linux: {}}}')
    cid=$(cri CreateContainer "$req" | jq -r .container_id) || { tail -20 "$C/log"; fail "$1: CreateContainer with CDI_devices $3"; }
    cri StartContainer "{\"container_id\":\"$cid\"}" >/dev/null || { tail -20 "$C/log"; fail "$1: StartContainer"; }
    wait_until 20 grep -q " $5" "$C/logs/$1/work.log" || { cat "$C/logs/$1/work.log" 2>/dev/null; fail "$1: no '$5' line from the container"; }
    cut -d' ' -f4- "$C/logs/$1/work.log" >"$C/out-$1"
    echo "$p"
}

echo "== CreateContainer with CDI_devices nvidia.com/gpu=0, pod annotated gpu.share=mps"
mark_shm_when_ready
P=$(run_cdi_pod mps '{"gpu.share":"mps"}' nvidia.com/gpu=0 "$INSIDE_CDI; $INSIDE_MPS" pipe:)
check_cdi_output "$C/out-mps"
check_mps_output "$C/out-mps" yes
cri StopPodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null || fail "remove the mps pod"
wait_until 10 daemon_gone || fail "daemon left running after the mps pod"

echo "== CreateContainer with CDI_devices nvidia.com/gpu=all, pod annotated gpu.share=limit"
: >"$T/cdi-hook.log"
P=$(run_cdi_pod limit '{"gpu.share":"limit","gpu.share.memory":"1Gi","gpu.share.cores":"30"}' nvidia.com/gpu=all "$INSIDE_CDI; $INSIDE_LIMIT" shared:)
check_cdi_output "$C/out-limit"
check_limit_output "$C/out-limit" yes
cri StopPodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null || fail "remove the limit pod"

echo "== gpushare's own CDI device, no annotation, the default runc handler: CDI_devices nvidia.com/gpu=0 + gpushare.io/share=mps"
"$GS_HOOK" cdi generate --config "$CONFIG" --output "$T/cdi" >"$T/gen" || { cat "$T/gen"; fail "cdi generate"; }
mark_shm_when_ready
: >"$T/cdi-hook.log"
mkdir -p "$C/logs/plain"
P=$(cri RunPodSandbox "{\"config\":$(pod_config plain '{}')}" | jq -r .pod_sandbox_id) || { tail -20 "$C/log"; fail "plain: RunPodSandbox"; }
REQ=$(jq -cn --arg p "$P" --argjson pc "$(pod_config plain '{}')" --arg cmd "$INSIDE_CDI; $INSIDE_MPS; exec sleep 3600" '{
    pod_sandbox_id: $p, sandbox_config: $pc,
    config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
             command: ["sh", "-c", $cmd], CDI_devices: [{name: "nvidia.com/gpu=0"}, {name: "gpushare.io/share=mps"}],
             log_path: "work.log", linux: {}}}')
CID=$(cri CreateContainer "$REQ" | jq -r .container_id) || { tail -20 "$C/log"; fail "plain: CreateContainer with gpushare.io/share=mps"; }
cri StartContainer "{\"container_id\":\"$CID\"}" >/dev/null || { tail -20 "$C/log"; fail "plain: StartContainer"; }
wait_until 20 grep -q " pipe:" "$C/logs/plain/work.log" || { cat "$C/logs/plain/work.log" 2>/dev/null; tail -5 "$T/gpushare.log"; fail "plain: no 'pipe:' line from the container"; }
cut -d' ' -f4- "$C/logs/plain/work.log" >"$C/out-plain"
check_cdi_output "$C/out-plain"
check_mps_output "$C/out-plain" yes
"$GS_HOOK" status --config "$CONFIG" --json | jq -e --arg c "$CID" '[.gpus[].clients[].id] | index($c)' >/dev/null ||
    { "$GS_HOOK" status --config "$CONFIG"; fail "status does not list the CDI-device container"; }
ok "gpushare.io/share=mps through containerd's CDI on the plain runc handler; status lists it"
cri StopPodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null || fail "remove the plain pod"
wait_until 10 daemon_gone || fail "daemon left running after the plain pod"
left=$("$GS_HOOK" status --config "$CONFIG" --json | jq '[.gpus[].clients[]] | length')
[ "$left" = 0 ] || fail "status still lists $left clients after the pod"
ok "nothing left after the pod"
