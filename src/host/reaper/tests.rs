//! Tests of `reaper`.

use super::*;
use crate::host::fakes::{uuid, FakeInventory};
use crate::host::state::Client;
use crate::vocab::{ComputeMode, Mode};

/// No wait once the GPU is idle: the tests of how a reaper ends.
const NO_LINGER: Duration = Duration::ZERO;

/// Waits (at most 10 s) until `cond` holds.
fn until(what: &str, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < end, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child process of the test, killed when dropped, so that a failing check cannot leave the
/// reaper waiting on it.
struct Kid(std::process::Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client(process: Option<ProcId>) -> Client {
    Client {
        mode: Mode::Timeslice,
        process,
        cores: 100,
        memory: None,
        domain: None,
        kube: Default::default(),
        cap: None,
    }
}

/// CPU time (user + system, clock ticks) of thread `tid` of this process.
fn cpu_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A reaper on GPU 0 whose clients are processes of this test's own: it holds its lock
/// (stamped with this process), sleeps while they live, releases each as it exits (its
/// gc event written), and ends, its stamp cleared, once no client with a process is left.
#[test]
fn a_reaper_sleeps_releases_each_exited_client_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        state_dir: dir.path().join("state"),
        log_file: dir.path().join("gpushare.log"),
        lock_timeout_seconds: 5,
        ..Config::default()
    };
    let sd = StateDir::new(&cfg.state_dir);
    sd.ensure().unwrap();
    let u = uuid(0);
    assert_eq!(
        lock_path(&sd, &u),
        sd.root().join(format!("reapers/{u}.lock"))
    );
    let a = Kid(Command::new("sleep").arg("60").spawn().unwrap());
    let b = Kid(Command::new("sleep").arg("60").spawn().unwrap());
    let proc_of = |c: &Kid| ProcId::of(c.0.id() as i32).unwrap();
    let mut rec = Record::new(&u, 0);
    rec.clients.insert("ca".into(), client(Some(proc_of(&a))));
    rec.clients.insert("cb".into(), client(Some(proc_of(&b))));
    rec.clients.insert("cn".into(), client(None));
    assert_eq!(watched(&rec), [proc_of(&a), proc_of(&b)]);
    sd.save(&rec).unwrap();
    let clients = || -> Vec<String> {
        sd.load(&u)
            .unwrap()
            .map(|r| r.clients.into_keys().collect())
            .unwrap_or_default()
    };
    assert!(!running(&sd, &u));
    assert!(
        !sd.reaper_alive(&u),
        "asking whether one runs stamps nothing"
    );
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (cfg, u) = (&cfg, &u);
        let reaper = s.spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            run(
                cfg,
                u,
                &|| Box::new(FakeInventory::new(&[(0, ComputeMode::Default)])),
                NO_LINGER,
            )
        });
        let tid = rx.recv().unwrap();
        // The stamp that says this live process holds the lock (written once it has it;
        // asking `running` meanwhile could take the free lock from under a starting
        // reaper, which then leaves it to the asker, as a hook's check does).
        until("the reaper stamps its lock", || sd.reaper_alive(u));
        assert!(running(&sd, u));
        // A second reaper for the GPU returns at once.
        run(
            cfg,
            u,
            &|| unreachable!("the second reaper opened NVML"),
            NO_LINGER,
        )
        .unwrap();
        // While its clients live it sleeps: almost no CPU over a while.
        let before = cpu_ticks(tid);
        std::thread::sleep(Duration::from_millis(300));
        assert!(cpu_ticks(tid) - before <= 5, "the reaper spins");
        drop(a);
        until("ca released", || clients() == ["cb", "cn"]);
        assert!(!reaper.is_finished(), "cb still lives");
        // A client added meanwhile (the record changes) is watched too.
        let c = Kid(Command::new("sleep").arg("60").spawn().unwrap());
        let mut rec = sd.load(u).unwrap().unwrap();
        rec.clients.insert("cc".into(), client(Some(proc_of(&c))));
        sd.save(&rec).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(c);
        until("cc released", || clients() == ["cb", "cn"]);
        drop(b);
        // The last watched client's exit wakes it at once (not at its next rescan).
        until("the reaper ends", || reaper.is_finished());
        reaper.join().unwrap().unwrap();
    });
    assert_eq!(
        clients(),
        ["cn"],
        "a client without a process is left to poststop"
    );
    assert!(!running(&sd, &u));
    assert!(!sd.reaper_alive(&u), "its stamp cleared");
    let events = std::fs::read_to_string(cfg.events_file()).unwrap();
    for c in ["ca", "cb"] {
        assert!(
            events
                .lines()
                .any(|l| l.contains(r#""kind":"drop_client""#) && l.contains(c)),
            "{c}: {events}"
        );
    }
}

/// A config whose state dir (made) is under `dir`, with a GPU lock timeout of 1 s.
fn cfg_in(dir: &std::path::Path) -> Config {
    let cfg = Config {
        state_dir: dir.join("state"),
        log_file: dir.join("gpushare.log"),
        lock_timeout_seconds: 1,
        ..Config::default()
    };
    StateDir::new(&cfg.state_dir).ensure().unwrap();
    cfg
}

fn fake_nvml() -> Box<dyn Inventory> {
    Box::new(FakeInventory::new(&[(0, ComputeMode::Default)]))
}

/// A reaper with nothing left to watch ends under the GPU's lock: while another holds that
/// lock it waits (and keeps its stamp), and it ends once the lock is free.
#[test]
fn a_reaper_ends_only_under_the_gpu_s_lock() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg_in(dir.path());
    let sd = StateDir::new(&cfg.state_dir);
    let u = uuid(0);
    let mut rec = Record::new(&u, 0);
    rec.clients.insert("cn".into(), client(None));
    sd.save(&rec).unwrap();
    let held = sd.lock(&u, Duration::from_secs(1), "the test").unwrap();
    std::thread::scope(|s| {
        let (cfg, u) = (&cfg, &u);
        let reaper = s.spawn(move || run(cfg, u, &fake_nvml, NO_LINGER));
        until("the reaper stamps its lock", || sd.reaper_alive(u));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!reaper.is_finished(), "ended without the GPU's lock");
        assert!(sd.reaper_alive(u));
        drop(held);
        until("the reaper ends", || reaper.is_finished());
        reaper.join().unwrap().unwrap();
    });
    assert!(!sd.reaper_alive(&u));
}

