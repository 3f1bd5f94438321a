#!/usr/bin/env bash
# containerd's CRI with CDI and NVIDIA's CDI spec (lib.sh nvidia_cdi_spec), as the kubelet asks
# for a device plugin's CDI devices: CreateContainer with `CDI_devices: [nvidia.com/gpu=0]`, no
# NVIDIA_VISIBLE_DEVICES of the pod's own, on the `gpushare` handler written by `gpushare-hook
# configure containerd`; mps and limit. Then gpushare's own device `gpushare.io/share=mps`: on the
# plain runc handler alone, and on the gpushare handler composed with the pod's annotations (a
# refining gpu.share.memory=8Gi is served with its cap, a contradicting gpu.share=limit is
# refused naming both), with no tenant-writable mount able to run a program. A private containerd
# (own root, state, socket, config).
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
cri_cdi_containerd_config "$C" "$T/cdi"
"$GS_HOOK" configure containerd --config "$CONFIG" --path "$C/config.toml" >/dev/null || fail "gpushare-hook configure containerd"

on_exit "rmdir /sys/fs/cgroup/*$CGROUP_PARENT /sys/fs/cgroup$CGROUP_PARENT"
start_cri_containerd
cri Status '{"verbose":true}' | jq -r .info.config | jq -e '[.. | objects | select(has("enableCDI")) | .enableCDI][0] == true' >/dev/null ||
    fail "the running containerd does not have CDI enabled"
ok "the running containerd has CDI enabled"

import_cri_images

