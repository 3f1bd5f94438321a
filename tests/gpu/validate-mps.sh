#!/bin/sh
# GPU validation of the hook core's MPS mode on a machine with a real NVIDIA GPU and driver.
# NOT run in CI (no GPU there); run by hand, as root:
#   tests/gpu/validate-mps.sh
# Needs: nvcc (Debian nvidia-cuda-toolkit), nvidia-smi, nvidia-cuda-mps-control, and cargo unless
# GPUSHARE_BIN names a folder with a built gpushare-hook (tests/gpu/prepare.sh makes .gpu-carry).
# tests/gpu/run-all.sh runs the fuller version of these checks (two domains, enforced defaults).
# Uses the real NVML (no simulated driver) and two host processes standing in for containers:
#   1. the first acquire starts one MPS daemon on GPU 0 and puts it in EXCLUSIVE_PROCESS
#   2. two CUDA clients (CUDA_MPS_PIPE_DIRECTORY = the daemon's pipe) run through one MPS server
#   3. the client-side limit CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M stops cudaMalloc near 1 GiB
#   4. the control daemon runs with no capabilities and NoNewPrivs, and its server serves (2.)
#   5. whether a client attaches through a read-only bind of the pipe directory: says whether
#      [mps] pipe_readonly = true works with this driver (informational, never a failure)
#   6. the first release keeps the daemon; the last stops it and restores compute mode DEFAULT
# Prints PASS/FAIL per check; exits 1 if any check fails, 2 when it cannot run here.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
a='' b=''
cleanup() {
    kill $a $b 2>/dev/null
    [ -x "$hook" ] && GPUSHARE_CONFIG=$work/config.toml "$hook" gc >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
command -v nvcc >/dev/null || { echo "SKIPPED: nvcc not found (apt-get install nvidia-cuda-toolkit)"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "SKIPPED: nvidia-smi not found (no NVIDIA driver)"; exit 2; }
nvidia-smi -L | grep -q '^GPU 0' || { echo "SKIPPED: nvidia-smi sees no GPU"; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null || { echo "SKIPPED: nvidia-cuda-mps-control missing"; exit 2; }
if [ -n "${GPUSHARE_BIN:-}" ]; then
    hook=$(cd "$GPUSHARE_BIN" && pwd)/gpushare-hook
else
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" --target-dir "$root/target/gpu" -p gpushare || exit 1
    hook=$root/target/gpu/release/gpushare-hook
fi
nvcc -O2 -o "$work/check" "$root/tests/gpu/limiter_check.cu" || { echo "FAIL: nvcc"; exit 1; }

fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
export GPUSHARE_CONFIG=$work/config.toml
# Two containers without a memory cap share the GPU (each counts as the whole GPU otherwise).
printf 'state_dir = "%s"\nlog_file = "%s"\n' "$work/state" "$work/log" >"$GPUSHARE_CONFIG"
mkdir -p "$work/bundle/rootfs/tmp"
echo '{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"annotations":{"gpu.share":"mps"}}' >"$work/bundle/config.json"
state() { printf '{"id":"%s","pid":%s,"bundle":"%s"}' "$1" "$2" "$work/bundle"; }
mode() { nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader | tr -d ' '; }

before=$(mode)
unshare -m --propagation private sleep 600 & a=$!
unshare -m --propagation private sleep 600 & b=$!
state va $a | "$hook" createRuntime || fail "acquire for the first container"
state vb $b | "$hook" createRuntime || fail "acquire for the second container"
daemons=$("$hook" status --json | grep -c '"answers": true')
[ "$daemons" = 1 ] && pass "one daemon answering for two clients" || fail "$daemons daemons answering"
[ "$(mode)" = "Exclusive_Process" ] && pass "GPU 0 in EXCLUSIVE_PROCESS while the daemon runs" || fail "compute mode $(mode)"

pipe=$(ls -d "$work"/state/mps/*/pipe)
export CUDA_VISIBLE_DEVICES=0
CUDA_MPS_PIPE_DIRECTORY=$pipe "$work/check" hold 256 >"$work/h1" & h1=$!
CUDA_MPS_PIPE_DIRECTORY=$pipe "$work/check" hold 256 >"$work/h2" & h2=$!
sleep 5
servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control)
clients=0
for s in $servers; do
    clients=$((clients + $(echo "get_client_list $s" | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control | wc -w)))
done
[ "$(echo $servers | wc -w)" = 1 ] && [ "$clients" -ge 2 ] && pass "two CUDA clients on one MPS server" \
    || fail "servers: $servers, clients: $clients"
kill $h1 $h2 2>/dev/null
wait $h1 $h2 2>/dev/null

dpid=$(cat "$(dirname "$pipe")/daemon" | cut -d' ' -f1)
caps=$(grep -E '^Cap(Prm|Eff|Bnd):' /proc/$dpid/status | awk '{print $2}' | sort -u)
nnp=$(awk '/^NoNewPrivs:/ {print $2}' /proc/$dpid/status)
[ "$caps" = 0000000000000000 ] && [ "$nnp" = 1 ] \
    && pass "the control daemon (pid $dpid) has no capabilities and NoNewPrivs, and its server served the clients above" \
    || fail "control daemon pid $dpid: capabilities $caps, NoNewPrivs $nnp"

# [mps] pipe_readonly: a client in a mount namespace where the pipe directory is read-only.
if unshare -m --propagation private sh -c "mount --bind '$pipe' '$pipe' && mount -o remount,bind,ro '$pipe' \
        && CUDA_MPS_PIPE_DIRECTORY='$pipe' '$work/check' fill 64" >"$work/ro" 2>&1 \
        && grep -q '^ALLOC_TOTAL=' "$work/ro"; then
    pass "a client attaches through a read-only pipe directory: [mps] pipe_readonly = true works with this driver"
else
    echo "NOTE: a client could not attach through a read-only pipe directory; keep [mps] pipe_readonly = false ($(tail -1 "$work/ro"))"
fi

got=$(CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M "$work/check" fill 64 | sed -n 's/^ALLOC_TOTAL=//p')
[ -n "$got" ] && [ "$got" -le 1073741824 ] && [ "$got" -ge 536870912 ] \
    && pass "pinned memory limit holds cudaMalloc to $got bytes (cap 1 GiB)" || fail "allocated $got bytes under a 1 GiB MPS limit"

echo '{"id":"va","bundle":"'"$work/bundle"'"}' | "$hook" poststop
echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control >/dev/null \
    && pass "daemon outlives the first container" || fail "daemon gone after the first release"
echo '{"id":"vb","bundle":"'"$work/bundle"'"}' | "$hook" poststop
[ ! -e "$pipe" ] && pass "daemon directories removed after the last" || fail "$pipe left behind"
[ "$(mode)" = "$before" ] && pass "compute mode restored to $before" || fail "compute mode $(mode), was $before"

[ $fails -eq 0 ] && echo "ALL PASS" && exit 0
echo "$fails check(s) failed"
exit 1
