# Shared helpers for the engine tests (sourced). Driven by tests/engines.rs, which passes:
#   GS_HOOK, GS_RUNTIME  the gpushare binaries under test
#   GS_SIMDRIVER         the TEST-ONLY simulated NVML library
#   GS_LIMITER           the limiter library (limit mode)
#   GS_REPO              the repository root
# Each script runs in its own temp dir, with its own state dir, policy file and simulated-driver
# state. Exit 0: passed; 77: skipped (the Rust driver fails that under CI=true); else failed.
set -euo pipefail

SAFE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# `grep -q` for the end of a pipeline: reads all its input, so that the writer before it is not
# killed by SIGPIPE when the match comes early (under pipefail that fails the whole pipeline).
has() { grep "$@" >/dev/null; }
T=$(mktemp -d /tmp/gpushare-engine-XXXXXX)
NAME="gs$$"
CLEANUPS=()

cleanup() {
    local rc=$? i
    set +e
    for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do
        eval "${CLEANUPS[$i]}" >/dev/null 2>&1 || true
    done
    # Any MPS daemon this test started (its pipe dir is under $T).
    for p in $(pgrep -f nvidia-cuda-mps-control 2>/dev/null || true); do
        if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | has "^CUDA_MPS_PIPE_DIRECTORY=$T/"; then
            kill "$p" 2>/dev/null || true
        fi
    done
    grep " $T/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$T" 2>/dev/null || true
    exit $rc
}
trap cleanup EXIT
on_exit() { CLEANUPS+=("$*"); }

skip() {
    echo "SKIPPED: $*"
    exit 77
}
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
ok() { echo "ok: $*"; }
need() {
    local c
    for c in "$@"; do command -v "$c" >/dev/null 2>&1 || skip "$c not installed (scripts/install-deps.sh)"; done
}

# Each script's engines, storage, sockets, state dir and MPS daemons are its own (under $T), so
# scripts run side by side, holding the host-wide lock shared. A script that changes or checks
# what every engine of the host sees holds it alone (GS_LOCK=exclusive): the package test installs
# into the host's /etc and /usr; the README examples check that no engine cgroup is left on the
# host. An exclusive holder waits for the shared ones to finish and makes new ones wait (the
# turnstile), so it is not starved. A script that first builds what it tests (GS_LOCK_LATER=1:
# the package test) takes the lock with host_lock once it has, before it touches anything of the
# host's.
host_lock() {
    exec 7>/tmp/gpushare-engine-tests.turnstile 9>/tmp/gpushare-engine-tests.lock
    flock -x 7
    if [ "${GS_LOCK:-shared}" = exclusive ]; then flock -x 9; else flock -s 9; fi
    exec 7>&-
}
# podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, and the scripts that put
# specs there use fixed names (gpushare.io-share.json) and refuse a second spec of a kind: they
# take this lock too, one at a time, before they write there.
cdi_lock() {
    exec 8>/tmp/gpushare-engine-tests.cdi.lock
    flock -x 8
}
[ -n "${GS_LOCK_LATER:-}" ] || host_lock

STATE=$T/state
SIM=$T/sim
CONFIG=$T/config.toml
mkdir -p "$SIM" "$T/bin"
export GPUSHARE_SIM_STATE=$SIM GPUSHARE_SIM_DEVICES=81920 GPUSHARE_CONFIG=$CONFIG

# The hook as runtimes call it: the real binary with the simulated driver's env added (the
# hook entries carry only PATH and GPUSHARE_CONFIG, so the test wraps the binary).
cat >"$T/bin/gpushare-hook" <<EOF
#!/bin/sh
exec env GPUSHARE_SIM_STATE=$SIM GPUSHARE_SIM_DEVICES=81920 "$GS_HOOK" "\$@"
EOF
chmod +x "$T/bin/gpushare-hook"
HOOK=$T/bin/gpushare-hook
# The same for gpushare-runtime as engines run it (conmon, containerd and dockerd pass their own
# env, not the test's): the policy file and the simulated driver's state.
cat >"$T/bin/gpushare-runtime" <<EOF
#!/bin/sh
exec env GPUSHARE_CONFIG=$CONFIG GPUSHARE_SIM_STATE=$SIM GPUSHARE_SIM_DEVICES=81920 "$GS_RUNTIME" "\$@"
EOF
chmod +x "$T/bin/gpushare-runtime"
RUNTIME=$T/bin/gpushare-runtime

