#!/usr/bin/env bash
# Hostile images: /tmp/nvidia-mps, /dev/shm, /etc/ld.so.preload, /usr/local/gpushare or a parent
# are symlinks to host paths (absolute, ../../.., loops) or fifos. Through the hook alone and
# through gpushare-runtime, nothing may be written or mounted outside the rootfs: the host marker
# dir must stay exactly as it was. The container either works or is refused with a message.
# Also: the image's env (LD_PRELOAD) never reaches the hook.
source "$(dirname "$0")/lib.sh"
need runc jq gcc
engine_version runc runc --version
make_rootfs "$T/rootfs"
HOSTDIR=$T/host
mkdir -p "$HOSTDIR/sub"
echo marker >"$HOSTDIR/marker"
echo "/host/own.so" >"$HOSTDIR/preload"
snapshot() { (cd "$HOSTDIR" && find . -printf '%p %y %s %m\n' | sort && cat marker preload); }
SNAP=$(snapshot)
host_ok() {
    [ "$SNAP" = "$(snapshot)" ] || { snapshot; fail "$1: the host dir changed"; }
    ! grep -q " $HOSTDIR" /proc/self/mountinfo || fail "$1: something was mounted on the host dir"
}
with_hooks() {
    jq --arg h "$HOOK" --arg c "GPUSHARE_CONFIG=$CONFIG" \
        '.hooks={"createRuntime":[{"path":$h,"args":["gpushare-hook","createRuntime"],"env":[$c]}],"poststop":[{"path":$h,"args":["gpushare-hook","poststop"],"env":[$c]}]}' \
        "$1/config.json" >"$1/c.tmp" && mv "$1/c.tmp" "$1/config.json"
}
REL=$(printf '../%.0s' $(seq 12))${HOSTDIR#/}
# What each case must end in, through the hook alone and through gpushare-runtime:
#   ran              the container ran and the hook acquired its share
#   hook:TEXT        gpushare-hook refused it with its own line, which contains TEXT
#   runtime:TEXT     gpushare-runtime refused it before runc, with its own line containing TEXT
#   runc:TEXT        runc refused the mount gpushare-runtime put in the spec (runc's SecureJoin
#                    stays inside the rootfs); the hook never ran
PIPE_BAD="hook:cannot resolve /tmp/nvidia-mps inside the container's rootfs"
PRELOAD_BAD="hook:cannot resolve /etc/ld.so.preload inside the container's rootfs"
LIMITER_BAD="hook:cannot resolve /usr/local/gpushare/libgpushare_limiter.so inside the container's rootfs"
FIFO="cannot read /etc/ld.so.preload in the image; fix or remove it in the image: not a regular file"
# (runc escapes the quotes in its error line)
PIPE_MOUNT='runc:to rootfs at \"/tmp/nvidia-mps\"'
LIMITER_MOUNT='runc:to rootfs at \"/usr/local/gpushare/libgpushare_limiter.so\"'
# name | mode | through the hook | through gpushare-runtime | shell run inside the rootfs
CASES=(
    "control-mps|mps|ran|ran|true"
    "control-limit|limit|ran|ran|true"
    "mps-pipe-abs|mps|$PIPE_BAD|ran|rm -rf tmp && mkdir tmp && ln -s $HOSTDIR tmp/nvidia-mps"
    "mps-pipe-rel|mps|$PIPE_BAD|ran|rm -rf tmp && mkdir tmp && ln -s $REL tmp/nvidia-mps"
    "mps-tmp-parent|mps|$PIPE_BAD|$PIPE_MOUNT|rm -rf tmp && ln -s $HOSTDIR tmp"
    "mps-tmp-parent-rel|mps|$PIPE_BAD|$PIPE_MOUNT|rm -rf tmp && ln -s $REL tmp"
    "mps-pipe-loop|mps|$PIPE_BAD|$PIPE_MOUNT|rm -rf tmp && mkdir tmp && ln -s /tmp/a tmp/nvidia-mps && ln -s /tmp/b tmp/a && ln -s /tmp/a tmp/b"
    "mps-devshm-abs|mps|ran|ran|mkdir -p dev && ln -s $HOSTDIR dev/shm"
    # Not tested: an image whose /dev itself is a symlink to a host dir. runc 1.1.5 on its own
    # (no gpushare involved) creates its /dev/fd, /dev/ptmx, /dev/std* symlinks through it on the
    # host, so that case would test runc, not gpushare.
    "limit-preload-abs|limit|$PRELOAD_BAD|ran|rm -f etc/ld.so.preload && ln -s $HOSTDIR/preload etc/ld.so.preload"
    "limit-preload-rel|limit|$PRELOAD_BAD|ran|rm -f etc/ld.so.preload && ln -s $REL/preload etc/ld.so.preload"
    "limit-etc-parent|limit|$PRELOAD_BAD|ran|rm -rf etc && ln -s $HOSTDIR etc"
    "limit-preload-fifo|limit|hook:$FIFO|runtime:$FIFO|rm -f etc/ld.so.preload && mkfifo etc/ld.so.preload"
    "limit-gpushare-abs|limit|$LIMITER_BAD|ran|mkdir -p usr/local && ln -s $HOSTDIR usr/local/gpushare"
    "limit-usr-parent|limit|$LIMITER_BAD|ran|rm -rf usr && ln -s $HOSTDIR usr"
    "limit-usr-parent-rel|limit|$LIMITER_BAD|ran|rm -rf usr && ln -s $REL usr"
    "limit-gpushare-loop|limit|$LIMITER_BAD|$LIMITER_MOUNT|mkdir -p usr/local && ln -s /usr/local/gpushare usr/local/gpushare"
)
LOG=$T/gpushare.log
# Prints a file for a failure's context (long lines cut), never failing itself.
show() { cut -c1-400 "$1" >&2 2>/dev/null || true; }
# The hook's log lines about container $1 (its id followed by a space or the end of the line).
hook_lines() { grep -E "container=$1( |$)" "$LOG" 2>/dev/null || true; }
worked=0 refused=0 n=0
for c in "${CASES[@]}"; do
    IFS='|' read -r name mode want_hook want_runtime mutate <<<"$c"
    for how in hook runtime; do
        n=$((n + 1))
        id="${NAME}s$n"
        b=$T/sec-$name-$how
        want=$want_hook
        [ $how = hook ] || want=$want_runtime
        mkdir -p "$b" && cp -a "$T/rootfs" "$b/rootfs"
        (cd "$b/rootfs" && eval "$mutate")
        ann='{"gpu.share":"mps"}'
        [ "$mode" = limit ] && ann='{"gpu.share":"limit","gpu.share.memory":"1Gi"}'
        make_bundle "$b" '["true"]' '["NVIDIA_VISIBLE_DEVICES=0"]' "$ann"
        set +e
        if [ $how = hook ]; then
            with_hooks "$b"
            (cd "$b" && timeout 30 runc run "$id" </dev/null >"$b.out" 2>"$b.err")
        else
            (cd "$b" && timeout 30 "$RUNTIME" run "$id" </dev/null >"$b.out" 2>"$b.err")
        fi
        rc=$?
        set -e
        runc delete -f "$id" >/dev/null 2>&1 || true
        what="$name ($how, $id)"
        [ $rc != 124 ] || fail "$what: hung"
        host_ok "$what"
        logged=$(hook_lines "$id")
        case $want in
        ran)
            [ $rc = 0 ] || { show "$b.err"; fail "$what: expected to run, exit $rc"; }
            # Positive control: the hook ran and gave the container its share.
            has -q acquired <<<"$logged" || { show "$LOG"; fail "$what: ran without the hook acquiring"; }
            worked=$((worked + 1))
            ok "$what: ran with its share, host untouched"
            ;;
        hook:* | runtime:*)
            who=gpushare-${want%%:*} text=${want#*:}
            [ $rc != 0 ] || fail "$what: ran, but $who should have refused it: $text"
            # runc quotes a hook's stderr inside its own error line.
            line=$(grep -o "$who: .*" "$b.err" | head -1 || true)
            [ -n "$line" ] || { show "$b.err"; fail "$what: no refusal line of $who (exit $rc)"; }
            has -qF "$text" <<<"$line" || fail "$what: $who refused for another reason: $line (expected: $text)"
            if [ $who = gpushare-hook ]; then
                has -q refused <<<"$logged" || { show "$LOG"; fail "$what: the hook logged no refusal"; }
            fi
            refused=$((refused + 1))
            ok "$what: refused by $who, host untouched: ${line:0:160}"
            ;;
        runc:*)
            text=${want#runc:}
            [ $rc != 0 ] || fail "$what: ran, but runc should have refused it: $text"
            has -qF "$text" <"$b.err" || { show "$b.err"; fail "$what: runc failed for another reason (expected: $text)"; }
            ! grep -q "gpushare-\(hook\|runtime\): " "$b.err" || { show "$b.err"; fail "$what: gpushare refused, runc was expected to"; }
            [ -z "$logged" ] || fail "$what: the hook ran after runc's refusal: $logged"
            refused=$((refused + 1))
            ok "$what: refused by runc's SecureJoin, host untouched"
            ;;
        *) fail "bad expectation $want" ;;
        esac
    done
