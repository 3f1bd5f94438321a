#!/usr/bin/env bash
# Times scripts/demo.sh on a fresh Debian 12 machine: a new Debian 12 root (mmdebstrap, its
# default package set: required and important, nothing of this host's caches: no ~/.cargo, no
# target/, no zig), this repository's HEAD as `git archive` puts it, and `scripts/demo.sh` run
# there as root (chroot in a private mount and pid namespace, with /proc, /sys, /dev and the
# network of the host, so that runc can start containers). Prints the wall time of each phase:
#   deps       apt: the packages the demo needs
#   toolchain  rustup's toolchain, the zig linker and cargo-zigbuild
#   build      cargo build of what the demo runs
#   run        the demo itself
# and the load of this machine before and after. Needs root and the network (Debian's mirror,
# the Rust toolchain, crates.io, PyPI). Everything is removed at the end, on failure too.
#
#   scripts/time-demo-fresh.sh [WORKDIR]   (default: a new directory under /var/tmp)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "time-demo-fresh: needs root" >&2; exit 1; }
if ! command -v mmdebstrap >/dev/null; then
    echo "time-demo-fresh: installing mmdebstrap" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
fi
W=${1:-$(mktemp -d /var/tmp/gpushare-fresh-XXXXXX)}
R=$W/root
LOG=$W/demo.log
cleanup() {
    set +e
    rm -rf --one-file-system "$R"
}
trap cleanup EXIT
mkdir -p "$W"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs" >&2
echo "== a fresh Debian 12 root in $R (not timed)" >&2
mmdebstrap --quiet bookworm "$R" http://deb.debian.org/debian >"$W/mmdebstrap.log" 2>&1 \
    || { tail -20 "$W/mmdebstrap.log" >&2; exit 1; }
# This host's network settings, which any machine on its network needs: the resolver, the local
# CA certificates (an HTTPS proxy on the way out; ca-certificates' install adds them to the
# store) and pip's pointer to that store.
cp /etc/resolv.conf "$R/etc/resolv.conf"
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    mkdir -p "$R/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
fi
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$R/etc/pip.conf"
mkdir -p "$R/root/gpushare"
git -C "$REPO" archive HEAD | tar -x -C "$R/root/gpushare"
echo "== HEAD $(git -C "$REPO" rev-parse --short HEAD): scripts/demo.sh in the fresh root" >&2

# Each line of the demo's output, with the seconds since the start.
start=$(date +%s.%N)
set +e
R=$R unshare --mount --pid --fork --propagation private sh -c '
    set -e
    mount --bind "$R" "$R"   # the root a mount point, as runc needs (it makes / a slave mount)
    mount --rbind /dev "$R/dev"
    mount --rbind /sys "$R/sys"
    mount -t proc proc "$R/proc"
    mount -t tmpfs tmpfs "$R/run"
    exec chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c "cd /root/gpushare && scripts/demo.sh 2>&1"
' </dev/null 2>&1 | while IFS= read -r line; do
    printf '%8.1f %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$line"
done | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Phase boundaries: the first line of each phase.
at() { grep -m1 -E "$1" "$LOG" | awk '{print $1}'; }
t_tool=$(at 'install-deps: (installing the Rust|cargo install|.*installing ziglang|.* has zig)')
t_build=$(at '== building')
t_run=$(at '== (no )?NVIDIA GPU')
total=$(echo "$end - $start" | bc)
phase() { # name from to
    if [ -n "$2" ] && [ -n "$3" ]; then
        printf '  %-10s %7.1f s\n' "$1" "$(echo "$3 - $2" | bc)"
    else
        printf '  %-10s (not reached)\n' "$1"
    fi
}
echo "== scripts/demo.sh on a fresh Debian 12 root: exit $rc, $(printf '%.1f' "$total") s"
phase deps 0 "$t_tool"
phase toolchain "$t_tool" "$t_build"
phase build "$t_build" "$t_run"
phase run "$t_run" "$total"
exit "$rc"
