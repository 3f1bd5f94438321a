#!/usr/bin/env bash
# Chaining with nvidia-container-runtime in CDI mode, both orders, under podman (runc):
#   A: engine -> gpushare-runtime -> NVIDIA -> runc   ([runtime] next = NVIDIA's)
#   B: engine -> NVIDIA -> gpushare-runtime -> runc   (NVIDIA's runtimes = [gpushare-runtime])
# NVIDIA's runtime is a stand-in ($T/bin/nvidia-runtime) that edits config.json as NVIDIA's CDI
# mode does with the spec `nvidia-ctk cdi generate` writes (tests/fixtures/cdi/nvidia.yaml): the
# devices asked for by the last NVIDIA_VISIBLE_DEVICES (0, a UUID or all; void/none/empty: none)
# or by `cdi.k8s.io/*` annotations become the spec's edits: env appended
# (NVIDIA_VISIBLE_DEVICES=void after the user's value), /dev/nvidia0 and /dev/nvidiactl added to
# linux.devices and the device cgroup, the library mounted, and its own legacy prestart hook
# (nvidia-container-runtime-hook) removed. The legacy hook planted here fails the container if it
# runs, so its removal is checked too.
source "$(dirname "$0")/lib.sh"
need podman runc jq mknod
engine_version podman podman --version
make_rootfs "$T/rootfs"
on_exit "podman_ rm -af -t 0"
nvidia_cdi_spec >"$T/nvidia.yaml"
DRV=$T/driver
cat >"$T/bin/nvidia-runtime" <<EOF2
#!/bin/sh
# Stand-in for nvidia-container-runtime (mode = "cdi"); runs \$NVIDIA_NEXT, else runc.
echo "nvidia: \$*" >>"$T/chain.log"
b=.; prev=; for a in "\$@"; do [ "\$prev" = --bundle ] || [ "\$prev" = -b ] && b=\$a; prev=\$a; done
case " \$* " in *" create "*|*" run "*)
  jq --arg drv "$DRV" '
    ([.process.env[]? | select(startswith("NVIDIA_VISIBLE_DEVICES=")) | ltrimstr("NVIDIA_VISIBLE_DEVICES=")] | last) as \$vis
    | ([(.annotations // {}) | to_entries[] | select(.key | startswith("cdi.k8s.io/")) | .value | split(",")[]]) as \$ann
    | (if (\$ann | length) > 0 then \$ann
       elif \$vis == null or \$vis == "" or \$vis == "void" or \$vis == "none" then []
       else [\$vis | split(",")[] | "nvidia.com/gpu=" + .] end) as \$want
    | if (\$want | length) == 0 then . else
        .process.env += ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu", "NVIDIA_VISIBLE_DEVICES=void"]
        | .linux.devices = ((.linux.devices // []) + [
            {path: "/dev/nvidia0", type: "c", major: 195, minor: 0, fileMode: 438, uid: 0, gid: 0},
            {path: "/dev/nvidiactl", type: "c", major: 195, minor: 255, fileMode: 438, uid: 0, gid: 0}])
        | .linux.resources.devices = ((.linux.resources.devices // []) + [
            {allow: true, type: "c", major: 195, minor: 0, access: "rwm"},
            {allow: true, type: "c", major: 195, minor: 255, access: "rwm"}])
        | .mounts += [{destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", type: "bind",
            source: (\$drv + "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
            options: ["ro", "nosuid", "nodev", "rbind", "rprivate"]}]
      end
    | if .hooks.prestart then .hooks.prestart |= map(select(.path | endswith("nvidia-container-runtime-hook") | not)) else . end
  ' "\$b/config.json" >"\$b/config.json.n" && mv "\$b/config.json.n" "\$b/config.json" || exit 1;;
esac
exec "\${NVIDIA_NEXT:-runc}" "\$@"
EOF2
chmod +x "$T/bin/nvidia-runtime"
# NVIDIA's legacy hook as its package installs it for podman: must never run in CDI mode.
cat >"$DRV/usr/bin/nvidia-container-runtime-hook" <<EOF2
#!/bin/sh
echo "legacy hook ran" >>"$T/legacy.log"
exit 1
EOF2
chmod +x "$DRV/usr/bin/nvidia-container-runtime-hook"
mkdir -p "$T/legacy-hooks"
jq -n --arg p "$DRV/usr/bin/nvidia-container-runtime-hook" \
    '{version: "1.0.0", hook: {path: $p, args: ["nvidia-container-runtime-hook", "prestart"]}, when: {always: true}, stages: ["prestart"]}' \
    >"$T/legacy-hooks/oci-nvidia-hook.json"
# Order B's front: NVIDIA's runtime with gpushare-runtime behind it.
cat >"$T/bin/nvidia-front" <<EOF2
#!/bin/sh
NVIDIA_NEXT="$RUNTIME" exec "$T/bin/nvidia-runtime" "\$@"
EOF2
chmod +x "$T/bin/nvidia-front"

run_chain() { # label front-runtime out-prefix podman-run-args...
    local label=$1 front=$2 o=$3
    shift 3
    : >"$T/chain.log"
    : >"$T/cdi-hook.log"
    podman_ --runtime "$front" --hooks-dir "$T/legacy-hooks" run --rm $PODMAN_ULIMITS "$@" >"$o.out" 2>"$o.err" ||
        { cat "$o.err"; fail "$label: podman run failed"; }
    grep -q '^nvidia: .*create' "$T/chain.log" || { cat "$T/chain.log"; fail "$label: NVIDIA's stand-in was not in the chain"; }
    [ ! -s "$T/legacy.log" ] || fail "$label: NVIDIA's legacy hook ran (it must be removed in CDI mode)"
}
inside_chain() { echo "test -c /dev/nvidia0 && echo cdi:nvidia0; echo \"cdi:visible=\$NVIDIA_VISIBLE_DEVICES\"; $1"; }
check_chain_cdi() { # out
    grep -qx 'cdi:nvidia0' "$1" && grep -qx 'cdi:visible=void' "$1" || { cat "$1"; fail "NVIDIA's CDI edits are missing inside"; }
    ok "NVIDIA's CDI edits inside (/dev/nvidia0, NVIDIA_VISIBLE_DEVICES=void appended), its legacy hook removed"
}

NEXT_RUNTIME=$T/bin/nvidia-runtime write_config
for mode in mps limit; do
    if [ $mode = mps ]; then ask=(--annotation gpu.share=mps); inside=$INSIDE_MPS; else
        ask=(--annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30); inside=$INSIDE_LIMIT; fi
    echo "== A ($mode): gpushare-runtime -> NVIDIA (CDI mode) -> runc, NVIDIA_VISIBLE_DEVICES=0"
    [ $mode = mps ] && mark_shm_when_ready
    run_chain "A $mode" "$RUNTIME" "$T/a-$mode" -e NVIDIA_VISIBLE_DEVICES=0 "${ask[@]}" --rootfs "$T/rootfs" sh -c "$(inside_chain "$inside")"
    check_chain_cdi "$T/a-$mode.out"
    if [ $mode = mps ]; then check_mps_output "$T/a-$mode.out" yes; wait_until 10 daemon_gone || fail "daemon left"; else check_limit_output "$T/a-$mode.out" yes; fi
done
NEXT_RUNTIME=runc write_config
for mode in mps limit; do
    if [ $mode = mps ]; then ask=(--annotation gpu.share=mps); inside=$INSIDE_MPS; else
        ask=(--annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30); inside=$INSIDE_LIMIT; fi
    echo "== B ($mode): NVIDIA (CDI mode) -> gpushare-runtime -> runc, NVIDIA_VISIBLE_DEVICES=0"
    [ $mode = mps ] && mark_shm_when_ready
    run_chain "B $mode" "$T/bin/nvidia-front" "$T/b-$mode" -e NVIDIA_VISIBLE_DEVICES=0 "${ask[@]}" --rootfs "$T/rootfs" sh -c "$(inside_chain "$inside")"
    check_chain_cdi "$T/b-$mode.out"
    if [ $mode = mps ]; then check_mps_output "$T/b-$mode.out" yes; wait_until 10 daemon_gone || fail "daemon left"; else check_limit_output "$T/b-$mode.out" yes; fi
done

echo "== B, GPU asked for by the CDI annotation cdi.k8s.io/gpu=nvidia.com/gpu=0 (no NVIDIA_VISIBLE_DEVICES)"
mark_shm_when_ready
run_chain "B annotation" "$T/bin/nvidia-front" "$T/b-ann" --annotation cdi.k8s.io/gpu=nvidia.com/gpu=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sh -c "$(inside_chain "$INSIDE_MPS")"
check_chain_cdi "$T/b-ann.out"
check_mps_output "$T/b-ann.out" yes
wait_until 10 daemon_gone || fail "daemon left"

echo "== A, GPU asked for by the CDI annotation only: gpushare-runtime plans before NVIDIA adds it"
NEXT_RUNTIME=$T/bin/nvidia-runtime write_config
: >"$T/chain.log"
if podman_ --runtime "$RUNTIME" run --rm $PODMAN_ULIMITS --annotation cdi.k8s.io/gpu=nvidia.com/gpu=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" true >"$T/a-ann.out" 2>"$T/a-ann.err"; then
    fail "A with the CDI annotation only: expected gpushare-runtime to refuse (docs say use order B); update the docs if this now works"
fi
has 'was given no GPU' "$T/a-ann.err" || { cat "$T/a-ann.err"; fail "A with the CDI annotation: not refused for having no GPU"; }
! grep -q '^nvidia: .*create' "$T/chain.log" || fail "A with the CDI annotation: NVIDIA's runtime ran after the refusal"
ok "A with only the CDI annotation: refused at once with 'given no GPU' (documented: use order B, or also set NVIDIA_VISIBLE_DEVICES)"
