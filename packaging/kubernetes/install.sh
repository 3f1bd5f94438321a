#!/bin/sh
# gpushare node installer: what the DaemonSet (daemonset.yaml) runs on each GPU node, from its
# image. Installs the binaries, the limiter, the CRI-O hooks and a default policy onto the node's
# root, then wires gpushare into the node's container runtime with `gpushare-hook configure`.
# Idempotent: files already as they should be are left alone, an existing policy is kept.
#
# Environment:
#   HOST_ROOT  the node's / as mounted in the pod (default /host)
#   PREFIX     where the files go on the node (default /usr/local): PREFIX/bin, PREFIX/lib/gpushare
#   ENGINE     containerd, crio or auto (default): found from the node's /etc and /run
#   RESTART    false (default): print how to restart the runtime; true: restart it through the
#              node's systemd when something changed (needs hostPID; running containers keep
#              running)
#   ACTION     install (default), or uninstall: `gpushare-hook configure <engine> --remove`, then
#              the binaries, the limiter and the policy this installer wrote are removed (a
#              policy the admin edited is kept, and said so)
#   MIN_GLIBC  the oldest glibc the binaries run with (default 2.17); a node with an older one
#              is refused before anything is copied
#   SRC        the image's files (default /opt/gpushare)
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
PREFIX=${PREFIX:-/usr/local}
ENGINE=${ENGINE:-auto}
RESTART=${RESTART:-false}
ACTION=${ACTION:-install}
MIN_GLIBC=${MIN_GLIBC:-2.17}
SRC=${SRC:-/opt/gpushare}

say() { echo "gpushare-install: $*"; }
die() {
    echo "gpushare-install: $*" >&2
    exit 1
}

