#!/usr/bin/env bash
# podman with the repo's hooks dirs (precreate included): a refused request is shown to the user
# (podman drops a precreate hook's stderr, so precreate carries the refusal to the createRuntime
# hook, whose stderr runc reports) and logged; a typo in the policy file does not stop containers
# that ask for nothing, the ones that ask see the policy error, and the error is logged in the
# default log file (the broken policy's own log path cannot be known).
source "$(dirname "$0")/lib.sh"
need podman runc jq
make_rootfs "$T/rootfs"
make_hooks_dirs "$T/hooks"
on_exit "podman_ rm -af -t 0"
DEFAULT_LOG=/var/log/gpushare.log
[ -e "$DEFAULT_LOG" ] && cp -a "$DEFAULT_LOG" "$T/log.saved"
on_exit "if [ -e $T/log.saved ]; then cp -a $T/log.saved $DEFAULT_LOG; else rm -f $DEFAULT_LOG; fi"
H=(--runtime runc --hooks-dir "$T/hooks/oci" --hooks-dir "$T/hooks/podman-precreate")
run() { podman_ "${H[@]}" run --rm $PODMAN_ULIMITS -e NVIDIA_VISIBLE_DEVICES=0 "$@"; }
R=(--rootfs "$T/rootfs")

echo "== a refused request: the user sees why"
run --annotation gpu.share=mps --annotation gpu.share.memory=1000Gi "${R[@]}" true >"$T/o1" 2>&1 && fail "a request above the GPU's memory ran"
cat "$T/o1"
grep -q 'gpu.share.memory asks for 1000.0 GiB but GPU 0 .* has 80.0 GiB in all' "$T/o1" || fail "podman does not show the refusal"
ok "podman shows the refusal"
grep -q 'refused: gpu.share.memory asks for 1000.0 GiB' "$T/gpushare.log" || { cat "$T/gpushare.log"; fail "the refusal is not in the log"; }
grep 'refused:' "$T/gpushare.log" | grep 'container=' | has 'gpus=0' || { cat "$T/gpushare.log"; fail "the log's refusal lacks the container id or GPU"; }
ok "the log has the refusal, with the container id and GPU"
run --annotation gpu.share=mps --annotation gpu.share.bogus=1 "${R[@]}" true >"$T/o1b" 2>&1 && fail "an unknown key ran"
grep -q 'gpu.share.bogus' "$T/o1b" || { cat "$T/o1b"; fail "podman does not show the unknown key"; }
ok "an invalid request is shown too"

echo "== a typo in the policy file"
cp "$CONFIG" "$T/config.good"
printf '\n[polcy]\nmodes = ["mps"]\n' >>"$CONFIG"
# Only this run's lines count: where the default log ends now, and this run's policy path.
LOG_START=$(stat -c %s "$DEFAULT_LOG" 2>/dev/null || echo 0)
this_runs_log() { tail -c +"$((LOG_START + 1))" "$DEFAULT_LOG" 2>/dev/null | grep -F "config $CONFIG "; }
run "${R[@]}" sh -c 'echo plain' >"$T/o2" 2>&1 || { cat "$T/o2"; fail "a container that asks for nothing was stopped by the broken policy"; }
grep -qx plain "$T/o2" || fail "plain container output"
ok "a container that asks for nothing runs through a broken policy"
run -e GPU_SHARE_X=1 "${R[@]}" sh -c 'echo env-without-request' >"$T/o2b" 2>&1 || { cat "$T/o2b"; fail "a GPU_SHARE_X env (no request) was refused"; }
ok "a container that only mentions GPU_SHARE runs too"
run --annotation gpu.share=mps "${R[@]}" true >"$T/o3" 2>&1 && fail "a request ran through a broken policy"
cat "$T/o3"
grep -q "is not valid TOML for gpushare: line .*unknown field .polcy." "$T/o3" || fail "podman does not show the policy error"
ok "a container that asks sees the policy error"
this_runs_log | grep -q 'unknown field `polcy`' || { this_runs_log; fail "this run's policy error is not in $DEFAULT_LOG"; }
ok "the policy error is logged in $DEFAULT_LOG"
cp "$T/config.good" "$CONFIG"
