#!/usr/bin/env bash
# runc directly: gpushare-runtime (spec edit) and the hook alone (hook entries as CRI-O's hooks.d
# would add them), MPS and limit mode; a no-share container's config.json stays byte-for-byte.
source "$(dirname "$0")/lib.sh"
need runc jq
engine_version runc runc --version
make_rootfs "$T/rootfs"
args() { jq -cn --arg s "$1" '["sh","-c",$s]'; }
with_hooks() { # bundle: add createRuntime/poststop entries calling the hook
    jq --arg h "$HOOK" --arg c "GPUSHARE_CONFIG=$CONFIG" \
        '.hooks={"createRuntime":[{"path":$h,"args":["gpushare-hook","createRuntime"],"env":[$c]}],"poststop":[{"path":$h,"args":["gpushare-hook","poststop"],"env":[$c]}]}' \
        "$1/config.json" >"$1/c.tmp" && mv "$1/c.tmp" "$1/config.json"
}
LIMIT='{"gpu.share":"limit","gpu.share.memory":"1Gi","gpu.share.cores":"30"}'
GPU='["NVIDIA_VISIBLE_DEVICES=0"]'
bundle() { mkdir -p "$1" && cp -a "$T/rootfs" "$1/rootfs" && make_bundle "$@"; }

echo "== gpushare-runtime run, mps"
bundle "$T/b1" "$(args "$INSIDE_MPS")" "$GPU" '{"gpu.share":"mps"}'
mark_shm_when_ready
(cd "$T/b1" && "$GS_RUNTIME" run "${NAME}1" >"$T/out1" 2>"$T/err1") || { cat "$T/err1"; fail "run"; }
check_mps_output "$T/out1" yes
wait_until 10 daemon_gone || fail "daemon left running"
ok "daemon gone after the container"

echo "== hook alone, mps"
bundle "$T/b2" "$(args "$INSIDE_MPS")" "$GPU" '{"gpu.share":"mps"}'
with_hooks "$T/b2"
mark_shm_when_ready
(cd "$T/b2" && runc run "${NAME}2" >"$T/out2" 2>"$T/err2") || { cat "$T/err2"; fail "run"; }
check_mps_output "$T/out2" no

echo "== gpushare-runtime create/start/delete, limit"
bundle "$T/b3" "$(args "$INSIDE_LIMIT")" "$GPU" "$LIMIT"
"$GS_RUNTIME" create --bundle "$T/b3" "${NAME}3" </dev/null >"$T/out3" 2>"$T/err3" || { cat "$T/err3"; fail "create"; }
[ -d "$STATE/containers/${NAME}3/shared" ] || fail "per-container dir not made before create"
runc start "${NAME}3"
wait_until 10 sh -c "runc state ${NAME}3 | grep -q stopped" || fail "container did not stop"
"$GS_RUNTIME" delete "${NAME}3"
check_limit_output "$T/out3" yes
[ ! -e "$STATE/containers/${NAME}3" ] || fail "poststop left $STATE/containers/${NAME}3"
ok "poststop removed the per-container files"
jq -e '.hooks.createRuntime | length == 1' "$T/b3/config.json" >/dev/null || fail "hook entry added more than once"
cp "$T/b3/config.json" "$T/b3.once"
"$GS_RUNTIME" create --bundle "$T/b3" "${NAME}3" </dev/null >/dev/null 2>"$T/err3b" || { cat "$T/err3b"; fail "second create"; }
"$GS_RUNTIME" delete -f "${NAME}3"
cmp -s "$T/b3.once" "$T/b3/config.json" || fail "editing twice changed config.json"
ok "editing an edited config.json changes nothing (idempotent)"
[ ! -e "$STATE/containers/${NAME}3" ] || fail "left files after the second delete"

echo "== hook alone, limit"
bundle "$T/b4" "$(args "$INSIDE_LIMIT")" "$GPU" "$LIMIT"
with_hooks "$T/b4"
(cd "$T/b4" && runc run "${NAME}4" >"$T/out4" 2>"$T/err4") || { cat "$T/err4"; fail "run"; }
check_limit_output "$T/out4" no
[ "$(cat "$T/b4/rootfs/etc/ld.so.preload")" = /usr/lib/image-own.so ] || fail "the image's own ld.so.preload was changed"
ok "the image's /etc/ld.so.preload file itself is untouched (ours is a bind mount)"

echo "== no share: config.json byte-for-byte untouched"
bundle "$T/b5" '["true"]' '[]' '{}'
printf '\n' >>"$T/b5/config.json"
sha=$(sha256sum "$T/b5/config.json")
ino=$(stat -c %i "$T/b5/config.json")
before=$(find "$STATE" -printf '%p %T@ %s\n' 2>/dev/null | sort)
(cd "$T/b5" && "$GS_RUNTIME" run "${NAME}5" >/dev/null 2>&1) || fail "run without share"
[ "$sha" = "$(sha256sum "$T/b5/config.json")" ] && [ "$ino" = "$(stat -c %i "$T/b5/config.json")" ] ||
    fail "config.json of a no-share container was rewritten"
[ "$before" = "$(find "$STATE" -printf '%p %T@ %s\n' 2>/dev/null | sort)" ] || fail "state written for a no-share container"
ok "no-share container: config.json untouched (same bytes, same inode), no state"

