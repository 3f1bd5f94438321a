#!/bin/sh
# GPU validation of the driver backend of memory caps (NVIDIA r615 / CUDA 13.4 cgroup memory
# limits, nvmlDeviceSetMemoryLimits_v1) on a machine with a real NVIDIA GPU, a driver that has
# them and cgroup v2 at /sys/fs/cgroup. NOT run in CI (no GPU there); run by hand:
#   tests/gpu/validate-memory-limits.sh
# Needs: root, nvcc, nvidia-smi with `memory-limits`, cargo unless GPUSHARE_BIN names a folder
# with a built gpushare-hook and libgpushare_limiter.so (tests/gpu/prepare.sh) (the hook is driven with a
# stand-in container process in a cgroup of its own, as the tests do; no engine).
# Checks, on GPU 0:
#   1. createRuntime of a `timeslice` container with gpu.share.memory=1Gi chooses the driver
#      backend (--dry-run) on the container's own cgroup
#   2. after createRuntime, `nvidia-smi memory-limits --get` shows hard 1024 MiB, soft 0 on it
#   3. a CUDA program in that cgroup WITHOUT the limiter preloaded stops at the cap, and
#      cudaMemGetInfo reports it (the driver enforces, not the preload)
#   4. poststop clears the limit (hard back to max)
#   5. a second container asking for more than the GPU has left is refused (admission)
# Prints PASS/FAIL per check; exits 1 if any check fails, 2 when it cannot run here.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
cg=/sys/fs/cgroup/gpushare-validate-$$
sleeper=
cleanup() {
    [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
    [ -d "$cg" ] && { cat "$cg/cgroup.procs" 2>/dev/null | while read -r p; do echo "$p" >/sys/fs/cgroup/cgroup.procs; done; rmdir "$cg"; }
    rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "SKIPPED: needs root (setting driver limits is privileged)"; exit 2; }
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { echo "SKIPPED: /sys/fs/cgroup is not cgroup v2"; exit 2; }
command -v nvcc >/dev/null || { echo "SKIPPED: nvcc not found"; exit 2; }
nvidia-smi memory-limits -h >/dev/null 2>&1 || { echo "SKIPPED: nvidia-smi has no memory-limits (driver before r615)"; exit 2; }
if [ -n "${GPUSHARE_BIN:-}" ]; then
    rel=$(cd "$GPUSHARE_BIN" && pwd)
else
    cargo build --release --quiet --workspace --manifest-path "$root/Cargo.toml" --target-dir "$root/target/gpu" || exit 1
    rel=$root/target/gpu/release
fi
nvcc -O2 -o "$work/check" "$root/tests/gpu/limiter_check.cu" || { echo "FAIL: nvcc"; exit 1; }
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
val() { sed -n "s/^$1=//p"; }
GIB=1073741824
cat >"$work/config.toml" <<EOC
state_dir = "$work/state"
log_file = "$work/log"
[limit]
library = "$rel/libgpushare_limiter.so"
EOC
export GPUSHARE_CONFIG=$work/config.toml
id=validate-$$
mkdir -p "$work/b/rootfs/lib64" "$work/b/rootfs/lib/x86_64-linux-gnu"
cp /lib64/ld-linux-x86-64.so.2 "$work/b/rootfs/lib64/"
cp /lib/x86_64-linux-gnu/libc.so.6 "$work/b/rootfs/lib/x86_64-linux-gnu/"
printf '{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["NVIDIA_VISIBLE_DEVICES=0"],"cwd":"/"},"root":{"path":"rootfs"},"linux":{"cgroupsPath":"/gpushare-validate-%s"},"annotations":{"gpu.share":"timeslice","gpu.share.memory":"1Gi"}}' $$ >"$work/b/config.json"
mkdir "$cg"
unshare -m --propagation private sleep 600 &
sleeper=$!
sleep 0.2
echo "$sleeper" >"$cg/cgroup.procs"
state=$(printf '{"ociVersion":"1.0.2","id":"%s","status":"creating","pid":%s,"bundle":"%s"}' "$id" "$sleeper" "$work/b")

plan=$(echo "$state" | "$rel/gpushare-hook" createRuntime --dry-run)
echo "$plan" | grep -q '"backend":"driver"' && pass "the plan chooses the driver backend: $plan" || fail "plan: $plan"
echo "$state" | "$rel/gpushare-hook" createRuntime || fail "createRuntime"
got=$(nvidia-smi memory-limits --get -n "$cg" -i 0)
echo "$got"
echo "$got" | grep -q 'hard limit: 1024 MiB' && echo "$got" | grep -q 'soft limit: 0 MiB' &&
    pass "the driver holds hard 1024 MiB, soft 0 on $cg" || fail "nvidia-smi memory-limits: $got"
"$rel/gpushare-hook" status

out=$(sh -c "echo \$\$ >$cg/cgroup.procs; exec $work/check fill 64")
tot=$(echo "$out" | val ALLOC_TOTAL)
[ -n "$tot" ] && [ "$tot" -le "$GIB" ] && pass "a process without the preload stops at the cap ($tot bytes)" || fail "allocated $tot bytes in a 1 GiB cgroup: $out"
mi=$(sh -c "echo \$\$ >$cg/cgroup.procs; exec $work/check meminfo" | val MEMINFO_TOTAL)
[ "$mi" -le "$GIB" ] 2>/dev/null && pass "cudaMemGetInfo in the cgroup reports $mi" || fail "cudaMemGetInfo total $mi"

phys=$("$work/check" meminfo | val MEMINFO_TOTAL)
printf '{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["NVIDIA_VISIBLE_DEVICES=0"],"cwd":"/"},"root":{"path":"rootfs"},"annotations":{"gpu.share":"timeslice","gpu.share.memory":"%s"}}' "$phys" >"$work/b2.json"
mkdir -p "$work/b2" && cp -a "$work/b/rootfs" "$work/b2/" && mv "$work/b2.json" "$work/b2/config.json"
if printf '{"ociVersion":"1.0.2","id":"big-%s","status":"creating","pid":%s,"bundle":"%s"}' $$ "$sleeper" "$work/b2" | "$rel/gpushare-hook" createRuntime 2>"$work/err"; then
    fail "a request for the whole GPU beside a 1 GiB cap was admitted"
else
    grep -q "cannot take" "$work/err" && pass "admission: $(cat "$work/err")" || fail "refused for another reason: $(cat "$work/err")"
fi

echo "$state" | "$rel/gpushare-hook" poststop
got=$(nvidia-smi memory-limits --get -n "$cg" -i 0)
echo "$got" | grep -q 'hard limit: 1024 MiB' && fail "poststop left the limit: $got" || pass "poststop cleared the limit: $got"
[ "$fails" = 0 ] || exit 1
