#!/usr/bin/env bash
# The .deb and .rpm end to end, on this machine: build both (cargo-deb, cargo-generate-rpm), check
# the .deb's contents (conffiles, modes, stripped binaries, man pages, completions), install it,
# point its policy at the TEST-ONLY simulated driver, `configure podman` (nothing to change: the
# package ships what configure writes) and `configure docker`, run podman (system containers.conf
# drop-in, installed hooks) and a private dockerd (the daemon.json configure wrote) through the
# installed binaries, reinstall (the policy edit survives), try to remove while a container uses
# a share and while a podman container runs on --runtime gpushare (both refused, the package
# stays working), then purge (which undoes `configure docker`) and check that the file list is
# the one before the install. The rpm's file list is checked.
# Always purges the package and restores the files it touched, even when it fails.
# It installs into the host, so it holds the host-wide lock alone (lib.sh). Both packages are
# built before it takes that lock (building them touches nothing of the host's), so that the
# other engine tests run meanwhile; the lock is taken before the checks and the install.
GS_LOCK_LATER=1 GS_LOCK=exclusive
source "$(dirname "$0")/lib.sh"
need dpkg dpkg-deb podman dockerd docker runc jq readelf rpm cargo-deb cargo-generate-rpm
unset GPUSHARE_CONFIG
PT=${GS_PACKAGE_TARGET:-$GS_REPO/target/package}
# GPUSHARE_PREBUILT (scripts/test.sh sets it to the workspace build the suite tests): both
# packages pack those binaries instead of a release build of their own (packaging/build-prep.sh).
if [ -n "${GPUSHARE_PREBUILT:-}" ]; then
    echo "== build the .deb (the suite's build from $GPUSHARE_PREBUILT, man pages and completions from the CLI)"
else
    echo "== build the .deb (release build, man pages and completions from the CLI)"
fi
DEB=$(CARGO_TARGET_DIR=$PT bash "$GS_REPO/packaging/deb/build.sh" 2>"$T/deb-build.log" | tail -1) || { cat "$T/deb-build.log"; fail "deb build"; }
echo "== build the .rpm (the same build)"
RPM=$(CARGO_TARGET_DIR=$PT bash "$GS_REPO/packaging/rpm/build.sh" 2>"$T/rpm-build.log" | tail -1) || { cat "$T/rpm-build.log"; fail "rpm build"; }
host_lock
if dpkg -s gpushare >/dev/null 2>&1; then
    skip "a gpushare package is already installed here; this test would replace and purge it"
fi
[ ! -e /etc/gpushare ] || skip "/etc/gpushare exists without the package; this test would remove it"

# Files outside the package this test may touch: saved now, put back at the end.
LOG=/var/log/gpushare.log
[ -e "$LOG" ] && cp -a "$LOG" "$T/log.saved"
restore_log() { rm -f "$LOG"; if [ -e "$T/log.saved" ]; then cp -a "$T/log.saved" "$LOG"; fi; }
on_exit restore_log
# The event log gpushare writes beside it: set aside, so that this test's is one gpushare created
# (the purge removes it); put back at the end.
EVENTS=/var/log/gpushare-events.jsonl
[ -e "$EVENTS" ] && mv "$EVENTS" "$T/events.saved"
restore_events() { rm -f "$EVENTS"; if [ -e "$T/events.saved" ]; then mv "$T/events.saved" "$EVENTS"; fi; }
on_exit restore_events
on_exit "GPUSHARE_FORCE_REMOVE=1 dpkg --purge gpushare"
on_exit "rm -f /etc/containers/containers.conf.d/50-gpushare.conf.bak-* /etc/containers/oci/hooks.d/gpushare-*.bak-* /etc/containers/oci/hooks.d-podman/gpushare-*.bak-*"
on_exit "podman_ rm -af -t 0"

