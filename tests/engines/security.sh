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
# name | mode | shell run inside the rootfs to make it hostile
CASES=(
    "mps-pipe-abs|mps|rm -rf tmp && mkdir tmp && ln -s $HOSTDIR tmp/nvidia-mps"
    "mps-pipe-rel|mps|rm -rf tmp && mkdir tmp && ln -s $REL tmp/nvidia-mps"
    "mps-tmp-parent|mps|rm -rf tmp && ln -s $HOSTDIR tmp"
    "mps-tmp-parent-rel|mps|rm -rf tmp && ln -s $REL tmp"
    "mps-pipe-loop|mps|rm -rf tmp && mkdir tmp && ln -s /tmp/a tmp/nvidia-mps && ln -s /tmp/b tmp/a && ln -s /tmp/a tmp/b"
    "mps-devshm-abs|mps|mkdir -p dev && ln -s $HOSTDIR dev/shm"
    # Not tested: an image whose /dev itself is a symlink to a host dir. runc 1.1.5 on its own
    # (no gpushare involved) creates its /dev/fd, /dev/ptmx, /dev/std* symlinks through it on the
    # host, so that case would test runc, not gpushare.
    "limit-preload-abs|limit|rm -f etc/ld.so.preload && ln -s $HOSTDIR/preload etc/ld.so.preload"
    "limit-preload-rel|limit|rm -f etc/ld.so.preload && ln -s $REL/preload etc/ld.so.preload"
    "limit-etc-parent|limit|rm -rf etc && ln -s $HOSTDIR etc"
    "limit-preload-fifo|limit|rm -f etc/ld.so.preload && mkfifo etc/ld.so.preload"
    "limit-gpushare-abs|limit|mkdir -p usr/local && ln -s $HOSTDIR usr/local/gpushare"
    "limit-usr-parent|limit|rm -rf usr && ln -s $HOSTDIR usr"
    "limit-usr-parent-rel|limit|rm -rf usr && ln -s $REL usr"
    "limit-gpushare-loop|limit|mkdir -p usr/local && ln -s /usr/local/gpushare usr/local/gpushare"
)
worked=0 refused=0 n=0
for c in "${CASES[@]}"; do
    IFS='|' read -r name mode mutate <<<"$c"
    for how in hook runtime; do
        n=$((n + 1))
        b=$T/sec-$name-$how
        mkdir -p "$b" && cp -a "$T/rootfs" "$b/rootfs"
        (cd "$b/rootfs" && eval "$mutate")
        ann='{"gpu.share":"mps"}'
        [ "$mode" = limit ] && ann='{"gpu.share":"limit","gpu.share.memory":"1Gi"}'
        make_bundle "$b" '["true"]' '["NVIDIA_VISIBLE_DEVICES=0"]' "$ann"
        set +e
        if [ $how = hook ]; then
            with_hooks "$b"
            (cd "$b" && timeout 30 runc run "${NAME}s$n" </dev/null >"$b.out" 2>"$b.err")
        else
            (cd "$b" && timeout 30 "$RUNTIME" run "${NAME}s$n" </dev/null >"$b.out" 2>"$b.err")
        fi
        rc=$?
        set -e
        runc delete -f "${NAME}s$n" >/dev/null 2>&1 || true
        [ $rc != 124 ] || fail "$name ($how): hung"
        host_ok "$name ($how)"
        if [ $rc = 0 ]; then
            worked=$((worked + 1))
            ok "$name ($how): ran, host untouched"
        else
            msg=$(grep -o 'gpushare-\(hook\|runtime\): .*' "$b.err" | head -1 || true)
            [ -n "$msg" ] || msg=$(tail -1 "$b.err" | cut -c1-200)
            [ -n "$msg" ] || fail "$name ($how): refused without a message"
            refused=$((refused + 1))
            ok "$name ($how): refused, host untouched: ${msg:0:200}"
        fi
    done
done
wait_until 10 daemon_gone || fail "daemon left running"
[ -z "$(ls -A "$STATE/containers" 2>/dev/null)" ] || { ls "$STATE/containers"; fail "per-container files left after refusals"; }
ok "$n hostile cases: $worked ran safely, $refused refused; host marker dir unchanged; no leftovers"

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
        (cd "$b" && runc run "${NAME}e$how" </dev/null >"$b.out" 2>"$b.err") || { cat "$b.err"; fail "leak ($how) run"; }
    else
        (cd "$b" && "$RUNTIME" run "${NAME}e$how" </dev/null >"$b.out" 2>"$b.err") || { cat "$b.err"; fail "leak ($how) run"; }
    fi
    [ ! -e "$T/leaked" ] || fail "the container's LD_PRELOAD was loaded by a host-side process ($how)"
    ok "container LD_PRELOAD/ld.so.preload/GPUSHARE_CONFIG did not reach the hook ($how)"
done
