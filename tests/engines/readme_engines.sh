#!/usr/bin/env bash
# The README's shell examples, as written, on a node with the package installed and the TEST-ONLY
# simulated driver selected as "Trying it without a GPU" says. The ```sh blocks are read from
# README.md (a change of the README is what is tested) and every line runs as written, in a
# private mount, network and pid namespace where /etc, /usr, /var/lib and /var/log are overlays
# and /run and /tmp are the test's own: the node's files, daemons and sockets are the test's.
# There the package's files (Cargo.toml's deb assets, from this build) are installed and its
# postinst run; podman, a private dockerd and a private containerd run at their default
# addresses, so `docker` and `ctr` find them as written.
#
# Each block that runs a container must show that the share happened: the container printed a
# non-empty $CUDA_MPS_PIPE_DIRECTORY path, the node's log has an `acquired` line in mode mps for
# it and the MPS daemon started, and the block's `gpushare-hook status` (run after the container
# has gone, `--rm`, so it cannot show the share itself) shows that nothing is left shared. The
# host's files are checked unchanged afterwards. A ```sh block the test does not know fails it.
source "$(dirname "$0")/lib.sh"
need podman docker dockerd containerd ctr runc jq python3 unshare ip gzip
engine_version podman podman --version
engine_version dockerd dockerd --version
engine_version containerd containerd --version

# What cannot run literally on a CI machine, what runs instead, and why. A README line that
# contains PATTERN has it replaced by RUN (`-`: the line is not run).
MAP_PAT=() MAP_RUN=() MAP_WHY=()
map() { MAP_PAT+=("$1") MAP_RUN+=("$2") MAP_WHY+=("$3"); }
map 'systemctl reload docker' 'reload_docker' \
    "no systemd here; docker.service's ExecReload is a SIGHUP to dockerd: SIGHUP to the test's private dockerd"
map 'systemctl restart containerd' 'restart_containerd' \
    "no systemd here: the test's private containerd is stopped and started again"
map 'ctr image pull docker.io/library/busybox:latest' \
    'ctr image import --index-name docker.io/library/busybox:latest "$GT/busybox-oci.tar"' \
    "no registry on CI: the locally built busybox image is imported under that name"
map 'kubectl apply' '-' \
    "no cluster here: the manifests are validated by tests/kubernetes.rs (and the DRA ones by gpushare-dra's tests)"
# Also set up before the blocks, as on a node where the engines are installed and running:
#  - `docker.io/library/busybox` (podman) and `busybox` (Docker): the locally built busybox
#    image, imported under those names (no registry on CI);
#  - podman: a containers.conf.d drop-in of this machine's (cgroupfs, no systemd; runc, as crun
#    refuses this machine's hybrid cgroups; ulimits; no network);
#  - dockerd: --storage-driver=vfs --iptables=false --ip-masq=false on its command line (its
#    data-root is under the test's dir), config file /etc/docker/daemon.json as configure writes it.
# Whole blocks (by the bold label or heading above them):
#   run:  "Trying it without a GPU" (first: the policy), podman, Docker, containerd (ctr),
#         "containerd or CRI-O under Kubernetes", CDI
#   not run, with why:
declare -A NOT_RUN=(
    ["Install from the package"]="this build's files are installed as the package's (Cargo.toml's deb assets, postinst); the .deb itself: tests/engines/package.sh"
    ["Kubernetes with DRA"]="no cluster here: the manifests are validated by tests/kubernetes.rs, the plugin by gpushare-dra's tests"
    ["Demo and tests"]="these are the demo and the test suite themselves"
)
RUN_ORDER=("Trying it without a GPU" "podman" "Docker" "containerd" "containerd or CRI-O under Kubernetes" "CDI")

# The README's ```sh blocks: "B<TAB>label" then "L<TAB>line" per line; the label is the bold
# text opening the paragraph above the block, or the heading.
awk '
    /^## / { label = substr($0, 4) }
    /^\*\*[^*]+\*\*/ { s = substr($0, 3); label = substr(s, 1, index(s, "**") - 1) }
    /^```/ { if (insh) { insh = 0; next } if ($0 == "```sh") { insh = 1; print "B\t" label }; next }
    insh && NF { print "L\t" $0 }
' "$GS_REPO/README.md" >"$T/blocks"
nblocks=$(grep -c '^B' "$T/blocks")
[ "$nblocks" -ge 8 ] || { cat "$T/blocks"; fail "positive control: $nblocks sh blocks found in README.md"; }
while IFS=$'\t' read -r kind label; do
    [ "$kind" = B ] || continue
    known=no
    for l in "${RUN_ORDER[@]}"; do if [ "$l" = "$label" ]; then known=yes; fi; done
    if [ -n "${NOT_RUN[$label]+x}" ]; then known=yes; fi
    [ $known = yes ] || fail "README.md has a sh block under \"$label\" that this test does not know: run it here, or say why not"
