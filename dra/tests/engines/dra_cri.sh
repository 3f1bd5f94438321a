#!/usr/bin/env bash
# gpushare-dra end to end, as a kubelet runs it with containerd's CRI and CDI, without a
# cluster: a fake API server (kubelet.py apiserver) serves the claims and takes the node's
# ResourceSlices; the real gpushare-dra binary publishes the slices, registers through a
# plugins_registry socket and prepares claims that a test kubelet (kubelet.py) asks for over
# gRPC; containerd (private, CDI on, plain runc handler) then creates each pod's container with
# the CDI devices the plugin answered, and gpushare's hook takes the share. The simulated driver
# stands in for one 80 GiB GPU. Driven by dra/tests/cri.rs, which adds GS_DRA (the plugin).
#
#   CRI_CONTAINERD=trixie   containerd 1.7 (Debian 13), enable_cdi = true
#   CRI_CONTAINERD=sid      containerd 2.x (Debian unstable), CDI on by default
source "$GS_REPO/tests/engines/lib.sh"
need runc jq gzip sha256sum mknod
need_containerd trixie "trixie sid"
cri_client
"$PYTHON" "$GS_REPO/dra/tests/engines/kubelet.py" gen "$T/kubelet-gen" "$GS_REPO/dra/proto" || fail "cannot compile dra/proto"
export KUBELET_GEN=$T/kubelet-gen
kubelet() { "$PYTHON" "$GS_REPO/dra/tests/engines/kubelet.py" "$@"; }

# The shipped policy: caps admitted up to the GPU's 80 GiB (memory_overcommit 1.0).
write_config

C=$T/ctd
mkdir -p "$C/cni/bin" "$C/cni/conf" "$C/logs" "$T/cdi"
nvidia_cdi_spec >"$T/cdi/nvidia.yaml"
CGROUP_PARENT=/gpushare-dra-$$
cri_cdi_containerd_config "$C" "$T/cdi"
on_exit "rmdir /sys/fs/cgroup/*$CGROUP_PARENT /sys/fs/cgroup$CGROUP_PARENT"
start_cri_containerd

import_cri_images