[ -f "$DEB" ] || fail "no .deb built ($DEB)"
ok "built $DEB"
dpkg-deb -f "$DEB" Package Depends
[ "$(dpkg-deb -f "$DEB" Depends)" = "libc6 (>= 2.17)" ] || fail "the .deb does not state glibc 2.17 as its minimum"
ok "the .deb states its minimum glibc: libc6 (>= 2.17)"
dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles >"$T/conffiles"
for f in /etc/gpushare/config.toml /etc/containers/containers.conf.d/50-gpushare.conf /etc/logrotate.d/gpushare; do
    grep -qx "$f" "$T/conffiles" || { cat "$T/conffiles"; fail "$f is not a conffile"; }
done
ok "conffiles: policy, podman drop-in, logrotate"
dpkg-deb --ctrl-tarfile "$DEB" | tar -t | has -x './prerm' || fail "no prerm"
dpkg-deb -c "$DEB" >"$T/contents"
grep -E '^d' "$T/contents" | grep -Ev '^drwxr-xr-x (root/root|0/0) ' && fail "a directory without mode 0755 root/root"
grep -E ' \./usr/bin/gpushare-(hook|runtime|dra)$' "$T/contents" | grep -Ev '^-rwxr-xr-x (root/root|0/0) ' && fail "a binary without mode 0755 root/root"
for f in usr/share/man/man1/gpushare-hook.1.gz usr/share/man/man1/gpushare-hook-configure.1.gz \
    usr/share/man/man1/gpushare-runtime.1.gz usr/share/man/man5/gpushare-config.5.gz \
    usr/share/bash-completion/completions/gpushare-hook usr/share/zsh/vendor-completions/_gpushare-hook \
    usr/share/fish/vendor_completions.d/gpushare-hook.fish usr/share/doc/gpushare/copyright \
    usr/lib/tmpfiles.d/gpushare.conf usr/lib/gpushare/libgpushare_limiter.so \
    usr/lib/gpushare/test-only/libgpushare_simdriver.so \
    usr/lib/systemd/system/gpushare-serve.service usr/lib/systemd/system/gpushare-gc.timer \
    usr/share/gpushare/grafana/gpushare.json usr/bin/gpushare-dra; do
    grep -q " \./$f\$" "$T/contents" || fail "$f missing from the .deb"
done
ok "modes 0755 root/root, man pages, completions, copyright, tmpfiles.d"
mkdir -p "$T/deb" && dpkg-deb -x "$DEB" "$T/deb"
for b in usr/bin/gpushare-hook usr/bin/gpushare-runtime usr/bin/gpushare-dra; do
    readelf -S "$T/deb/$b" | has '\.symtab' && fail "$b is not stripped"
done
ok "binaries stripped"

# What is on the node before the install, where the package, configure and gpushare write: the
# list after the purge must be the same. A log gpushare did not create is there first, and stays.
snapshot() {
    {
        find /etc/gpushare /etc/containers /etc/docker /etc/cdi /etc/crio /etc/logrotate.d \
            /usr/lib/gpushare /usr/share/containers /usr/share/doc/gpushare /usr/share/gpushare \
            /var/lib/gpushare /run/gpushare /var/run/cdi /usr/lib/systemd/system /usr/lib/tmpfiles.d \
            /usr/share/bash-completion/completions /usr/share/fish/vendor_completions.d \
            /usr/share/zsh/site-functions /usr/share/man -xdev 2>/dev/null || true
        find /var/log /usr/bin -maxdepth 1 -name 'gpushare*' 2>/dev/null || true
    } | sort
}
# A /run/gpushare there before the install is not the package's (a gpushare of this build, run
# by another test with the default state dir, made it): it is kept aside while the package is
# installed and purged, and put back after, so that the purge's removal of its state dir is checked
# on the package's own. Said, with what it held, so that its maker can be found.
if [ -e /run/gpushare ]; then
    echo "note: /run/gpushare was there before the install, kept aside until the test ends: $(find /run/gpushare | tr '\n' ' ')"
    mv /run/gpushare "$T/run-gpushare.before" || fail "cannot keep /run/gpushare aside"
    on_exit 'rm -rf /run/gpushare; mv "$T/run-gpushare.before" /run/gpushare'