done <"$T/blocks"
for l in "${RUN_ORDER[@]}"; do
    has -xF "$(printf 'B\t%s' "$l")" "$T/blocks" || fail "README.md has no sh block under \"$l\" any more: update this test"
done
ok "README.md: $nblocks sh blocks, each run here or named with why not"
for l in "${!NOT_RUN[@]}"; do echo "   not run: $l: ${NOT_RUN[$l]}"; done

# The busybox image: a rootfs with busybox, as a plain tarball (podman, docker import) and as an
# OCI image layout (ctr import).
make_rootfs "$T/rootfs"
tar -C "$T/rootfs" -cf "$T/busybox.tar" .
make_oci_tar "$T/rootfs" "$T/busybox-oci.tar"

# The package's files, from this build: the deb assets of Cargo.toml with target/release's
# binaries replaced by the ones under test; those not built here (gpushare-dra, man pages,
# completions) are listed and left out.
python3 - "$GS_REPO" >"$T/assets" <<'EOF'
import sys, tomllib
repo = sys.argv[1]
with open(f"{repo}/Cargo.toml", "rb") as f:
    deb = tomllib.load(f)["package"]["metadata"]["deb"]
for src, dest, mode in deb["assets"]:
    print(f"{src}\t{dest}\t{mode}")
EOF
[ "$(wc -l <"$T/assets")" -ge 10 ] || fail "positive control: Cargo.toml's deb assets: $(cat "$T/assets")"
mkdir -p "$T/pkg"
while IFS=$'\t' read -r src dest mode; do
    case $src in
    target/release/gpushare-hook) src=$GS_HOOK ;;
    target/release/gpushare-runtime) src=$GS_RUNTIME ;;
    target/release/libgpushare_limiter.so) src=$GS_LIMITER ;;
    target/release/libgpushare_simdriver.so) src=$GS_SIMDRIVER ;;
    target/*) echo "   not installed (not built by this test): $src"; continue ;;
    *) src=$GS_REPO/$src ;;
    esac
    [ -f "$src" ] || fail "package asset $src missing"
    if [ "${dest%/}" != "$dest" ]; then out=$T/pkg/$dest$(basename "$src"); else out=$T/pkg/$dest; fi
    install -D -m "$mode" "$src" "$out"
done <"$T/assets"
for f in usr/bin/gpushare-hook usr/bin/gpushare-runtime usr/lib/gpushare/test-only/libgpushare_simdriver.so \
    etc/gpushare/config.toml etc/containers/containers.conf.d/50-gpushare.conf; do
    [ -e "$T/pkg/$f" ] || fail "positive control: the package's $f was not staged"
done
ok "the package's files staged from this build"

# The host's files where the package, configure, the hook and the engines write: the same after
# the test (everything happened in the namespaces).
host_files() {
    find /etc/gpushare /etc/docker /etc/containerd /etc/containers /etc/cdi /var/run/cdi /usr/lib/gpushare \
        /usr/share/containers/oci /var/lib/gpushare /run/gpushare /tmp/gpushare-sim -xdev \
        -printf '%p %s %T@\n' 2>/dev/null | sort || true
    find /var/log /usr/bin -maxdepth 1 -name 'gpushare*' -printf '%p %s %T@\n' 2>/dev/null | sort || true
}
host_files >"$T/host.before"
# The parent cgroups the examples' engines make (containerd's namespace `default`, dockerd's
# `docker`, podman's `libpod_parent`): those that were not there before are removed at the end
# (rmdir: only when empty).
engine_cgroups() { ls -d /sys/fs/cgroup/default /sys/fs/cgroup/docker /sys/fs/cgroup/libpod_parent \
    /sys/fs/cgroup/*/default /sys/fs/cgroup/*/docker /sys/fs/cgroup/*/libpod_parent 2>/dev/null | sort || true; }
engine_cgroups >"$T/cgroups.before"
on_exit 'engine_cgroups | comm -13 "$T/cgroups.before" - | xargs -r rmdir'

