#!/bin/sh
# TEST-ONLY: make the simulated NVIDIA driver loadable as libcuda.so.1 and libnvidia-ml.so.1.
# Usage: install-sim.sh DIR [LIBRARY]
#   DIR      directory to put on LD_LIBRARY_PATH (created if missing)
#   LIBRARY  path of the built libgpushare_simdriver.so (default: ./target/debug/...)
# Never use this on a machine with a real NVIDIA driver in the same directory.
set -eu
dir=${1:?usage: install-sim.sh DIR [LIBRARY]}
lib=${2:-$(dirname "$0")/../target/debug/libgpushare_simdriver.so}
[ -f "$lib" ] || { echo "install-sim.sh: $lib not found; build with: cargo build -p gpushare-simdriver" >&2; exit 1; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
mkdir -p "$dir"
for name in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do
    ln -sfn "$lib" "$dir/$name"
done
echo "$dir"
