//! The contract every MPS control keeps (the fake the tables rely on, and the real one where MPS
//! is installed), and the fakes' own rules.

use super::world::*;
use crate::host::fakes::uuid;
use crate::host::procinfo::ProcId;
use crate::vocab::{Isolation, Limits};

/// The fake's own rules, which the rows above rely on.
const NO_DEFAULTS_PROBE: Limits = Limits {
    cores: 7,
    memory_mib: None,
};

/// The contract every [`MpsControl`] keeps, run on the fake and, where MPS is installed, on the
/// real [`crate::host::mps::Control`]: `hang(p, true)` makes daemon `p` stay alive but stop
/// answering (the fake's switch; SIGSTOP for a real one).
///
/// `known`: the clauses an implementation is known to break today, left out of its run.
/// Clauses of [`control_contract`] an implementation may be known to break; the fake and the
/// real `Control` keep them all (the real one refused no second start and lost refreshes while
/// it ran NVIDIA's client detached; it speaks the protocol itself now).
#[derive(Clone, Copy)]
struct Known {
    /// A start on a pipe a live daemon serves fails and leaves that daemon serving.
    second_start_refused: bool,
    /// `refresh` then `flush` puts the defaults back.
    refresh_lands: bool,
}

const ALL_CLAUSES: Known = Known {
    second_start_refused: true,
    refresh_lands: true,
};

fn control_contract(
    ctl: &dyn crate::host::mps::MpsControl,
    uuid: &str,
    dirs: &crate::host::mps::MpsDirs,
    hang: &dyn Fn(ProcId, bool),
    known: Known,
) {
    let t = std::time::Duration::from_secs(10);
    let pipe = &dirs.pipe;
    // Nothing before a start (whoever is named as the daemon: here this very process).
    let nobody = ProcId::of(std::process::id() as i32).expect("this process");
    assert_eq!(ctl.find_daemon(pipe), None, "no daemon before start");
    assert!(!ctl.answers(pipe, nobody), "nothing answers before start");
    assert!(
        ctl.defaults(pipe, nobody).is_err(),
        "no defaults without a daemon"
    );
    assert!(
        ctl.refresh(pipe, nobody, &POLICY).is_err(),
        "no socket accepts"
    );
    // A started daemon is live, found, answers; a second start on its pipe fails and leaves
    // the first serving.
    let p = ctl.start(uuid, dirs, false, t).expect("start");
    assert!(p.is_alive());
    assert_eq!(ctl.find_daemon(pipe), Some(p));
    assert!(ctl.answers(pipe, p));
    // Only the daemon it was started as is believed: the same socket, named as another
    // process's, does not answer.
    assert!(
        !ctl.answers(pipe, nobody),
        "a daemon proven to be another process"
    );
    if known.second_start_refused {
        assert!(
            ctl.start(uuid, dirs, false, t).is_err(),
            "a second daemon on one pipe"
        );
        assert_eq!(ctl.find_daemon(pipe), Some(p), "the first still serves");
        assert!(ctl.answers(pipe, p), "the first still answers");
    }
    // Defaults set are read back; refresh (flushed) puts back what a tenant changed.
    ctl.set_defaults(pipe, p, &POLICY).expect("set_defaults");
    assert_eq!(ctl.defaults(pipe, p).expect("defaults"), POLICY);
    ctl.set_defaults(pipe, p, &NO_DEFAULTS_PROBE)
        .expect("set_defaults");
    assert_eq!(ctl.defaults(pipe, p).expect("defaults"), NO_DEFAULTS_PROBE);
    ctl.refresh(pipe, p, &POLICY)
        .expect("refresh of a live daemon");
    ctl.flush();
    if known.refresh_lands {
        let deadline = std::time::Instant::now() + 2 * t;
        let mut last = Vec::new();
        loop {
            let r = ctl.defaults(pipe, p);
            if r.as_ref().ok() == Some(&POLICY) {
                break;
            }
            last.push(format!("{r:?}"));
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {:?} waiting for refresh to put the defaults back; read: {last:#?}",
                2 * t
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    // A hung daemon is still found, but it does not answer, so a joiner's refresh fails (within
    // its deadline) instead of handing the daemon on; stop kills the process it is given.
    hang(p, true);
    assert_eq!(ctl.find_daemon(pipe), Some(p), "a hung daemon is found");
    assert!(!ctl.answers(pipe, p), "a hung daemon does not answer");
    assert!(
        ctl.refresh(pipe, p, &POLICY).is_err(),
        "a hung daemon fails refresh"
    );
    ctl.stop(pipe, Some(p));
    // (SIGKILL lands a moment after `stop` returns.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p.is_alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "stop did not kill the hung daemon it was given ({p:?}) within 5s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(ctl.find_daemon(pipe), None);
    assert!(!ctl.answers(pipe, p));
    assert!(ctl.set_defaults(pipe, p, &POLICY).is_err());
    // Stop is idempotent.
    ctl.stop(pipe, None);
    ctl.stop(pipe, Some(p));
}

#[test]
fn the_fake_control_keeps_the_contract() {
    let w = World::new(Isolation::Gpu, TWO_GPUS);
    let dirs = w.host().mps_dirs(&uuid(0), "gpu");
    let pipe = dirs.pipe.clone();
    let h = w.host();
    let ctl = h.control().unwrap();
    control_contract(
        ctl,
        &uuid(0),
        &dirs,
        &|_, on| w.ctl.hang(&pipe, on),
        ALL_CLAUSES,
    );
    ctl.flush();
}

#[test]
fn the_real_control_keeps_the_contract() {
    let Some(bin) = crate::host::mps::find_binary("nvidia-cuda-mps-control") else {
        let msg = "SKIPPED: the real MPS control contract: nvidia-cuda-mps-control missing; run scripts/install-deps.sh";
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{msg} (CI requires it)"
        );
        eprintln!("\n******** {msg} ********\n");
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        let msg = "SKIPPED: the real MPS control contract needs root (it mounts the daemon's shm)";
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{msg} (CI requires it)"
        );
        eprintln!("\n******** {msg} ********\n");
        return;
    }
    let ctl = crate::host::mps::Control::new(&bin.display().to_string()).expect("control");
    let dir = tempfile::Builder::new()
        .prefix("gpushare-contract-")
        .tempdir()
        .unwrap();
    let dirs = crate::host::mps::MpsDirs::owned(dir.path().join("mps").join("d"), &uuid(0), "gpu");
    /// Stops whatever daemon is left and removes the directories, even when the contract fails.
    struct Clean<'a>(&'a crate::host::mps::Control, &'a crate::host::mps::MpsDirs);
    impl Drop for Clean<'_> {
        fn drop(&mut self) {
            if let Some(p) = crate::host::mps::MpsControl::find_daemon(self.0, &self.1.pipe) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            self.1.remove();
        }
    }
    let _clean = Clean(&ctl, &dirs);
    dirs.prepare(64 << 20)
        .expect("the domain's directories and mounts");
    let signal = |p: ProcId, on: bool| {
        let sig = if on {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), sig).unwrap();
    };
    control_contract(&ctl, &uuid(0), &dirs, &signal, ALL_CLAUSES);
}