# Inside: the steps below run in the private namespaces; everything there dies with them.
cat >"$T/inside.sh" <<'INSIDE'
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
has() { grep "$@" >/dev/null; }
wait_until() { local n=$(($1 * 10)); shift; while ((n-- > 0)); do "$@" && return 0; sleep 0.1; done; return 1; }
# The test's dir, reachable once /tmp is covered.
mount -t tmpfs gpushare-test /run || fail "tmpfs on /run"
mkdir -p /run/gs-test && mount --bind "$T" /run/gs-test || fail "bind $T"
GT=/run/gs-test
for d in etc usr varlib varlog; do mkdir -p "$GT/ov/$d/up" "$GT/ov/$d/work"; done
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$GT/ov/etc/up,workdir=$GT/ov/etc/work" /etc || fail "overlay /etc"
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$GT/ov/usr/up,workdir=$GT/ov/usr/work" /usr || fail "overlay /usr"
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$GT/ov/varlib/up,workdir=$GT/ov/varlib/work" /var/lib || fail "overlay /var/lib"
mount -t overlay overlay -o "lowerdir=/var/log,upperdir=$GT/ov/varlog/up,workdir=$GT/ov/varlog/work" /var/log || fail "overlay /var/log"
mkdir -p "$GT/tmp" && mount --bind "$GT/tmp" /tmp || fail "bind /tmp"
chmod 1777 /tmp
# The engines' storage on the test's disk (an overlay's upper dir cannot hold overlay mounts).
for d in containers docker containerd; do
    mkdir -p "$GT/storage/$d" /var/lib/$d && mount --bind "$GT/storage/$d" /var/lib/$d || fail "bind /var/lib/$d"
done
ip link set lo up

