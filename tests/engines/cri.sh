#!/usr/bin/env bash
# containerd's CRI API driven as the kubelet drives it (RunPodSandbox, CreateContainer,
# StartContainer, ExecSync, StopContainer, RemovePodSandbox), without a kubelet: a private
# containerd (own root, state, socket, config) with a `gpushare` runtime handler whose BinaryName
# is gpushare-runtime and pod_annotations ["gpu.share*"]. No network: the pause image is built
# here from busybox and imported; pods use the node's network namespace.
#
#   CRI_CONTAINERD=system   containerd of this machine (Debian 12: 1.6)
#   CRI_CONTAINERD=trixie   containerd 1.7 unpacked from Debian 13 (scripts/fetch-engines.sh)
#   CRI_CONTAINERD=sid      containerd 2.x unpacked from Debian unstable: config version 3
source "$(dirname "$0")/lib.sh"
need runc jq gzip sha256sum
need_containerd system "system trixie sid"
cri_client

C=$T/ctd
mkdir -p "$C/cni/bin" "$C/cni/conf" "$T/logs"
CGROUP_PARENT=/gpushare-cri-$$

# The gpushare runtime handler merged into the containerd config `$1` by
# `gpushare-hook configure containerd --path` for this test's policy (BinaryName = the
# gpushare-runtime next to the policy's hook, or its launcher).
configure_containerd() { # file
    "$GS_HOOK" configure containerd --config "$CONFIG" --path "$1" >/dev/null || fail "gpushare-hook configure containerd"
    grep -Eq "^ *BinaryName = \"($RUNTIME|${CONFIG%/*}/gpushare-runtime-config)\"" "$1" || { cat "$1"; fail "configure containerd did not name $RUNTIME"; }
}

# The containerd config (version 2): this test's paths and CRI settings, then the handler.
write_containerd_cri_config() { # file
    cat >"$1" <<EOF2
version = 2
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/sock"
[ttrpc]
  address = "$C/sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "gpushare.test/pause:1"
  # This machine may not lower oom_score_adj (the sandbox asks for -998).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$C/cni/bin"
    conf_dir = "$C/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
EOF2
    configure_containerd "$1"
}

# containerd 2.x: config version 3, where the CRI plugin is split into images and runtime; the
# handler as configure writes it there.
write_containerd_cri_config_v3() { # file
    cat >"$1" <<EOF2
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
  # This machine may not lower oom_score_adj (the sandbox asks for -998).
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$C/cni/bin"]
    conf_dir = "$C/cni/conf"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
EOF2
    configure_containerd "$1"
}
if [ "${CRI_CONTAINERD:-system}" = sid ]; then
    write_containerd_cri_config_v3 "$C/config.toml"
else
    write_containerd_cri_config "$C/config.toml"
fi

on_exit "rmdir /sys/fs/cgroup/*$CGROUP_PARENT /sys/fs/cgroup$CGROUP_PARENT"
start_cri_containerd
cri Version '{}' | jq -r '"CRI: \(.runtime_name) \(.runtime_version) API \(.runtime_api_version)"'
import_cri_images

