#!/usr/bin/env bash
# gpushare demo: two containers share one GPU through one reference-counted MPS daemon, each with
# a memory cap for the whole container; a third that would overcommit the GPU is refused.
#
# Installs what is missing of what it needs (runc, busybox-static, nvidia-cuda-mps, jq, the C
# toolchain, rustup's minimal Rust toolchain, the zig linker), builds what it runs of gpushare
# (unoptimised: the quickest build from nothing), then runs two busybox containers under runc through
# gpushare-runtime with `gpu.share=mps`. Each container talks to the MPS control daemon from
# inside; `gpushare-hook status` shows one daemon with two clients; the daemon outlives the first
# container and is gone after the second. On a machine without an NVIDIA GPU the hook's NVML
# answers come from the TEST-ONLY simulated driver (libgpushare_simdriver.so); the MPS control
# daemon is NVIDIA's real one in both cases. Needs root.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
scripts/install-deps.sh --demo >&2   # only what the demo needs; scripts/test.sh installs the rest
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"   # where rustup put cargo
# GS_DEMO_BIN: a directory where those four files are already built (the test suite's own
# build: tests/demo.rs), used as they are instead of building them again.
if [ -n "${GS_DEMO_BIN:-}" ]; then
    BIN=$GS_DEMO_BIN
    for f in gpushare-hook gpushare-runtime libgpushare_limiter.so libgpushare_simdriver.so; do
        [ -f "$BIN/$f" ] || { echo "demo: GS_DEMO_BIN=$BIN has no $f" >&2; exit 1; }
    done
    echo "== using the binaries in $BIN" >&2
else
    echo "== building (profile demo: unoptimised, no debug info; the quickest from nothing)" >&2
    # Only what the demo runs: the hook and the runtime, the limiter, the simulated driver.
    cargo build --profile demo -p gpushare -p gpushare-limiter -p gpushare-simdriver >&2
    BIN=$REPO/target/demo
fi

D=$(mktemp -d /tmp/gpushare-demo-XXXXXX)
ID=demo$$
cleanup() {
    set +e
    for n in a b c; do runc delete -f "$ID-$n" >/dev/null 2>&1; done
    "$BIN/gpushare-hook" gc >/dev/null 2>&1
    grep " $D/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT

SIM_ENV=""
if nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
    echo "== NVIDIA GPU found: using the real driver"
    NVML=libnvidia-ml.so.1
else
    echo "== no NVIDIA GPU here: NVML answers come from the TEST-ONLY simulated driver"
    NVML=$BIN/libgpushare_simdriver.so
    export GPUSHARE_SIM_STATE=$D/sim GPUSHARE_SIM_DEVICES=81920
    SIM_ENV="GPUSHARE_SIM_STATE=$D/sim GPUSHARE_SIM_DEVICES=81920"
fi
export GPUSHARE_CONFIG=$D/config.toml
printf '%s\n' \
    "state_dir = \"$D/state\"" \
    "log_file = \"$D/gpushare.log\"" \
    "[nvml]" "library = \"$NVML\"" \
    "[limit]" "library = \"$BIN/libgpushare_limiter.so\"" \
    "[runtime]" "next = [\"runc\"]" "hook = \"$D/gpushare-hook\"" >"$GPUSHARE_CONFIG"
# The hook as runc will call it (its hook entries carry only PATH and GPUSHARE_CONFIG).
printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "$SIM_ENV" "$BIN/gpushare-hook" >"$D/gpushare-hook"
chmod +x "$D/gpushare-hook"

# A busybox rootfs with NVIDIA's MPS control client and its libraries.
R=$D/rootfs
mkdir -p "$R/bin" "$R/tmp" "$R/dev" "$R/proc" "$R/sys" "$R/etc"
cp /bin/busybox "$R/bin/"
for c in sh echo sleep cat ls; do ln -s busybox "$R/bin/$c"; done
MPS=$(command -v nvidia-cuda-mps-control)
cp "$MPS" "$R/bin/"
for lib in $(ldd "$MPS" | grep -o '/[^ ]*'); do
    mkdir -p "$R$(dirname "$lib")" && cp -L "$lib" "$R$lib"
done

start() { # name cores memory
    local b=$D/$1 script
    mkdir -p "$b" && cp -a "$R" "$b/rootfs"
    (cd "$b" && runc spec)
    script="echo \"[$1] CUDA_MPS_PIPE_DIRECTORY=\$CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=\$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\"; echo get_server_list | nvidia-cuda-mps-control >/dev/null && echo \"[$1] the MPS control daemon answers inside the container\"; exec sleep 1000"
    jq --arg s "$script" --arg c "$2" --arg m "$3" \
        '.process.terminal=false | .process.args=["sh","-c",$s] | .process.env+=["NVIDIA_VISIBLE_DEVICES=0"] | .annotations={"gpu.share":"mps","gpu.share.cores":$c,"gpu.share.memory":$m}' \
        "$b/config.json" >"$b/c" && mv "$b/c" "$b/config.json"
    "$BIN/gpushare-runtime" create --bundle "$b" "$ID-$1" </dev/null >"$b/out" 2>"$b/err" || {
        cat "$b/err"
        return 1
    }
    runc start "$ID-$1"
    for _ in $(seq 50); do grep -q answers "$b/out" && break; sleep 0.1; done
    cat "$b/out"
}
stop() { # name
    runc kill "$ID-$1" KILL
    for _ in $(seq 50); do runc state "$ID-$1" | grep stopped >/dev/null && break; sleep 0.1; done
    "$BIN/gpushare-runtime" delete "$ID-$1"
}

echo "== container a: gpu.share=mps, gpu.share.cores=50, gpu.share.memory=16Gi (a cap for the whole container)"
start a 50 16Gi
echo "== container b: gpu.share=mps, gpu.share.cores=30, gpu.share.memory=8Gi"
start b 30 8Gi
echo "== gpushare-hook status: one daemon, two clients, each with its cap and what enforces it"
"$BIN/gpushare-hook" status
echo "== container c asks for 64Gi: with a and b holding 24.0 GiB of the GPU's 80.0 GiB, it is refused"
if start c 30 64Gi; then echo "container c was admitted" >&2; exit 1; fi
echo "== container a stops: the daemon stays for b"
stop a
"$BIN/gpushare-hook" status
echo "== container b stops: the daemon is gone"
stop b
"$BIN/gpushare-hook" status
if [ -z "$(ls "$D/state/mps" 2>/dev/null)" ]; then
    echo "== daemon directories removed; demo done"
else
    echo "== leftover daemon directories: $(ls "$D/state/mps")" >&2
    exit 1
fi