echo "== install the package's files and run its postinst"
for d in "$GT"/pkg/*; do cp -a "$d" / || fail "install the package's files ($d)"; done
sh "$GS_REPO/packaging/deb/maintainer-scripts/postinst" configure || fail "postinst configure"
command -v gpushare-hook | has -x /usr/bin/gpushare-hook || fail "gpushare-hook is not /usr/bin's"

# This machine's podman settings (no systemd, hybrid cgroups, no network for the examples).
cat >/etc/containers/containers.conf.d/99-this-machine.conf <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
EOF
podman import -q "$GT/busybox.tar" docker.io/library/busybox:latest >/dev/null || fail "podman import busybox"

echo "== a private dockerd (its config file: /etc/docker/daemon.json, written by configure below)"
dockerd --storage-driver=vfs --iptables=false --ip-masq=false >"$GT/dockerd.log" 2>&1 &
DOCKERD=$!
wait_until 60 docker version >/dev/null 2>&1 || { tail -20 "$GT/dockerd.log"; fail "dockerd did not come up"; }
docker import "$GT/busybox.tar" busybox:latest >/dev/null || fail "docker import busybox"
reload_docker() { kill -HUP "$DOCKERD"; }

echo "== a private containerd (Debian's config, its default socket)"
CONTAINERD=
start_containerd() {
    containerd >>"$GT/containerd.log" 2>&1 &
    CONTAINERD=$!
    wait_until 30 ctr version >/dev/null 2>&1 || { tail -20 "$GT/containerd.log"; fail "containerd did not come up"; }
}
restart_containerd() {
    kill "$CONTAINERD" && wait "$CONTAINERD"
    start_containerd
}
start_containerd

cleanup_inside() {
    set +e
    docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1
    podman rm -af -t 0 >/dev/null 2>&1
    for c in $(ctr containers ls -q 2>/dev/null); do ctr task kill -s KILL "$c"; ctr task rm -f "$c"; ctr containers rm "$c"; done >/dev/null 2>&1
    kill "$DOCKERD" "$CONTAINERD" 2>/dev/null
    wait "$DOCKERD" "$CONTAINERD" 2>/dev/null
    /usr/bin/gpushare-hook gc >/dev/null 2>&1
}
trap cleanup_inside EXIT

# Runs README block $1 line by line, each as written (or as MAP says), output in $GT/out.<n>.
n=0
run_block() {
    local label=$1 line run i rc status_out="" run_out="" log_before
    echo
    echo "==== README block: $label"
    log_before=$(wc -l </var/log/gpushare.log 2>/dev/null || echo 0)
    while IFS= read -r line; do
        run=$line
        echo "\$ $line"
        for i in "${!MAP_PAT[@]}"; do
            case $line in *"${MAP_PAT[$i]}"*)
                if [ "${MAP_RUN[$i]}" = - ]; then run=-; else run=${run//"${MAP_PAT[$i]}"/${MAP_RUN[$i]}}; fi
                echo "   (mapped: ${MAP_PAT[$i]} -> ${MAP_RUN[$i]}: ${MAP_WHY[$i]})" ;;
            esac
        done
        if [ "$run" = - ]; then echo "   (not run)"; continue; fi
        n=$((n + 1))
        eval "$run" </dev/null >"$GT/out.$n" 2>&1
        rc=$?
        sed 's/^/   | /' "$GT/out.$n"
        case $line in
        "gpushare-hook doctor"*) [ $rc -le 1 ] || fail "exit $rc: $line" ;; # 1: a check failed on this machine
        *) [ $rc -eq 0 ] || fail "exit $rc: $line" ;;
        esac
        case $line in
        "podman run "* | "docker run "* | "ctr run "*) run_out=$GT/out.$n ;;
        "gpushare-hook status"*) status_out=$GT/out.$n ;;
        esac
    done < <(awk -F'\t' -v want="$label" '$1 == "B" { inb = ($2 == want) } $1 == "L" && inb { print $2 }' "$GT/blocks")
    tail -n +"$((log_before + 1))" /var/log/gpushare.log 2>/dev/null | sed 's/^/   node log: /'
    if [ -n "$run_out" ]; then
        has -E '^/[^ ]+$' "$run_out" || fail "$label: the container printed no \$CUDA_MPS_PIPE_DIRECTORY path"
        ok "$label: the container's \$CUDA_MPS_PIPE_DIRECTORY is $(grep -E '^/' "$run_out")"
        tail -n +"$((log_before + 1))" /var/log/gpushare.log | grep 'acquired' | has 'mode=mps' ||
            { tail -5 /var/log/gpushare.log; fail "$label: the node's log has no share acquired in mode mps"; }
        ok "$label: the node's log: $(tail -n +"$((log_before + 1))" /var/log/gpushare.log | grep -m1 acquired | grep -o 'container=[^ ]* mode=mps')"
        tail -n +"$((log_before + 1))" /var/log/gpushare.log | has 'MPS daemon started on GPU 0' ||
            fail "$label: the node's log has no MPS daemon started for the container"
        ok "$label: the node's log: the GPU's MPS daemon started for it"
        [ -n "$status_out" ] || fail "$label: no gpushare-hook status in the block"
        has '^no GPU is shared' "$status_out" ||
            fail "$label: status after the container has gone still shows a share: $(cat "$status_out")"
        ok "$label: gpushare-hook status afterwards: no GPU is shared (released, the daemon stopped)"
    fi
}

run_block "Trying it without a GPU"
grep -q '^library = "/usr/lib/gpushare/test-only/libgpushare_simdriver.so"' /etc/gpushare/config.toml ||
    fail "the policy does not select the simulated driver after the README's sed"
has TEST-ONLY "$GT/out.2" || fail "doctor does not say TEST-ONLY"
ok "the policy selects the simulated driver; doctor says TEST-ONLY"

run_block podman
run_block Docker
has -F '"gpushare"' /etc/docker/daemon.json || fail "configure docker wrote no gpushare runtime in /etc/docker/daemon.json"
docker info --format '{{json .Runtimes}}' | has gpushare || fail "dockerd did not load the gpushare runtime"
ok "Docker: the dockerd reading /etc/docker/daemon.json (configure's) loaded runtime gpushare on SIGHUP"
run_block containerd
run_block "containerd or CRI-O under Kubernetes"
has gpushare /etc/containerd/config.toml || fail "configure containerd wrote no gpushare runtime"
ctr version >/dev/null || fail "containerd did not come back after the restart"
/usr/bin/gpushare-hook doctor 2>/dev/null | grep -i 'containerd' | sed 's/^/   doctor: /'
ok "containerd restarted with the config configure wrote"
run_block CDI
grep -l 'gpushare.io' /etc/cdi/* 2>/dev/null | has . || fail "cdi generate wrote no spec in /etc/cdi"
ok "CDI: the share device came from the spec in /etc/cdi ($(grep -l 'gpushare.io' /etc/cdi/*))"
echo "== inside: done"
INSIDE

{
    declare -p MAP_PAT MAP_RUN MAP_WHY
    echo "T=$T GS_REPO=$GS_REPO"
    echo "export PATH=$SAFE_PATH"
} >"$T/inside.env"
# The node's environment: none of the test's GPUSHARE_* settings.
set +e
env -u GPUSHARE_CONFIG -u GPUSHARE_SIM_STATE -u GPUSHARE_SIM_DEVICES \
    unshare --mount --net --pid --fork --mount-proc --propagation private \
    bash -c "source '$T/inside.env'; source '$T/inside.sh'" </dev/null 2>&1 | tee "$T/inside.out"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || fail "the README's examples (above) exit $rc"
has -x '== inside: done' "$T/inside.out" || fail "the README's examples did not all run"
for w in 'podman: the container' 'Docker: the container' 'containerd: the container' 'CDI: the container'; do
    has "^ok: $w" "$T/inside.out" || fail "positive control: no \"$w\" line"
done
host_files >"$T/host.after"
engine_cgroups | comm -13 "$T/cgroups.before" - | xargs -r rmdir || fail "a cgroup the engines made is not empty"
[ -z "$(engine_cgroups | comm -13 "$T/cgroups.before" -)" ] || fail "cgroups left: $(engine_cgroups | comm -13 "$T/cgroups.before" -)"
diff "$T/host.before" "$T/host.after" || fail "the host's files changed (above): the examples must run in the namespaces only"
ok "the host's /etc, /usr, /var/lib, /var/log, /run and /tmp files of gpushare and the engines are as before"
ok "every README engine example ran as written on the simulated driver"
