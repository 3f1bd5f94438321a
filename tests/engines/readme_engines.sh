#!/usr/bin/env bash
# The shell examples of README.md, or of docs/install.md with GS_DOC=docs/install.md, as
# written, on a node with the package installed and the TEST-ONLY simulated driver selected as
# the README's "Trying it without a GPU" says. The ```sh blocks are read from the document (a
# change of the document is what is tested) and every line runs as written, in a
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
# host's files are checked unchanged afterwards. A ```sh block the test does not know fails it,
# and so does a known block that is gone.
#
# docs/install.md runs on a fresh node of its own, where also: NVIDIA's CDI spec is in /etc/cdi
# (lib.sh nvidia_cdi_spec: the form `nvidia-ctk cdi generate` writes), NVIDIA's config file
# /etc/nvidia-container-runtime/config.toml is the toolkit's stock one
# (tests/fixtures/nvidia-container-runtime/config.toml), and dockerd is Debian 13's Docker 26
# (its CDI examples need Docker 25+) with `"features": {"cdi": true}` in /etc/docker/daemon.json,
# as the guide says Docker 25 to 28.1 need.
#
# It checks the host's engine cgroups, /etc/cdi and /var/run/cdi unchanged afterwards: it holds
# the host-wide lock alone (lib.sh).
GS_LOCK=exclusive
source "$(dirname "$0")/lib.sh"
DOC=${GS_DOC:-README.md}
need podman docker dockerd containerd ctr runc jq python3 unshare ip gzip
DOCKERD_BIN=dockerd DOCKERD_PATH=$SAFE_PATH
if [ "$DOC" = docs/install.md ]; then
    need mknod
    need_trixie usr/sbin/dockerd usr/bin/containerd usr/bin/containerd-shim-runc-v2
    DOCKERD_BIN=$TRIXIE/usr/sbin/dockerd DOCKERD_PATH=$TRIXIE/usr/bin:$TRIXIE/usr/sbin:$SAFE_PATH
fi
engine_version podman podman --version
engine_version dockerd "$DOCKERD_BIN" --version
engine_version containerd containerd --version

# What cannot run literally on a CI machine, what runs instead, and why. A README line that
# contains PATTERN has it replaced by RUN (`-`: the line is not run).
MAP_PAT=() MAP_RUN=() MAP_WHY=()
map() { MAP_PAT+=("$1") MAP_RUN+=("$2") MAP_WHY+=("$3"); }
map 'systemctl reload docker' 'reload_docker' \
    "no systemd here; docker.service's ExecReload is a SIGHUP to dockerd: SIGHUP to the test's private dockerd, done when its log says it reloaded"
map 'systemctl restart containerd' 'restart_containerd' \
    "no systemd here: the test's private containerd is stopped and started again"
map 'ctr image pull docker.io/library/busybox:latest' \
    'ctr image import --index-name docker.io/library/busybox:latest "$GT/busybox-oci.tar"' \
    "no registry on CI: the locally built busybox image is imported under that name"
map 'kubectl apply' '-' \
    "no cluster here: the manifests are validated by tests/kubernetes.rs (and the DRA ones by gpushare-dra's tests)"
map 'systemctl restart crio' '-' \
    "CRI-O is not installed on this machine (Debian 12 has no package): the drop-in configure crio wrote is checked below; what CRI-O v1.37.0 accepts: tests/crio.rs"
map 'scripts/install-deps.sh' '-' \
    "the test suite's installer: this machine's engines and tools are installed already"
map 'packaging/deb/build.sh' '-' \
    "the .deb is built, its contents checked, installed, used and purged by tests/engines/package.sh; here this build's files are installed as the package's"
map 'dpkg -i target/debian/' '-' \
    "the .deb is installed (and purged) by tests/engines/package.sh; here this build's files are installed as the package's"
map 'cargo build --release' '-' \
    "the binaries under test are the ones cargo test built; the lines below install those"
map 'target/release/' '$BUILT/' \
    "the binaries under test, where cargo test built them (\$BUILT)"
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
declare -A NOT_RUN=()
case $DOC in
README.md)
    NOT_RUN=(
        ["Install from the package"]="this build's files are installed as the package's (Cargo.toml's deb assets, postinst); the .deb itself: tests/engines/package.sh"
        ["Kubernetes with DRA"]="no cluster here: the manifests are validated by tests/kubernetes.rs, the plugin by gpushare-dra's tests"
        ["Demo and tests"]="scripts/demo.sh is run by tests/demo.rs on the binaries the suite built (GS_DEMO_BIN: its own build step is timed by scripts/time-demo-fresh.sh); scripts/test.sh is the suite this test is part of (.ci/run runs it)"
    )
    RUN_ORDER=("Trying it without a GPU" "podman" "Docker" "containerd" "containerd or CRI-O under Kubernetes" "CDI")
    ;;