fi
[ -e "$LOG" ] || echo "a log gpushare did not create" >"$LOG"
LOG_FIRST=$(head -1 "$LOG")
# Left out of both lists: the event log (other tests beside this one may write it; its own
# check after the purge goes by inode), and Docker's trust key, which dockerd 20.10 writes at
# its first start on a node (this test's own dockerd, on a machine where none ran before).
listed() { snapshot | grep -vxF -e "$EVENTS" -e /etc/docker/key.json; }
listed >"$T/files.before"
grep -q . "$T/files.before" || fail "positive control: the file list before the install is empty"

echo "== install"
dpkg -i "$DEB" >"$T/dpkg.out" 2>&1 || { cat "$T/dpkg.out"; fail "dpkg -i"; }
jq -e '.kind == "gpushare.io/share" and ([.devices[].name] | index("mps"))' /etc/cdi/gpushare.io-share.json >/dev/null ||
    { cat "$T/dpkg.out"; fail "the package did not write its CDI spec to /etc/cdi"; }
ok "the package wrote /etc/cdi/gpushare.io-share.json"
# A /etc/cdi the install made is noted, for removal to take away (checked after the purge).
if ! grep -qx /etc/cdi "$T/files.before"; then
    [ -f /var/lib/gpushare/made-etc-cdi ] || fail "the install made /etc/cdi and did not note it"
fi
/usr/bin/gpushare-hook version | has '^gpushare-hook ' || fail "installed gpushare-hook does not run"
[ "$(stat -c %a /run/gpushare)" = 700 ] || fail "/run/gpushare is not 0700"
man -w gpushare-hook-configure >/dev/null 2>&1 || fail "man gpushare-hook-configure not found"
man -w gpushare-runtime >/dev/null 2>&1 || fail "man gpushare-runtime not found"
man -w 5 gpushare-config >/dev/null 2>&1 || fail "man 5 gpushare-config not found"
ok "installed: binaries run, state dir 0700, man pages found"

echo "== edit the policy: the package's TEST-ONLY simulated driver, this test's state dir"
SIM=/usr/lib/gpushare/test-only/libgpushare_simdriver.so
sed -i -e "s#^state_dir = .*#state_dir = \"$STATE\"#" -e "s#^library = \"libnvidia-ml.so.1\"#library = \"$SIM\"#" /etc/gpushare/config.toml
grep -q "$SIM" /etc/gpushare/config.toml || fail "policy edit"
/usr/bin/gpushare-hook doctor >"$T/doctor" || true
cat "$T/doctor"
grep -q '^warn  driver .*TEST-ONLY' "$T/doctor" || fail "doctor does not say the simulated driver is TEST-ONLY"
grep -q '^ok    podman ' "$T/doctor" || fail "doctor does not see podman configured by the package"

echo "== configure podman: the package already has it"
/usr/bin/gpushare-hook configure podman >"$T/cp" || { cat "$T/cp"; fail "configure podman"; }
grep -q '^nothing to change: podman is already configured' "$T/cp" || { cat "$T/cp"; fail "configure podman changed the installed files"; }
ok "configure podman: nothing to change"

echo "== podman through the installed hooks (system containers.conf.d, no --hooks-dir)"
make_rootfs "$T/rootfs"
mark_shm_when_ready
podman_ --runtime runc run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sh -c "$INSIDE_MPS" >"$T/p1" 2>"$T/p1e" || { cat "$T/p1e"; fail "podman run (installed)"; }
check_mps_output "$T/p1" yes
podman_ --runtime runc run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps --annotation gpu.share.memory=1000Gi \
    --rootfs "$T/rootfs" true >"$T/p2" 2>&1 && fail "a request above the GPU's memory ran"
grep -q 'gpu.share.memory asks for 1000.0 GiB but GPU 0' "$T/p2" || { cat "$T/p2"; fail "the refusal is not shown to the podman user"; }
ok "a refused podman container shows why: $(grep -o 'gpu.share.memory asks[^"]*GiB in all' "$T/p2" | head -1)"
wait_until 10 daemon_gone || fail "daemon still running after the podman containers"