done
wait_until 10 daemon_gone || fail "daemon left running"
[ -z "$(ls -A "$STATE/containers" 2>/dev/null)" ] || { ls "$STATE/containers"; fail "per-container files left after refusals"; }
ok "$n hostile cases: $worked ran safely, $refused refused as expected; host marker dir unchanged; no leftovers"

echo "== the image's env never reaches the hook (no LD_PRELOAD leak)"
cat >"$T/evil.c" <<EOF2
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void leak(void) {
    int fd = open("$T/leaked", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "x", 1); close(fd); }
}
EOF2
gcc -shared -fPIC -o "$T/evil.so" "$T/evil.c"
LD_PRELOAD=$T/evil.so /bin/true
[ -e "$T/leaked" ] || fail "positive control: the preload marker library does not work"
rm -f "$T/leaked"
for how in hook runtime; do
    b=$T/leak-$how
    mkdir -p "$b" && cp -a "$T/rootfs" "$b/rootfs"
    make_bundle "$b" '["true"]' "[\"NVIDIA_VISIBLE_DEVICES=0\",\"LD_PRELOAD=$T/evil.so\",\"GPUSHARE_CONFIG=/nonexistent\"]" '{"gpu.share":"limit"}'
    echo "$T/evil.so" >"$b/rootfs/etc/ld.so.preload"
    if [ $how = hook ]; then
        with_hooks "$b"
        (cd "$b" && runc run "${NAME}e$how" </dev/null >"$b.out" 2>"$b.err") || { show "$b.err"; fail "leak ($how) run"; }
    else
        (cd "$b" && "$RUNTIME" run "${NAME}e$how" </dev/null >"$b.out" 2>"$b.err") || { show "$b.err"; fail "leak ($how) run"; }
    fi
    [ ! -e "$T/leaked" ] || fail "the container's LD_PRELOAD was loaded by a host-side process ($how)"
    ok "container LD_PRELOAD/ld.so.preload/GPUSHARE_CONFIG did not reach the hook ($how)"
done