pod_config() { # name annotations-json
    jq -cn --arg n "$1" --argjson a "$2" --arg logs "$T/logs/$1" --arg cg "$CGROUP_PARENT" '{
        metadata: {name: $n, uid: ("uid-" + $n), namespace: "gpushare-test", attempt: 0},
        log_directory: $logs, annotations: $a,
        linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: "NODE"}}}}'
}
run_pod() { # name annotations-json -> pod id
    mkdir -p "$T/logs/$1"
    cri RunPodSandbox "{\"config\":$(pod_config "$1" "$2"),\"runtime_handler\":\"${CRI_HANDLER:-gpushare}\"}" | jq -r .pod_sandbox_id
}
start_container() { # pod-id pod-name annotations-json shell-command -> container id
    local req cid
    req=$(jq -cn --arg p "$1" --argjson pc "$(pod_config "$2" "$3")" --arg cmd "$4" '{
        pod_sandbox_id: $p, sandbox_config: $pc,
        config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
                 command: ["sh", "-c", $cmd], envs: [{key: "NVIDIA_VISIBLE_DEVICES", value: "0"}],
                 log_path: "work.log", linux: {}}}')
    cid=$(cri CreateContainer "$req" | jq -r .container_id) || return 1
    cri StartContainer "{\"container_id\":\"$cid\"}" >/dev/null || return 1
    echo "$cid"
}
remove_pod() { # pod-id
    cri StopPodSandbox "{\"pod_sandbox_id\":\"$1\"}" >/dev/null || fail "StopPodSandbox $1"
    cri RemovePodSandbox "{\"pod_sandbox_id\":\"$1\"}" >/dev/null || fail "RemovePodSandbox $1"
}
# The container's output from its CRI log (`TIME STREAM TAG line`), once it printed `pipe:`
# or `shared:` (the last line of the INSIDE_* scripts).
log_of() { # pod-name out-file marker
    local f=$T/logs/$1/work.log
    wait_until 20 grep -q " $3" "$f" || { cat "$f" 2>/dev/null; fail "$1: no '$3' line in the container's log"; }
    cut -d' ' -f4- "$f" >"$2"
}
bundle_config() { # container or sandbox id
    echo "$C/state/io.containerd.runtime.v2.task/k8s.io/$1/config.json"
}

echo "== RunPodSandbox of a pod annotated gpu.share=mps: the sandbox passes through untouched"
mark_shm_when_ready
PA=$(run_pod mps-a '{"gpu.share":"mps"}') || { tail -20 "$C/log"; fail "RunPodSandbox of an annotated pod"; }
# (protobuf JSON leaves out enum fields at their zero value, SANDBOX_READY)
cri PodSandboxStatus "{\"pod_sandbox_id\":\"$PA\"}" | jq -e '(.status.state // "SANDBOX_READY") == "SANDBOX_READY"' >/dev/null || fail "sandbox not ready"
SB=$(bundle_config "$PA")
jq -e '.annotations["gpu.share"] == "mps" and .annotations["io.kubernetes.cri.container-type"] == "sandbox"' "$SB" >/dev/null ||
    { jq .annotations "$SB"; fail "the sandbox's spec lacks the pod's gpu.share annotation or the sandbox marker"; }
if grep -q -e gpushare-hook -e CUDA_MPS -e /tmp/nvidia-mps "$SB"; then fail "the sandbox container was given a share"; fi
daemon_running && fail "an MPS daemon runs for a sandbox alone"
ok "sandbox ready with gpu.share=mps in its spec, no share given, no daemon"

echo "== the pod's container gets its MPS share"
CA=$(start_container "$PA" mps-a '{"gpu.share":"mps"}' "$INSIDE_MPS; exec sleep 3600") || { tail -20 "$C/log"; fail "container in mps-a"; }
log_of mps-a "$T/out-a" pipe:
check_mps_output "$T/out-a" yes
daemon_running || fail "no MPS daemon while an mps pod runs"
ok "MPS daemon running"

echo "== ExecSync (kubectl exec) gets the share's env"
cri_exec "$CA" 20 sh -c 'echo "env:$CUDA_MPS_PIPE_DIRECTORY"; echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 && echo control:answers' >"$T/exec-a" ||
    { cat "$T/exec-a"; fail "ExecSync"; }
grep -qx 'env:/tmp/nvidia-mps' "$T/exec-a" || { cat "$T/exec-a"; fail "exec'd process lacks CUDA_MPS_PIPE_DIRECTORY"; }
grep -qx 'control:answers' "$T/exec-a" || { cat "$T/exec-a"; fail "MPS control did not answer the exec'd process"; }
ok "exec'd process has CUDA_MPS_PIPE_DIRECTORY and reaches the daemon"