[ -d "$HOST_ROOT" ] || die "HOST_ROOT=$HOST_ROOT is not a directory; mount the node's / there"
case $PREFIX in /*) ;; *) die "PREFIX=$PREFIX must be an absolute path" ;; esac
case $RESTART in true | false) ;; *) die "RESTART=$RESTART must be true or false" ;; esac
case $ACTION in install | uninstall) ;; *) die "ACTION=$ACTION must be install or uninstall" ;; esac
case $MIN_GLIBC in [0-9]*.[0-9]*) ;; *) die "MIN_GLIBC=$MIN_GLIBC must be a version like 2.17" ;; esac
for f in bin/gpushare-hook bin/gpushare-runtime lib/libgpushare_limiter.so config.toml.example; do
    [ -f "$SRC/$f" ] || die "$SRC/$f is missing from the image; rebuild it from packaging/kubernetes/Containerfile"
done
R=${HOST_ROOT%/}

# Which runtime to wire in: decided before anything is written.
if [ "$ENGINE" = auto ]; then
    found=""
    if [ -d "$R/etc/containerd" ] || [ -S "$R/run/containerd/containerd.sock" ]; then found="$found containerd"; fi
    if [ -d "$R/etc/crio" ] || [ -S "$R/run/crio/crio.sock" ]; then found="$found crio"; fi
    set -- $found
    [ $# -eq 1 ] || die "found container runtimes: ${found:- none}; set ENGINE to containerd or crio"
    ENGINE=$1
fi
case $ENGINE in containerd | crio) ;; *) die "ENGINE=$ENGINE: gpushare installs for containerd or crio" ;; esac
say "container runtime: $ENGINE"

# The node's glibc version, from its libc.so.6 ("... release version 2.36."), without running it.
node_glibc() {
    for l in "$R"/lib64/libc.so.6 "$R"/lib/*-linux-gnu/libc.so.6 "$R"/usr/lib64/libc.so.6 \
        "$R"/usr/lib/*-linux-gnu/libc.so.6 "$R"/lib/libc.so.6 "$R"/usr/lib/libc.so.6; do
        [ -f "$l" ] || continue
        v=$(grep -aoE 'release version [0-9]+\.[0-9]+' "$l" | head -n 1 | sed 's/^release version //')
        if [ -n "$v" ]; then
            echo "$v ${l#"$R"}"
            return 0
        fi
    done
    return 1
}
# Whether version $1 >= $2 (major.minor).
version_ge() {
    a1=${1%%.*} a2=${1#*.} b1=${2%%.*} b2=${2#*.}
    a2=${a2%%.*} b2=${b2%%.*}
    [ "$a1" -gt "$b1" ] || { [ "$a1" -eq "$b1" ] && [ "$a2" -ge "$b2" ]; }
}
if [ "$ACTION" = install ]; then
    glibc=$(node_glibc) || die "no glibc found on the node (libc.so.6 under /lib64, /lib/*-linux-gnu, /usr/lib64, /usr/lib); gpushare's binaries need glibc $MIN_GLIBC or newer; nothing was installed"
    version_ge "${glibc%% *}" "$MIN_GLIBC" ||
        die "the node's glibc is ${glibc%% *} (${glibc#* }); gpushare's binaries need glibc $MIN_GLIBC or newer; nothing was installed"
    say "node glibc ${glibc%% *} (needs $MIN_GLIBC or newer)"
fi

# Whether anything on the node changed (the runtime is restarted only then).
changed=false

# Copies $1 to $R$2 with mode $3 through a temp file and a rename (a running binary is replaced,
# never written into); a file already identical is left alone.
put() { # source node-path mode
    dest=$R$2
    if [ -f "$dest" ] && cmp -s "$1" "$dest"; then
        chmod "$3" "$dest"
        say "unchanged $2"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    tmp=$(dirname "$dest")/.$(basename "$dest").gpushare-new
    cp "$1" "$tmp" && chmod "$3" "$tmp" && mv -f "$tmp" "$dest" || {
        rm -f "$tmp"
        die "cannot write $2 on the node"
    }
    changed=true
    say "installed $2"
}
# Writes stdin to $R$1 the same way.
put_text() { # node-path mode
    t=$(mktemp)
    cat >"$t"
    put "$t" "$1" "$2"
    rm -f "$t"
}

BIN=$PREFIX/bin
LIB=$PREFIX/lib/gpushare

POLICY=/etc/gpushare/config.toml
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# The policy this installer writes: the example with this node's paths.
sed -e "s#^hook = \"/usr/bin/gpushare-hook\"#hook = \"$BIN/gpushare-hook\"#" \
    -e "s#^library = \"/usr/lib/gpushare/libgpushare_limiter.so\"#library = \"$LIB/libgpushare_limiter.so\"#" \
    "$SRC/config.toml.example" >"$OUT/default-policy.toml"

case $ENGINE in
containerd) restart="systemctl restart containerd" ;;
crio) restart="systemctl restart crio" ;;
esac
# Restarts the runtime when asked and something changed; else says what to run.
finish() {
    if [ "$changed" = false ]; then
        say "nothing changed on the node; $ENGINE not restarted"
    elif [ "$RESTART" = true ]; then
        nsenter -t 1 -m -u -i -n -p -- $restart || die "'$restart' on the node failed"
        say "restarted $ENGINE ($restart); running containers keep running"
    else
        say "restart $ENGINE to load the change: '$restart' on the node (running containers keep running), or set RESTART=true"
    fi
    say "done"
}
# Runs `gpushare-hook configure` (with $@), shows what it did, notes whether it changed a file.
configure() {
    "$SRC/bin/gpushare-hook" configure "$@" >"$OUT/configure.out" || {
        cat "$OUT/configure.out"
        die "gpushare-hook configure $* failed (above)"
    }
    if grep -Eq '^(written|created|removed) ' "$OUT/configure.out"; then
        changed=true
    fi
    grep -E '^(written|created|removed|kept|replaced) ' "$OUT/configure.out" | sed 's/^/gpushare-install: /' || true
}
# Removes $R$1 when it is there.
unput() {
    if [ -e "$R$1" ]; then
        rm -f "$R$1" || die "cannot remove $1 on the node"
        changed=true
        say "removed $1"
    fi
}

if [ "$ACTION" = uninstall ]; then
    # --config /dev/null: the removal needs no policy (the node's may be broken).
    case $ENGINE in
    containerd) configure containerd --config /dev/null --remove --path "$R/etc/containerd/config.toml" ;;
    crio)
        configure crio --config /dev/null --remove --path "$R/etc/crio/crio.conf.d/10-gpushare.conf" \
            --hooks-dir "$R/etc/containers/oci"
        # The drop-in is the installer's own: what configure left (the node's hooks dirs) goes too.
        unput /etc/crio/crio.conf.d/10-gpushare.conf
        ;;
    esac
    unput "/etc/gpushare/$ENGINE-gpushare.toml"
    unput "$BIN/gpushare-hook"
    unput "$BIN/gpushare-runtime"
    unput "$LIB/libgpushare_limiter.so"
    rmdir "$R$LIB" 2>/dev/null || true
    if [ -f "$R$POLICY" ] && cmp -s "$OUT/default-policy.toml" "$R$POLICY"; then
        unput "$POLICY"
        rmdir "$R/etc/gpushare" 2>/dev/null || true
    elif [ -f "$R$POLICY" ]; then
        say "kept $POLICY: it is not the one this installer wrote (edited by the admin)"
    fi
    finish
    exit 0
fi

# The policy: the node's own if it has one, else the example with this node's paths.
if [ -e "$R$POLICY" ]; then
    USE_POLICY=$R$POLICY
    NEW_POLICY=""
else
    NEW_POLICY=$OUT/config.toml
    USE_POLICY=$NEW_POLICY
    cp "$OUT/default-policy.toml" "$NEW_POLICY"
    grep -qx "hook = \"$BIN/gpushare-hook\"" "$NEW_POLICY" && grep -qx "library = \"$LIB/libgpushare_limiter.so\"" "$NEW_POLICY" ||
        die "$SRC/config.toml.example does not name the default hook and limiter paths; rebuild the image"
fi

# `gpushare-hook configure` prints the engine's files as `# ---- PATH` sections (`(merge)`: to be
# merged into an existing file). It names the policy file the hooks must read: the node's path.
# Made before anything is written: a policy it refuses stops the install here.
# CRI-O: a drop-in's hooks_dir replaces the list of the files before it, so the drop-in starts
# from the node's own list (the last file that sets it), and configure adds gpushare's dir to it.
SEED=""
if [ "$ENGINE" = crio ]; then
    DROPIN=/etc/crio/crio.conf.d/10-gpushare.conf
    node_dirs=""
    for f in "$R/etc/crio/crio.conf" "$R"/etc/crio/crio.conf.d/*.conf; do
        [ -f "$f" ] && [ "$f" != "$R$DROPIN" ] || continue
        d=$(awk '
            /^[ \t]*hooks_dir[ \t]*=/ { on = 1; v = "" }
            on { v = v $0 "\n"; if ($0 ~ /\]/) { on = 0; last = v } }
            END { printf "%s", last }' "$f")
        [ -n "$d" ] && node_dirs=$d
    done
    if [ -n "$node_dirs" ]; then
        SEED=$OUT/seed.conf
        printf '[crio.runtime]\n%s' "$node_dirs" >"$SEED"
        say "the node's CRI-O hooks_dir is kept in $DROPIN, with gpushare's added"
    fi
fi
"$SRC/bin/gpushare-hook" configure "$ENGINE" --config "$USE_POLICY" --policy-at "$POLICY" ${SEED:+--path "$SEED"} --print >"$OUT/all" ||
    die "gpushare-hook configure $ENGINE refused the policy or failed (above); fix $POLICY on the node"
sed -i "s#$USE_POLICY#$POLICY#g" "$OUT/all"
[ -z "$SEED" ] || sed -i "s#^\# ---- $SEED\$#\# ---- $DROPIN#" "$OUT/all"
awk -v out="$OUT" '
    /^# ---- / { n++; sub(/^# ---- /, ""); print > (out "/" n ".path"); next }
    n { print > (out "/" n ".body") }' "$OUT/all"

ls "$OUT"/*.path >/dev/null 2>&1 || die "gpushare-hook configure $ENGINE printed no files"

put "$SRC/bin/gpushare-hook" "$BIN/gpushare-hook" 0755
put "$SRC/bin/gpushare-runtime" "$BIN/gpushare-runtime" 0755
put "$SRC/lib/libgpushare_limiter.so" "$LIB/libgpushare_limiter.so" 0644
if [ -n "$NEW_POLICY" ]; then
    put "$NEW_POLICY" "$POLICY" 0644
else
    say "kept the node's $POLICY"
fi

merge=""
for p in "$OUT"/*.path; do
    path=$(cat "$p")
    body=${p%.path}.body
    case $path in
    *" (merge)")
        path=${path% (merge)}
        # Merged into the engine's main config by `gpushare-hook configure --path`, where this
        # gpushare has it; else kept next to the policy for the admin to merge.
        if "$SRC/bin/gpushare-hook" configure --help 2>/dev/null | grep -q -- '--path'; then
            # --allow-missing: the entries name the node's paths, which this container sees under $R.
            configure "$ENGINE" --config "$USE_POLICY" --policy-at "$POLICY" --path "$R$path" --allow-missing
            say "merged the gpushare runtime handler into $path"
        else
            put_text "/etc/gpushare/$ENGINE-gpushare.toml" 0644 <"$body"
            merge="$merge $path"
            say "merge /etc/gpushare/$ENGINE-gpushare.toml into $path (this gpushare-hook cannot merge it itself)"
        fi
        ;;
    *) put_text "$path" 0644 <"$body" ;;
    esac
done

if [ -n "$merge" ]; then
    say "not restarting $ENGINE: merge first, then run '$restart' on the node"
    say "done"
else
    finish
fi
