#!/usr/bin/env python3
"""Kill storms and soaks against the built `gpushare-hook` on the TEST-ONLY simulated driver,
with sleeping processes in mount namespaces of their own as container stand-ins (as the tests'
FakeContainer). Driven only through the CLI and `status --json`; invariants are checked by
scripts/check-invariants.py. Needs root and nvidia-cuda-mps-control.

    storm.py storm ROUNDS SEED   # scripts/kill-storm.sh
    storm.py soak CYCLES [SEED]  # scripts/soak.sh

Environment: GS_HOOK (default target/debug/gpushare-hook), GS_SIMDRIVER (default next to it),
GS_ISOLATION (`gpu`, the default, or `group`: MPS containers then name one of three groups, so
several isolation domains share each GPU).
"""
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "check_invariants", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-invariants.py"))
inv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inv)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPUS = 4
# GS_ISOLATION=group: MPS containers name one of three groups, so that several isolation
# domains (daemons) share each GPU; "mps" then stands for the first group's bundle.
ISOLATION = os.environ.get("GS_ISOLATION", "gpu")
GROUPS = ["", "#1", "#2"] if ISOLATION == "group" else [""]
MODES = [f"mps{g}" for g in GROUPS] * (6 // len(GROUPS)) + ["limit", "timeslice"]


class World:
    """A sandbox: policy file, state dir, simulated driver state, one bundle per GPU and mode."""

    def __init__(self):
        self.hook = os.environ.get("GS_HOOK", os.path.join(REPO, "target/debug/gpushare-hook"))
        sim_lib = os.environ.get("GS_SIMDRIVER", os.path.join(os.path.dirname(self.hook), "libgpushare_simdriver.so"))
        for p in (self.hook, sim_lib):
            if not os.path.exists(p):
                sys.exit(f"storm: {p} is missing: run `cargo build --workspace` first")
        if shutil.which("nvidia-cuda-mps-control") is None:
            sys.exit("storm: nvidia-cuda-mps-control is missing (scripts/install-deps.sh)")
        self.dir = tempfile.mkdtemp(prefix="gpushare-storm-")
        self.state = os.path.join(self.dir, "state")
        self.sim = os.path.join(self.dir, "sim")
        os.makedirs(self.sim)
        limiter = os.path.join(self.dir, "libgpushare_limiter.so")
        open(limiter, "w").write("stand-in\n")
        self.config = os.path.join(self.dir, "config.toml")
        with open(self.config, "w") as f:
            f.write(f'state_dir = "{self.state}"\nlog_file = "{self.dir}/log"\nlock_timeout_seconds = 20\n'
                    f'[nvml]\nlibrary = "{sim_lib}"\n[limit]\nlibrary = "{limiter}"\n'
                    f'[mps]\nisolation = "{ISOLATION}"\n')
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUSHARE_CONFIG": self.config,
            "GPUSHARE_SIM_STATE": self.sim,
            "GPUSHARE_SIM_DEVICES": ",".join(["81920"] * GPUS),
        }
        self.bundles = {}
        for g in range(GPUS):
            for m in set(MODES):
                b = os.path.join(self.dir, "bundles", f"{m}{g}")
                os.makedirs(os.path.join(b, "rootfs", "tmp"))
                ann = {"gpu.share": m.split("#")[0]}
                if m.startswith("mps"):
                    ann["gpu.share.cores"] = "50"
                    if ISOLATION == "group":
                        ann["gpu.share.group"] = "g" + (m.split("#")[1] if "#" in m else "0")
                if m == "limit":
                    ann["gpu.share.memory"] = "1Gi"
                spec = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "cwd": "/",
                        "env": [f"NVIDIA_VISIBLE_DEVICES={g}"]}, "root": {"path": "rootfs"}, "annotations": ann}
                with open(os.path.join(b, "config.json"), "w") as f:
                    json.dump(spec, f)
                self.bundles[(m, g)] = b
        self.live = {}  # id -> (container Popen, bundle)
        self.started = []  # every container stand-in, killed by close() whatever happened
        self.serial = 0

    def container(self):
        c = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "3600"],
                             stdin=subprocess.DEVNULL)
        self.started.append(c)
        # As a runtime's container process is by createRuntime: in its own mount namespace.
        own = os.readlink("/proc/self/ns/mnt")
        for _ in range(1000):
            try:
                if os.readlink(f"/proc/{c.pid}/ns/mnt") != own:
                    break
            except OSError:
                pass
            time.sleep(0.005)
        return c

    def new_id(self):
        self.serial += 1
        return f"c{self.serial}"

    def start_hook(self, stage, cid, pid, bundle):
        p = subprocess.Popen([self.hook, stage], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=self.env)
        state = {"ociVersion": "1.0.2", "id": cid, "status": "creating" if stage == "createRuntime" else "stopped",
                 "bundle": bundle}
        if pid:
            state["pid"] = pid
        try:
            p.stdin.write(json.dumps(state).encode())
            p.stdin.close()
        except BrokenPipeError:
            pass
        p.stdin = None
        return p

    def run(self, *args):
        return subprocess.run([self.hook, *args], capture_output=True, env=self.env, stdin=subprocess.DEVNULL)

    def gc(self):
        r = self.run("gc")
        return [] if r.returncode == 0 else [f"gc: exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}"]

    def check(self):
        return inv.check(self.hook, self.state, self.sim, GPUS, list(self.live), env=self.env)

    def serving(self):
        st = json.loads(self.run("status", "--json").stdout or b'{"gpus":[]}')
        return {g["index"]: g.get("mode") for g in st["gpus"]}

    def fresh_acquire(self, rng):
        """A new container on a random GPU, in a mode the GPU can take, acquires and releases."""
        g = rng.randrange(GPUS)
        mode = self.serving().get(g) or "mps"
        cid, c = self.new_id(), self.container()
        b = self.bundles[(mode, g)]
        p = self.start_hook("createRuntime", cid, c.pid, b)
        _, err = p.communicate()
        bad = []
        if p.returncode != 0:
            bad.append(f"fresh acquire ({mode} on GPU {g}): exit {p.returncode}: {err.decode(errors='replace').strip()}")
        c.kill()
        c.wait()
        p = self.start_hook("poststop", cid, None, b)
        p.communicate()
        return bad

    def unknown_daemons(self):
        """MPS control daemons running on this storm's pipe directories that no `daemon` file
        names: found by their environment (the storm's own view, not gpushare's)."""
        known = set(inv.daemons_under(self.state))
        return sorted(set(mps_processes_under(self.dir)) - known)

    def close(self):
        for c in self.started:
            if c.poll() is None:
                c.kill()
            c.wait()
        self.live.clear()
        # The GPUs' reapers first (by the pid and start time stamped in their lock files), so
        # that nothing acts on the state while it is torn down; then every daemon.
        for pid in reapers_under(self.state):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in set(inv.daemons_under(self.state)) | set(mps_processes_under(self.dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for m in sorted(inv.mounts_under(self.dir), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        if os.environ.get("STORM_KEEP"):
            print(f"storm: kept {self.dir}", flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def reapers_under(state):
    """pids of the running reapers stamped in `state`/reapers/*.lock ("pid start-time")."""
    out = []
    d = os.path.join(state, "reapers")
    for name in os.listdir(d) if os.path.isdir(d) else []:
        try:
            with open(os.path.join(d, name)) as f:
                pid, start = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        if inv.start_time(pid) == start:
            out.append(pid)
    return out


def mps_processes_under(root):
    """pids of MPS control daemon processes whose pipe directory lies under `root`."""
    want = f"CUDA_MPS_PIPE_DIRECTORY={root}/".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                if not f.read().startswith("nvidia-cuda-mps"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if any(v.startswith(want) for v in f.read().split(b"\0")):
                    out.append(int(name))
        except OSError:
            continue
    return out


def round_of_hooks(w, rng, n_hooks, gpus, kill_p, max_delay):
    """Up to n_hooks concurrent createRuntime/poststop hooks, a random subset SIGKILLed after a
    random delay. Returns the createRuntime latencies (s) of the hooks that finished."""
    jobs = []  # (kind, id, hook Popen, container Popen, bundle)
    to_stop = rng.sample(sorted(w.live), k=min(len(w.live), rng.randint(0, n_hooks // 2)))
    for cid in to_stop:
        c, b = w.live.pop(cid)
        c.kill()  # the runtime stops the container before poststop
        c.wait()
        jobs.append(("poststop", cid, w.start_hook("poststop", cid, None, b), None, b, time.monotonic()))
    for _ in range(n_hooks - len(to_stop)):
        cid, c = w.new_id(), w.container()
        b = w.bundles[(rng.choice(MODES), rng.randrange(gpus))]
        jobs.append(("create", cid, w.start_hook("createRuntime", cid, c.pid, b), c, b, time.monotonic()))
    time.sleep(rng.uniform(0, max_delay))
    for j in jobs:
        if rng.random() < kill_p and j[2].poll() is None:
            j[2].kill()
    lat = []
    for kind, cid, p, c, b, t0 in jobs:
        p.communicate()
        if kind != "create":
            continue
        if p.returncode == 0:
            lat.append(time.monotonic() - t0)
            w.live[cid] = (c, b)
        else:
            # A failed or killed createRuntime fails the create: the runtime kills the container
            # and (sometimes) runs poststop.
            c.kill()
            c.wait()
            if p.returncode > 0 and rng.random() < 0.5:
                w.start_hook("poststop", cid, None, b).communicate()
    return lat


def storm(rounds, seed):
    rng = random.Random(seed)
    w = World()
    violations, seen, t0 = [], set(), time.monotonic()

    def report(where, bad):
        # A violation that persists is reported once, in the round it first appeared.
        for b in bad:
            if b not in seen:
                seen.add(b)
                violations.append((where, b))
                print(f"round {where} (seed {seed}): {b}", flush=True)

    try:
        for r in range(1, rounds + 1):
            gpus = rng.randint(1, GPUS)
            round_of_hooks(w, rng, rng.randint(1, 16), gpus, kill_p=rng.choice([0.2, 0.5, 0.8]), max_delay=0.06)
            report(r, w.gc() + w.check())
            report(r, w.fresh_acquire(rng) + w.gc() + w.check())
            if violations and os.environ.get("STORM_STOP_ON_VIOLATION"):
                break
        for cid in list(w.live):
            c, b = w.live.pop(cid)
            c.kill()
            c.wait()
            w.start_hook("poststop", cid, None, b).communicate()
        report("final", w.gc() + w.check())
        # A daemon a SIGKILLed hook started and nobody recorded would run on for ever.
        report("final", [f"unknown daemon: pid {p} runs with no daemon file naming it"
                         for p in w.unknown_daemons()])
    finally:
        w.close()
    kinds = sorted({b.split(":")[0] for _, b in violations})
    print(f"kill-storm: {rounds} rounds, seed {seed}, {time.monotonic() - t0:.0f} s: "
          f"{len(violations)} distinct violations, first seen in {len({r for r, _ in violations})} rounds"
          + (f" ({', '.join(kinds)})" if kinds else ""))
    return 1 if violations else 0


def fds_and_size(w):
    """(open fds of the MPS daemons, state dir bytes, state dir files, daemon count)."""
    ds = inv.daemons_under(w.state)
    fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in ds if os.path.isdir(f"/proc/{p}/fd"))
    size = files = 0
    for root, _, fs in os.walk(w.state):
        for f in fs:
            try:
                # A lock file's content is its last holder's name, whose length varies.
                if not f.endswith(".lock"):
                    size += os.lstat(os.path.join(root, f)).st_size
                files += 1
            except OSError:
                pass
    return fds, size, files, len(ds)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def soak(cycles, seed):
    rng = random.Random(seed)
    w = World()
    lat, done, violations, rounds = [], 0, [], 0
    t0 = time.monotonic()
    try:
        # Baseline after one acquire/release on every GPU: the state dir then holds what it
        # keeps for good (a lock file per GPU).
        for g in range(GPUS):
            cid, c = w.new_id(), w.container()
            w.start_hook("createRuntime", cid, c.pid, w.bundles[("mps", g)]).communicate()
            c.kill()
            c.wait()
            w.start_hook("poststop", cid, None, w.bundles[("mps", g)]).communicate()
        w.gc()
        base = fds_and_size(w) + (len(os.listdir(f"/proc/{os.getpid()}/fd")),)
        while done < cycles:
            rounds += 1
            n = min(rng.randint(1, 8), cycles - done)
            lat += round_of_hooks(w, rng, n, GPUS, kill_p=0.05, max_delay=0.02)
            # Release everything still live (poststop), as containers end.
            for cid in list(w.live):
                c, b = w.live.pop(cid)
                c.kill()
                c.wait()
                w.start_hook("poststop", cid, None, b).communicate()
            done += n
            if rounds % 50 == 0:
                bad = [b for b in w.gc() + w.check() if b not in violations]
                violations += bad
                for b in bad:
                    print(f"soak round {rounds}: {b}", flush=True)
        bad = [b for b in w.gc() + w.check() if b not in violations]
        violations += bad
        for b in bad:
            print(f"soak end: {b}", flush=True)
        end = fds_and_size(w) + (len(os.listdir(f"/proc/{os.getpid()}/fd")),)
    finally:
        w.close()
    k = min(1000, len(lat) // 2)
    first, last = lat[:k], lat[-k:]
    print(f"soak: {cycles} acquire/release cycles over {GPUS} simulated GPUs in {rounds} rounds, seed {seed}, "
          f"{time.monotonic() - t0:.0f} s")
    print("| figure | first | last |\n|---|---|---|")
    print(f"| createRuntime p50 (ms), {k} hooks each | {pct(first, 0.5):.2f} | {pct(last, 0.5):.2f} |")
    print(f"| createRuntime p99 (ms) | {pct(first, 0.99):.2f} | {pct(last, 0.99):.2f} |")
    names = ["daemon fds", "state dir bytes (lock files aside)", "state dir files", "daemons", "soak driver's own fds"]
    print("| figure | baseline | end |\n|---|---|---|")
    for n, a, b in zip(names, base, end):
        print(f"| {n} | {a} | {b} |")
    drift = [n for n, a, b in zip(names, base, end) if b > a]
    if drift:
        print(f"soak: not back to baseline: {', '.join(drift)}")
    print(f"soak: {len(violations)} distinct invariant violations (each reported where first seen)")
    return 1 if violations or drift else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("storm: needs root (mounts, mount namespaces)")
    if len(sys.argv) >= 3 and sys.argv[1] == "storm":
        sys.exit(storm(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1))
    if len(sys.argv) >= 3 and sys.argv[1] == "soak":
        sys.exit(soak(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1))
    sys.exit(__doc__)