echo "== configure docker (a private dockerd reading the daemon.json it wrote)"
echo '{"log-level": "warn"}' >"$T/daemon.json"
/usr/bin/gpushare-hook configure docker --path "$T/daemon.json" >"$T/cd" || { cat "$T/cd"; fail "configure docker"; }
grep -q '^reload Docker.*SIGHUP' "$T/cd" || { cat "$T/cd"; fail "configure docker does not say what to restart"; }
[ "$(jq -r '.runtimes.gpushare.path' "$T/daemon.json")" = /usr/bin/gpushare-runtime ] || fail "daemon.json has no gpushare runtime"
[ "$(jq -r '."log-level"' "$T/daemon.json")" = warn ] || fail "daemon.json lost a key"
/usr/bin/gpushare-hook configure docker --path "$T/daemon.json" | has '^nothing to change' || fail "second configure docker changed something"
ok "configure docker: merged, then nothing to change"
D=$T/docker
mkdir -p "$D"
X=$(mktemp -d /tmp/gsp-XXXX)
on_exit "rm -rf $X"
dockerd --config-file "$T/daemon.json" --data-root "$D/data" --exec-root "$X" -H "unix://$D/sock" --pidfile "$D/pid" \
    --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs >"$D/log" 2>&1 &
DPID=$!
on_exit "kill $DPID; wait $DPID"
docker_() { docker -H "unix://$D/sock" "$@"; }
wait_until 60 docker_ version >/dev/null 2>&1 || { tail -20 "$D/log"; fail "dockerd did not come up with the configured daemon.json"; }
tar -C "$T/rootfs" -cf "$T/rootfs.tar" .
docker_ import "$T/rootfs.tar" gpushare-busybox:pkg >/dev/null || fail "docker import"
mark_shm_when_ready
docker_ run --rm --runtime gpushare --network none -e NVIDIA_VISIBLE_DEVICES=0 -e GPU_SHARE=mps \
    gpushare-busybox:pkg sh -c "$INSIDE_MPS" >"$T/d1" 2>"$T/d1e" || { cat "$T/d1e"; fail "docker run (installed)"; }
check_mps_output "$T/d1" yes
wait_until 10 daemon_gone || fail "daemon still running after the docker container"
ok "Docker through the installed gpushare-runtime"

echo "== reinstall: the policy edit survives"
dpkg -i "$DEB" >"$T/dpkg2.out" 2>&1 || { cat "$T/dpkg2.out"; fail "dpkg -i (again)"; }
grep -q "$SIM" /etc/gpushare/config.toml || fail "the reinstall undid the policy edit"
ok "policy edit kept across a reinstall"

echo "== removal while a container uses a share is refused"
podman_ --runtime runc run -d --name "${NAME}busy" $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sleep 120 >/dev/null || fail "busy container"
wait_until 10 daemon_running || fail "no daemon for the busy container"
dpkg -r gpushare >"$T/rm.out" 2>&1 && fail "dpkg -r went ahead while a container uses a share"
grep -q 'not removing the package while containers use it' "$T/rm.out" || { cat "$T/rm.out"; fail "the refusal does not say why"; }
dpkg -s gpushare 2>/dev/null | grep -Eq '^Status: (install|deinstall) ok installed$' || fail "package not intact after a refused removal"
[ -x /usr/bin/gpushare-hook ] || fail "binary gone after a refused removal"
ok "removal refused while a container uses a share: $(grep -m1 'client' "$T/rm.out" | sed 's/^ *//')"
podman_ rm -f -t 0 "${NAME}busy" >/dev/null
wait_until 15 daemon_gone || fail "daemon still running after the busy container"

echo "== removal while a podman container runs on --runtime gpushare (no share) is refused"
# prerm's podman must see this test's private storage: the same roots, through storage.conf.
printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' \
    "$(podman_ info --format '{{.Store.GraphDriverName}}')" "$T/storage" "$T/runroot" >"$T/storage.conf"
podman_ --runtime gpushare run -d --name "${NAME}rt" $PODMAN_ULIMITS --rootfs "$T/rootfs" sleep 120 >/dev/null ||
    fail "podman --runtime gpushare run"
