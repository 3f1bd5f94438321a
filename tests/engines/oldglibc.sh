#!/usr/bin/env bash
# limit mode in old and minimal userlands, under runc (gpushare-runtime) or podman ($ENGINE):
#  - a Debian 11 rootfs (glibc 2.31, as Ubuntu 20.04; libc6, libgcc-s1 and a dynamically linked
#    busybox from Debian 11's packages, unpacked by scripts/fetch-engines.sh): its dynamic
#    programs run with the limiter preloaded, and a CUDA test program over the simulated driver
#    (as libcuda.so.1 inside the rootfs) sees the 1 GiB cap;
#  - the same without libgcc_s.so.1 (minimal and distroless-style images);
#  - a rootfs without a C library, and a musl one (Debian 11's musl loader): refused with
#    gpushare's one line naming the image's libc, and nothing left behind.
source "$(dirname "$0")/lib.sh"
ENGINE=${ENGINE:-runc}
need runc jq
[ "$ENGINE" = podman ] && need podman
BULLSEYE=${GS_ENGINES:-/var/cache/gpushare-engines}/bullseye/root
need_unpacked "$BULLSEYE" lib/x86_64-linux-gnu/libc-2.31.so lib/x86_64-linux-gnu/libgcc_s.so.1 bin/busybox lib/ld-musl-x86_64.so.1
LINK="$GS_REPO/scripts/link-glibc2.17"
[ -x "$LINK" ] && "$LINK" --version >/dev/null 2>&1 || skip "zig or cargo-zigbuild missing (scripts/install-deps.sh)"
engine_version "$ENGINE" "$ENGINE" --version

# The CUDA test program, built for glibc 2.17 so that it runs on Debian 11's glibc (it
# dlopens libcuda.so.1, which is the simulated driver in the rootfs).
sh "$GS_REPO/simdriver/install-sim.sh" "$T/simlib" "$GS_SIMDRIVER" >/dev/null
"$LINK" -O2 -idirafter /usr/include -o "$T/cuprobe" "$GS_REPO/tests/limiter/cuprobe.c" \
    -L"$T/simlib" -lcuda -lnvidia-ml -ldl 2>"$T/cc.err" \
    || { cat "$T/cc.err"; fail "cannot build cuprobe for glibc 2.17"; }

# Debian 11's userland: loader, libc and friends, busybox (dynamic), the probe, the simulated
# driver as libcuda.so.1 / libnvidia-ml.so.1.
old_rootfs() { # dir
    local r=$1 c
    mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/dev" "$r/proc" "$r/sys" "$r/lib/x86_64-linux-gnu" "$r/lib64"
    cp -a "$BULLSEYE/lib/x86_64-linux-gnu/." "$r/lib/x86_64-linux-gnu/"
    cp -a "$BULLSEYE/lib64/ld-linux-x86-64.so.2" "$r/lib64/"
    cp "$BULLSEYE/bin/busybox" "$r/bin/busybox"
    for c in sh cat echo grep sed env true; do ln -sf busybox "$r/bin/$c"; done
    cp "$T/cuprobe" "$r/bin/cuprobe"
    cp "$GS_SIMDRIVER" "$r/lib/x86_64-linux-gnu/libgpushare_simdriver.so"
    for c in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do
        ln -sf libgpushare_simdriver.so "$r/lib/x86_64-linux-gnu/$c"
    done
    echo "root:x:0:0:root:/:/bin/sh" >"$r/etc/passwd"
}
LIMIT='{"gpu.share":"limit","gpu.share.memory":"1Gi","gpu.share.cores":"30"}'
ENV='["NVIDIA_VISIBLE_DEVICES=0","GPUSHARE_SIM_STATE=/tmp/sim","GPUSHARE_SIM_DEVICES=4096"]'
INSIDE='busybox echo dynamic:ran; grep -q libgpushare_limiter /etc/ld.so.preload && echo preload:ours; mkdir -p /tmp/sim; /bin/cuprobe dlopen cap 0 100'