echo "== the fake API server, then gpushare-dra"
API=$T/api
mkdir -p "$API/claims/default"
# Not through the function: the pid must be python's own, for the kill at exit.
"$PYTHON" "$GS_REPO/dra/tests/engines/kubelet.py" apiserver "$T/api.port" "$API" 2>"$T/api.log" &
APID=$!
on_exit "kill $APID"
wait_until 10 test -s "$T/api.port" || fail "the fake API server did not start"
cat >"$T/kubeconfig" <<EOF2
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$(cat "$T/api.port")"}}]
users: [{name: fake, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
EOF2
KL=$T/kubelet
env KUBECONFIG="$T/kubeconfig" GPUSHARE_SIM_STATE=$SIM GPUSHARE_SIM_DEVICES=81920 RUST_LOG=info \
    "$GS_DRA" --node-name gs-node --config "$CONFIG" --registry-dir "$KL/plugins_registry" \
    --plugin-dir "$KL/plugins/gpushare.io" --state-dir "$T/dra" --cdi-dir "$T/cdi" \
    >"$T/dra.log" 2>&1 &
DPID=$!
on_exit "kill $DPID; wait $DPID"
wait_until 20 test -S "$KL/plugins_registry/gpushare.io-reg.sock" || { cat "$T/dra.log"; fail "no registration socket"; }
wait_until 20 test -s "$API/slices/gs-node-gpushare.io-devices-0.json" || { cat "$T/dra.log" "$T/api.log"; fail "no ResourceSlices published"; }
jq -e '.spec.devices | map(.name) == ["gpu-0-mps","gpu-0-timeslice","gpu-0-limit"]' "$API/slices/gs-node-gpushare.io-devices-0.json" >/dev/null ||
    { cat "$API/slices/"*; fail "the published devices are not one per mode of GPU 0"; }
jq -e '.spec.sharedCounters[0].counters.memory.value == "85899345920"' "$API/slices/gs-node-gpushare.io-counters-0.json" >/dev/null ||
    { cat "$API/slices/"*; fail "GPU 0's memory counter is not the simulated 80 GiB"; }
ok "ResourceSlices published: GPU 0's 80 GiB as a counter, a share device per mode"

INFO=$(kubelet register "$KL/plugins_registry/gpushare.io-reg.sock") || fail "registration"
echo "$INFO" | jq -e '.type == "DRAPlugin" and .name == "gpushare.io" and (.supported_versions | index("v1.DRAPlugin"))' >/dev/null || fail "plugin info: $INFO"
EP=$(echo "$INFO" | jq -r .endpoint)
ok "registered through plugins_registry; endpoint $EP"

claim_json() { # name uid memory cores
    jq -cn --arg n "$1" --arg u "$2" --arg m "$3" --arg c "$4" '{
        apiVersion: "resource.k8s.io/v1", kind: "ResourceClaim",
        metadata: {name: $n, namespace: "default", uid: $u},
        spec: {devices: {requests: [{name: "gpu", exactly: {deviceClassName: "gpushare-mps", capacity: {requests: {memory: $m}}}}]}},
        status: {allocation: {devices: {
            results: [{driver: "gpushare.io", pool: "gs-node", device: "gpu-0-mps", request: "gpu", consumedCapacity: {memory: $m}}],
            config: [{source: "FromClaim", requests: ["gpu"], opaque: {driver: "gpushare.io",
                parameters: {apiVersion: "gpushare.io/v1alpha1", kind: "ShareConfig", cores: $c}}}]}}}}'
}
UA=11111111-0000-4000-8000-000000000001
UB=11111111-0000-4000-8000-000000000002
UC=11111111-0000-4000-8000-000000000003
claim_json a $UA 30Gi 25 >"$API/claims/default/a.json"
claim_json b $UB 40Gi 50 >"$API/claims/default/b.json"
claim_json c $UC 20Gi 25 >"$API/claims/default/c.json"

echo "== prepare a (30Gi) and b (40Gi) on one GPU"
R=$(kubelet prepare "$EP" v1 default/a/$UA default/b/$UB) || fail "prepare a b"
echo "$R"
for u in $UA $UB; do
    echo "$R" | jq -e --arg u $u '.claims[$u].error // "" == ""' >/dev/null || fail "claim $u refused: $R"
    echo "$R" | jq -e --arg u $u '.claims[$u].devices[0].cdi_device_ids == ["gpushare.io/claim=c-" + $u, "nvidia.com/gpu=0"]' >/dev/null || fail "CDI devices of $u: $R"
done
ok "prepared: each claim answers its own CDI device and NVIDIA's nvidia.com/gpu=0"

echo "== c (20Gi) does not fit beside 70Gi: refused at prepare, one line"
R=$(kubelet prepare "$EP" v1 default/c/$UC) || fail "prepare c"
E=$(echo "$R" | jq -r --arg u $UC '.claims[$u].error')
case $E in *"cannot take 20.0 GiB more"*"70.0 GiB of the 80.0 GiB"*) ;; *) fail "c: $R" ;; esac
[ "$(printf '%s' "$E" | wc -l)" = 0 ] || fail "c: the error is not one line: $E"
[ ! -e "$T/cdi/gpushare.io-claim-$UC.json" ] || fail "a spec was written for the refused claim"
ok "c refused: $E"