docs/install.md)
    # nvidia-container-runtime comes last: gpushare first puts NVIDIA's runtime, not installed
    # here, in the policy's [runtime] next.
    RUN_ORDER=("Install, then one command per engine" "podman" "Docker" "CDI: the first way, on every engine that reads CDI specs"
        "containerd" "CRI-O" "By hand: runc with the hook in \`config.json\`" "Behind or in front of nvidia-container-runtime")
    ;;
*) fail "GS_DOC=$DOC: README.md or docs/install.md" ;;
esac

# The document's ```sh blocks: "B<TAB>label" then "L<TAB>line" per line; the label is the bold
# text opening the paragraph above the block, or the heading.
awk '
    /^## / { label = substr($0, 4) }
    /^\*\*[^*]+\*\*/ { s = substr($0, 3); label = substr(s, 1, index(s, "**") - 1) }
    /^```/ { if (insh) { insh = 0; next } if ($0 == "```sh") { insh = 1; print "B\t" label }; next }
    insh && NF { print "L\t" $0 }
' "$GS_REPO/$DOC" >"$T/blocks"
while IFS=$'\t' read -r kind label; do
    [ "$kind" = B ] || continue
    known=no
    for l in "${RUN_ORDER[@]}"; do if [ "$l" = "$label" ]; then known=yes; fi; done
    if [ -n "${NOT_RUN[$label]+x}" ]; then known=yes; fi
    [ $known = yes ] || fail "$DOC has a sh block under \"$label\" that this test does not know: run it here, or say why not"
done <"$T/blocks"
for l in "${RUN_ORDER[@]}"; do
    has -xF "$(printf 'B\t%s' "$l")" "$T/blocks" || fail "$DOC has no sh block under \"$l\" any more: update this test"
done
nblocks=$(grep -c '^B' "$T/blocks")
[ "$nblocks" -ge 8 ] || { cat "$T/blocks"; fail "positive control: $nblocks sh blocks found in $DOC"; }
ok "$DOC: $nblocks sh blocks, each run here or named with why not"
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

# The binaries under test for the install guide's by-hand lines (target/release/ there).
mkdir -p "$T/built"
cp "$GS_HOOK" "$GS_RUNTIME" "$GS_LIMITER" "$T/built/"
# The install guide's node: NVIDIA's CDI spec (its driver files under the test's dir, reached at
# /run/gs-test inside) and NVIDIA's stock config file.
if [ "$DOC" = docs/install.md ]; then
    nvidia_cdi_spec | sed "s#$T/#/run/gs-test/#g" >"$T/nvidia.yaml"
    sed -i "s#$T/#/run/gs-test/#g" "$T/driver/usr/bin/nvidia-cdi-hook"
    has -F 'hostPath: /run/gs-test/driver/dev/nvidia0' "$T/nvidia.yaml" || fail "positive control: NVIDIA's spec rendered for inside"
fi

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

if [ "$DOC" = docs/install.md ]; then
    echo "== NVIDIA's CDI spec in /etc/cdi, NVIDIA's stock config file, Docker's CDI feature on"
    mkdir -p /etc/cdi /etc/nvidia-container-runtime /etc/docker
    cp "$GT/nvidia.yaml" /etc/cdi/nvidia.yaml || fail "NVIDIA's CDI spec"
    cp "$GS_REPO/tests/fixtures/nvidia-container-runtime/config.toml" /etc/nvidia-container-runtime/config.toml || fail "NVIDIA's config file"
    [ ! -e /etc/docker/daemon.json ] || fail "this machine has an /etc/docker/daemon.json: the node's should be Docker's stock (none)"
    echo '{"features": {"cdi": true}}' >/etc/docker/daemon.json
    # The node's policy selects the simulated driver as README.md's "Trying it without a GPU" says.
    sed -i 's#^library = "libnvidia-ml.so.1"#library = "/usr/lib/gpushare/test-only/libgpushare_simdriver.so"#' /etc/gpushare/config.toml
    has -x 'library = "/usr/lib/gpushare/test-only/libgpushare_simdriver.so"' /etc/gpushare/config.toml || fail "the simulated driver is not selected"
fi