# Runs `cmd...` in the rootfs $1/rootfs with `limit`; stdout in $1.out, stderr in $1.err.
run_limit() { # bundle name cmd...
    local b=$1 name=$2
    shift 2
    if [ "$ENGINE" = podman ]; then
        on_exit "podman_ rm -f -t 0 $name"
        podman_ --runtime "$RUNTIME" run --name "$name" $PODMAN_ULIMITS \
            --annotation gpu.share=limit --annotation gpu.share.memory=1Gi --annotation gpu.share.cores=30 \
            -e NVIDIA_VISIBLE_DEVICES=0 -e GPUSHARE_SIM_STATE=/tmp/sim -e GPUSHARE_SIM_DEVICES=4096 \
            --rootfs "$b/rootfs" "$@" >"$b.out" 2>"$b.err"
    else
        local argv='[]' a
        for a in "$@"; do argv=$(jq -c --arg a "$a" '. + [$a]' <<<"$argv"); done
        make_bundle "$b" "$argv" "$ENV" "$LIMIT"
        (cd "$b" && "$GS_RUNTIME" run "$name" >"$b.out" 2>"$b.err")
    fi
}

check_capped() { # bundle label
    local b=$1 what=$2
    grep -qx 'dynamic:ran' "$b.out" || { cat "$b.out" "$b.err"; fail "$what: busybox (dynamic) did not run under limit"; }
    ok "$what: busybox echo (dynamic, glibc 2.31) ran with the limiter preloaded"
    grep -qx 'preload:ours' "$b.out" || { cat "$b.out"; fail "$what: /etc/ld.so.preload lacks the limiter"; }
    grep -qx 'MEMINFO_TOTAL=1073741824' "$b.out" || { cat "$b.out" "$b.err"; fail "$what: cuMemGetInfo total is not the 1 GiB cap"; }
    grep -qx "ALLOC_TOTAL=$((1000 * 1024 * 1024))" "$b.out" || { cat "$b.out"; fail "$what: the 1 GiB cap did not hold (ten 100 MiB chunks, the 11th refused)"; }
    grep -qx 'OOM_RC=2' "$b.out" || { cat "$b.out"; fail "$what: the 11th chunk was not CUDA_ERROR_OUT_OF_MEMORY"; }
    ok "$what: the cap holds for a CUDA program (1 GiB of a 4 GiB simulated device)"
}

check_refused() { # bundle name label words
    local b=$1 name=$2 what=$3 words=$4
    grep -q 'gpushare' "$b.err" && grep -q "$words" "$b.err" || { cat "$b.out" "$b.err"; fail "$what: not refused with gpushare's line naming the libc ($words)"; }
    ! grep -qx 'ran' "$b.out" || fail "$what: the container ran"
    [ ! -e "$STATE/containers/$name" ] || fail "$what: left $STATE/containers/$name"
    ok "$what: refused: $(grep -m1 "$words" "$b.err")"
}

echo "== Debian 11 (glibc 2.31) with libgcc_s, limit"
old_rootfs "$T/b1/rootfs"
run_limit "$T/b1" "${NAME}old1" sh -c "$INSIDE" || true
check_capped "$T/b1" "glibc 2.31"

echo "== the node binaries on Debian 11's userland (glibc 2.31, chroot)"
cp "$GS_HOOK" "$GS_RUNTIME" "$T/b1/rootfs/bin/"
chroot "$T/b1/rootfs" /bin/gpushare-hook --version >"$T/v.out" 2>&1 || { cat "$T/v.out"; fail "gpushare-hook does not run on glibc 2.31"; }
grep -q '^gpushare-hook ' "$T/v.out" || { cat "$T/v.out"; fail "gpushare-hook --version"; }
chroot "$T/b1/rootfs" /bin/gpushare-runtime --version >"$T/v.out" 2>&1 || true
grep -q '^gpushare-runtime version ' "$T/v.out" || { cat "$T/v.out"; fail "gpushare-runtime does not run on glibc 2.31"; }
ok "gpushare-hook and gpushare-runtime run on glibc 2.31: $(head -1 "$T/v.out")"