#[test]
fn fakes_behave_like_the_world_they_model() {
    let w = World::new(Isolation::Gpu, TWO_GPUS);
    let pipe = w.pipe(0, "gpu");
    // A started daemon is live, found, answers; a second start on its pipe fails.
    let dirs = w.host().mps_dirs(&uuid(0), "gpu");
    let h = w.host();
    let ctl = h.control().unwrap();
    let p = ctl
        .start(&uuid(0), &dirs, false, std::time::Duration::from_secs(1))
        .unwrap();
    assert!(p.is_alive());
    assert_eq!(ctl.find_daemon(&pipe), Some(p));
    assert!(ctl.answers(&pipe, p));
    assert!(ctl
        .start(&uuid(0), &dirs, false, std::time::Duration::from_secs(1))
        .is_err());
    ctl.set_defaults(&pipe, p, &POLICY).unwrap();
    assert_eq!(ctl.defaults(&pipe, p).unwrap(), POLICY);
    // Another process on the socket is no answer from the daemon: tampered.
    let other = w.ctl.spawn_process();
    assert!(!ctl.answers(&pipe, other));
    assert!(ctl.defaults(&pipe, other).unwrap_err().is_tampered());
    // A hung daemon is found but does not answer, and its defaults are not put back.
    w.ctl.hang(&pipe, true);
    assert!(!ctl.answers(&pipe, p));
    w.ctl.drift(&pipe, NO_DEFAULTS_PROBE);
    assert!(ctl.refresh(&pipe, p, &POLICY).is_err());
    assert_eq!(w.ctl.defaults_on(&pipe), Some(NO_DEFAULTS_PROBE));
    ctl.stop(&pipe, None);
    assert!(
        p.is_alive(),
        "nothing is signalled without a recorded daemon"
    );
    ctl.stop(&pipe, Some(p));
    assert!(!p.is_alive());
    assert_eq!(ctl.find_daemon(&pipe), None);
    // The inventory records failed sets and keeps the mode.
    w.inv.fail_set(1, true);
    assert!(crate::vocab::Inventory::set_compute_mode(&w.inv, 1, EXCLUSIVE).is_err());
    assert_eq!(w.inv.modes(), [(0, DEFAULT), (1, DEFAULT)]);
    assert_eq!(w.inv.sets(), [(1, EXCLUSIVE)]);
    // A dead process is dead.
    assert!(!w.ctl.dead_process().is_alive());
}
