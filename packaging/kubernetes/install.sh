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
#              node's systemd (needs hostPID; running containers keep running)
#   SRC        the image's files (default /opt/gpushare)
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
PREFIX=${PREFIX:-/usr/local}
ENGINE=${ENGINE:-auto}
RESTART=${RESTART:-false}
SRC=${SRC:-/opt/gpushare}

say() { echo "gpushare-install: $*"; }
die() {
    echo "gpushare-install: $*" >&2
    exit 1
}

[ -d "$HOST_ROOT" ] || die "HOST_ROOT=$HOST_ROOT is not a directory; mount the node's / there"
case $PREFIX in /*) ;; *) die "PREFIX=$PREFIX must be an absolute path" ;; esac
case $RESTART in true | false) ;; *) die "RESTART=$RESTART must be true or false" ;; esac
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

# The policy: the node's own if it has one, else the example with this node's paths.
POLICY=/etc/gpushare/config.toml
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [ -e "$R$POLICY" ]; then
    USE_POLICY=$R$POLICY
    NEW_POLICY=""
else
    NEW_POLICY=$OUT/config.toml
    USE_POLICY=$NEW_POLICY
    sed -e "s#^hook = \"/usr/bin/gpushare-hook\"#hook = \"$BIN/gpushare-hook\"#" \
        -e "s#^library = \"/usr/lib/gpushare/libgpushare_limiter.so\"#library = \"$LIB/libgpushare_limiter.so\"#" \
        "$SRC/config.toml.example" >"$NEW_POLICY"
    grep -qx "hook = \"$BIN/gpushare-hook\"" "$NEW_POLICY" && grep -qx "library = \"$LIB/libgpushare_limiter.so\"" "$NEW_POLICY" ||
        die "$SRC/config.toml.example does not name the default hook and limiter paths; rebuild the image"
fi

# `gpushare-hook configure` prints the engine's files as `# ---- PATH` sections (`(merge)`: to be
# merged into an existing file). It names the policy file the hooks must read: the node's path.
# Made before anything is written: a policy it refuses stops the install here.
"$SRC/bin/gpushare-hook" configure "$ENGINE" --config "$USE_POLICY" --policy-at "$POLICY" --print >"$OUT/all" ||
    die "gpushare-hook configure $ENGINE refused the policy or failed (above); fix $POLICY on the node"
sed -i "s#$USE_POLICY#$POLICY#g" "$OUT/all"
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
            "$SRC/bin/gpushare-hook" configure "$ENGINE" --config "$USE_POLICY" --policy-at "$POLICY" --path "$R$path" --allow-missing >/dev/null ||
                die "gpushare-hook configure $ENGINE --path $path failed (above)"
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

case $ENGINE in
containerd) restart="systemctl restart containerd" ;;
crio) restart="systemctl restart crio" ;;
esac
if [ -n "$merge" ]; then
    say "not restarting $ENGINE: merge first, then run '$restart' on the node"
elif [ "$RESTART" = true ]; then
    nsenter -t 1 -m -u -i -n -p -- $restart || die "'$restart' on the node failed"
    say "restarted $ENGINE ($restart); running containers keep running"
else
    say "restart $ENGINE to load the gpushare runtime handler: '$restart' on the node (running containers keep running), or set RESTART=true"
fi
say "done"
