#!/usr/bin/env bash
# Chaining like nvidia-container-runtime: a wrapper in front of gpushare-runtime and one behind
# it (as [runtime] next), each also editing the spec; and loops refused with a clear error.
source "$(dirname "$0")/lib.sh"
need podman runc jq
engine_version podman podman --version
engine_version runc runc --version
make_rootfs "$T/rootfs"
on_exit "podman_ rm -af -t 0"
# Behind: adds its own env to create's config.json (as a vendor wrapper would), then runc.
cat >"$T/bin/behind" <<EOF2
#!/bin/sh
echo "behind: \$*" >>"$T/chain.log"
b=.; prev=; for a in "\$@"; do [ "\$prev" = --bundle ] || [ "\$prev" = -b ] && b=\$a; prev=\$a; done
case " \$* " in *" create "*|*" run "*)
  jq '.process.env += ["BEHIND=1"]' "\$b/config.json" >"\$b/config.json.b" && mv "\$b/config.json.b" "\$b/config.json";;
esac
exec runc "\$@"
EOF2
# Front: logs, then gpushare-runtime.
cat >"$T/bin/front" <<EOF2
#!/bin/sh
echo "front: \$*" >>"$T/chain.log"
exec "$RUNTIME" "\$@"
EOF2
chmod +x "$T/bin/behind" "$T/bin/front"
NEXT_RUNTIME=$T/bin/behind write_config

echo "== podman --runtime front -> gpushare-runtime -> behind -> runc"
mark_shm_when_ready
podman_ --runtime "$T/bin/front" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 --annotation gpu.share=mps \
    --rootfs "$T/rootfs" sh -c "echo behind:\$BEHIND; $INSIDE_MPS" >"$T/out1" 2>"$T/err1" || { cat "$T/err1"; fail "podman run"; }
check_mps_output "$T/out1" yes
grep -qx 'behind:1' "$T/out1" || fail "the wrapper behind gpushare-runtime did not get to edit the spec"
grep -q '^front: .*create' "$T/chain.log" && grep -q '^behind: .*create' "$T/chain.log" || { cat "$T/chain.log"; fail "chain not traversed"; }
ok "both wrappers ran (front and behind) and their edits compose with gpushare's"

echo "== a loop back to gpushare-runtime is refused"
NEXT_RUNTIME=$T/bin/front write_config
mkdir -p "$T/b" && cp -a "$T/rootfs" "$T/b/rootfs" && make_bundle "$T/b" '["true"]' '[]' '{}'
set +e
(cd "$T/b" && timeout 20 "$RUNTIME" run "${NAME}l" >"$T/out2" 2>"$T/err2")
rc=$?
set -e
[ $rc = 1 ] || { cat "$T/err2"; fail "loop: exit $rc, wanted 1"; }
grep -q "leads back to gpushare-runtime" "$T/err2" || { cat "$T/err2"; fail "loop error unclear"; }
ok "loop through a wrapper refused: $(head -1 "$T/err2")"
NEXT_RUNTIME=$GS_RUNTIME write_config
set +e
(cd "$T/b" && timeout 20 "$RUNTIME" run "${NAME}l" >"$T/out3" 2>"$T/err3")
rc=$?
set -e
[ $rc = 1 ] && grep -q "leads back to gpushare-runtime" "$T/err3" || { cat "$T/err3"; fail "next = itself not refused"; }
ok "next = itself refused: $(head -1 "$T/err3")"