echo "== a second mps pod shares the daemon; the daemon follows the pods"
PB=$(run_pod mps-b '{"gpu.share":"mps"}') || fail "RunPodSandbox mps-b"
start_container "$PB" mps-b '{"gpu.share":"mps"}' "$INSIDE_MPS; exec sleep 3600" >/dev/null || fail "container in mps-b"
log_of mps-b "$T/out-b" pipe:
grep -q '^control:answers' "$T/out-b" || { cat "$T/out-b"; fail "MPS control did not answer in mps-b"; }
n=0
for p in $(pgrep -f nvidia-cuda-mps-control || true); do
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | has "^CUDA_MPS_PIPE_DIRECTORY=$STATE/"; then n=$((n + 1)); fi
done
[ "$n" = 1 ] || fail "expected one MPS daemon for two pods, found $n"
ok "two mps pods, one daemon"
released "$CA" && fail "pod mps-a's container is not a client of the GPU before its pod is removed"

echo "== doctor and the package's removal guard ask this containerd (crictl answering through the CRI)"
# A stand-in for crictl: \`info\` and \`pods -o json\` printed as crictl prints them (the Status
# RPC's verbose info map merged into one object; ListPodSandbox as indented camelCase JSON),
# answered by this containerd through the CRI client.
mkdir -p "$T/crictl-bin"
cat >"$T/crictl-bin/crictl" <<EOF2
#!/bin/sh
while [ "\$#" -gt 0 ]; do case "\$1" in --runtime-endpoint) shift; sock=\${1#unix://} ;; info|pods) cmd=\$1 ;; esac; shift; done
exec "$PYTHON" - "\$sock" "\$cmd" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["CRI_GEN"])
sock, cmd = sys.argv[1], sys.argv[2]
import grpc, api_pb2, api_pb2_grpc
from google.protobuf import json_format
rt = api_pb2_grpc.RuntimeServiceStub(grpc.insecure_channel("unix://" + sock))
if cmd == "info":
    r = rt.Status(api_pb2.StatusRequest(verbose=True), timeout=30)
    out = {"status": json.loads(json_format.MessageToJson(r.status))}
    for k, v in r.info.items():
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v  # crictl keeps a value that is not JSON as a string
else:
    out = json.loads(json_format.MessageToJson(rt.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30)))
print(json.dumps(out, indent=2))
PY
EOF2
chmod +x "$T/crictl-bin/crictl"
env PATH="$T/crictl-bin:$PATH" CONTAINERD_ADDRESS="$C/sock" "$GS_HOOK" doctor --json >"$T/doctor.json" 2>/dev/null || true
jq -e '.[] | select(.name == "containerd daemon" and .verdict == "ok" and (.detail | test("containerd has loaded handler \"gpushare\"")))' "$T/doctor.json" >/dev/null ||
    { jq '.[] | select(.name == "containerd daemon")' "$T/doctor.json"; fail "doctor does not see the running containerd's gpushare handler"; }
ok "doctor: $(jq -r '.[] | select(.name == "containerd daemon") | .detail' "$T/doctor.json")"
env PATH="$T/crictl-bin:$PATH" GPUSHARE_CRI_SOCKETS="$C/sock" TMPDIR="$T" sh "$GS_REPO/packaging/deb/maintainer-scripts/prerm" remove >"$T/prerm.out" 2>&1 &&
    fail "the package's removal guard lets it go while CRI pods run on the gpushare handler"
for p in "$PA" "$PB"; do
    grep -q "CRI pod $p ($C/sock) runs on the gpushare handler" "$T/prerm.out" || { cat "$T/prerm.out"; fail "the removal guard does not name pod $p"; }
done
ok "removal refused: $(grep -c 'CRI pod' "$T/prerm.out") pods on the gpushare handler named"
remove_pod "$PA"
wait_until 10 released "$CA" || { "$HOOK" status; fail "pod mps-a's container was not released within 10s of its pod's removal"; }
daemon_running || fail "the daemon stopped while pod mps-b still runs"
ok "daemon kept after the first pod was removed"
remove_pod "$PB"
wait_until 10 daemon_gone || fail "daemon left running after the last mps pod"
ok "daemon gone after the last mps pod"

