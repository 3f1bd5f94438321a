#!/usr/bin/env bash
# `gpushare-hook configure containerd` on the config files users have (tests/fixtures/containerd:
# Debian 12's and 13's stock files, kubeadm's SystemdCgroup file, containerd 2's version 3, an
# empty file, no file), each then loaded by a REAL containerd of one version with a private root,
# state and socket: `ctr plugins ls` must show the CRI plugin ok, the running containerd must have
# the gpushare handler (asked of its CRI Status, not read from the file) with the default
# runtime's options, and a pod on the handler must get its MPS share (the CRI harness).
#
#   CRI_CONTAINERD=system   containerd of this machine (Debian 12: 1.6)
#   CRI_CONTAINERD=trixie   containerd 1.7 unpacked from Debian 13 (scripts/fetch-engines.sh)
#   CRI_CONTAINERD=sid      containerd 2.x unpacked from Debian unstable
#
# Only the test's own paths are added to the configured file before containerd reads it: root,
# state, the sockets, the sandbox image (built here) and restrict_oom_score_adj (this machine may
# not lower oom_score_adj). Nothing about runtimes is touched.
source "$(dirname "$0")/lib.sh"
need runc jq gzip sha256sum python3
FIX=$GS_REPO/tests/fixtures/containerd
need_containerd system "system trixie sid"
case ${CRI_CONTAINERD:-system} in
system) CASES="debian12-stock.toml kubeadm-systemd-cgroup.toml empty missing" ;;
trixie) CASES="debian13-stock.toml kubeadm-systemd-cgroup.toml empty" ;;
sid) CASES="containerd2-v3.toml debian13-stock.toml missing" ;;
esac
cri_client
VERSION3=no
[ "${CRI_CONTAINERD:-system}" = sid ] && VERSION3=yes

mkdir -p "$T/pause/bin"
cp /bin/busybox "$T/pause/bin/" && ln -s busybox "$T/pause/bin/sleep"
make_oci_tar "$T/pause" "$T/pause.tar" '["/bin/sleep","2147483647"]'
make_rootfs "$T/rootfs"
make_oci_tar "$T/rootfs" "$T/image.tar"
CGROUP_PARENT=/gpushare-cfg-$$
on_exit "rmdir /sys/fs/cgroup/*$CGROUP_PARENT /sys/fs/cgroup$CGROUP_PARENT"

# The configured file plus this test's private paths (see the header), as containerd reads it.
private_config() { # configured-file out-file dir
    python3 - "$1" "$2" "$3" <<'PY'
import re, sys, tomllib
src, out, c = sys.argv[1:]
text = open(src).read()
doc = tomllib.loads(text)
v3 = doc.get("version") == 3
cri = "plugins.'io.containerd.cri.v1.runtime'" if v3 else 'plugins."io.containerd.grpc.v1.cri"'
head = re.compile(r"^\s*\[\s*" + re.escape(cri).replace("'", "['\"]") + r"\s*\]\s*$", re.M)
keys = "restrict_oom_score_adj = true\n"
if not v3:
    text = re.sub(r"^\s*sandbox_image\s*=.*$", "", text, flags=re.M)
    keys += 'sandbox_image = "gpushare.test/pause:1"\n'
m = head.search(text)
if m:
    text = text[: m.end()] + "\n" + keys + text[m.end():]
else:
    text += f"\n[{cri}]\n{keys}"
if v3:
    text += "\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\nsandbox = 'gpushare.test/pause:1'\n"
text = f'root = "{c}/root"\nstate = "{c}/state"\n' + text
text += f'\n[grpc]\naddress = "{c}/sock"\n[ttrpc]\naddress = "{c}/sock.ttrpc"\n'
tomllib.loads(text)
open(out, "w").write(text)
PY
}

CPID=
stop_containerd() {
    [ -n "$CPID" ] || return 0
    remove_all_pods
    kill "$CPID" 2>/dev/null
    wait "$CPID" 2>/dev/null
    CPID=
}
on_exit stop_containerd
cri() { "$PYTHON" "$GS_REPO/tests/cri/cri.py" call "$C/sock" "$@"; }
remove_all_pods() {
    local p
    for p in $(cri ListPodSandbox '{}' 2>/dev/null | jq -r '.items[]?.id'); do
        cri StopPodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
        cri RemovePodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
    done
}
ctr_() { env PATH="$CTD_PATH" ctr --address "$C/sock" -n k8s.io "$@"; }
pod_config() { # name annotations-json
    jq -cn --arg n "$1" --argjson a "$2" --arg logs "$C/logs/$1" --arg cg "$CGROUP_PARENT" '{
        metadata: {name: $n, uid: ("uid-" + $n), namespace: "gpushare-test", attempt: 0},
        log_directory: $logs, annotations: $a,
        linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: "NODE"}}}}'
}