pod_config() { # name annotations-json
    jq -cn --arg n "$1" --argjson a "$2" --arg logs "$C/logs/$1" --arg cg "$CGROUP_PARENT" '{
        metadata: {name: $n, uid: ("uid-" + $n), namespace: "gpushare-test", attempt: 0},
        log_directory: $logs, annotations: $a,
        linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: "NODE"}}}}'
}
run_cdi_pod() { # name annotations-json cdi-devices (space-separated) command marker -> output in $C/out-NAME
    local p req cid
    mkdir -p "$C/logs/$1"
    p=$(cri RunPodSandbox "{\"config\":$(pod_config "$1" "$2"),\"runtime_handler\":\"gpushare\"}" | jq -r .pod_sandbox_id) ||
        { tail -20 "$C/log"; fail "$1: RunPodSandbox"; }
    req=$(jq -cn --arg p "$p" --argjson pc "$(pod_config "$1" "$2")" --arg dev "$3" --arg cmd "$4; exec sleep 3600" '{
        pod_sandbox_id: $p, sandbox_config: $pc,
        config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
                 command: ["sh", "-c", $cmd], CDI_devices: ($dev | split(" ") | map({name: .})),
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

echo "== the gpushare handler: CDI_devices nvidia.com/gpu=0 + gpushare.io/share=mps, the pod annotated gpu.share.memory=8Gi"
# 8 GiB in bytes, and as MPS's pinned-memory limit (MiB), computed here rather than by gpushare.
CAP_BYTES=$((8 * 1024 * 1024 * 1024))
CAP_MIB=$((8 * 1024))
mark_shm_when_ready
: >"$T/cdi-hook.log"
P=$(run_cdi_pod capped '{"gpu.share.memory":"8Gi"}' "nvidia.com/gpu=0 gpushare.io/share=mps" \
    "$INSIDE_CDI; $INSIDE_MPS; echo \"pin:\$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\"; $INSIDE_NOEXEC; echo noexec:done" noexec:done)
CID=$(cri ListContainers "{\"filter\":{\"pod_sandbox_id\":\"$P\"}}" | jq -r '.containers[0].id')
jq -e '.annotations["gpu.share.memory"] == "8Gi"' "$C/state/io.containerd.runtime.v2.task/k8s.io/$CID/config.json" >/dev/null ||
    fail "the pod's gpu.share.memory annotation did not reach the container's OCI spec through the gpushare handler"
check_cdi_output "$C/out-capped"
check_mps_output "$C/out-capped" yes
has -x "pin:0=${CAP_MIB}M" "$C/out-capped" || { cat "$C/out-capped"; fail "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is not 0=${CAP_MIB}M inside"; }
"$GS_HOOK" status --config "$CONFIG" --json >"$T/status-capped.json"
jq -e --arg c "$CID" --argjson b "$CAP_BYTES" '[.gpus[].clients[] | select(.id == $c and .mode == "mps" and .memory == $b)] | length == 1' \
    "$T/status-capped.json" >/dev/null || { "$GS_HOOK" status --config "$CONFIG"; fail "status does not list container $CID as an mps client capped at $CAP_BYTES bytes"; }
ok "status --json: $(jq -c --arg c "$CID" '.gpus[].clients[] | select(.id == $c) | {id: .id[0:12], mode, memory, cap: .cap.bytes}' "$T/status-capped.json")"
ok "gpushare.io/share=mps refined by gpu.share.memory=8Gi through containerd's CRI: served with the cap (pin:0=${CAP_MIB}M inside)"
check_noexec "$C/out-capped" "CRI CDI device with an annotation"
# kubectl cp then kubectl exec: a script copied from /tmp into /dev/shm and into the MPS pipe
# directory cannot be run; the same script runs from /tmp.
cri_exec "$CID" 20 sh -c 'printf "#!/bin/sh\necho ran\n" >/tmp/gs-copy && busybox chmod 755 /tmp/gs-copy && busybox mkdir -p /tmp/run
for d in /tmp/run /dev/shm /tmp/nvidia-mps; do
    busybox cp /tmp/gs-copy $d/gs-copy || { echo "copy:$d:failed"; continue; }
    if out=$($d/gs-copy 2>&1); then echo "run:$d:$out"; else echo "refused:$d:$out"; fi
    busybox rm -f $d/gs-copy
done' >"$T/exec-copy" 2>&1 || true
has -x 'run:/tmp/run:ran' "$T/exec-copy" || { cat "$T/exec-copy"; fail "positive control: the script copied to /tmp did not run"; }
for d in /dev/shm /tmp/nvidia-mps; do
    has "^refused:$d:.*Permission denied" "$T/exec-copy" || { cat "$T/exec-copy"; fail "a script copied to $d was not refused with Permission denied"; }
done
ok "ExecSync: copied to /tmp it ran; $(grep '^refused:' "$T/exec-copy" | tr '\n' ' ')"
cri StopPodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null || fail "remove the capped pod"
wait_until 10 daemon_gone || fail "daemon left running after the capped pod"
wait_until 10 released "$CID" || fail "the capped pod's container still listed after its pod"

echo "== the gpushare handler: gpushare.io/share=mps with the pod annotated gpu.share=limit is refused"
mkdir -p "$C/logs/contra"
EVENTS=$T/gpushare-events.jsonl
EV0=$(cat "$EVENTS" 2>/dev/null | wc -l)
P=$(cri RunPodSandbox "{\"config\":$(pod_config contra '{"gpu.share":"limit"}'),\"runtime_handler\":\"gpushare\"}" | jq -r .pod_sandbox_id) ||
    { tail -20 "$C/log"; fail "contra: RunPodSandbox"; }
REQ=$(jq -cn --arg p "$P" --argjson pc "$(pod_config contra '{"gpu.share":"limit"}')" '{
    pod_sandbox_id: $p, sandbox_config: $pc,
    config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
             command: ["sh", "-c", "echo started; exec sleep 3600"],
             CDI_devices: [{name: "nvidia.com/gpu=0"}, {name: "gpushare.io/share=mps"}],
             log_path: "work.log", linux: {}}}')
STEP=CreateContainer
if CID=$(cri CreateContainer "$REQ" 2>"$T/err-contra" | jq -r .container_id); then
    STEP=StartContainer
    cri StartContainer "{\"container_id\":\"$CID\"}" >/dev/null 2>"$T/err-contra" && fail "a container asking gpu.share=limit with the device gpushare.io/share=mps was started"
fi
WANT='the container asks for gpu.share="limit" but its CDI device gpushare.io/share=mps sets gpu.share="mps"; drop the annotation or pick the device that matches it'
has -F "$WANT" "$T/err-contra" || { cat "$T/err-contra"; tail -5 "$T/gpushare.log"; fail "$STEP's error is not gpushare's line naming the annotation and the device"; }
ok "refused at $STEP naming both: $(head -1 "$T/err-contra" | cut -c1-400)"
tail -n +$((EV0 + 1)) "$EVENTS" 2>/dev/null | jq -s -e --arg w "$WANT" '[.[] | select(.event == "refusal" and (.message | contains($w)))] | length == 1' >/dev/null ||
    { tail -n +$((EV0 + 1)) "$EVENTS"; fail "gpushare's event log has not one refusal event with that line"; }
ok "one refusal event in gpushare's event log: $(tail -n +$((EV0 + 1)) "$EVENTS" | jq -c 'select(.event == "refusal") | {event, reason}')"
[ "$("$GS_HOOK" status --config "$CONFIG" --json | jq '[.gpus[].clients[]] | length')" = 0 ] || fail "the refused container is listed"
daemon_running && fail "an MPS daemon runs after a refused container"
ls -A "$STATE/mps" 2>/dev/null | has . && fail "MPS directories left after the refusal: $(ls -A "$STATE/mps")"
ok "nothing left by the refusal: no client, no daemon, no MPS directory"
cri StopPodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$P\"}" >/dev/null || fail "remove the contra pod"