pod_config() { # name
    jq -cn --arg n "$1" --arg logs "$C/logs/$1" --arg cg "$CGROUP_PARENT" '{
        metadata: {name: $n, uid: ("uid-" + $n), namespace: "gpushare-test", attempt: 0},
        log_directory: $logs,
        linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: "NODE"}}}}'
}
run_claim_pod() { # name uid -> pod id; output in $C/out-NAME
    local p req cid devs
    mkdir -p "$C/logs/$1"
    devs=$(jq -cn --arg u "$2" '[{name: ("gpushare.io/claim=c-" + $u)}, {name: "nvidia.com/gpu=0"}]')
    p=$(cri RunPodSandbox "{\"config\":$(pod_config "$1")}" | jq -r .pod_sandbox_id) || { tail -20 "$C/log"; fail "$1: RunPodSandbox"; }
    req=$(jq -cn --arg p "$p" --argjson pc "$(pod_config "$1")" --argjson d "$devs" --arg cmd "$INSIDE_CDI; $INSIDE_MPS; echo limit:\$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; echo sm:\$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; exec sleep 3600" '{
        pod_sandbox_id: $p, sandbox_config: $pc,
        config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
                 command: ["sh", "-c", $cmd], CDI_devices: $d, log_path: "work.log", linux: {}}}')
    cid=$(cri CreateContainer "$req" | jq -r .container_id) || { tail -20 "$C/log"; tail -5 "$T/gpushare.log"; fail "$1: CreateContainer"; }
    cri StartContainer "{\"container_id\":\"$cid\"}" >/dev/null || { tail -20 "$C/log"; fail "$1: StartContainer"; }
    wait_until 20 grep -q " sm:" "$C/logs/$1/work.log" || { cat "$C/logs/$1/work.log" 2>/dev/null; tail -5 "$T/gpushare.log"; fail "$1: no 'sm:' line from the container"; }
    cut -d' ' -f4- "$C/logs/$1/work.log" >"$C/out-$1"
    echo "$p"
}

echo "== the pods of a and b: containerd applies both CDI devices, the hook takes the shares"
mark_shm_when_ready
: >"$T/cdi-hook.log"
PA=$(run_claim_pod a $UA)
check_cdi_output "$C/out-a"
check_mps_output "$C/out-a" yes
PB=$(run_claim_pod b $UB)
grep -qx 'limit:0=30720M' "$C/out-a" && grep -qx 'sm:25' "$C/out-a" || { cat "$C/out-a"; fail "a: MPS client limits"; }
grep -qx 'limit:0=40960M' "$C/out-b" && grep -qx 'sm:50' "$C/out-b" || { cat "$C/out-b"; fail "b: MPS client limits"; }
ok "inside: each claim's memory and SM limits"
ST=$("$GS_HOOK" status --config "$CONFIG" --json)
echo "$ST" | jq -e '[.gpus[].clients[]] | length == 2' >/dev/null || { echo "$ST"; fail "status does not list two clients"; }
echo "$ST" | jq -e '[.gpus[].clients[].memory] | sort == [32212254720, 42949672960]' >/dev/null || { echo "$ST"; fail "the clients' memory caps are not the claims'"; }
echo "$ST" | jq -e '[.gpus[].clients[].cores] | sort == [25, 50]' >/dev/null || { echo "$ST"; fail "the clients' cores are not the claims'"; }
echo "$ST" | jq -e '[.gpus[].domains[] | select(.daemon.alive)] as $d | ($d | length) == 1 and ($d[0].clients | length) == 2' >/dev/null ||
    { echo "$ST"; fail "not one MPS daemon for both"; }
ok "status: two clients with the claims' caps (30Gi, 40Gi) and cores (25, 50) on one MPS daemon"

echo "== delete the pods, unprepare: everything released"
for p in $PA $PB; do
    cri StopPodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null || fail "remove pod $p"
done
R=$(kubelet unprepare "$EP" default/a/$UA default/b/$UB) || fail "unprepare"
echo "$R" | jq -e '[.claims[] | .error // ""] == ["", ""]' >/dev/null || fail "unprepare: $R"
ls "$T/cdi" | has -v gpushare.io-claim || true
[ -z "$(ls "$T/cdi" | grep gpushare.io-claim || true)" ] || fail "claim specs left: $(ls "$T/cdi")"
jq -e '.claims == {}' "$T/dra/checkpoint.json" >/dev/null || fail "checkpoint not empty: $(cat "$T/dra/checkpoint.json")"
wait_until 10 daemon_gone || fail "daemon left running after the pods"
left=$("$GS_HOOK" status --config "$CONFIG" --json | jq '[.gpus[].clients[]] | length')
[ "$left" = 0 ] || fail "status still lists $left clients"
ok "no spec, no checkpoint entry, no client, no daemon left"
R=$(kubelet prepare "$EP" v1beta1 default/c/$UC) || fail "prepare c again"
echo "$R" | jq -e --arg u $UC '.claims[$u].error // "" == ""' >/dev/null || fail "c after release: $R"
ok "c fits once a and b are released (v1beta1 call)"