n=0
for case in $CASES; do
    n=$((n + 1))
    C=$T/c$n
    mkdir -p "$C/logs"
    F=$C/config.toml
    args=()
    case $case in
    empty) : >"$F" ;;
    missing) [ "$VERSION3" = yes ] && args=(--containerd-version 3) ;;
    *) cp "$FIX/$case" "$F" ;;
    esac
    echo "== $case: configure containerd, then containerd $(env PATH="$CTD_PATH" containerd --version | awk '{print $3}') on the result"
    "$GS_HOOK" configure containerd --config "$CONFIG" "${args[@]}" --path "$F" >"$C/configure.out" 2>&1 ||
        { cat "$C/configure.out"; fail "$case: configure containerd failed"; }
    grep -Eq "^ *BinaryName = \"($RUNTIME|${CONFIG%/*}/gpushare-runtime-config)\"" "$F" || { cat "$F"; fail "$case: the handler does not name $RUNTIME"; }
    private_config "$F" "$C/run.toml" "$C" || fail "$case: cannot add the test's paths to the configured file"
    env PATH="$CTD_PATH" containerd --config "$C/run.toml" >"$C/log" 2>&1 &
    CPID=$!
    wait_until 30 ctr_ version >/dev/null 2>&1 || { tail -30 "$C/log"; fail "$case: containerd did not come up (log above)"; }
    ctr_ plugins ls >"$C/plugins"
    if ! grep -Eq '^io\.containerd\.grpc\.v1 +cri +[^ ]+ +ok *$' "$C/plugins"; then
        grep -E 'cri' "$C/plugins"
        grep -iE 'level=(error|fatal|warning)' "$C/log" | cut -c1-400 | tail -5
        cat "$F"
        fail "$case: containerd did not load its CRI plugin on the configured file"
    fi
    ok "$case: ctr plugins ls shows cri ok"
    cri Status '{"verbose":true}' | jq -r '.info.config' >"$C/cri-config.json" || fail "$case: CRI Status"
    handler=$(jq -c '[.. | objects | select(has("gpushare")) | .gpushare][0]' "$C/cri-config.json")
    [ "$handler" != null ] || { jq . "$C/cri-config.json" | head -80; fail "$case: the running containerd has no gpushare handler"; }
    echo "$handler" | jq -e --arg r "$RUNTIME" --arg l "${CONFIG%/*}/gpushare-runtime-config" \
        '(.options.BinaryName == $r or .options.BinaryName == $l) and (.runtimeType // .runtime_type) == "io.containerd.runc.v2"' >/dev/null ||
        { echo "$handler"; fail "$case: the running handler is not the runc shim with gpushare-runtime"; }
    ok "$case: the running containerd has the gpushare handler (CRI Status)"
    if [ "$case" = kubeadm-systemd-cgroup.toml ]; then
        echo "$handler" | jq -e '.options.SystemdCgroup == true' >/dev/null || { echo "$handler"; fail "$case: the handler lost SystemdCgroup = true"; }
        ok "$case: the running handler has the default runtime's SystemdCgroup = true"
        if [ ! -d /run/systemd/system ]; then
            echo "note: $case: no pod run (SystemdCgroup needs systemd as init, which this machine lacks)"
            stop_containerd
            continue
        fi
    fi
    ctr_ images import --index-name gpushare.test/pause:1 "$T/pause.tar" >/dev/null || fail "$case: pause image import"
    ctr_ images import --index-name gpushare.test/busybox:1 "$T/image.tar" >/dev/null || fail "$case: image import"
    mkdir -p "$C/logs/mps"
    mark_shm_when_ready
    P=$(cri RunPodSandbox "{\"config\":$(pod_config mps '{"gpu.share":"mps"}'),\"runtime_handler\":\"gpushare\"}" | jq -r .pod_sandbox_id) ||
        { tail -20 "$C/log"; fail "$case: RunPodSandbox on the gpushare handler"; }
    req=$(jq -cn --arg p "$P" --argjson pc "$(pod_config mps '{"gpu.share":"mps"}')" --arg cmd "$INSIDE_MPS; exec sleep 3600" '{
        pod_sandbox_id: $p, sandbox_config: $pc,
        config: {metadata: {name: "work"}, image: {image: "gpushare.test/busybox:1"},
                 command: ["sh", "-c", $cmd], envs: [{key: "NVIDIA_VISIBLE_DEVICES", value: "0"}],
                 log_path: "work.log", linux: {}}}')
    CID=$(cri CreateContainer "$req" | jq -r .container_id) || { tail -20 "$C/log"; fail "$case: CreateContainer"; }
    cri StartContainer "{\"container_id\":\"$CID\"}" >/dev/null || { tail -20 "$C/log"; fail "$case: StartContainer"; }
    wait_until 20 grep -q ' pipe:' "$C/logs/mps/work.log" || { cat "$C/logs/mps/work.log" 2>/dev/null; fail "$case: no output from the container"; }
    cut -d' ' -f4- "$C/logs/mps/work.log" >"$C/out"
    check_mps_output "$C/out" yes
    ok "$case: a pod on the gpushare handler got its MPS share"
    stop_containerd
    wait_until 10 daemon_gone || fail "$case: MPS daemon left running after the pod"
done