echo "== Debian 11 (glibc 2.31) without libgcc_s, limit"
old_rootfs "$T/b2/rootfs"
rm -f "$T/b2/rootfs/lib/x86_64-linux-gnu/libgcc_s.so.1"
run_limit "$T/b2" "${NAME}old2" sh -c "$INSIDE" || true
check_capped "$T/b2" "glibc 2.31 without libgcc_s"

echo "== Debian 11 (glibc 2.31) without libpthread.so.0 and libdl.so.2 (trimmed), limit"
old_rootfs "$T/b5/rootfs"
rm -f "$T/b5/rootfs/lib/x86_64-linux-gnu/"{libpthread.so.0,libdl.so.2}
if run_limit "$T/b5" "${NAME}old5" busybox echo ran; then fail "trimmed glibc: the container ran"; fi
check_refused "$T/b5" "${NAME}old5" "trimmed glibc" "without libpthread.so.0 and libdl.so.2"

echo "== no C library (a static busybox only), limit"
mkdir -p "$T/b3/rootfs/bin" "$T/b3/rootfs/etc"
cp /bin/busybox "$T/b3/rootfs/bin/busybox"
ln -sf busybox "$T/b3/rootfs/bin/sh"
if run_limit "$T/b3" "${NAME}old3" busybox echo ran; then fail "no libc: the container ran"; fi
check_refused "$T/b3" "${NAME}old3" "no libc" "no C library"

echo "== musl (Debian 11's musl loader), limit"
mkdir -p "$T/b4/rootfs/bin" "$T/b4/rootfs/lib" "$T/b4/rootfs/etc"
cp -a "$BULLSEYE/lib/ld-musl-x86_64.so.1" "$T/b4/rootfs/lib/"
mkdir -p "$T/b4/rootfs/lib/x86_64-linux-musl"
cp -a "$BULLSEYE/lib/x86_64-linux-musl/." "$T/b4/rootfs/lib/x86_64-linux-musl/"
cp /bin/busybox "$T/b4/rootfs/bin/busybox"
ln -sf busybox "$T/b4/rootfs/bin/sh"
# Why musl is refused: musl's loader honours LD_PRELOAD (which limit mode sets) and then fails
# every dynamic program on the glibc limiter. Shown with a dynamic musl program, by chroot.
printf '#include <stdio.h>\nint main(void){puts("musl:ran");return 0;}\n' >"$T/m.c"
GS_ZIG_TARGET=x86_64-linux-musl "$LINK" -dynamic -o "$T/b4/rootfs/bin/mhello" "$T/m.c" 2>"$T/mcc.err" || { cat "$T/mcc.err"; fail "cannot build a musl program"; }
cp "$GS_LIMITER" "$T/b4/rootfs/lim.so"
[ "$(chroot "$T/b4/rootfs" /bin/mhello)" = musl:ran ] || fail "the musl program does not run in its rootfs"
if env LD_PRELOAD=/lim.so chroot "$T/b4/rootfs" /bin/mhello >"$T/m.out" 2>&1; then fail "musl ran with the limiter preloaded"; fi
grep -q 'Error relocating /lim.so' "$T/m.out" || { cat "$T/m.out"; fail "unexpected musl failure"; }
ok "musl without gpushare's check: every dynamic program fails ($(grep -m1 'Error relocating' "$T/m.out"))"
rm "$T/b4/rootfs/lim.so"
if run_limit "$T/b4" "${NAME}old4" busybox echo ran; then fail "musl: the container ran"; fi
check_refused "$T/b4" "${NAME}old4" "musl" "C library is musl"
echo "PASS"