/// Whether a reaper watching one live client (a process of this test's own) ends within 10 s
/// of `act` (given the state dir and the GPU), done once it has stamped its lock. The client
/// is killed afterwards either way, so that a reaper that did not end goes too.
fn ends_after(act: impl FnOnce(&StateDir, &str)) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg_in(dir.path());
    let sd = StateDir::new(&cfg.state_dir);
    let u = uuid(0);
    let mut kid = Command::new("sleep").arg("60").spawn().unwrap();
    let mut rec = Record::new(&u, 0);
    rec.clients
        .insert("c1".into(), client(ProcId::of(kid.id() as i32)));
    sd.save(&rec).unwrap();
    std::thread::scope(|s| {
        let (cfg, u) = (&cfg, &u);
        let reaper = s.spawn(move || run(cfg, u, &fake_nvml, NO_LINGER));
        until("the reaper stamps its lock", || sd.reaper_alive(u));
        act(&sd, u);
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while !reaper.is_finished() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        let ended = reaper.is_finished();
        let _ = kid.kill();
        let _ = kid.wait();
        ended
    })
}

/// The state directory removed under a waiting reaper (its watch goes with it): it ends.
#[test]
fn a_reaper_whose_state_dir_is_removed_ends() {
    let ended = ends_after(|sd, _| {
        // (What the reaper writes as it wakes may race one removal: removed again.)
        let mut tries = 0;
        while let Err(e) = std::fs::remove_dir_all(sd.root()) {
            tries += 1;
            assert!(tries < 100, "cannot remove the state dir: {e}");
        }
    });
    assert!(ended, "the reaper went on without its state dir");
}

/// A client released by someone else (poststop) while its process lives: the record goes,
/// and the reaper, woken by that, ends.
#[test]
fn a_reaper_whose_record_is_removed_ends() {
    let ended = ends_after(|sd, u| {
        // What a release of the last client saves: an empty record, which removes the file.
        sd.save(&Record::new(u, 0)).unwrap();
        assert!(!sd.record_path(u).exists());
    });
    assert!(ended, "the reaper went on after its record was removed");
}

/// A client whose pid now belongs to another process (its start time differs) has exited:
/// it is released, and the other process is not waited on.
#[test]
fn a_client_whose_pid_was_reused_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg_in(dir.path());
    let sd = StateDir::new(&cfg.state_dir);
    let u = uuid(0);
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let mut gone = ProcId::of(other.id() as i32).unwrap();
    gone.start_time += 1;
    let mut rec = Record::new(&u, 0);
    rec.clients.insert("c1".into(), client(Some(gone)));
    sd.save(&rec).unwrap();
    let r = run(&cfg, &u, &fake_nvml, NO_LINGER);
    let _ = other.kill();
    let _ = other.wait();
    r.unwrap();
    assert_eq!(sd.load(&u).unwrap(), None, "released, and the record gone");
}

