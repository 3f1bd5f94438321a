#!/usr/bin/env bash
# noexec, nosuid and nodev on every tenant-writable mount inside the container (the MPS pipe
# directory, the domain's /dev/shm, the limiter's shared directory), on every path that gives a
# share: the hook alone (runc with hook entries, as CRI-O's hooks dir adds them), gpushare-runtime
# (runc), podman's OCI hooks dir alone (the hooks.d mechanism CRI-O reads too), podman with the
# precreate hook, and a CDI device (podman, refined by an annotation, with the package's hooks
# installed). Each runs a script from each such mount and must see it refused. (Docker: in
# docker.sh.) An mps share with a memory cap has all three mounts.
source "$(dirname "$0")/lib.sh"
need runc podman jq
engine_version runc runc --version
engine_version podman podman --version
make_rootfs "$T/rootfs"
make_hooks_dirs "$T/hooks"
on_exit "podman_ rm -af -t 0"
args() { jq -cn --arg s "$1" '["sh","-c",$s]'; }
with_hooks() { # bundle: add createRuntime/poststop entries calling the hook
    jq --arg h "$HOOK" --arg c "GPUSHARE_CONFIG=$CONFIG" \
        '.hooks={"createRuntime":[{"path":$h,"args":["gpushare-hook","createRuntime"],"env":[$c]}],"poststop":[{"path":$h,"args":["gpushare-hook","poststop"],"env":[$c]}]}' \
        "$1/config.json" >"$1/c.tmp" && mv "$1/c.tmp" "$1/config.json"
}
bundle() { mkdir -p "$1" && cp -a "$T/rootfs" "$1/rootfs" && make_bundle "$@"; }
GPU='["NVIDIA_VISIBLE_DEVICES=0"]'
CAPPED='{"gpu.share":"mps","gpu.share.memory":"1Gi"}'

echo "== the hook alone (runc, hook entries)"
bundle "$T/b1" "$(args "$INSIDE_NOEXEC")" "$GPU" "$CAPPED"
with_hooks "$T/b1"
(cd "$T/b1" && runc run "${NAME}1" >"$T/out1" 2>"$T/err1") || { cat "$T/err1"; fail "run"; }
check_noexec "$T/out1" "hook alone"

echo "== gpushare-runtime (runc)"
bundle "$T/b2" "$(args "$INSIDE_NOEXEC")" "$GPU" "$CAPPED"
(cd "$T/b2" && "$RUNTIME" run "${NAME}2" >"$T/out2" 2>"$T/err2") || { cat "$T/err2"; fail "run"; }
jq -e --arg s "$STATE/" '[.mounts[] | select(.source | startswith($s)) | select(.destination == "/dev/shm" or .destination == "/tmp/nvidia-mps" or .destination == "/usr/local/gpushare/shared") | select(.options | index("noexec"))] | length == 3' "$T/b2/config.json" >/dev/null ||
    { jq '.mounts' "$T/b2/config.json"; fail "the spec edit's binds lack noexec"; }
check_noexec "$T/out2" "gpushare-runtime"

run_podman() { # out hooks-args... -- podman-run-args...
    local out=$1 hooks=()
    shift
    while [ "$1" != "--" ]; do hooks+=("$1"); shift; done
    shift
    podman_ --runtime runc "${hooks[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 "$@" \
        --rootfs "$T/rootfs" sh -c "$INSIDE_NOEXEC" >"$out" 2>"$out.err" || { cat "$out.err"; fail "podman run ($out)"; }
}

echo "== podman, the OCI hooks dir alone (hooks.d, as CRI-O reads it)"
run_podman "$T/out3" --hooks-dir "$T/hooks/oci" -- --annotation gpu.share=mps --annotation gpu.share.memory=1Gi
check_noexec "$T/out3" "OCI hooks dir"

echo "== podman, hooks dir and precreate"
run_podman "$T/out4" --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --annotation gpu.share=mps --annotation gpu.share.memory=1Gi
check_noexec "$T/out4" "podman precreate"

echo "== a CDI device refined by an annotation (podman, the package's hooks installed)"
cdi_lock
CDI_DIR=/var/run/cdi
SHARE_SPEC=$CDI_DIR/gpushare.io-share.json
[ -e "$SHARE_SPEC" ] && skip "$SHARE_SPEC exists (a real gpushare install on this machine): not overwritten"
mkdir -p "$CDI_DIR"
on_exit "rm -f $SHARE_SPEC"
"$HOOK" cdi generate --output "$CDI_DIR" >"$T/gen" || { cat "$T/gen"; fail "cdi generate"; }
run_podman "$T/out5" --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate" -- --device gpushare.io/share=mps --annotation gpu.share.memory=1Gi
check_noexec "$T/out5" "CDI device with an annotation"
released_all() { [ "$("$HOOK" status --json | jq '[.gpus[].clients[]] | length')" = 0 ]; }
wait_until 10 released_all || fail "a container is still listed after its run"
ok "every container released"