echo "== a pod annotated gpu.share=limit"
PL=$(run_pod limit '{"gpu.share":"limit","gpu.share.memory":"1Gi","gpu.share.cores":"30"}') || fail "RunPodSandbox limit"
grep -q -e gpushare-hook -e libgpushare_limiter "$(bundle_config "$PL")" && fail "the limit pod's sandbox was given a share"
CL=$(start_container "$PL" limit '{"gpu.share":"limit","gpu.share.memory":"1Gi","gpu.share.cores":"30"}' "$INSIDE_LIMIT; exec sleep 3600") ||
    { tail -20 "$C/log"; fail "container in the limit pod"; }
log_of limit "$T/out-l" shared:
check_limit_output "$T/out-l" yes
cri_exec "$CL" 20 sh -c 'echo "mem:$CUDA_DEVICE_MEMORY_LIMIT_0"; echo "sm:$CUDA_DEVICE_SM_LIMIT"; echo "ld:$LD_PRELOAD"' >"$T/exec-l" || fail "ExecSync in the limit pod"
grep -qx 'mem:1073741824' "$T/exec-l" && grep -qx 'sm:30' "$T/exec-l" && grep -q '^ld:.*/usr/local/gpushare/libgpushare_limiter.so$' "$T/exec-l" ||
    { cat "$T/exec-l"; fail "exec'd process lacks the limit env"; }
ok "exec'd process has the limit env"
remove_pod "$PL"

echo "== gpu.share.group (examples/pod-mps-group.yaml): refused under isolation \"gpu\", served under \"group\""
PG=$(run_pod group-gpu '{"gpu.share":"mps","gpu.share.group":"team-a"}') || fail "RunPodSandbox with a group"
if start_container "$PG" group-gpu '{"gpu.share":"mps","gpu.share.group":"team-a"}' true >/dev/null 2>"$T/err-g"; then
    fail "a group was served under isolation \"gpu\""
fi
grep -q 'needs \[mps\] isolation' "$T/err-g" || { cat "$T/err-g"; fail "the refusal does not name the isolation policy"; }
ok "refused under isolation \"gpu\", naming the policy"
remove_pod "$PG"
write_config '[mps]
isolation = "group"'
mark_shm_when_ready
PG=$(run_pod group-a '{"gpu.share":"mps","gpu.share.group":"team-a"}') || fail "RunPodSandbox group-a"
start_container "$PG" group-a '{"gpu.share":"mps","gpu.share.group":"team-a"}' "$INSIDE_MPS; exec sleep 3600" >/dev/null ||
    { tail -20 "$C/log"; fail "container in group-a"; }
log_of group-a "$T/out-g" pipe:
grep -q '^control:answers' "$T/out-g" && grep -q '^env:/tmp/nvidia-mps' "$T/out-g" || { cat "$T/out-g"; fail "group-a has no MPS share"; }
ok "a team-a pod reaches its domain's daemon"
remove_pod "$PG"
wait_until 10 daemon_gone || fail "the group's daemon left running after its last pod"
ok "the group's daemon gone after its last pod"
write_config

echo "== a refused request: the sandbox starts, the container is refused with our message"
PX=$(run_pod bogus '{"gpu.share":"mps","gpu.share.bogus":"1"}') || fail "RunPodSandbox with an unknown gpu.share key"
if start_container "$PX" bogus '{"gpu.share":"mps","gpu.share.bogus":"1"}' true >/dev/null 2>"$T/err-x"; then
    fail "a container with an unknown gpu.share key was started"
fi
grep -q 'gpu.share.bogus' "$T/err-x" || { cat "$T/err-x"; fail "the CRI error does not name gpu.share.bogus"; }
ok "refused: $(grep -o 'gpushare-runtime:.*' "$T/err-x" | head -1 | cut -c1-160)"
remove_pod "$PX"
cri ListPodSandbox '{}' | jq -e '(.items // []) | length == 0' >/dev/null || fail "pods left behind"
ok "no pods left"
