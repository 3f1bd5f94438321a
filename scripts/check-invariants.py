#!/usr/bin/env python3
"""Checks gpushare's host invariants after `gc`, from the outside: `status --json`, /proc, the
mount table, the state dir and the TEST-ONLY simulated driver's compute modes. Shared by
scripts/kill-storm.sh and scripts/soak.sh; usable alone:

    scripts/check-invariants.py --hook BIN --state DIR --sim DIR --gpus N [--live ID ...]

The hook runs with the caller's env (GPUSHARE_CONFIG, GPUSHARE_SIM_*). Prints one line per
violation and exits 1 when there is any; exits 0 and prints nothing otherwise.

Invariants:
  records    the clients in the records are exactly the live containers (--live), all alive
  daemons    at most one MPS control daemon per pipe dir; an isolation domain has a daemon iff
             it has mps clients; every daemon process found is one a record names
  mounts     no mount under the state dir except a domain's shm while its daemon runs
  files      no temp file (*.tmp) and no pending-* dir under the state dir, no per-container dir
             of a container that is not live, no MPS dir of a domain without a daemon
  modes      under isolation "gpu" a GPU is EXCLUSIVE_PROCESS (3) iff its daemon runs, DEFAULT
             (0) otherwise; with several domains per GPU it stays DEFAULT
"""
import argparse
import json
import os
import subprocess
import sys


def start_time(pid):
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), None for a gone or zombie pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 1:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def daemons_under(state):
    """pid -> pipe dir of the running MPS control daemons gpushare started under `state`: as
    gpushare knows them, by the pid and start time it wrote into <state>/mps/<id>/daemon when it
    spawned each (never by a process's name, arguments or environment, which a tenant can
    imitate)."""
    out = {}
    root = os.path.join(state, "mps")
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(root, n, "daemon")) as f:
                pid, start = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        if start_time(pid) == start:
            out[pid] = os.path.join(root, n, "pipe")
    return out


def mounts_under(state):
    prefix = state.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [l.split(" ")[4] for l in f if l.split(" ")[4].startswith(prefix)]


def compute_mode(sim, i):
    try:
        with open(os.path.join(sim, f"compute_mode.{i}")) as f:
            return int(f.read().strip() or 0)
    except OSError:
        return 0


def check(hook, state, sim, gpus, live, env=None):
    """The list of violations (strings); empty when every invariant holds."""
    bad = []
    st = subprocess.run([hook, "status", "--json"], capture_output=True, env=env)
    if st.returncode != 0:
        return [f"status: exit {st.returncode}: {st.stderr.decode(errors='replace').strip()}"]
    status = json.loads(st.stdout)
    # with_daemon: GPU index -> set of domain directories (mps/<id>) whose daemon runs.
    ids, with_daemon, daemon_pids = [], {}, set()
    for g in status["gpus"]:
        if g.get("error"):
            bad.append(f"records: GPU {g['uuid']}: {g['error']}")
        clients = g.get("clients") or []
        for c in clients:
            ids.append(c["id"])
            if not c.get("alive"):
                bad.append(f"records: client {c['id']} on GPU {g['index']} is not alive after gc")
        for dom in g.get("domains") or []:
            d = dom.get("daemon")
            mps = [c for c in clients if c.get("mode") == "mps" and c.get("domain") == dom["key"]]
            if d:
                daemon_pids.add(d["pid"])
                with_daemon.setdefault(g["index"], set()).add(os.path.basename(os.path.dirname(d["pipe"])))
                if not d.get("alive"):
                    bad.append(f"daemons: GPU {g['index']} domain {dom['key']}: recorded daemon {d['pid']} is dead")
            if bool(d) != bool(mps):
                bad.append(f"daemons: GPU {g['index']} domain {dom['key']}: daemon {'present' if d else 'absent'} with {len(mps)} mps clients")
        orphans = [c["id"] for c in clients if c.get("mode") == "mps"
                   and not any(dom["key"] == c.get("domain") for dom in g.get("domains") or [])]
        if orphans:
            bad.append(f"daemons: GPU {g['index']}: mps clients without a domain: {orphans}")
    if sorted(ids) != sorted(live):
        extra = sorted(set(ids) - set(live))
        missing = sorted(set(live) - set(ids))
        bad.append(f"records: recorded clients differ from live containers: extra {extra}, missing {missing}")
    if len(ids) != len(set(ids)):
        bad.append("records: a container is recorded twice")
    found = daemons_under(state)
    by_dir = {}
    for pid, pipe in found.items():
        by_dir.setdefault(pipe, []).append(pid)
        if pid not in daemon_pids:
            bad.append(f"daemons: daemon {pid} ({pipe}) is in no record")
    for pipe, pids in by_dir.items():
        if len(pids) > 1:
            bad.append(f"daemons: {len(pids)} daemons on {pipe}: {sorted(pids)}")
    live_dirs = set().union(*with_daemon.values()) if with_daemon else set()
    # A live domain has three capped tmpfs: its pipe directory, its log and its shm.
    shm_ok = {os.path.join(state, "mps", n, d) for n in live_dirs for d in ("pipe", "log", "shm")}
    # A live container that uses the limiter has one: its shared directory.
    shm_ok |= {os.path.join(state, "containers", n, "shared") for n in live}
    for m in mounts_under(state):
        if m not in shm_ok:
            bad.append(f"mounts: {m} is mounted")
    for root, dirs, files in os.walk(state):
        for n in files:
            if n.endswith(".tmp"):
                bad.append(f"files: temp file {os.path.join(root, n)}")
        for n in dirs:
            if n.startswith("pending-"):
                bad.append(f"files: pending dir {os.path.join(root, n)}")
    cdir = os.path.join(state, "containers")
    if os.path.isdir(cdir):
        for n in os.listdir(cdir):
            if n not in live and not n.startswith("pending-"):
                bad.append(f"files: per-container dir {n} of a container that is not live")
    mdir = os.path.join(state, "mps")
    if os.path.isdir(mdir):
        for n in os.listdir(mdir):
            if n not in live_dirs:
                bad.append(f"files: MPS dir {n} of a domain without a daemon")
    exclusive = status.get("isolation", "gpu") == "gpu"
    for i in range(gpus):
        want = 3 if exclusive and i in with_daemon else 0
        got = compute_mode(sim, i)
        if got != want:
            bad.append(f"modes: GPU {i} compute mode {got}, {'a' if want else 'no'} daemon runs")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hook", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--live", nargs="*", default=[])
    a = ap.parse_args()
    bad = check(a.hook, a.state, a.sim, a.gpus, a.live)
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