/// A reaper whose GPU has no client left stays for its linger: a client that comes meanwhile is
/// watched and released as it exits; with none, it ends once the linger is over.
#[test]
fn an_idle_reaper_waits_for_the_next_client_then_ends() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg_in(dir.path());
    let sd = StateDir::new(&cfg.state_dir);
    let u = uuid(0);
    let sleeper = || Command::new("sleep").arg("60").spawn().unwrap();
    let save_one = |id: &str, kid: &std::process::Child| {
        let mut rec = Record::new(&u, 0);
        rec.clients
            .insert(id.into(), client(ProcId::of(kid.id() as i32)));
        sd.save(&rec).unwrap();
    };
    let gone = || sd.load(&u).unwrap().is_none();
    let mut a = sleeper();
    save_one("ca", &a);
    let linger = Duration::from_secs(3);
    std::thread::scope(|s| {
        let (cfg, u) = (&cfg, &u);
        let reaper = s.spawn(move || run(cfg, u, &fake_nvml, linger));
        until("the reaper stamps its lock", || sd.reaper_alive(u));
        let _ = a.kill();
        let _ = a.wait();
        until("ca released", gone);
        let idle = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !reaper.is_finished(),
            "it ended as soon as the GPU was idle"
        );
        assert!(running(&sd, u) && sd.reaper_alive(u));
        // A client that comes during the linger is watched: released when its process exits.
        let mut b = sleeper();
        save_one("cb", &b);
        std::thread::sleep(Duration::from_millis(100));
        let _ = b.kill();
        let _ = b.wait();
        until("cb released", gone);
        until("the reaper ends", || reaper.is_finished());
        reaper.join().unwrap().unwrap();
        assert!(
            idle.elapsed() >= linger,
            "it ended {:?} after the GPU went idle, before its linger",
            idle.elapsed()
        );
    });
    assert!(!sd.reaper_alive(&u));
}

/// A change of the record wakes the reaper, which lets it settle ([`SETTLE`]) before it reads
/// the record: the hook that renamed it in is not made to wait for the reaper's look.
#[test]
fn a_reaper_lets_a_change_settle_before_it_reads_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cfg_in(dir.path());
    let sd = StateDir::new(&cfg.state_dir);
    let u = uuid(0);
    let kid = || Kid(Command::new("sleep").arg("60").spawn().unwrap());
    let (a, b) = (kid(), kid());
    let mut rec = Record::new(&u, 0);
    rec.clients
        .insert("ca".into(), client(ProcId::of(a.0.id() as i32)));
    sd.save(&rec).unwrap();
    let name = sd.record_path(&u).file_name().unwrap().to_owned();
    // Every open of a name in the GPUs' directory: the reaper reads the record by opening it.
    let watch = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).unwrap();
    watch
        .add_watch(&sd.gpus_dir(), AddWatchFlags::IN_OPEN)
        .unwrap();
    let opened = |until: std::time::Instant| -> Option<std::time::Instant> {
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            let mut p = [PollFd::new(watch.as_fd(), PollFlags::POLLIN)];
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            if nix::poll::poll(&mut p, PollTimeout::from(ms)).unwrap() == 0 {
                return None;
            }
            let at = std::time::Instant::now();
            if watch
                .read_events()
                .unwrap_or_default()
                .iter()
                .any(|e| e.name.as_deref() == Some(name.as_os_str()))
            {
                return Some(at);
            }
        }
    };
    let in_10s = || std::time::Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        let (cfg, u) = (&cfg, &u);
        let reaper = s.spawn(move || run(cfg, u, &fake_nvml, NO_LINGER));
        // Its first look, at start (the control: this watch sees its reads).
        assert!(
            opened(in_10s()).is_some(),
            "the reaper never read the record"
        );
        until("the reaper stamps its lock", || sd.reaper_alive(u));
        // Quiet while its client lives.
        assert_eq!(
            opened(std::time::Instant::now() + Duration::from_millis(200)),
            None
        );
        let mut rec = Record::new(u, 0);
        rec.clients
            .insert("ca".into(), client(ProcId::of(a.0.id() as i32)));
        rec.clients
            .insert("cb".into(), client(ProcId::of(b.0.id() as i32)));
        let changed = std::time::Instant::now();
        sd.save(&rec).unwrap();
        let read = opened(in_10s()).expect("the reaper did not read the changed record");
        assert!(
            read - changed >= SETTLE,
            "the reaper read the record {:?} after it changed, before the change settled ({SETTLE:?})",
            read - changed
        );
        // And it watches what it read: cb's exit is released.
        drop(b);
        until("cb released", || {
            sd.load(u)
                .unwrap()
                .is_some_and(|r| !r.clients.contains_key("cb"))
        });
        drop(a);
        until("the reaper ends", || reaper.is_finished());
        reaper.join().unwrap().unwrap();
    });
}
