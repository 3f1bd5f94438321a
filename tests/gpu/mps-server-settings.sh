#!/bin/sh
# GPU observation of what NVIDIA's MPS control daemon answers about a running server, which
# gpushare's per-server restore (src/host/mps/mod.rs `restore_servers`) relies on:
#   get_server_list with a server up; get/set_active_thread_percentage <pid>;
#   get/set_device_pinned_mem_limit <pid> 0; whether a per-server pinned limit holds a new
#   client's allocation; get/set_default_client_priority; and the answer to the one session in
#   which an acquire sets the defaults, reads them back and lists the servers (`set_answer`
#   reads it as: the echo of the set percentage, the read-back, then one server pid a line).
# NOT run in CI (no GPU there); run by hand, as root: tests/gpu/mps-server-settings.sh
# Needs: nvidia-smi, nvidia-cuda-mps-control, python3 (a ctypes CUDA driver client).
# Leaves the GPU's compute mode as it was. Prints what it saw; exits 2 when it cannot run.
set -u
command -v nvidia-smi >/dev/null || { echo "SKIPPED: nvidia-smi not found"; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null || { echo "SKIPPED: nvidia-cuda-mps-control missing"; exit 2; }
command -v python3 >/dev/null || { echo "SKIPPED: python3 missing"; exit 2; }
nvidia-smi -L
work=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
cat >"$work/client.py" <<'PY'
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
print("cuInit", cu.cuInit(0), flush=True)
dev = ctypes.c_int()
cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
print("cuCtxCreate", cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), flush=True)
p = ctypes.c_uint64()
mib = int(sys.argv[2])
print("cuMemAlloc %d MiB" % mib, cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20)), flush=True)
time.sleep(float(sys.argv[1]))
PY
ask() { echo "> $1"; echo "$1" | timeout 10 nvidia-cuda-mps-control | sed 's/^/< /'; }
nvidia-cuda-mps-control -d
ask "set_default_active_thread_percentage 60"
ask "set_default_device_pinned_mem_limit 0 4096M"
python3 "$work/client.py" 40 256 & c1=$!
sleep 8
ask get_server_list
srv=$(echo get_server_list | nvidia-cuda-mps-control | head -n1 | tr -dc 0-9)
echo "server pid: $srv"
echo "an acquire's defaults session, with that server up:"
printf '%s\n' "set_default_active_thread_percentage 60" "set_default_device_pinned_mem_limit 0 4096M" \
    "set_default_client_priority 0" get_default_active_thread_percentage \
    "get_default_device_pinned_mem_limit 0" get_default_client_priority get_server_list |
    timeout 10 nvidia-cuda-mps-control | sed 's/^/< /'
ask "get_active_thread_percentage $srv"
ask "get_device_pinned_mem_limit $srv 0"
ask "set_active_thread_percentage $srv 100"
ask "get_active_thread_percentage $srv"
ask "set_device_pinned_mem_limit $srv 0 1024M"
ask "get_device_pinned_mem_limit $srv 0"
ask "set_active_thread_percentage $srv 60"
ask "get_active_thread_percentage $srv"
echo "a new client of that server asks 2048 MiB under its 1024M per-server limit:"
timeout 30 python3 "$work/client.py" 0 2048
ask "set_device_pinned_mem_limit $srv 0 0M"
ask "get_device_pinned_mem_limit $srv 0"
ask "get_default_client_priority"
ask "set_default_client_priority 1"
ask "get_default_client_priority"
ask "set_default_client_priority 0"
ask "get_server_list"
kill $c1 2>/dev/null; wait $c1 2>/dev/null
ask quit
sleep 2
echo "--- control.log (tail)"; tail -n 40 "$work/log/control.log"
rm -rf "$work"