CONTAINERS_STORAGE_CONF=$T/storage.conf dpkg -r gpushare >"$T/rm2.out" 2>&1 && fail "dpkg -r went ahead while a podman container runs on --runtime gpushare"
grep -q "podman container ${NAME}rt (.*) runs with --runtime gpushare" "$T/rm2.out" || { cat "$T/rm2.out"; fail "the refusal does not name the podman container"; }
dpkg -s gpushare 2>/dev/null | grep -Eq '^Status: (install|deinstall) ok installed$' || fail "package not intact after a refused removal"
/usr/bin/gpushare-hook version | has '^gpushare-hook ' || fail "gpushare-hook does not run after a refused removal"
grep -q 'still installed and working' "$T/rm2.out" || { cat "$T/rm2.out"; fail "the refusal does not say the package stays"; }
podman_ --runtime gpushare stop -t 1 "${NAME}rt" >/dev/null 2>"$T/stop.err" || { cat "$T/stop.err"; fail "podman stop after a refused removal"; }
[ "$(podman_ inspect --format '{{.State.Status}}' "${NAME}rt")" = exited ] || fail "the container did not stop"
podman_ rm "${NAME}rt" >/dev/null || fail "podman rm"
ok "removal refused while a podman container runs on gpushare; the package still works: podman stop went through it"

echo "== purge undoes configure docker (the default daemon.json)"
[ -e /etc/docker/daemon.json ] && cp -a /etc/docker/daemon.json "$T/daemon.json.saved"
restore_daemon_json() { rm -f /etc/docker/daemon.json /etc/docker/daemon.json.bak-*; if [ -e "$T/daemon.json.saved" ]; then cp -a "$T/daemon.json.saved" /etc/docker/daemon.json; fi; }
on_exit restore_daemon_json
rm -f /etc/docker/daemon.json
/usr/bin/gpushare-hook configure docker >"$T/cd2" || { cat "$T/cd2"; fail "configure docker (default path)"; }
grep -q '^created /etc/docker/daemon.json' "$T/cd2" || { cat "$T/cd2"; fail "configure docker did not create daemon.json"; }
[ "$(jq -r '.runtimes.gpushare.path' /etc/docker/daemon.json)" = /usr/bin/gpushare-runtime ] || fail "daemon.json has no gpushare runtime"

echo "== purge leaves nothing behind, and removes nothing it did not create"
# The event log is a host-wide default: other tests running beside this one (gpushare binaries of
# the build, with a policy that does not load) append to it too, and may create it again after the
# purge. Which file the package's gpushare wrote is known by its inode and birth time (an inode
# number alone may be reused by a new file) and its first line.
events_id() { [ -e "$EVENTS" ] && echo "$(stat -c '%i %w' "$EVENTS") $(head -1 "$EVENTS" | sha256sum)" || echo none; }
EV_ID=$(events_id)
[ "$EV_ID" != none ] || fail "positive control: no event log before the purge (the installed gpushare logged no event)"
dpkg --purge gpushare >"$T/purge.out" 2>&1 || { cat "$T/purge.out"; fail "dpkg --purge"; }
dpkg -s gpushare >/dev/null 2>&1 && fail "package still known to dpkg"
grep -q "^removed /etc/docker/daemon.json" "$T/purge.out" || { cat "$T/purge.out"; fail "purge does not say it undid configure docker"; }
[ -e /etc/docker/daemon.json ] && { cat /etc/docker/daemon.json; fail "purge left the daemon.json configure created"; }
[ -e /var/lib/gpushare ] && fail "/var/lib/gpushare left after purge"
[ -e /etc/cdi/gpushare.io-share.json ] && fail "the CDI spec left after purge"
ok "purge ran configure docker --remove: daemon.json is as it was before configure"
while read -r p; do
    [ -d "$T/deb$p" ] && continue
    [ -e "$p" ] && fail "$p left after purge"
done < <(awk '{print $NF}' "$T/contents" | sed 's#^\./#/#')
for p in /etc/gpushare /run/gpushare /usr/lib/gpushare /etc/containers/oci/hooks.d-podman; do
    [ -e "$p" ] && fail "$p left after purge"