write_config() { # extra TOML appended
    cat >"$CONFIG" <<EOF
state_dir = "$STATE"
log_file = "$T/gpushare.log"
lock_timeout_seconds = 20
[nvml]
library = "$GS_SIMDRIVER"
[limit]
library = "$GS_LIMITER"
[runtime]
next = ["${NEXT_RUNTIME:-runc}"]
hook = "$HOOK"
${1:-}
EOF
}
write_config

# A busybox rootfs with nvidia-cuda-mps-control and its libraries, and an image preload line.
make_rootfs() { # dir
    local r=$1 c lib
    mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/dev" "$r/proc" "$r/sys" "$r/usr/lib"
    cp /bin/busybox "$r/bin/busybox"
    for c in sh cat ls env sleep grep mount test echo touch stat wc head tr ps true false sed; do ln -sf busybox "$r/bin/$c"; done
    cp /usr/bin/nvidia-cuda-mps-control "$r/bin/"
    for lib in $(ldd /usr/bin/nvidia-cuda-mps-control | grep -o '/[^ ]*'); do
        mkdir -p "$r$(dirname "$lib")"
        cp -L "$lib" "$r$lib"
    done
    echo "/usr/lib/image-own.so" >"$r/etc/ld.so.preload"
    : >"$r/usr/lib/image-own.so"
    echo "root:x:0:0:root:/:/bin/sh" >"$r/etc/passwd"
}

# An OCI image layout tarball (index.json, blobs) of a rootfs, for `ctr image import`; the
# image's Cmd is the JSON array $3 (default ["sh"]).
make_oci_tar() { # rootfs out.tar [cmd-json]
    local r=$1 out=$2 cmd=${3:-'["sh"]'} d layer diff lsz cfg csz man msz
    d=$(mktemp -d "$T/oci-XXXX")
    mkdir -p "$d/blobs/sha256"
    tar -C "$r" -cf "$d/layer.tar" .
    diff=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
    gzip -n "$d/layer.tar"
    layer=$(sha256sum "$d/layer.tar.gz" | cut -d' ' -f1)
    lsz=$(stat -c %s "$d/layer.tar.gz")
    mv "$d/layer.tar.gz" "$d/blobs/sha256/$layer"
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$diff" >"$d/cfg"
    cfg=$(sha256sum "$d/cfg" | cut -d' ' -f1)
    csz=$(stat -c %s "$d/cfg")
    mv "$d/cfg" "$d/blobs/sha256/$cfg"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
        "$cfg" "$csz" "$layer" "$lsz" >"$d/man"
    man=$(sha256sum "$d/man" | cut -d' ' -f1)
    msz=$(stat -c %s "$d/man")
    mv "$d/man" "$d/blobs/sha256/$man"
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s}]}' "$man" "$msz" >"$d/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
    tar -C "$d" -cf "$out" oci-layout index.json blobs
}

# A runc bundle: rootfs + config.json from `runc spec`, not a terminal, with args/env/annotations.
make_bundle() { # dir args-json env-json annotations-json
    local b=$1
    mkdir -p "$b"
    [ -d "$b/rootfs" ] || make_rootfs "$b/rootfs"
    (cd "$b" && runc spec)
    jq --argjson a "$2" --argjson e "$3" --argjson n "$4" \
        '.process.terminal=false | .process.args=$a | .process.env=(.process.env+$e) | .annotations=$n | .root.readonly=false' \
        "$b/config.json" >"$b/c.tmp" && mv "$b/c.tmp" "$b/config.json"
}

pipe_dir() { # the single GPU domain's host pipe dir
    local d
    for d in "$STATE"/mps/*/pipe; do [ -d "$d" ] && echo "$d" && return 0; done
    return 0
}
shm_dir() {
    local d
    for d in "$STATE"/mps/*/shm; do [ -d "$d" ] && echo "$d" && return 0; done
    return 0
}

