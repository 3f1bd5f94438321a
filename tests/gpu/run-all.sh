#!/usr/bin/env bash
# Everything only a real GPU can answer, in one time-boxed run (NOT run in CI: no GPU there).
#
#   tests/gpu/prepare.sh                    # here: builds .gpu-carry/ (binaries, simulated answers)
#   tests/gpu/run-all.sh                    # there, from the repo root, as root
#
# Uses the binaries in $GPUSHARE_BIN (default .gpu-carry, made by prepare.sh; no cargo needed),
# compiles tests/gpu/limiter_check.cu and tests/gpu/guesses.c with nvcc, then, each section
# under its own timeout and all under one deadline ($RA_DEADLINE seconds, default 270):
#   0. inventory: driver, CUDA, GPU, kernel, MPS binaries, cgroup v2, namespaces, NVML symbols
#   1. MPS through gpushare-hook (isolation "group", compute mode left as found): two clients in
#      one domain and two domains at once make progress; each domain's active-thread percentage
#      and pinned-memory limit hold for clients that set nothing (and for one that asks for
#      more); the daemons have no capabilities and NoNewPrivs and serve; a client attaches
#      through a read-only pipe directory (or not); release stops the daemons
#   2. the limiter (LD_PRELOAD) on the real driver: memory cap, nvidia-smi, two processes, SM
#      cap; then tests/gpu/guesses.c without the limiter, as a table of real vs simulated
#      (.gpu-carry/guesses-sim.out, measured by prepare.sh on the simulated driver)
#   3. driver memory limits (nvmlDeviceSetMemoryLimits_v1, cgroup v2): present or not; if
#      present, a 1 GiB cap on a container's cgroup across two processes without the preload
#   4. overhead: limiter_check bench bare, under the limiter, as an MPS client, and as an MPS
#      client with the limiter, 5 runs each, medians and ratios; PyTorch if time is left
# Every figure goes to a summary at the end (and to $OUT/gpu-run.log when $OUT is set).
# The card's settings are left alone: no compute mode, clock or MIG change (the MPS section is
# skipped unless the GPU is in compute mode Default, where gpushare changes nothing).
# Exit status: 0 when nothing FAILED (SKIPs allowed), 1 otherwise.
#
# Dry run without a GPU (checks the script and the hook steps of section 1 against the TEST-ONLY
# simulated NVML; CUDA clients skipped): RA_SIM_NVML=target/release/libgpushare_simdriver.so
# (with RA_DRY_CHECK=PROGRAM too, PROGRAM stands in for the CUDA programs, to exercise the
# script's own steps: it must answer like limiter_check and guesses).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SELF=$ROOT/tests/gpu/run-all.sh
SAFE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# ---------------------------------------------------------------- helpers (all sections)
say() { printf '%s\n' "$*"; }
hdr() { printf '\n======== %s  [t=%ss] ========\n' "$*" "$(elapsed)"; }
elapsed() { echo $(($(date +%s) - RA_START)); }
verdict() { # KIND TEXT: PASS/FAIL/SKIP/NOTE, printed and kept for the summary
    printf '%s: %s\n' "$1" "$2"
    printf '%s: %s\n' "$1" "$2" >>"$RA_WORK/verdicts"
}
pass() { verdict PASS "$*"; }
fail() { verdict FAIL "$*"; }
skip() { verdict SKIP "$*"; }
note() { verdict NOTE "$*"; }
res() { printf '%s=%s\n' "$1" "$2" >>"$RA_WORK/results"; } # a figure for the summary
val() { sed -n "s/^$1=//p" | tail -1; }
num() { case "${1:-}" in '' | *[!0-9]*) return 1 ;; esac; }
run_to() { # SECONDS CMD...: never hangs; prints the command's output. --foreground keeps it in
    # the section's process group, which the section's own timeout kills as a whole.
    timeout --foreground -k 3 "$@"
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b == 0) print "n/a"; else printf "%.2f\n", a/b}'; }
ms_now() { date +%s%N | cut -c1-13; }
start_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'; } # field 22
ours() { # PID: remembered with its start time; kill_ours signals it only while it still has it
    echo "$1 $(start_of "$1")" >>"$RA_WORK/pids"
}
alive() { # PID: exists and is not a zombie
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
kill_if_same() { # PID START
    num "$1" && [ -n "$2" ] && [ "$(start_of "$1")" = "$2" ] && kill "$1" 2>/dev/null
}

# Writes a gpushare policy for a section: $1 = dir, $2 = extra TOML (tables).
write_config() {
    local d=$1 extra=${2:-}
    mkdir -p "$d"
    {
        printf 'state_dir = "%s"\nlog_file = "%s"\nlock_timeout_seconds = 10\n' "$d/state" "$d/gpushare.log"
        printf '[nvml]\nlibrary = "%s"\n' "$RA_NVML"
        printf '[limit]\nlibrary = "%s"\n' "$RA_BIN/libgpushare_limiter.so"
        printf '%s\n' "$extra"
    } >"$d/config.toml"
}

# A bundle for a stand-in container: $1 = dir, $2 = annotations JSON object.
make_bundle() {
    mkdir -p "$1/rootfs/tmp" "$1/rootfs/dev"
    printf '{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["NVIDIA_VISIBLE_DEVICES=0"],"cwd":"/"},"root":{"path":"rootfs"},"annotations":%s}\n' "$2" >"$1/config.json"
}

# A stand-in for a container's init process: a sleep in a private mount namespace of its own.
# Prints its pid once it is in its own namespace; its pid is kept in $RA_WORK/pids.
stand_in() {
    unshare -m --propagation private sleep 600 </dev/null >/dev/null 2>&1 &
    local p=$! i=0 own t
    ours "$p"
    own=$(readlink /proc/self/ns/mnt)
    while [ $i -lt 200 ]; do
        t=$(readlink "/proc/$p/ns/mnt" 2>/dev/null)
        [ -n "$t" ] && [ "$t" != "$own" ] && { echo "$p"; return 0; }
        sleep 0.02
        i=$((i + 1))
    done
    echo "$p"
    return 1
}
oci_state() { printf '{"ociVersion":"1.0.2","id":"%s","status":"creating","pid":%s,"bundle":"%s"}' "$1" "$2" "$3"; }

# Kills processes this run started (recorded with their start time in $RA_WORK/pids) and MPS
# daemons that gpushare started for this run (pid and start time in <state>/mps/*/daemon,
# written by gpushare when it spawned them); a pid that now names another process is left alone.
kill_ours() {
    local p st f
    [ -f "$RA_WORK/pids" ] && while read -r p st; do kill_if_same "$p" "$st"; done <"$RA_WORK/pids"
    for f in "$RA_WORK"/*/state/mps/*/daemon; do
        [ -f "$f" ] || continue
        read -r p st <"$f"
        kill_if_same "$p" "$st" && say "cleanup: stopped MPS control daemon $p ($f)"
    done
}

# Runs gpushare's gc on every policy this run wrote (releases clients whose stand-ins are gone,
# stops their daemons, clears driver limits, restores compute modes).
gc_all() {
    local c
    for c in "$RA_WORK"/*/config.toml; do
        [ -f "$c" ] || continue
        GPUSHARE_CONFIG=$c run_to 20 "$RA_BIN/gpushare-hook" gc >/dev/null 2>&1
    done
}

# ---------------------------------------------------------------- section 1: MPS
sec_mps() {
    D=$RA_WORK/mps # globals: the EXIT trap reads them after the function returned
    hook=$RA_BIN/gpushare-hook
    declare -gA PID
    [ -n "$RA_MPSCTL" ] || { skip "MPS: nvidia-cuda-mps-control not found on this machine"; return 0; }
    [ "$RA_NS" = yes ] || { skip "MPS: unshare -m / mount do not work here (no stand-in containers)"; return 0; }
    if [ "$RA_MODE0" != Default ]; then
        skip "MPS: GPU 0 is in compute mode $RA_MODE0, not Default; isolation 'group' would change it (left alone)"
        return 0
    fi
    write_config "$D" "[mps]
control = \"$RA_MPSCTL\"
isolation = \"group\"
exclusive_compute_mode = false
start_timeout_seconds = 20
[mps.groups.a]
cores = 25
memory = \"1Gi\"
[mps.groups.b]
cores = 50
memory = \"2Gi\""
    export GPUSHARE_CONFIG=$D/config.toml
    trap 'for c in a1 a2 b1; do [ -n "${PID[$c]:-}" ] && echo "{\"id\":\"$c\",\"bundle\":\"$D/$c\"}" | timeout 20 "$hook" poststop >/dev/null 2>&1; done; kill_ours' EXIT
    trap 'exit 143' TERM INT
    local c g ok=1 times=""
    for c in a1 a2 b1; do
        g=${c%1}; g=${g%2}
        make_bundle "$D/$c" "{\"gpu.share\":\"mps\",\"gpu.share.group\":\"$g\"}"
        PID[$c]=$(stand_in) || { fail "MPS: stand-in for $c did not get a mount namespace"; ok=0; }
        local t0 out
        t0=$(ms_now)
        if out=$(oci_state "$c" "${PID[$c]}" "$D/$c" | run_to 30 "$hook" createRuntime 2>&1); then
            say "createRuntime $c (group $g): ok in $(($(ms_now) - t0)) ms"
            times="$times$c $(($(ms_now) - t0)) ms; "
        else
            fail "MPS: createRuntime $c: $out"
            ok=0
        fi
    done
    res mps_createRuntime_times "$times(a1 and b1 start a daemon, a2 joins)"
    [ $ok = 1 ] || { fail "MPS: could not acquire; log: $(tail -5 "$D/gpushare.log" 2>/dev/null)"; return 0; }
    run_to 15 "$hook" status --json >"$D/status.json" 2>&1
    python3 - "$D/status.json" >"$D/domains" <<'EOF'
import json, sys, os
st = json.load(open(sys.argv[1]))
for g in st.get("gpus", []):
    for d in g.get("domains", []):
        dm = d.get("daemon") or {}
        e = d.get("enforced") or {}
        cur = d.get("current") or {}
        print(d["key"], dm.get("pid", ""), int(bool(dm.get("answers"))), dm.get("pipe", ""),
              json.dumps(e, separators=(",", ":")), json.dumps(cur, separators=(",", ":")), len(d.get("clients", [])))
EOF
    say "domains (key daemon-pid answers pipe enforced current clients):"
    cat "$D/domains"
    local n
    n=$(awk '$3 == 1' "$D/domains" | wc -l)
    [ "$n" = 2 ] && pass "MPS: two domains (g-a with 2 containers, g-b with 1), one answering daemon each" \
        || fail "MPS: $n answering domains, expected 2 (status: $(head -c 600 "$D/status.json"))"
    local mode
    mode=$(gpu_mode)
    [ "$mode" = "$RA_MODE0" ] && pass "MPS: compute mode stays $mode with two daemons (isolation group)" \
        || fail "MPS: compute mode $mode, was $RA_MODE0"
    # The sandbox: no capability in any set, NoNewPrivs, for each control daemon and any
    # process it started (the MPS server, once a client came).
    local key dpid pipe
    sandbox_report() {
        local p=$1 what=$2 caps nnp
        caps=$(grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' "/proc/$p/status" 2>/dev/null | awk '{print $2}' | sort -u | tr '\n' ' ')
        nnp=$(awk '/^NoNewPrivs:/ {print $2}' "/proc/$p/status" 2>/dev/null)
        say "$what pid $p: capabilities $caps NoNewPrivs $nnp"
        SANDBOX="caps $(echo $caps | tr ' ' ',') NoNewPrivs $nnp"
        [ "$caps" = "0000000000000000 " ] && [ "$nnp" = 1 ]
    }
    while read -r key dpid _ pipe _; do
        sandbox_report "$dpid" "control daemon of $key"
        res "mps_control_daemon_$key" "$SANDBOX"
        [ "$SANDBOX" = "caps 0000000000000000 NoNewPrivs 1" ] && pass "MPS: control daemon of $key (pid $dpid) has no capabilities and NoNewPrivs" \
            || fail "MPS: control daemon of $key (pid $dpid) keeps capabilities or lacks NoNewPrivs"
    done <"$D/domains"
    pipe_of() { awk -v k="$1" '$1 == k {print $4}' "$D/domains"; }
    if [ -z "$RA_CHECK" ]; then
        skip "MPS: CUDA clients (no CUDA program built)"
    else
        # A client sees what the hook mounted into the container: the pipe at
        # <rootfs>/tmp/nvidia-mps and the domain's shm at <rootfs>/dev/shm (bound onto /dev/shm,
        # as a container's /dev/shm is).
        for c in a1 a2 b1; do
            nsenter -t "${PID[$c]}" -m mount --bind "$D/$c/rootfs/dev/shm" /dev/shm 2>"$D/ns.err" \
                || note "MPS: binding $c's shm onto /dev/shm in its namespace: $(cat "$D/ns.err")"
            grep -q " $D/$c/rootfs/tmp/nvidia-mps " /proc/"${PID[$c]}"/mountinfo \
                && say "$c: the hook mounted the pipe at $D/$c/rootfs/tmp/nvidia-mps" \
                || fail "MPS: no pipe mount in $c's namespace"
        done
        client() { # CONTAINER CMD...: a CUDA client in the container's mount namespace, no MPS env but the pipe
            local c=$1
            shift
            run_to 25 nsenter -t "${PID[$c]}" -m env -u CUDA_MPS_ACTIVE_THREAD_PERCENTAGE -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT \
                CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$D/$c/rootfs/tmp/nvidia-mps" "$@"
        }
        # A first client alone: a server that cannot start would hang every client below.
        local probe
        probe=$(client a1 "$RA_CHECK" meminfo 2>&1)
        say "first client of g-a (starts its MPS server): $(echo "$probe" | tr '\n' ' ')"
        if ! echo "$probe" | grep -q '^MEMINFO_TOTAL='; then
            fail "MPS: a client of g-a did not start: $(echo "$probe" | tail -2 | tr '\n' ' '); control log: $(tail -5 "$(dirname "$(pipe_of g-a)")/log/control.log" 2>/dev/null | tr '\n' ' ')"
            say "server log: $(tail -5 "$(dirname "$(pipe_of g-a)")/log/server.log" 2>/dev/null)"
            RA_CHECK=""
        fi
    fi
    if [ -n "$RA_CHECK" ]; then
        # Two clients in one domain and one in the other, at once.
        client a1 "$RA_CHECK" spin 4 >"$D/s.a1" 2>&1 &
        local s1=$!
        client a2 "$RA_CHECK" spin 4 >"$D/s.a2" 2>&1 &
        local s2=$!
        client b1 "$RA_CHECK" spin 4 >"$D/s.b1" 2>&1 &
        local s3=$!
        ours $s1; ours $s2; ours $s3
        sleep 3
        local lists="" ca=0 cb=0
        for key in g-a g-b; do
            pipe=$(pipe_of "$key")
            local servers clients=0 s
            servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe run_to 5 "$RA_MPSCTL" 2>&1)
            for s in $servers; do
                num "$s" || continue
                clients=$((clients + $(echo "get_client_list $s" | CUDA_MPS_PIPE_DIRECTORY=$pipe run_to 5 "$RA_MPSCTL" 2>/dev/null | wc -w)))
                sandbox_report "$s" "MPS server of $key" >/dev/null
                res "mps_server_$key" "$SANDBOX"
                [ "$SANDBOX" = "caps 0000000000000000 NoNewPrivs 1" ] && note "MPS: the MPS server of $key (pid $s) runs with no capabilities and NoNewPrivs" \
                    || note "MPS: the MPS server of $key (pid $s): $(grep -E '^(CapEff|NoNewPrivs):' /proc/"$s"/status 2>/dev/null | tr '\n' ' ')"
            done
            lists="$lists $key: servers [$(echo $servers)] clients $clients;"
            [ $key = g-a ] && ca=$clients
            [ $key = g-b ] && cb=$clients
            res "mps_${key}_servers_clients" "$(echo "$servers" | wc -w)/$clients"
        done
        say "while running:$lists"
        wait $s1 $s2 $s3
        local k1 k2 k3
        k1=$(val KERNELS <"$D/s.a1"); k2=$(val KERNELS <"$D/s.a2"); k3=$(val KERNELS <"$D/s.b1")
        say "kernels of ~1 ms in 4 s: a1 $k1, a2 $k2 (domain g-a, 25%), b1 $k3 (domain g-b, 50%)"
        res mps_concurrent_kernels_a1_a2_b1 "$k1/$k2/$k3"
        # A client that finds no daemon runs without MPS: progress counts only with the clients
        # listed by their domain's server.
        if num "$k1" && num "$k2" && [ "$k1" -gt 0 ] && [ "$k2" -gt 0 ] && [ "$ca" -ge 2 ]; then
            pass "MPS: two clients in one domain, both on its MPS server ($ca clients listed), both make progress ($k1 and $k2 kernels)"
        else
            fail "MPS: two clients in one domain: a1 '$k1' a2 '$k2' kernels, $ca clients on g-a's server ($(tail -1 "$D/s.a1") / $(tail -1 "$D/s.a2"))"
        fi
        if num "$k1" && num "$k3" && [ "$k1" -gt 0 ] && [ "$k3" -gt 0 ] && [ "$ca" -ge 1 ] && [ "$cb" -ge 1 ]; then
            pass "MPS: two domains at once, each with its own server, both make progress (g-a $k1, g-b $k3 kernels)"
        else
            fail "MPS: two domains at once: g-a '$k1' g-b '$k3' kernels, clients on the servers g-a $ca g-b $cb ($(tail -1 "$D/s.b1"))"
        fi
        # Enforced defaults: SM share and pinned memory, for clients that set nothing.
        local sa sb sx fa fb fx ma
        sa=$(client a1 "$RA_CHECK" smshare "$RA_SMS" 2>&1); echo "$sa" | sed 's/^/  g-a smshare: /'
        sb=$(client b1 "$RA_CHECK" smshare "$RA_SMS" 2>&1); echo "$sb" | sed 's/^/  g-b smshare: /'
        sx=$(run_to 25 nsenter -t "${PID[a1]}" -m env CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$D/a1/rootfs/tmp/nvidia-mps" \
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 "$RA_CHECK" smshare "$RA_SMS" 2>&1); echo "$sx" | sed 's/^/  g-a smshare, client asks 100%: /'
        local pa_s pb_s px_s
        pa_s=$(echo "$sa" | val SHARE_PCT); pb_s=$(echo "$sb" | val SHARE_PCT); px_s=$(echo "$sx" | val SHARE_PCT)
        res mps_sm_share_pct_domain25_domain50_asks100 "$pa_s/$pb_s/$px_s (bare: $(val SHARE_PCT <"$RA_WORK/bare.smshare" 2>/dev/null))"
        res mps_sms_reported_domain25_domain50 "$(echo "$sa" | val SMS)/$(echo "$sb" | val SMS) of $(val SMS <"$RA_WORK/bare.smshare" 2>/dev/null)"
        res mps_distinct_smids_domain25_domain50 "$(echo "$sa" | val DISTINCT_SMIDS)/$(echo "$sb" | val DISTINCT_SMIDS)"
        if num "$pa_s" && [ "$pa_s" -ge 15 ] && [ "$pa_s" -le 35 ]; then
            pass "MPS: domain g-a's active-thread percentage 25 holds: the client gets $pa_s% of the SMs"
        else
            fail "MPS: domain g-a (25%): the client gets '$pa_s'% of the SMs"
        fi
        if num "$pb_s" && [ "$pb_s" -ge 40 ] && [ "$pb_s" -le 60 ]; then
            pass "MPS: domain g-b's active-thread percentage 50 holds: the client gets $pb_s% of the SMs"
        else
            fail "MPS: domain g-b (50%): the client gets '$pb_s'% of the SMs"
        fi
        if num "$px_s" && [ "$px_s" -le 35 ]; then
            pass "MPS: a client asking CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 in g-a still gets $px_s%"
        else
            fail "MPS: a client asking 100% in g-a gets '$px_s'%"
        fi
        fa=$(client a1 "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        fb=$(client b1 "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        fx=$(run_to 25 nsenter -t "${PID[a1]}" -m env CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$D/a1/rootfs/tmp/nvidia-mps" \
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        ma=$(client a1 "$RA_CHECK" meminfo 2>&1 | tr '\n' ' ')
        say "cudaMalloc totals in 64 MiB steps: g-a (1 GiB) $fa, g-b (2 GiB) $fb, g-a client asking 4096M $fx"
        say "cudaMemGetInfo in g-a: $ma (the simulated driver assumes total = min(device, limit); unconfirmed)"
        res mps_pinned_fill_bytes_1G_2G_asks4G "$fa/$fb/$fx"
        res mps_meminfo_in_1G_domain "$ma"
        local GIB=1073741824
        if num "$fa" && [ "$fa" -le $GIB ] && [ "$fa" -ge $((GIB / 2)) ]; then
            pass "MPS: domain g-a's pinned memory limit (1 GiB) holds: $fa bytes"
        else
            fail "MPS: domain g-a (1 GiB): the client allocated '$fa' bytes"
        fi
        if num "$fb" && [ "$fb" -le $((2 * GIB)) ] && [ "$fb" -ge $GIB ]; then
            pass "MPS: domain g-b's pinned memory limit (2 GiB) holds: $fb bytes"
        else
            fail "MPS: domain g-b (2 GiB): the client allocated '$fb' bytes"
        fi
        if num "$fx" && [ "$fx" -le $GIB ]; then
            pass "MPS: a client asking CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M in g-a still stops at $fx bytes"
        else
            fail "MPS: a client asking 4096M in g-a allocated '$fx' bytes"
        fi
        # [mps] pipe_readonly: the container's pipe mount made read-only, in a namespace of its own.
        local ro
        ro=$(run_to 25 nsenter -t "${PID[a2]}" -m unshare -m --propagation private sh -c '
                mount -o remount,bind,ro "$1" || { echo "REMOUNT_FAILED"; exit 1; }
                touch "$1/.probe" 2>/dev/null && echo "STILL_WRITABLE"
                CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$1" exec "$2" fill 64' sh \
            "$D/a2/rootfs/tmp/nvidia-mps" "$RA_CHECK" 2>&1)
        say "read-only pipe client: $(echo "$ro" | tr '\n' ' ')"
        local rot
        rot=$(echo "$ro" | val ALLOC_TOTAL)
        if echo "$ro" | grep -q 'REMOUNT_FAILED\|STILL_WRITABLE'; then
            fail "MPS: could not make the pipe directory read-only for the probe: $ro"
        elif num "$rot" && [ "$rot" -gt 0 ] && [ "$rot" -le $GIB ]; then
            pass "MPS: a client attaches through a read-only pipe directory (allocated $rot bytes under g-a's 1 GiB): [mps] pipe_readonly = true works with this driver"
            res mps_pipe_readonly_works yes
        else
            note "MPS: a client could NOT attach through a read-only pipe directory; keep [mps] pipe_readonly = false ($(echo "$ro" | tail -2 | tr '\n' ' '))"
            res mps_pipe_readonly_works no
        fi
    fi
    # The daemons' own logs, before release removes them.
    while read -r key dpid _ pipe _; do
        say "$key control.log (last lines):"
        tail -6 "$(dirname "$pipe")/log/control.log" 2>/dev/null | cut -c1-200 | sed 's/^/  /'
        [ -f "$(dirname "$pipe")/log/server.log" ] && { say "$key server.log (last lines):"; tail -4 "$(dirname "$pipe")/log/server.log" | cut -c1-200 | sed 's/^/  /'; }
    done <"$D/domains"
    # Release: the first keeps the domain's daemon, the last stops it; compute mode as found.
    local da
    da=$(awk '$1 == "g-a" {print $2}' "$D/domains")
    echo "{\"id\":\"a1\",\"bundle\":\"$D/a1\"}" | run_to 20 "$hook" poststop
    unset 'PID[a1]'
    alive "$da" && pass "MPS: g-a's daemon outlives its first container" || fail "MPS: g-a's daemon gone after its first container"
    echo "{\"id\":\"a2\",\"bundle\":\"$D/a2\"}" | run_to 20 "$hook" poststop
    unset 'PID[a2]'
    echo "{\"id\":\"b1\",\"bundle\":\"$D/b1\"}" | run_to 20 "$hook" poststop
    unset 'PID[b1]'
    sleep 0.5
    local left=0
    while read -r key dpid _; do alive "$dpid" && left=$((left + 1)); done <"$D/domains"
    [ $left = 0 ] && pass "MPS: both daemons stopped after their last container" || fail "MPS: $left daemon(s) left after release"
    [ -z "$(ls "$D/state/mps" 2>/dev/null)" ] && pass "MPS: domain directories removed" || fail "MPS: left in state/mps: $(ls "$D/state/mps")"
    mode=$(gpu_mode)
    [ "$mode" = "$RA_MODE0" ] && pass "MPS: compute mode $mode as found" || fail "MPS: compute mode $mode after release, was $RA_MODE0"
    say "gpushare log (last lines):"
    tail -8 "$D/gpushare.log" 2>/dev/null | cut -c1-300
}

gpu_mode() {
    if [ -n "${RA_SIM_NVML:-}" ]; then echo Default; return; fi
    local m
    m=$(timeout -k 3 15 nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader 2>/dev/null) || m=unknown
    echo "$m" | tr -d ' '
}

# ---------------------------------------------------------------- section 2: limiter + guesses
sec_limiter() {
    local D=$RA_WORK/limiter lib=$RA_BIN/libgpushare_limiter.so GIB=1073741824
    mkdir -p "$D"
    trap kill_ours EXIT
    trap 'exit 143' TERM INT
    if [ -z "$RA_CHECK" ]; then
        skip "limiter: no CUDA program built"
    else
        limited() { env CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache" \
            GPUSHARE_LIMITS_FILE="$D/none" LD_PRELOAD="$lib" "$@"; }
        local phys tot got smi second after
        phys=$(val MEMINFO_TOTAL <"$RA_WORK/bare.meminfo")
        tot=$(limited "$RA_CHECK" meminfo 2>&1 | val MEMINFO_TOTAL)
        say "cudaMemGetInfo total: bare $phys, under a 1 GiB cap $tot"
        [ "$tot" = "$GIB" ] && pass "limiter: cudaMemGetInfo reports the 1 GiB cap" || fail "limiter: cudaMemGetInfo total '$tot'"
        got=$(limited "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        res limiter_fill_under_1G "$got"
        if num "$got" && [ "$got" -le $GIB ] && [ "$got" -ge $((GIB - 640 * 1048576)) ]; then
            pass "limiter: cudaMalloc stops at the cap ($got bytes; the context's footprint counted)"
        else
            fail "limiter: cudaMalloc allocated '$got' bytes under a 1 GiB cap"
        fi
        smi=$(run_to 15 env CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache" GPUSHARE_LIMITS_FILE="$D/none" \
            LD_PRELOAD="$lib" nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>&1 | tr -d ' ')
        [ "$smi" = 1024 ] && pass "limiter: nvidia-smi under the limiter reports 1024 MiB" || fail "limiter: nvidia-smi memory.total '$smi'"
        # Started directly (not through the function) so that $! is the holder itself.
        env CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache" \
            GPUSHARE_LIMITS_FILE="$D/none" LD_PRELOAD="$lib" "$RA_CHECK" hold 600 >"$D/hold.out" 2>&1 &
        local holder=$! i=0
        ours $holder
        while ! grep -q HELD=1 "$D/hold.out" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
        second=$(limited "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        kill $holder 2>/dev/null
        wait $holder 2>/dev/null
        after=$(limited "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
        say "second process: $second bytes while the first held 600 MiB; $after after the holder was killed"
        res limiter_two_processes_second_then_after "$second/$after"
        num "$second" && [ "$second" -le $((GIB - 600 * 1048576)) ] && pass "limiter: two processes share one cap" \
            || fail "limiter: the second process got '$second' bytes"
        # A lone process gets what `fill` got above (the cap less its own context's footprint).
        num "$after" && num "$got" && [ "$after" -ge $((got - 2097152)) ] \
            && pass "limiter: a killed holder's memory came back ($after bytes, a lone process got $got)" \
            || fail "limiter: after the kill '$after' bytes"
        local fk ck pct
        fk=$(env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" spin 4 2>&1 | val KERNELS)
        ck=$(env CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=30 GPUSHARE_LIMITS_FILE="$D/none" CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache2" \
            LD_PRELOAD="$lib" "$RA_CHECK" spin 4 2>&1 | val KERNELS)
        say "kernels of ~1 ms in 4 s: uncapped $fk, SM cap 30% $ck"
        if num "$fk" && num "$ck" && [ "$fk" -gt 0 ]; then
            pct=$((ck * 100 / fk))
            res limiter_sm_cap30_throughput_pct "$pct"
            [ $pct -ge 25 ] && [ $pct -le 40 ] && pass "limiter: SM cap 30% gives $pct% of the uncapped throughput" \
                || fail "limiter: SM cap 30% gives $pct% of the uncapped throughput"
        else
            fail "limiter: spin runs printed nothing ('$fk', '$ck')"
        fi
    fi
    # The simulated driver's guesses, measured without the limiter.
    if [ -z "$RA_GUESSES" ]; then
        skip "guesses: tests/gpu/guesses.c not built"
        return 0
    fi
    run_to 30 env CUDA_VISIBLE_DEVICES=0 "$RA_GUESSES" guesses >"$D/guesses.out" 2>"$D/guesses.err" \
        || fail "guesses: the probe exited $? ($(tail -2 "$D/guesses.err"))"
    cp "$D/guesses.out" "$RA_WORK/guesses-real.out"
    local sim=$RA_BIN/guesses-sim.out
    [ -f "$sim" ] || { note "guesses: no $sim (prepare.sh makes it); simulated column empty"; sim=/dev/null; }
    python3 - "$D/guesses.out" "$sim" <<'EOF' | tee "$RA_WORK/guesses-table"
import sys
def load(p):
    d = {}
    for l in open(p):
        if "=" in l:
            k, v = l.strip().split("=", 1)
            d[k] = v
    return d
real, sim = load(sys.argv[1]), load(sys.argv[2])
MIB = 1 << 20
def fmt(v):
    try:
        n = int(v)
    except (TypeError, ValueError):
        return "-" if v is None else v
    return f"{n} ({n / MIB:.1f} MiB)" if abs(n) >= MIB else str(n)
keys = list(real) + [k for k in sim if k not in real]
print(f"{'guess':34} {'real GPU':>26} {'simulated driver':>26}  same")
for k in keys:
    r, s = real.get(k), sim.get(k)
    print(f"{k:34} {fmt(r):>26} {fmt(s):>26}  {'yes' if r == s else 'NO'}")
EOF
    g() { val "$1" <"$D/guesses.out"; }
    local a t e
    for a in ROWS100 FLOAT4 BC1 BC7; do
        t=$(g ${a}_TAKEN); e=$(g ${a}_ESTIMATE)
        if [ "$(g ${a}_RC)" = 0 ] && num "$t" && num "$e" && [ "$t" -le $((e + 2097152)) ]; then
            pass "guesses: array $a takes $t bytes, within the limiter's estimate $e (+2 MiB of measuring grain)"
        else
            fail "guesses: array $a (rc $(g ${a}_RC)) takes '$t' bytes, more than the limiter's estimate '$e'"
        fi
    done
    t=$(g DEFERRED_TAKEN)
    num "$t" && [ "$t" -le 2097152 ] && pass "guesses: a deferred-mapping array takes no memory ($t)" \
        || fail "guesses: a deferred-mapping array took '$t' bytes"
    for k in PITCH_OF_1000 VMM_GRANULARITY VMM_RELEASED_MAPPED_TAKEN VMM_UNMAPPED_TAKEN POOL_STEP REUSE_ON_RESERVED POOL_SYNCED_RESERVED REUSE_OFF_RESERVED GRAPH_FREED_RESERVED GRAPH_TRIMMED_RESERVED TEXTURE_PITCH_ALIGNMENT; do
        res "guess_$k" "$(g $k) (sim $(val $k <"$sim"))"
    done
}

# ---------------------------------------------------------------- section 3: driver memory limits
sec_memlimits() {
    local D=$RA_WORK/memlimits GIB=1073741824
    mkdir -p "$D"
    local sym smi_ml
    sym=$RA_NVML_MEMLIMITS
    smi_ml=no
    run_to 10 nvidia-smi memory-limits -h >/dev/null 2>&1 && smi_ml=yes
    say "nvmlDeviceSetMemoryLimits_v1 in NVML: $sym; nvidia-smi memory-limits: $smi_ml; /sys/fs/cgroup: $RA_CGROUP"
    res driver_memory_limits "NVML symbol $sym, nvidia-smi memory-limits $smi_ml, cgroup $RA_CGROUP"
    if [ "$sym" != yes ]; then
        skip "driver memory limits: this driver's NVML has no nvmlDeviceSetMemoryLimits_v1 (r615 / CUDA 13.4 and later); the limiter enforces caps here"
        return 0
    fi
    case "$RA_CGROUP" in cgroup2fs*writable*) ;; *)
        skip "driver memory limits: /sys/fs/cgroup is not a writable cgroup v2 ($RA_CGROUP)"
        return 0 ;;
    esac
    [ -n "$RA_CHECK" ] || { skip "driver memory limits: no CUDA program built"; return 0; }
    write_config "$D" ""
    export GPUSHARE_CONFIG=$D/config.toml
    hook=$RA_BIN/gpushare-hook cg=/sys/fs/cgroup/gpushare-gpu-run-$$ state='' # globals for the EXIT trap
    local id=memlimit-$$ sleeper
    cleanup_ml() {
        [ -n "${state:-}" ] && echo "$state" | timeout 20 "$hook" poststop >/dev/null 2>&1
        kill_ours
        if [ -d "$cg" ]; then
            while read -r p; do echo "$p" >/sys/fs/cgroup/cgroup.procs; done <"$cg/cgroup.procs" 2>/dev/null
            rmdir "$cg" 2>/dev/null
        fi
    }
    trap cleanup_ml EXIT
    trap 'exit 143' TERM INT
    make_bundle "$D/b" '{"gpu.share":"timeslice","gpu.share.memory":"1Gi"}'
    # The limiter is mounted too (every mode with a cap): the hook checks the image's glibc.
    mkdir -p "$D/b/rootfs/lib64" "$D/b/rootfs/lib/x86_64-linux-gnu"
    cp /lib64/ld-linux-x86-64.so.2 "$D/b/rootfs/lib64/" 2>/dev/null
    cp /lib/x86_64-linux-gnu/libc.so.6 "$D/b/rootfs/lib/x86_64-linux-gnu/" 2>/dev/null
    python3 - "$D/b/config.json" "/gpushare-gpu-run-$$" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["linux"] = {"cgroupsPath": sys.argv[2]}
json.dump(c, open(sys.argv[1], "w"))
EOF
    mkdir "$cg" || { fail "driver memory limits: mkdir $cg"; return 0; }
    sleeper=$(stand_in)
    echo "$sleeper" >"$cg/cgroup.procs" || { fail "driver memory limits: cannot move a process into $cg"; return 0; }
    state=$(oci_state "$id" "$sleeper" "$D/b")
    local plan
    plan=$(echo "$state" | run_to 15 "$hook" createRuntime --dry-run 2>&1)
    say "plan: $plan"
    echo "$plan" | grep -q '"backend":"driver"' && pass "driver memory limits: the plan chooses the driver backend" \
        || fail "driver memory limits: the plan does not choose the driver ($plan)"
    echo "$state" | run_to 20 "$hook" createRuntime || { fail "driver memory limits: createRuntime"; return 0; }
    local got
    got=$(run_to 10 nvidia-smi memory-limits --get -n "$cg" -i 0 2>&1)
    say "nvidia-smi memory-limits --get: $got"
    in_cg() { sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"; }
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" hold 600 >"$D/hold" 2>&1 &
    local h=$! i=0
    ours $h
    while ! grep -q HELD=1 "$D/hold" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
    local second one mi
    second=$(in_cg env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
    kill $h 2>/dev/null
    wait $h 2>/dev/null
    one=$(in_cg env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" fill 64 2>&1 | val ALLOC_TOTAL)
    mi=$(in_cg env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" meminfo 2>&1 | tr '\n' ' ')
    say "in the 1 GiB cgroup without the preload: alone $one bytes; beside a 600 MiB holder $second bytes; meminfo $mi"
    res driver_limit_fill_alone_beside600 "$one/$second"
    num "$one" && [ "$one" -le $GIB ] && pass "driver memory limits: one process stops at the cap ($one bytes)" \
        || fail "driver memory limits: one process allocated '$one' bytes"
    num "$second" && [ "$second" -le $((GIB - 600 * 1048576 + 67108864)) ] \
        && pass "driver memory limits: the cap holds across processes ($second bytes beside 600 MiB)" \
        || fail "driver memory limits: beside a 600 MiB holder a second process got '$second' bytes"
    echo "$state" | run_to 20 "$hook" poststop
    state=
    got=$(run_to 10 nvidia-smi memory-limits --get -n "$cg" -i 0 2>&1)
    echo "$got" | grep -q 'hard limit: 1024 MiB' && fail "driver memory limits: poststop left the limit: $got" \
        || pass "driver memory limits: poststop cleared the limit"
}

# ---------------------------------------------------------------- section 4: overhead
sec_overhead() {
    D=$RA_WORK/overhead lib=$RA_BIN/libgpushare_limiter.so hook=$RA_BIN/gpushare-hook pid='' pipe='' # globals
    local reps=${RA_REPS:-5} mps=no
    mkdir -p "$D"
    [ -n "$RA_CHECK" ] || { skip "overhead: no CUDA program built"; return 0; }
    trap '[ -n "$pid" ] && echo "{\"id\":\"ovh\",\"bundle\":\"$D/c\"}" | timeout 20 "$hook" poststop >/dev/null 2>&1; kill_ours' EXIT
    trap 'exit 143' TERM INT
    if [ -n "$RA_MPSCTL" ] && [ "$RA_NS" = yes ] && [ "$RA_MODE0" = Default ]; then
        write_config "$D" "[mps]
control = \"$RA_MPSCTL\"
isolation = \"group\"
exclusive_compute_mode = false
start_timeout_seconds = 20"
        export GPUSHARE_CONFIG=$D/config.toml
        make_bundle "$D/c" '{"gpu.share":"mps","gpu.share.group":"bench"}'
        pid=$(stand_in)
        if oci_state ovh "$pid" "$D/c" | run_to 30 "$hook" createRuntime; then
            nsenter -t "$pid" -m mount --bind "$D/c/rootfs/dev/shm" /dev/shm && mps=yes
            pipe=$D/c/rootfs/tmp/nvidia-mps
        else
            note "overhead: MPS domain for the benchmark not acquired; mps rows skipped"
        fi
    else
        note "overhead: mps rows skipped (no MPS control program, namespaces, or compute mode not Default)"
    fi
    variant() { # NAME: runs one `check bench` in that setting
        case $1 in
        bare) run_to 30 env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" bench ;;
        limit) run_to 30 env CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache" \
            GPUSHARE_LIMITS_FILE="$D/none" LD_PRELOAD="$lib" "$RA_CHECK" bench ;;
        mps) run_to 30 nsenter -t "$pid" -m env CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$pipe" "$RA_CHECK" bench ;;
        mps+limiter) run_to 30 nsenter -t "$pid" -m env CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$pipe" \
            CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache-mps" GPUSHARE_LIMITS_FILE="$D/none" \
            LD_PRELOAD="$lib" "$RA_CHECK" bench ;;
        esac
    }
    local vs="bare limit" v r t0 out
    # A first MPS client starts the MPS server: not counted. A client that finds no daemon runs
    # without MPS, so the server must be listed.
    if [ $mps = yes ]; then
        variant mps >/dev/null 2>&1
        local servers
        servers=$(echo get_server_list | run_to 5 nsenter -t "$pid" -m env CUDA_MPS_PIPE_DIRECTORY="$pipe" "$RA_MPSCTL" 2>&1)
        say "MPS server of the benchmark's domain: [$(echo $servers)]"
        if [ -z "$(echo $servers | tr -cd 0-9)" ]; then
            fail "overhead: no MPS server after a client ran; mps rows skipped"
            mps=no
        fi
    fi
    [ $mps = yes ] && vs="$vs mps mps+limiter"
    for r in $(seq "$reps"); do
        for v in $vs; do
            t0=$(ms_now)
            out=$(variant "$v" 2>&1)
            echo "WALL_MS=$(($(ms_now) - t0))" >>"$D/$v.$r"
            echo "$out" >>"$D/$v.$r"
            echo "$out" | grep -q '^MEMINFO_US=' || say "$v run $r: $(echo "$out" | tail -2 | tr '\n' ' ')"
        done
    done
    printf '%-12s %10s %10s %10s %11s %11s   (medians of %s runs; ratio to bare)\n' variant wall_ms init_ms malloc_us launch_us meminfo_us "$reps"
    local k m
    declare -A BASE
    for v in $vs; do
        local line="" rl=""
        for k in WALL_MS INIT_MS MALLOC_US LAUNCH_US MEMINFO_US; do
            m=$(cat "$D/$v".* 2>/dev/null | val_all "$k" | median)
            [ $v = bare ] && BASE[$k]=$m
            line="$line $(printf '%10s' "${m:-n/a}")"
            rl="$rl $(ratio "$m" "${BASE[$k]:-}")"
        done
        printf '%-12s%s   x%s\n' "$v" "$line" "$(echo $rl | tr ' ' '/')"
        res "overhead_${v}_wall_init_malloc_launch_meminfo" "$(echo $line | tr ' ' '/') (x bare: $(echo $rl | tr ' ' '/'))"
    done
    if [ $mps = yes ]; then
        echo "{\"id\":\"ovh\",\"bundle\":\"$D/c\"}" | run_to 20 "$hook" poststop
        pid=
    fi
}
val_all() { sed -n "s/^$1=//p"; }

sec_pytorch() {
    local D=$RA_WORK/pytorch lib=$RA_BIN/libgpushare_limiter.so
    mkdir -p "$D"
    trap kill_ours EXIT
    trap 'exit 143' TERM INT
    cat >"$D/bench.py" <<'EOF'
import time, os
t0 = time.time()
import torch
t1 = time.time()
x = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
t2 = time.time()
for _ in range(3):
    y = x @ x
torch.cuda.synchronize()
t3 = time.time()
for _ in range(50):
    y = x @ x
torch.cuda.synchronize()
t4 = time.time()
small = time.time()
for _ in range(2000):
    z = torch.empty(1 << 20, device="cuda", dtype=torch.uint8)
    del z
torch.cuda.synchronize()
t5 = time.time()
print(f"TORCH={torch.__version__} CUDA={torch.version.cuda} DEV={torch.cuda.get_device_name(0)}")
print(f"IMPORT_S={t1-t0:.2f}\nINIT_S={t2-t1:.2f}\nMATMUL50_MS={(t4-t3)*1e3:.1f}\nALLOC2000_MS={(t5-t4)*1e3:.1f}")
print(f"MEM_TOTAL={torch.cuda.mem_get_info()[1]}")
EOF
    local v r out
    for r in 1 2 3; do
        for v in bare limit; do
            if [ $v = bare ]; then
                out=$(run_to 40 env CUDA_VISIBLE_DEVICES=0 python3 "$D/bench.py" 2>&1)
            else
                out=$(run_to 40 env CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$D/cache" \
                    GPUSHARE_LIMITS_FILE="$D/none" LD_PRELOAD="$lib" python3 "$D/bench.py" 2>&1)
            fi
            echo "$out" >"$D/$v.$r"
            echo "$out" | grep -q '^MEM_TOTAL=' || say "pytorch $v run $r: $(echo "$out" | tail -3 | tr '\n' ' ')"
            [ $r = 1 ] && say "pytorch $v: $(echo "$out" | tr '\n' ' ')"
            [ "$(elapsed)" -gt "$((RA_DEADLINE - 25))" ] && break 2
        done
    done
    local k m line
    for v in bare limit; do
        line=""
        for k in INIT_S MATMUL50_MS ALLOC2000_MS; do
            m=$(cat "$D/$v".* 2>/dev/null | val_all "$k" | median)
            line="$line $k=${m:-n/a}"
        done
        say "pytorch $v (median):$line"
        res "pytorch_$v" "$line; mem_total $(val MEM_TOTAL <"$D/$v.1")"
    done
    grep -q "^MEM_TOTAL=8589934592$" "$D/limit.1" && pass "pytorch: under the limiter torch.cuda.mem_get_info total is the 8 GiB cap" \
        || fail "pytorch: under the limiter mem_get_info total '$(val MEM_TOTAL <"$D/limit.1")', expected 8589934592"
}

# ---------------------------------------------------------------- section dispatch
if [ "${1:-}" = __section ]; then
    declare -f "sec_$2" >/dev/null || { echo "no section $2"; exit 2; }
    "sec_$2"
    exit 0
fi

# ---------------------------------------------------------------- main
RA_START=$(date +%s)
export RA_START
export RA_DEADLINE=${RA_DEADLINE:-270}
RA_WORK=$(mktemp -d /tmp/gpushare-gpu-run.XXXXXX)
export RA_WORK
LOG=${OUT:+$OUT/gpu-run.log}
LOG=${LOG:-/tmp/gpushare-gpu-run.log}
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
: >"$RA_WORK/verdicts"
: >"$RA_WORK/results"
RA_BIN=$(cd "${GPUSHARE_BIN:-$ROOT/.gpu-carry}" 2>/dev/null && pwd) || RA_BIN=/nonexistent
export RA_BIN
# A copy that lost its mode bits on the way.
for f in "$RA_BIN/gpushare-hook" "$RA_BIN/gpushare-runtime" "$RA_BIN"/mps/nvidia-cuda-mps-*; do
    [ -f "$f" ] && [ ! -x "$f" ] && chmod +x "$f" 2>/dev/null
done
if [ -n "${RA_SIM_NVML:-}" ]; then
    export GPUSHARE_SIM_DEVICES=81920 GPUSHARE_SIM_STATE=$RA_WORK/sim
    mkdir -p "$GPUSHARE_SIM_STATE"
fi

final_cleanup() {
    kill_ours
    gc_all
    local l
    [ -f "$RA_WORK/added-links" ] && while read -r l; do rm -f "$l" && say "cleanup: removed $l"; done <"$RA_WORK/added-links"
    [ -n "${OUT:-}" ] && cp "$RA_WORK"/guesses-real.out "$OUT/" 2>/dev/null
    rm -rf "$RA_WORK"
}

main() {
    cd "$ROOT" || exit 1
    hdr "gpushare GPU run: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || cat "$ROOT/.gpu-carry/MANIFEST" 2>/dev/null | head -1)"
    # -------- binaries
    local bin=$RA_BIN
    if [ ! -x "$bin/gpushare-hook" ] || [ ! -f "$bin/libgpushare_limiter.so" ]; then
        say "FATAL: no gpushare-hook / libgpushare_limiter.so in ${GPUSHARE_BIN:-.gpu-carry}: run tests/gpu/prepare.sh and carry .gpu-carry"
        fail "binaries missing"
    else
        cat "$bin/MANIFEST" 2>/dev/null
        say "gpushare-hook: $("$bin/gpushare-hook" --version 2>&1 | head -1)"
    fi
    # -------- inventory
    hdr "0. inventory"
    say "kernel: $(uname -a)"
    say "user: $(id)  cpus: $(nproc)  mem: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
    say "glibc: $(ldd --version 2>&1 | head -1)"
    local gpu_ok=no
    if [ -n "${RA_SIM_NVML:-}" ]; then
        say "DRY RUN: NVML is the TEST-ONLY simulated driver $RA_SIM_NVML; no CUDA program will run"
        export RA_NVML=$RA_SIM_NVML
        res gpu "simulated (dry run)"
    elif command -v nvidia-smi >/dev/null; then
        run_to 15 nvidia-smi 2>&1 | head -25 | tee "$RA_WORK/smi.txt"
        res cuda_driver_api "$(grep -o 'CUDA Version: [0-9.]*' "$RA_WORK/smi.txt" | head -1)"
        local q
        q=$(run_to 15 nvidia-smi -i 0 --query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current,persistence_mode,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1)
        say "GPU 0: $q"
        if run_to 15 nvidia-smi -L 2>/dev/null | grep -q '^GPU 0'; then
            gpu_ok=yes
            res gpu "$(echo "$q" | cut -d, -f1 | sed 's/^ *//')"
            res driver "$(echo "$q" | cut -d, -f2 | tr -d ' ')"
            res gpu_memory "$(echo "$q" | cut -d, -f3 | sed 's/^ *//')"
        fi
        cat /proc/driver/nvidia/version 2>/dev/null | head -2
    else
        say "nvidia-smi: not found"
    fi
    local nvcc
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
    if [ -n "$nvcc" ]; then
        say "nvcc ($nvcc): $("$nvcc" --version 2>&1 | grep -i release)"
        res cuda_nvcc "$("$nvcc" --version 2>&1 | grep -io 'release [0-9.]*, V[0-9.]*')"
    else
        say "nvcc: not found"
    fi
    say "python3: $(python3 --version 2>&1); torch: $(run_to 10 python3 -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo none)"
    # NVML library and its r615 memory-limit functions.
    if [ -z "${RA_SIM_NVML:-}" ]; then
        local nvml
        nvml=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml.so.1 / {print $NF; exit}')
        [ -n "$nvml" ] || nvml=$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/lib64/libnvidia-ml.so.1 2>/dev/null | head -1)
        export RA_NVML=${nvml:-libnvidia-ml.so.1}
    fi
    say "NVML: $RA_NVML"
    export RA_NVML_MEMLIMITS
    RA_NVML_MEMLIMITS=$(run_to 10 python3 -c '
import ctypes, sys
l = ctypes.CDLL(sys.argv[1])
print("yes" if all(hasattr(l, f) for f in ("nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1")) else "no")' "$RA_NVML" 2>&1 | tail -1)
    say "NVML has nvmlDeviceSetMemoryLimits_v1/GetMemoryLimits_v1: $RA_NVML_MEMLIMITS"
    # MPS programs: on PATH, in the driver's folders, or (last) the carried ones.
    local ctl="" srv="" d
    ctl=$(command -v nvidia-cuda-mps-control 2>/dev/null)
    local mps_dirs="/usr/local/nvidia/bin /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin /opt/nvidia/bin /usr/lib/nvidia/bin /usr/local/cuda/bin"
    for d in $mps_dirs; do
        [ -z "$ctl" ] && [ -x "$d/nvidia-cuda-mps-control" ] && ctl=$d/nvidia-cuda-mps-control
    done
    [ -z "$ctl" ] && [ -z "${RA_SIM_NVML:-}" ] && ctl=$(run_to 8 find /usr/local /opt /usr/lib /usr/lib64 -maxdepth 5 -name nvidia-cuda-mps-control -type f 2>/dev/null | head -1)
    if [ -n "$ctl" ]; then
        srv=$(PATH=$SAFE_PATH command -v nvidia-cuda-mps-server 2>/dev/null)
        [ -z "$srv" ] && [ -x "$(dirname "$ctl")/nvidia-cuda-mps-server" ] && srv=$(dirname "$ctl")/nvidia-cuda-mps-server
        for d in $mps_dirs; do
            [ -z "$srv" ] && [ -x "$d/nvidia-cuda-mps-server" ] && srv=$d/nvidia-cuda-mps-server
        done
        [ -z "$srv" ] && srv=$(run_to 8 find /usr/local /opt /usr/lib /usr/lib64 -maxdepth 5 -name nvidia-cuda-mps-server -type f 2>/dev/null | head -1)
        say "MPS: control $ctl, server ${srv:-NOT FOUND}"
        res mps_binaries "$ctl (server ${srv:-missing})"
    elif [ -x "$bin/mps/nvidia-cuda-mps-control" ] && [ ! -e /usr/local/bin/nvidia-cuda-mps-control ]; then
        note "MPS: no nvidia-cuda-mps-control on this machine; using the carried ones ($(cat "$bin/mps/VERSION" 2>/dev/null)), which may not match driver $(cat /sys/module/nvidia/version 2>/dev/null)"
        ctl=$bin/mps/nvidia-cuda-mps-control
        srv=$bin/mps/nvidia-cuda-mps-server
        res mps_binaries "carried $(cat "$bin/mps/VERSION" 2>/dev/null) (none on the machine)"
    else
        say "MPS: nvidia-cuda-mps-control not found"
        res mps_binaries "none"
    fi
    # The control daemon starts the server with execlp on gpushare's fixed PATH: make it findable.
    if [ -n "$srv" ] && ! PATH=$SAFE_PATH command -v nvidia-cuda-mps-server >/dev/null 2>&1; then
        if [ ! -e /usr/local/bin/nvidia-cuda-mps-server ] && ln -s "$srv" /usr/local/bin/nvidia-cuda-mps-server 2>/dev/null; then
            echo /usr/local/bin/nvidia-cuda-mps-server >>"$RA_WORK/added-links"
            say "MPS: linked /usr/local/bin/nvidia-cuda-mps-server -> $srv (removed at the end)"
        else
            note "MPS: nvidia-cuda-mps-server is not on $SAFE_PATH and could not be linked there"
        fi
    fi
    export RA_MPSCTL=$ctl
    # Namespaces, mounts, cgroup v2.
    export RA_NS=no
    if run_to 10 unshare -m --propagation private sh -c 'mount -t tmpfs none /mnt && umount /mnt' 2>"$RA_WORK/ns.err" \
        && command -v nsenter >/dev/null; then
        RA_NS=yes
    fi
    say "unshare -m + mount + nsenter: $RA_NS $(head -1 "$RA_WORK/ns.err")"
    export RA_CGROUP
    RA_CGROUP=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)
    if [ "$RA_CGROUP" = cgroup2fs ]; then
        if mkdir /sys/fs/cgroup/gpushare-probe-$$ 2>/dev/null; then
            rmdir /sys/fs/cgroup/gpushare-probe-$$
            RA_CGROUP="$RA_CGROUP writable"
        else
            RA_CGROUP="$RA_CGROUP read-only"
        fi
        RA_CGROUP="$RA_CGROUP, controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
    fi
    say "cgroup: ${RA_CGROUP:-none}"
    say "/dev/shm: $(df -h /dev/shm 2>/dev/null | tail -1)"
    export RA_MODE0
    RA_MODE0=$(gpu_mode)
    say "compute mode of GPU 0: $RA_MODE0"
    res compute_mode_before "$RA_MODE0"
    if [ -x "$RA_BIN/gpushare-hook" ]; then
        write_config "$RA_WORK/doctor" "[mps]
control = \"${ctl:-nvidia-cuda-mps-control}\"
[runtime]
hook = \"$RA_BIN/gpushare-hook\""
        say "gpushare-hook doctor:"
        GPUSHARE_CONFIG=$RA_WORK/doctor/config.toml run_to 20 "$RA_BIN/gpushare-hook" doctor 2>&1 | head -40 | sed 's/^/  /'
    fi
    # -------- build the CUDA programs
    hdr "build (nvcc)"
    export RA_CHECK="" RA_GUESSES="" RA_SMS=""
    if [ -n "${RA_SIM_NVML:-}" ]; then
        skip "CUDA programs: dry run"
        if [ -n "${RA_DRY_CHECK:-}" ]; then
            RA_CHECK=$RA_DRY_CHECK RA_GUESSES=$RA_DRY_CHECK
            "$RA_CHECK" meminfo >"$RA_WORK/bare.meminfo"
            "$RA_CHECK" smshare >"$RA_WORK/bare.smshare"
            RA_SMS=$(val SMS <"$RA_WORK/bare.smshare")
            note "dry run: $RA_DRY_CHECK stands in for the CUDA programs (its figures mean nothing)"
        fi
    elif [ -z "$nvcc" ] || [ $gpu_ok != yes ]; then
        skip "CUDA programs: no nvcc or no GPU"
    else
        local cuda_home
        cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
        mkdir -p "$RA_WORK/bin"
        (
            for arch in -arch=native -arch=sm_90 ""; do
                run_to 120 "$nvcc" -O2 $arch -o "$RA_WORK/bin/check" tests/gpu/limiter_check.cu >"$RA_WORK/nvcc.check" 2>&1 && { echo "built with ${arch:-no -arch}" >>"$RA_WORK/nvcc.check"; break; }
            done
        ) &
        local b1=$!
        run_to 60 "$nvcc" -O2 -o "$RA_WORK/bin/guesses" tests/gpu/guesses.c -L"$cuda_home/lib64/stubs" -L"$cuda_home/targets/x86_64-linux/lib/stubs" -lcuda >"$RA_WORK/nvcc.guesses" 2>&1 \
            || run_to 60 "$nvcc" -O2 -o "$RA_WORK/bin/guesses" tests/gpu/guesses.c -L"$(dirname "$(ldconfig -p | awk '/libcuda.so.1 / {print $NF; exit}')")" -l:libcuda.so.1 >>"$RA_WORK/nvcc.guesses" 2>&1
        wait $b1
        [ -x "$RA_WORK/bin/check" ] && RA_CHECK=$RA_WORK/bin/check && say "limiter_check.cu: $(tail -1 "$RA_WORK/nvcc.check")" \
            || { fail "nvcc tests/gpu/limiter_check.cu"; cat "$RA_WORK/nvcc.check"; }
        [ -x "$RA_WORK/bin/guesses" ] && RA_GUESSES=$RA_WORK/bin/guesses && say "guesses.c: built" \
            || { fail "build tests/gpu/guesses.c"; cat "$RA_WORK/nvcc.guesses"; }
        if [ -n "$RA_CHECK" ]; then
            run_to 30 env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" meminfo >"$RA_WORK/bare.meminfo" 2>&1
            run_to 30 env CUDA_VISIBLE_DEVICES=0 "$RA_CHECK" smshare >"$RA_WORK/bare.smshare" 2>&1
            say "bare: $(tr '\n' ' ' <"$RA_WORK/bare.meminfo")"
            say "bare smshare (the positive control of the MPS SM share): $(tr '\n' ' ' <"$RA_WORK/bare.smshare")"
            local bs
            bs=$(val SHARE_PCT <"$RA_WORK/bare.smshare")
            RA_SMS=$(val SMS <"$RA_WORK/bare.smshare")
            num "$bs" && [ "$bs" -ge 85 ] && pass "smshare measures ${bs}% of the SMs for a lone process (positive control)" \
                || { fail "smshare on a lone process: '$bs'% (the MPS share checks cannot be trusted)"; }
            res bare_sm_share_pct "$bs"
        fi
    fi
    # -------- sections, each under its own timeout and the global deadline
    section() { # NAME BUDGET TITLE
        local name=$1 budget=$2 left
        hdr "$3"
        left=$((RA_DEADLINE - $(elapsed) - 10))
        if [ $left -lt 8 ]; then
            skip "$3: out of time ($(elapsed) s gone of $RA_DEADLINE)"
            return
        fi
        [ "$budget" -gt $left ] && budget=$left
        local t0 rc
        t0=$(date +%s)
        timeout -k 3 "$budget" bash "$SELF" __section "$name"
        rc=$?
        [ $rc = 124 ] || [ $rc = 137 ] && fail "$3: timed out after $budget s (figures above are partial)"
        say "[section $name: $(($(date +%s) - t0)) s, rc $rc]"
        kill_ours
    }
    if [ ! -x "$RA_BIN/gpushare-hook" ]; then
        skip "all sections: no binaries"
    elif [ $gpu_ok != yes ] && [ -z "${RA_SIM_NVML:-}" ]; then
        skip "1. MPS: no GPU"
        skip "2. limiter and guesses: no GPU"
        skip "3. driver memory limits: no GPU"
        skip "4. overhead: no GPU"
    else
        section mps 90 "1. MPS through gpushare"
        section limiter 60 "2. limiter on the real driver, and the simulated driver's guesses"
        section memlimits 40 "3. driver memory limits (nvmlDeviceSetMemoryLimits_v1, cgroup v2)"
        section overhead 60 "4. overhead: bare, limit, mps, mps+limiter"
        if [ "$(elapsed)" -lt $((RA_DEADLINE - 90)) ] && [ $gpu_ok = yes ]; then
            section pytorch 75 "4b. PyTorch: bare and under the limiter"
        else
            hdr "4b. PyTorch"
            skip "PyTorch: not enough time left ($(elapsed) s gone) or no GPU"
        fi
    fi
    # -------- summary
    local mode_after
    mode_after=$(gpu_mode)
    [ "$mode_after" = "$RA_MODE0" ] || fail "compute mode is $mode_after at the end, was $RA_MODE0"
    hdr "SUMMARY"
    say "gpushare $(head -1 "$RA_BIN/MANIFEST" 2>/dev/null), run $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s"
    say "| figure | value |"
    say "| --- | --- |"
    awk '{k = $0; sub(/=.*/, "", k); v = $0; sub(/^[^=]*=/, "", v); printf "| %s | %s |\n", k, v}' "$RA_WORK/results"
    [ -f "$RA_WORK/guesses-table" ] && { say "guesses, real vs simulated:"; cat "$RA_WORK/guesses-table"; }
    say "--"
    grep -c '^PASS' "$RA_WORK/verdicts" | sed 's/^/PASS count: /'
    grep -v '^PASS' "$RA_WORK/verdicts"
    local nf
    nf=$(grep -c '^FAIL' "$RA_WORK/verdicts")
    say "FAILED: $nf"
    [ "$nf" = 0 ]
}

trap final_cleanup EXIT
trap 'exit 143' TERM INT
set -o pipefail
main 2>&1 | tee "$LOG"
rc=$?
exit $rc