done
# No process of the package's binaries runs on: a GPU's reaper exits once /run/gpushare is gone, and
# an idle one (this test's state dir is its own) within seconds of its binary's removal.
package_processes() {
    local e
    for e in /proc/[0-9]*/exe; do
        case $(readlink "$e" 2>/dev/null) in /usr/bin/gpushare-*) echo "${e%/exe}" ;; esac
    done
}
no_package_process() { [ -z "$(package_processes)" ]; }
wait_until 10 no_package_process || fail "processes of the package run on after purge: $(package_processes)"
[ "$(events_id)" = "$EV_ID" ] && fail "$EVENTS left after purge"
if [ -e "$EVENTS" ]; then
    # Made after the purge (another file) while no process of the package ran: another test's.
    echo "note: $EVENTS was made again after the purge by another test beside this one: $(tail -1 "$EVENTS" | cut -c1-160)"
fi
[ -f "$LOG" ] && [ "$(head -1 "$LOG")" = "$LOG_FIRST" ] || fail "purge removed $LOG, which was there before the install"
restore_daemon_json
listed >"$T/files.after"
diff -u "$T/files.before" "$T/files.after" || fail "the files after the purge differ from those before the install (above)"
ok "purged: the file list is the one before the install ($(wc -l <"$T/files.before") paths); the log that was there stays"
if grep -qx /etc/cdi "$T/files.before"; then
    echo "note: /etc/cdi was there before the install: kept by the purge"
else
    ok "/etc/cdi, made by the install for its CDI spec, went with the purge"
fi

echo "== the rpm"
[ -f "$RPM" ] || fail "no .rpm built"
rpm -qlp "$RPM" 2>/dev/null | sort >"$T/rpm.list"
rpm -qpR "$RPM" 2>/dev/null | has -x 'glibc >= 2.17' || { rpm -qpR "$RPM"; fail "the .rpm does not require glibc >= 2.17"; }
ok "the .rpm states its minimum glibc: glibc >= 2.17"
cat >"$T/rpm.want" <<LIST
/etc/containers/containers.conf.d/50-gpushare.conf
/etc/containers/oci/hooks.d-podman/gpushare-precreate.json
/etc/gpushare/config.toml
/etc/logrotate.d/gpushare
/usr/bin/gpushare-dra
/usr/bin/gpushare-hook
/usr/bin/gpushare-runtime
/usr/lib/gpushare/libgpushare_limiter.so
/usr/lib/gpushare/test-only/libgpushare_simdriver.so
/usr/lib/systemd/system/gpushare-gc.service
/usr/lib/systemd/system/gpushare-gc.timer
/usr/lib/systemd/system/gpushare-serve.service
/usr/lib/tmpfiles.d/gpushare.conf
/usr/share/bash-completion/completions/gpushare-hook
/etc/containers/oci/hooks.d/gpushare-createRuntime.json
/etc/containers/oci/hooks.d/gpushare-poststop.json
/usr/share/doc/gpushare/config.toml.example
/usr/share/fish/vendor_completions.d/gpushare-hook.fish
/usr/share/gpushare/grafana/gpushare.json
$(cd "$PT/release/gen/man" && for f in *.gz; do s=${f%.gz}; echo "/usr/share/man/man${s##*.}/$f"; done)
/usr/share/zsh/site-functions/_gpushare-hook
LIST
sort -o "$T/rpm.want" "$T/rpm.want"
diff -u "$T/rpm.want" "$T/rpm.list" || fail "rpm file list differs (above)"
rpm -qcp "$RPM" >"$T/rpm.conf" 2>/dev/null
grep -qx /etc/gpushare/config.toml "$T/rpm.conf" || fail "the rpm's policy is not a config file"
rpm -qp --scripts "$RPM" >"$T/rpm.scripts" 2>/dev/null
grep -q 'not removing the package while containers use it' "$T/rpm.scripts" || fail "the rpm has no removal guard"
ok "rpm $(basename "$RPM"): file list, config files and removal guard as expected"