echo "== bad request: one line, exit 1, config.json unchanged, --log gets a JSON error line"
bundle "$T/b6" '["true"]' "$GPU" '{"gpu.share":"bogus"}'
sha=$(sha256sum "$T/b6/config.json")
set +e
"$GS_RUNTIME" --log "$T/b6/log.json" --log-format json create --bundle "$T/b6" "${NAME}6" </dev/null >/dev/null 2>"$T/err6"
rc=$?
set -e
[ $rc = 1 ] || fail "exit $rc, wanted 1"
[ "$(wc -l <"$T/err6")" = 1 ] || { cat "$T/err6"; fail "not one line on stderr"; }
[ "$sha" = "$(sha256sum "$T/b6/config.json")" ] || fail "config.json changed on a refused request"
jq -s -e 'any(.[]; .level=="error" and (.msg | contains("gpu.share")))' "$T/b6/log.json" >/dev/null || { cat "$T/b6/log.json"; fail "no JSON error line in --log"; }
runc state "${NAME}6" >/dev/null 2>&1 && fail "container created despite the refusal"
ok "refused: $(cat "$T/err6")"
set +e
"$GS_RUNTIME" --log "$T/b6/log.txt" create --bundle "$T/b6" "${NAME}6" </dev/null >/dev/null 2>/dev/null
set -e
grep -q '^time="[0-9T:Z-]*" level=error msg="gpushare-runtime: .*gpu.share' "$T/b6/log.txt" || { cat "$T/b6/log.txt"; fail "no text error line in --log (runc's default format)"; }
ok "--log gets runc's text format unless --log-format json"

echo "== race: the last other client leaves between the spec edit and the acquire"
# Holder X keeps the daemon up while B's spec is edited and mounted; a createRuntime hook placed
# before gpushare's then deletes X (last client: the daemon stops). B's spec edit reserved the
# daemon's directories, so they stay where B has them mounted, and gpushare's hook starts a new
# daemon in them: B reaches it.
bundle "$T/bx" '["sleep","100"]' "$GPU" '{"gpu.share":"mps"}'
"$RUNTIME" create --bundle "$T/bx" "${NAME}x" </dev/null >/dev/null 2>"$T/errx" || { cat "$T/errx"; fail "holder create"; }
runc start "${NAME}x"
on_exit "runc delete -f ${NAME}x"
bundle "$T/b7" "$(args "$INSIDE_MPS")" "$GPU" '{"gpu.share":"mps"}'
old=$(stat -c %i "$(pipe_dir)")
cat >"$T/bin/kill-holder" <<EOF2
#!/bin/sh
cat >/dev/null
env GPUSHARE_CONFIG=$CONFIG "$RUNTIME" delete -f ${NAME}x
stat -c %i "$(pipe_dir)" >"$T/inode-after-release"
EOF2
chmod +x "$T/bin/kill-holder"
jq --arg k "$T/bin/kill-holder" '.hooks={"createRuntime":[{"path":$k}]}' "$T/b7/config.json" >"$T/b7/c" && mv "$T/b7/c" "$T/b7/config.json"
mark_shm_when_ready
(cd "$T/b7" && "$RUNTIME" run "${NAME}7" >"$T/out7" 2>"$T/err7") || { cat "$T/err7"; fail "run"; }
[ "$(cat "$T/inode-after-release")" = "$old" ] || fail "the reserved directories were removed by the release"
ok "the release of the last other client kept the directories B had reserved"
check_mps_output "$T/out7" yes
ok "B reaches the daemon restarted in the same directories"

echo "== timeslice with a memory cap for the whole container (gpushare-runtime, real runc cgroups)"
# runc gives the container a cgroup of its own in the unified hierarchy (here /sys/fs/cgroup/unified
# on a hybrid node), so the (simulated) driver's r615 limits enforce the cap; the limiter is
# preloaded with the cap alone (no SM limit: timeslice takes none).
INSIDE_CAP='cat /proc/self/cgroup | sed -n "s/^0::/cg:/p"; sed "s/^/limits:/" /usr/local/gpushare/limits; echo "ld:$LD_PRELOAD"; echo "mem:$CUDA_DEVICE_MEMORY_LIMIT_0"; echo'
bundle "$T/b8" "$(args "$INSIDE_CAP")" "$GPU" '{"gpu.share":"timeslice","gpu.share.memory":"1Gi"}'
(cd "$T/b8" && "$RUNTIME" run "${NAME}8" >"$T/out8" 2>"$T/err8") || { cat "$T/err8"; fail "run"; }
grep -qx 'limits:CUDA_DEVICE_MEMORY_LIMIT_0=1073741824' "$T/out8" && ! grep -q 'limits:CUDA_DEVICE_SM_LIMIT' "$T/out8" || { cat "$T/out8"; fail "limits file of a capped timeslice container"; }
grep -qx 'mem:1073741824' "$T/out8" && has '^ld:.*libgpushare_limiter.so$' "$T/out8" || { cat "$T/out8"; fail "limiter env not set"; }
ok "the limiter is preloaded in timeslice mode with the container's cap and no SM limit"
cg=$(sed -n 's/^cg://p' "$T/out8")
[ -n "$cg" ] && [ "$cg" != / ] || { cat "$T/out8"; fail "runc gave the container no unified cgroup of its own"; }
log=$SIM/nvml-memory-limits.log
# Any line of the log (jq 1.6's -e judges only the last input of a stream, and the release's own
# line may already follow).
jq -s -e --arg cg "$cg" 'any(.[]; .call=="set" and (.namespace|endswith($cg)) and .soft==0 and .hard==1073741824 and .result==0)' "$log" >/dev/null ||
    { cat "$log"; fail "no driver limit set on the container's cgroup $cg"; }
ok "the driver's memory limit (hard 1 GiB, soft 0) was set on the container's own cgroup ($cg)"
released "${NAME}8" || fail "the capped container is still listed after its delete"
ok "released after the run"