daemon_running() { # is an MPS daemon serving our state dir?
    local p
    for p in $(pgrep -f nvidia-cuda-mps-control 2>/dev/null || true); do
        { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | has "^CUDA_MPS_PIPE_DIRECTORY=$STATE/" && return 0
    done
    return 1
}

# The commands run inside an MPS container; prints lines the checks below grep.
INSIDE_MPS='for i in $(seq 100); do [ -f /dev/shm/host-marker ] && break; sleep 0.05; done; echo "env:$CUDA_MPS_PIPE_DIRECTORY"; echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 && echo control:answers || echo control:silent; cat /dev/shm/host-marker 2>/dev/null | sed "s/^/shm:/"; ls /tmp/nvidia-mps | tr "\n" " " | sed "s/^/pipe:/"; echo'

check_mps_output() { # file with the container's output; $1 expect env (yes/no)
    local out=$1 want_env=${2:-yes}
    grep -q '^control:answers' "$out" || { cat "$out"; fail "MPS control did not answer inside the container"; }
    ok "nvidia-cuda-mps-control get_server_list answered inside"
    grep -q '^shm:from-host' "$out" || { cat "$out"; fail "/dev/shm is not the daemon's tmpfs"; }
    ok "/dev/shm is the daemon's tmpfs (host marker seen)"
    if [ "$want_env" = yes ]; then
        grep -q '^env:/tmp/nvidia-mps' "$out" || { cat "$out"; fail "CUDA_MPS_PIPE_DIRECTORY not set"; }
        ok "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps set"
    fi
}

# Puts a marker into the daemon's shm once it exists (the first hook creates it). It waits up
# to a minute: a CRI pod's sandbox can take more than 10 s to come up beside the rest of the
# suite on a 2-CPU machine, and a marker never written fails the check as a wrong /dev/shm would.
mark_shm_when_ready() {
    (for _ in $(seq 1200); do
        s=$(shm_dir)
        if [ -n "$s" ] && mountpoint -q "$s"; then echo from-host >"$s/host-marker"; exit 0; fi
        sleep 0.05
    done) &
}

INSIDE_LIMIT='sed "s/^/preload:/" /etc/ld.so.preload; echo "ld:$LD_PRELOAD"; echo "mem:$CUDA_DEVICE_MEMORY_LIMIT_0"; echo "sm:$CUDA_DEVICE_SM_LIMIT"; if touch /usr/local/gpushare/libgpushare_limiter.so 2>/dev/null; then echo lib:writable; else echo lib:readonly; fi; test -s /usr/local/gpushare/libgpushare_limiter.so && echo lib:present; sed "s/^/limits:/" /usr/local/gpushare/limits; touch /usr/local/gpushare/shared/x && echo shared:writable; echo'

check_limit_output() { # file; $2 expect env (yes/no)
    local out=$1 want_env=${2:-yes}
    grep -q '^lib:present' "$out" && grep -q '^lib:readonly' "$out" || { cat "$out"; fail "limiter library not mounted read-only"; }
    ok "limiter library mounted read-only"
    grep -qx 'preload:/usr/lib/image-own.so' "$out" && grep -qx 'preload:/usr/local/gpushare/libgpushare_limiter.so' "$out" || { cat "$out"; fail "/etc/ld.so.preload lacks the image's line or ours"; }
    ok "/etc/ld.so.preload has the image's line and the limiter"
    grep -qx 'limits:CUDA_DEVICE_MEMORY_LIMIT_0=1073741824' "$out" || { cat "$out"; fail "limits file missing"; }
    grep -qx 'shared:writable' "$out" || { cat "$out"; fail "shared dir not writable"; }
    ok "limits file and writable shared dir present"
    if [ "$want_env" = yes ]; then
        grep -qx 'mem:1073741824' "$out" && grep -qx 'sm:30' "$out" || { cat "$out"; fail "CUDA_DEVICE_* env not set"; }
        grep -qx 'ld:/usr/local/gpushare/libgpushare_limiter.so' "$out" || has '^ld:.*:/usr/local/gpushare/libgpushare_limiter.so$' "$out" || { cat "$out"; fail "LD_PRELOAD not appended"; }
        ok "limit env (CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT, LD_PRELOAD) set"
    fi
}

# Run inside a container: into each tenant-writable mount gpushare gives it (the MPS pipe
# directory, the domain's /dev/shm, the limiter's shared directory), writes a script and runs it
# directly; prints `exec:DIR:refused` or `exec:DIR:RAN`, and `opts:DIR:OPTIONS` (the mount's
# per-mount options as the container's mountinfo shows the last mount on DIR).
INSIDE_NOEXEC='printf "#!/bin/sh\necho ran\n" >/tmp/gs-exec-control && chmod 755 /tmp/gs-exec-control && /tmp/gs-exec-control >/dev/null 2>&1 && echo exec:control:ran; for d in /tmp/nvidia-mps /dev/shm /usr/local/gpushare/shared; do if [ ! -d "$d" ]; then echo "exec:$d:missing"; continue; fi; f=$d/gs-exec-probe; if ! printf "#!/bin/sh\necho ran\n" >"$f" 2>/dev/null; then echo "exec:$d:unwritable"; continue; fi; chmod 755 "$f"; if "$f" >/dev/null 2>&1; then echo "exec:$d:RAN"; else echo "exec:$d:refused"; fi; rm -f "$f"; o=$(grep " $d " /proc/self/mountinfo | tail -1 | cut -d" " -f6); echo "opts:$d:$o"; done; echo'

check_noexec() { # file with the container's output; what (the path under test)
    local out=$1 what=$2 d o
    grep -qx "exec:control:ran" "$out" || { cat "$out"; fail "$what: positive control: the same script did not run from /tmp"; }
    for d in /tmp/nvidia-mps /dev/shm /usr/local/gpushare/shared; do
        grep -qx "exec:$d:refused" "$out" || { cat "$out"; fail "$what: a script in $d was not refused ($(grep "^exec:$d:" "$out"))"; }
        o=$(sed -n "s|^opts:$d:||p" "$out")
        for f in noexec nosuid nodev; do
            echo ",$o," | has ",$f," || { cat "$out"; fail "$what: $d is mounted $o, without $f"; }
        done
    done
    ok "$what: a script written to /tmp/nvidia-mps, /dev/shm and /usr/local/gpushare/shared is refused (noexec,nosuid,nodev on each)"
}

# The repo's hooks/ files, pointed at the hook under test and this test's policy file.
make_hooks_dirs() { # out-dir
    local out=$1 f sub
    for sub in oci podman-precreate; do
        mkdir -p "$out/$sub"
        for f in "$GS_REPO/hooks/$sub"/*.json; do
            jq --arg h "$HOOK" --arg c "GPUSHARE_CONFIG=$CONFIG" \
                '.hook.path=$h | .hook.env=(.hook.env+[$c])' "$f" >"$out/$sub/$(basename "$f")"
        done
    done
}

PODMAN_ULIMITS="--ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
podman_() { # podman with private storage under $T
    podman --root "$T/storage" --runroot "$T/runroot" --cgroup-manager cgroupfs "$@"
}

wait_until() { # seconds command...
    local n=$(($1 * 10))
    shift
    while ((n-- > 0)); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}
daemon_gone() { ! daemon_running; }
# Whether gpushare's record no longer lists container $1 as a client of any GPU.
released() { # container id
    ! "$HOOK" status --json | jq -e --arg id "$1" '[.gpus[].clients[].id] | index($id)' >/dev/null
}

# Prints which engine (and version) a test runs against: `engine: NAME VERSION`.
engine_version() { # name command...
    local name=$1 v
    shift
    v=$("$@" 2>/dev/null | head -1) || true
    echo "engine: $name ${v:-unknown version}"
}

# Debian 13 engines unpacked into a private prefix by scripts/fetch-engines.sh (containerd 1.7,
# Docker 26, the CRI api.proto); $TRIXIE is that root (usr/bin, usr/sbin, usr/share).
# containerd 2.x from Debian unstable is unpacked next to it, in $SID.
TRIXIE=${GS_ENGINES:-/var/cache/gpushare-engines}/trixie/root
SID=${GS_ENGINES:-/var/cache/gpushare-engines}/sid/root
need_unpacked() { # root files...
    local root=$1 f
    shift
    for f in "$@"; do
        [ -e "$root/$f" ] || skip "$root/$f missing (scripts/fetch-engines.sh, run by scripts/install-deps.sh)"
    done
}
need_trixie() { need_unpacked "$TRIXIE" "$@"; }
# The Python with grpcio-tools and kubernetes-validate (made by scripts/install-deps.sh).
PYTHON=${GS_PYTHON:-${GS_ENGINES:-/var/cache/gpushare-engines}/venv/bin/python}

# NVIDIA's CDI spec (tests/fixtures/cdi/nvidia.yaml, in the form `nvidia-ctk cdi generate`
# writes: common NVIDIA_VISIBLE_DEVICES=void, /dev/nvidia0 under the names 0, the UUID and all,
# library mounts, nvidia-cdi-hook hooks) rendered for this machine, which has no NVIDIA driver:
# every hostPath is moved under the stand-in driver root $T/driver, as `nvidia-ctk cdi generate
# --driver-root` writes it (the GPU Operator's /run/nvidia/driver), where the device nodes are
# char devices made with mknod (nvidia0 195:0, nvidiactl 195:255, as the driver numbers them) and
# the libraries and nvidia-smi empty files; nvidia-cdi-hook is a stand-in that logs its
# arguments to $T/cdi-hook.log. Nothing else of the spec is changed. Prints the spec's text.
nvidia_cdi_spec() {
    local d=$T/driver f
    mkdir -p "$d/dev" "$d/usr/lib/x86_64-linux-gnu" "$d/usr/bin"
    [ -e "$d/dev/nvidia0" ] || {
        mknod -m 666 "$d/dev/nvidia0" c 195 0 &&
            mknod -m 666 "$d/dev/nvidiactl" c 195 255 &&
            mknod -m 666 "$d/dev/nvidia-uvm" c 511 0 &&
            mknod -m 666 "$d/dev/nvidia-uvm-tools" c 511 1
    } || fail "cannot make the stand-in device nodes with mknod under $d"
    for f in usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05 usr/bin/nvidia-smi; do
        echo "stand-in $f" >"$d/$f"
    done
    cat >"$d/usr/bin/nvidia-cdi-hook" <<EOF2
#!/bin/sh
echo "\$*" >>"$T/cdi-hook.log"
cat >/dev/null
EOF2
    chmod +x "$d/usr/bin/nvidia-cdi-hook"
    sed -e "s#hostPath: /#hostPath: $d/#" -e "s#path: /usr/bin/nvidia-cdi-hook#path: $d/usr/bin/nvidia-cdi-hook#" \
        "$GS_REPO/tests/fixtures/cdi/nvidia.yaml"
}

# What a container given GPUs by CDI prints about them (checked by check_cdi_output).
INSIDE_CDI='test -c /dev/nvidia0 && echo cdi:nvidia0; test -c /dev/nvidiactl && echo cdi:nvidiactl; grep -q stand-in /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 && echo cdi:libcuda; echo "cdi:visible=$NVIDIA_VISIBLE_DEVICES"'
check_cdi_output() { # file: the CDI spec was applied (device nodes, mounts, env, hooks)
    local out=$1
    grep -qx 'cdi:nvidia0' "$out" && grep -qx 'cdi:nvidiactl' "$out" && grep -qx 'cdi:libcuda' "$out" ||
        { cat "$out"; fail "the CDI spec's device nodes or library mount are missing inside"; }
    grep -qx 'cdi:visible=void' "$out" || { cat "$out"; fail "the CDI spec's NVIDIA_VISIBLE_DEVICES=void is not the container's value"; }
    has 'update-ldcache' "$T/cdi-hook.log" || fail "the CDI spec's nvidia-cdi-hook did not run"
    ok "CDI applied: /dev/nvidia0, /dev/nvidiactl, libcuda mount, NVIDIA_VISIBLE_DEVICES=void, nvidia-cdi-hook ran"
}

# The containerd build $CRI_CONTAINERD names (default $1), one of the builds in $2: `system`
# (this machine's), `trixie` (Debian 13, 1.7) or `sid` (Debian unstable, 2.x). Sets CTD_PATH.
need_containerd() { # default allowed-builds
    local build=${CRI_CONTAINERD:-$1}
    case " $2 " in *" $build "*) ;; *) fail "CRI_CONTAINERD must be one of: $2" ;; esac
    case $build in
    system)
        need containerd ctr
        CTD_PATH=$PATH
        ;;
    trixie)
        need_trixie usr/bin/containerd usr/bin/ctr usr/bin/containerd-shim-runc-v2
        CTD_PATH=$TRIXIE/usr/bin:$PATH
        ;;
    sid)
        need_unpacked "$SID" usr/bin/containerd usr/bin/ctr usr/bin/containerd-shim-runc-v2
        CTD_PATH=$SID/usr/bin:$PATH
        ;;
    esac
}

# The CRI client (tests/cri/cri.py) with its stubs compiled into $CRI_GEN from Debian 13's
# api.proto, and the containerd version on the log.
cri_client() {
    local proto=usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
    need_trixie "$proto"
    [ -x "$PYTHON" ] && "$PYTHON" -c 'import grpc_tools' 2>/dev/null ||
        skip "$PYTHON with grpcio-tools missing (scripts/install-deps.sh)"
    export CRI_GEN=$T/cri-gen
    "$PYTHON" "$GS_REPO/tests/cri/cri.py" gen "$CRI_GEN" "$TRIXIE/$proto" || fail "cannot compile the CRI api.proto"
    engine_version containerd env PATH="$CTD_PATH" containerd --version
}

# The config of a private containerd under $1 with its CRI on and CDI specs read from $2, written
# to $1/config.toml: version 3 for CRI_CONTAINERD=sid (containerd 2.x, CDI on by default),
# version 2 with enable_cdi otherwise (containerd 1.7).
cri_cdi_containerd_config() {
    local c=$1 cdi=$2
    if [ "${CRI_CONTAINERD:-trixie}" = sid ]; then
        cat >"$c/config.toml" <<EOF2
version = 3
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$c/sock"
[ttrpc]
  address = "$c/sock.ttrpc"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "gpushare.test/pause:1"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["$cdi"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$c/cni/bin"]
    conf_dir = "$c/cni/conf"
EOF2
    else
        cat >"$c/config.toml" <<EOF2
version = 2
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$c/sock"
[ttrpc]
  address = "$c/sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "gpushare.test/pause:1"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["$cdi"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$c/cni/bin"
    conf_dir = "$c/cni/conf"
EOF2
    fi
}

# Starts a private containerd on $C/config.toml (its socket $C/sock, its log $C/log), stopped
# at exit, with `cri` (and `cri_exec`) calling its CRI and every pod removed before it stops
# (the shims would outlive it otherwise); waits until its CRI answers.
start_cri_containerd() {
    env PATH="$CTD_PATH" containerd --config "$C/config.toml" >"$C/log" 2>&1 &
    CPID=$!
    on_exit "kill $CPID; wait $CPID"
    cri() { "$PYTHON" "$GS_REPO/tests/cri/cri.py" call "$C/sock" "$@"; }
    cri_exec() { "$PYTHON" "$GS_REPO/tests/cri/cri.py" exec "$C/sock" "$@"; }
    wait_until 30 cri Version '{}' >/dev/null 2>&1 || { tail -30 "$C/log"; fail "containerd's CRI did not come up (log above)"; }
    remove_all_pods() {
        local p
        for p in $(cri ListPodSandbox '{}' | jq -r '.items[]?.id'); do
            cri StopPodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
            cri RemovePodSandbox "{\"pod_sandbox_id\":\"$p\"}" >/dev/null
        done
    }
    on_exit remove_all_pods
}

# Imports the pause image (sleeps; gpushare.test/pause:1) and the workload image (busybox and
# nvidia-cuda-mps-control; gpushare.test/busybox:1) into the started containerd's k8s.io
# namespace, with `ctr_` calling its ctr.
import_cri_images() {
    mkdir -p "$T/pause/bin"
    cp /bin/busybox "$T/pause/bin/" && ln -s busybox "$T/pause/bin/sleep"
    make_oci_tar "$T/pause" "$T/pause.tar" '["/bin/sleep","2147483647"]'
    make_rootfs "$T/rootfs"
    make_oci_tar "$T/rootfs" "$T/image.tar"
    ctr_() { env PATH="$CTD_PATH" ctr --address "$C/sock" -n k8s.io "$@"; }
    ctr_ images import --index-name gpushare.test/pause:1 "$T/pause.tar" >/dev/null || fail "pause image import"
    ctr_ images import --index-name gpushare.test/busybox:1 "$T/image.tar" >/dev/null || fail "image import"
}