echo "== a private dockerd $("$DOCKERD_BIN" --version) (its config file: /etc/docker/daemon.json, written by configure below)"
env PATH="$DOCKERD_PATH" "$DOCKERD_BIN" --storage-driver=vfs --iptables=false --ip-masq=false >"$GT/dockerd.log" 2>&1 &
DOCKERD=$!
wait_until 60 docker version >/dev/null 2>&1 || { tail -20 "$GT/dockerd.log"; fail "dockerd did not come up"; }
docker import "$GT/busybox.tar" busybox:latest >/dev/null || fail "docker import busybox"
# docker.service's ExecReload, then until dockerd has logged the reload's outcome (a SIGHUP is
# handled in the background): "Reloaded configuration", else "Error reconfiguring the daemon".
reload_docker() {
    local before pat='Reloaded configuration|Error reconfiguring'
    before=$(grep -c -E "$pat" "$GT/dockerd.log")
    kill -HUP "$DOCKERD" || return 1
    reloaded() { [ "$(grep -c -E "$pat" "$GT/dockerd.log")" -gt "$before" ]; }
    wait_until 20 reloaded || { echo "dockerd logged no reload:"; tail -15 "$GT/dockerd.log"; return 1; }
    tail -n +"$((before + 1))" "$GT/dockerd.log" | grep -E "$pat" | cut -c1-200
    ! tail -n +"$((before + 1))" "$GT/dockerd.log" | has 'Error reconfiguring'
}

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
    local label=$1 line run i rc status_out="" run_outs=() log_before out acquired
    echo
    echo "==== $DOC block: $label"
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
        "podman run "* | "docker run "* | "ctr run "*) run_outs+=("$GT/out.$n") ;;
        "gpushare-hook status"*) status_out=$GT/out.$n ;;
        esac
    done < <(awk -F'\t' -v want="$label" '$1 == "B" { inb = ($2 == want) } $1 == "L" && inb { print $2 }' "$GT/blocks")
    tail -n +"$((log_before + 1))" /var/log/gpushare.log 2>/dev/null | sed 's/^/   node log: /'
    if [ ${#run_outs[@]} -gt 0 ]; then
        for out in "${run_outs[@]}"; do
            has -E '^/[^ ]+$' "$out" || fail "$label: a container printed no \$CUDA_MPS_PIPE_DIRECTORY path: $(cat "$out")"
            ok "$label: the container's \$CUDA_MPS_PIPE_DIRECTORY is $(grep -E '^/' "$out")"
        done
        tail -n +"$((log_before + 1))" /var/log/gpushare.log | grep 'acquired' | grep 'mode=mps' >"$GT/acquired.$n"
        acquired=$(wc -l <"$GT/acquired.$n")
        [ "$acquired" -eq ${#run_outs[@]} ] ||
            { tail -5 /var/log/gpushare.log; fail "$label: the node's log has $acquired shares acquired in mode mps for ${#run_outs[@]} containers"; }
        while read -r line; do ok "$label: the node's log: $(echo "$line" | grep -o 'container=[^ ]* mode=mps.*')"; done <"$GT/acquired.$n"
        tail -n +"$((log_before + 1))" /var/log/gpushare.log | has 'MPS daemon started on GPU 0' ||
            fail "$label: the node's log has no MPS daemon started for the container"
        ok "$label: the node's log: the GPU's MPS daemon started for it"
        [ -n "$status_out" ] || fail "$label: no gpushare-hook status in the block"
        has '^no GPU is shared' "$status_out" ||
            fail "$label: status after the container has gone still shows a share: $(cat "$status_out")"
        ok "$label: gpushare-hook status afterwards: no GPU is shared (released, the daemon stopped)"
    fi
}

readme_blocks() {
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
}

install_blocks() {
run_block "Install, then one command per engine"
has TEST-ONLY "$GT/out.1" || fail "doctor does not say TEST-ONLY"
ok "the installed package's doctor ran on the simulated driver"
run_block podman
has update-ldcache "$GT/cdi-hook.log" || fail "podman: NVIDIA's CDI device was not applied (its nvidia-cdi-hook did not run)"
ok "podman: NVIDIA's CDI device nvidia.com/gpu=0 was applied (its nvidia-cdi-hook ran)"
run_block Docker
docker info --format '{{json .Runtimes}}' | has gpushare || fail "dockerd did not load the gpushare runtime"
ok "Docker: dockerd loaded runtime gpushare on SIGHUP"
: >"$GT/cdi-hook.log"
run_block "CDI: the first way, on every engine that reads CDI specs"
jq -e '[.devices[].name] | index("small") and index("mps")' /var/run/cdi/gpushare.io-share.json >/dev/null ||
    fail "cdi generate wrote no devices small and mps in /var/run/cdi/gpushare.io-share.json"
grep acquired "$GT/acquired.$n" | grep -c 'cores=25' | has -x 1 || fail "CDI: the profile small (cores 25) was not what one container got"
[ "$(grep -c update-ldcache "$GT/cdi-hook.log")" -eq 2 ] || fail "CDI: NVIDIA's CDI device was not applied to both containers"
ok "CDI: podman and Docker $(docker version --format '{{.Server.Version}}') got NVIDIA's device and the share devices mps and small (cores=25) from the specs"
run_block containerd
has gpushare /etc/containerd/config.toml || fail "configure containerd wrote no gpushare runtime"
ctr plugins ls | grep -E '^io.containerd.grpc.v1 +cri ' | has ' ok' || fail "containerd's CRI plugin did not load the config configure wrote"
ok "containerd restarted with the config configure wrote; its CRI plugin is ok"
run_block CRI-O
f=/etc/crio/crio.conf.d/10-gpushare.conf
has -F '[crio.runtime.runtimes.gpushare]' "$f" && has -F 'runtime_path = "/usr/bin/gpushare-runtime"' "$f" ||
    { cat "$f"; fail "configure crio wrote no gpushare handler running /usr/bin/gpushare-runtime in $f"; }
ok "CRI-O: $f has the gpushare handler (CRI-O is not installed here: not restarted)"
run_block "By hand: runc with the hook in \`config.json\`"
for b in gpushare-hook gpushare-runtime; do
    cmp "$GT/built/$b" /usr/bin/$b && [ "$(stat -c %a /usr/bin/$b)" = 755 ] || fail "by hand: /usr/bin/$b is not the built one, mode 755"
done
cmp "$GT/built/libgpushare_limiter.so" /usr/lib/gpushare/libgpushare_limiter.so && [ "$(stat -c %a /usr/lib/gpushare/libgpushare_limiter.so)" = 644 ] ||
    fail "by hand: the limiter is not the built one, mode 644"
ok "by hand: the built binaries in /usr/bin (755) and the limiter in /usr/lib/gpushare (644)"
cp /etc/nvidia-container-runtime/config.toml "$GT/nvidia-config.before"
run_block "Behind or in front of nvidia-container-runtime"
python3 - /etc/gpushare/config.toml /etc/nvidia-container-runtime/config.toml "$GT/nvidia-config.before" <<'EOF' || fail "nvidia-container-runtime: the files configure wrote"
import sys, tomllib
policy, nvidia, before = (tomllib.load(open(p, "rb")) for p in sys.argv[1:])
assert policy["runtime"]["next"][0] == "nvidia-container-runtime", policy["runtime"]
runtimes = nvidia["nvidia-container-runtime"]["runtimes"]
assert runtimes[0] == "/usr/bin/gpushare-runtime", runtimes
assert runtimes[1:] == before["nvidia-container-runtime"]["runtimes"], runtimes
nvidia["nvidia-container-runtime"]["runtimes"] = runtimes[1:]
assert nvidia == before, "NVIDIA's other settings changed"
EOF
ok "nvidia-container-runtime: the policy's [runtime] next starts with nvidia-container-runtime; NVIDIA's runtimes with /usr/bin/gpushare-runtime, the rest of its stock file as it was"
}

case $DOC in
README.md) readme_blocks ;;
docs/install.md) install_blocks ;;
esac
echo "== inside: done"
INSIDE

{
    declare -p MAP_PAT MAP_RUN MAP_WHY
    echo "T=$T GS_REPO=$GS_REPO DOC=$DOC BUILT=/run/gs-test/built"
    declare -p DOCKERD_BIN DOCKERD_PATH
    echo "export PATH=$SAFE_PATH"
} >"$T/inside.env"
# The node's environment: none of the test's GPUSHARE_* settings.
set +e
env -u GPUSHARE_CONFIG -u GPUSHARE_SIM_STATE -u GPUSHARE_SIM_DEVICES \
    unshare --mount --net --pid --fork --mount-proc --propagation private \
    bash -c "source '$T/inside.env'; source '$T/inside.sh'" </dev/null 2>&1 | tee "$T/inside.out"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || fail "the examples of $DOC (above) exit $rc"
has -x '== inside: done' "$T/inside.out" || fail "the examples of $DOC did not all run"
case $DOC in
README.md) controls=('podman: the container' 'Docker: the container' 'containerd: the container' 'CDI: the container') ;;
*) controls=('podman: the container' 'Docker: the container' 'CDI: the first way, on every engine that reads CDI specs: the container'
    'CDI: podman and Docker' 'CRI-O: ' 'by hand: ' 'nvidia-container-runtime: ') ;;
esac
for w in "${controls[@]}"; do
    has "^ok: $w" "$T/inside.out" || fail "positive control: no \"$w\" line"
done
host_files >"$T/host.after"
engine_cgroups | comm -13 "$T/cgroups.before" - | xargs -r rmdir || fail "a cgroup the engines made is not empty"
[ -z "$(engine_cgroups | comm -13 "$T/cgroups.before" -)" ] || fail "cgroups left: $(engine_cgroups | comm -13 "$T/cgroups.before" -)"
diff "$T/host.before" "$T/host.after" || fail "the host's files changed (above): the examples must run in the namespaces only"
ok "the host's /etc, /usr, /var/lib, /var/log, /run and /tmp files of gpushare and the engines are as before"
ok "every engine example of $DOC ran as written on the simulated driver"
