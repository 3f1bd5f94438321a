//! Tests of the daemon settings and servers (`mps`), on parsers and on the scripted daemon.

use super::*;

fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn settings_are_read_with_or_without_a_memory_limit() {
    // As NVIDIA's daemon answers GET_THREADS, GET_PINNED (nothing when unset), GET_PRIORITY.
    type Row<'a> = (&'a [&'a str], Option<(u8, Option<u64>, u32)>);
    let rows: &[Row] = &[
        (&["100.0", "0"], Some((100, None, 0))),
        (&["60.0", "2G", "1"], Some((60, Some(2048), 1))),
        (&["60.0", "512M", "0"], Some((60, Some(512), 0))),
        (&["60.0"], None),
        (&["60.0", "2G", "x"], None),
        (&["60.0", "2G", "3G", "0"], None),
        (&[], None),
    ];
    for (answer, want) in rows {
        let got = parse_settings(&lines(answer))
            .map(|s| (s.limits.cores, s.limits.memory_mib, s.priority));
        assert_eq!(got, *want, "{answer:?}");
    }
}

#[test]
fn pinned_limits_in_every_unit_and_zero_as_none() {
    // (answer, the pinned limit read; `None`: not a read at all)
    for (answer, want) in [
        ("50.0\n1048576K", Some(Some(1024))),
        ("50.0\n1T", Some(Some(1 << 20))),
        ("50.0\n1.5G", Some(Some(1536))),
        ("50.0\n0M", Some(None)),
        ("50.0\n2P", None),
    ] {
        assert_eq!(
            parse_defaults(answer).map(|l| l.memory_mib),
            want,
            "{answer:?}"
        );
    }
    assert_eq!(parse_defaults("100.5"), None, "above 100%");
}

/// A scripted daemon (this process, recorded as the domain's daemon) in a fresh domain
/// directory; its pipe directory.
fn scripted(held: scripted::Held) -> (tempfile::TempDir, MpsDirs, ProcId, scripted::Scripted) {
    let t = tempfile::tempdir().unwrap();
    let dirs = MpsDirs::new(t.path().join("d"));
    std::fs::create_dir_all(&dirs.pipe).unwrap();
    let me = ProcId::of(std::process::id() as i32).unwrap();
    let daemon = scripted::Scripted::start(&dirs.pipe, held);
    (t, dirs, me, daemon)
}

const LIMITS: Limits = Limits {
    cores: 50,
    memory_mib: Some(1024),
};

#[test]
fn running_servers_get_the_domain_s_limits_back() {
    let held = scripted::Held {
        servers: [(101, (100, None)), (102, (80, Some(4096)))].into(),
        ..Default::default()
    };
    let (_t, dirs, me, daemon) = scripted(held);
    assert_eq!(servers(&dirs.pipe, me), [101, 102]);
    let log = crate::host::tests::logged(|| restore_servers(&dirs.pipe, me, &LIMITS));
    assert!(log.is_empty(), "{log}");
    let want = Some((50, Some(1024)));
    let h = daemon.held.lock().unwrap();
    assert_eq!(h.servers.get(&101).copied(), want);
    assert_eq!(h.servers.get(&102).copied(), want);
    drop(h);
    assert_eq!(
        server_limits(&dirs.pipe, me),
        [(101, LIMITS), (102, LIMITS)]
    );
}

#[test]
fn a_server_that_keeps_its_limits_is_logged() {
    let held = scripted::Held {
        servers: [(101, (100, None)), (102, (100, None))].into(),
        stuck: vec![102],
        ..Default::default()
    };
    let (_t, dirs, me, _daemon) = scripted(held);
    let log = crate::host::tests::logged(|| restore_servers(&dirs.pipe, me, &LIMITS));
    assert!(
        log.contains("cannot put back the limits of MPS server 102"),
        "{log}"
    );
    assert!(!log.contains("server 101"), "{log}");
    let now = server_limits(&dirs.pipe, me);
    assert_eq!(now[0], (101, LIMITS));
    assert_eq!(
        now[1],
        (
            102,
            Limits {
                cores: 100,
                memory_mib: None
            }
        )
    );
}

#[test]
fn defaults_are_set_read_back_and_passed_to_running_servers() {
    let held = scripted::Held {
        defaults: (100, None),
        priority: 2,
        servers: [(101, (100, None))].into(),
        ..Default::default()
    };
    let (_t, dirs, me, daemon) = scripted(held);
    let ctl = Control {
        binary: PathBuf::from("/nonexistent/nvidia-cuda-mps-control"),
    };
    assert!(
        matches!(
            ctl.set_defaults(&dirs.pipe, &LIMITS),
            Err(MpsError::Unreachable { .. })
        ),
        "no recorded daemon: nothing is sent"
    );
    assert!(daemon.held.lock().unwrap().conversations.is_empty());
    find::record(&dirs, me).unwrap();
    ctl.set_defaults(&dirs.pipe, &LIMITS).unwrap();
    let h = daemon.held.lock().unwrap();
    assert_eq!(h.defaults, (50, Some(1024)));
    assert_eq!(h.priority, CLIENT_PRIORITY);
    assert_eq!(h.servers[&101], (50, Some(1024)));
    // One conversation sets, reads back and lists the servers (last); one more per server.
    let firsts: Vec<&str> = h.conversations.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(
        firsts,
        [
            "set_default_active_thread_percentage 50",
            "set_active_thread_percentage 101 50"
        ]
    );
    assert_eq!(
        h.conversations[0].last().map(String::as_str),
        Some(GET_SERVERS)
    );
    drop(h);
    assert_eq!(defaults(&dirs.pipe, me).unwrap(), LIMITS);
}

#[test]
fn the_set_answer_is_read_back_then_the_server_list() {
    let none = Limits {
        cores: 50,
        memory_mib: None,
    };
    // (answer to set_defaults' conversation, limits set, the server lines; `None`: refused)
    type Row<'a> = (&'a str, &'a [&'a str], Limits, Option<&'a [&'a str]>);
    let rows: &[Row] = &[
        (
            "echo, no servers",
            &["50.0", "50.0", "1G", "0"],
            LIMITS,
            Some(&[]),
        ),
        (
            "echo, two servers",
            &["50.0", "50.0", "1G", "0", "101", "102"],
            LIMITS,
            Some(&["101", "102"]),
        ),
        (
            "no memory limit",
            &["50.0", "50.0", "0", "7"],
            none,
            Some(&["7"]),
        ),
        (
            "no echo",
            &["50.0", "1G", "0", "101"],
            LIMITS,
            Some(&["101"]),
        ),
        (
            "other percentage",
            &["50.0", "60.0", "1G", "0"],
            LIMITS,
            None,
        ),
        ("pinned left", &["50.0", "50.0", "2G", "0"], LIMITS, None),
        (
            "pinned not cleared",
            &["50.0", "50.0", "1G", "0"],
            none,
            None,
        ),
        ("other priority", &["50.0", "50.0", "1G", "2"], LIMITS, None),
        ("cut short", &["50.0", "50.0"], LIMITS, None),
        ("nothing", &[], none, None),
    ];
    for (what, answer, limits, want) in rows {
        let answer = lines(answer);
        let got = set_answer(&answer, limits);
        assert_eq!(got, want.map(lines).as_deref(), "{what}");
    }
}

#[test]
fn server_pids_and_their_commands() {
    assert_eq!(
        server_pids(&lines(&["12", "34 56", "Server list:"])),
        [12, 34, 56]
    );
    assert!(server_pids(&[]).is_empty());
    let limits = Limits {
        cores: 30,
        memory_mib: Some(1024),
    };
    assert_eq!(
        server_commands(7, &limits),
        [
            "set_active_thread_percentage 7 30".to_owned(),
            "set_device_pinned_mem_limit 7 0 1024M".to_owned(),
            "get_active_thread_percentage 7".to_owned(),
            "get_device_pinned_mem_limit 7 0".to_owned()
        ]
    );
}
