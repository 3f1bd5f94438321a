#!/bin/bash
# On a real GPU: which part of gpushare's daemon sandbox an MPS server's driver initialisation
# needs. Starts NVIDIA's control daemon under each part alone (no capabilities and NoNewPrivs; a
# read-only root with a private /tmp; a 64 MiB /dev/shm), runs one CUDA client through it, and
# prints whether the server started. Needs root, setpriv and unshare. Not run in CI.
set -u
ctl=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
default_client='python3 -c "import torch; print(torch.ones(4).cuda().sum().item())"'
client=${CLIENT:-$default_client}
# The daemons' directories live on a tmpfs of their own, which a read-only root leaves writable.
base=$(mktemp -d /var/tmp/sp.XXXXXX)
mount -t tmpfs -o size=64m tmpfs "$base" || exit 2
trap 'umount -l "$base"; rmdir "$base"' EXIT
try() {
    name=$1; shift
    [ -n "${ONLY:-}" ] && ! echo "$name" | grep -Eq "$ONLY" && return
    d=$(mktemp -d "$base/t.XXXXXX"); mkdir -p "$d/p" "$d/l"
    "$@" env CUDA_MPS_PIPE_DIRECTORY="$d/p" CUDA_MPS_LOG_DIRECTORY="$d/l" "$ctl" -d
    sleep 0.5
    CUDA_MPS_PIPE_DIRECTORY=$d/p timeout 60 sh -c "$client" >"$d/c" 2>&1
    rc=$?
    if grep -q 'Server has started' "$d/l/server.log" 2>/dev/null; then r=started; else r="did not start: $(grep -h 'failed' "$d/l/control.log" | head -1)"; fi
    echo "$name: client rc $rc, server $r"
    [ "$rc" = 0 ] || tail -2 "$d/c"
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$d/p "$ctl" >/dev/null 2>&1
    sleep 0.5
    rm -rf "$d"
}
try "plain (root, all capabilities)"
try "no capabilities, NoNewPrivs" setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all
try "no capabilities, keeping CAP_SYS_ADMIN" setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all,+sys_admin
try "no NoNewPrivs, no capabilities" setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all
try "read-only root, private /tmp" unshare -m --propagation private sh -c 'mount -o remount,bind,ro / && mount -t tmpfs -o size=64m tmpfs /tmp && exec "$@"' sh
try "64 MiB /dev/shm" unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /dev/shm && exec "$@"' sh
safe=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null)
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PATH=$PATH"
echo "servers: $(which -a nvidia-cuda-mps-server | tr '\n' ' ')"
echo "libcuda in ld.so.cache: $(ldconfig -p | grep -c 'libcuda.so.1')"
try "gpushare's environment (PATH=$safe, CUDA_VISIBLE_DEVICES=uuid, nothing else)" env -i PATH=$safe CUDA_VISIBLE_DEVICES="$uuid"
try "gpushare's environment with the caller's LD_LIBRARY_PATH" env -i PATH=$safe CUDA_VISIBLE_DEVICES="$uuid" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
try "the caller's environment, CUDA_VISIBLE_DEVICES=uuid" env CUDA_VISIBLE_DEVICES="$uuid"
ro_all='for m in $(awk "{print \$5}" /proc/self/mountinfo | sort -u); do mount -o remount,bind,ro "$m" 2>/dev/null; done; mount -o remount,bind,rw "'"$base"'"'
try "every mount read-only (recursive), the daemons' tmpfs writable" unshare -m --propagation private sh -c "$ro_all"' && exec "$@"' sh
try "/dev/shm with nosymfollow" unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64m,nosuid,nodev,nosymfollow tmpfs /dev/shm && exec "$@"' sh
try "new session (setsid)" setsid
try "in the root cgroup" sh -c 'echo $$ > /sys/fs/cgroup/cgroup.procs && exec "$@"' sh
try "all together" unshare -m --propagation private sh -c "$ro_all"' && mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /tmp && mount -t tmpfs -o size=64m,nosuid,nodev,nosymfollow tmpfs /dev/shm && echo $$ > /sys/fs/cgroup/cgroup.procs; exec setsid setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"' sh
# Every mount read-only but the daemons' tmpfs and a writable /dev/shm, then each of /dev, /proc
# and /sys left writable in turn: which one the server's driver initialisation writes to.
ro_but() {
    printf '%s' "$ro_all"' && mount -t tmpfs -o size=64m,nosuid,nodev tmpfs /dev/shm'
    for k in "$@"; do printf ' && mount -o remount,bind,rw %s' "$k"; done
    printf ' && exec "$@"'
}
try "read-only but /dev/shm" unshare -m --propagation private sh -c "$(ro_but)" sh
try "read-only but /dev/shm and /dev" unshare -m --propagation private sh -c "$(ro_but /dev)" sh
try "read-only but /dev/shm and /proc" unshare -m --propagation private sh -c "$(ro_but /proc)" sh
try "read-only but /dev/shm and /sys" unshare -m --propagation private sh -c "$(ro_but /sys)" sh
