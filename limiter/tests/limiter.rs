//! End-to-end tests of libgpushare_limiter.so against the TEST-ONLY simulated driver.
//! Harness: `common/mod.rs`.
//!
//! The two cdylibs are built by a nested `cargo build` into `target/nested` (its own target
//! directory, so it never waits on the build lock the outer `cargo test` holds), the simulated
//! driver is installed as `libcuda.so.1`/`libnvidia-ml.so.1` with `simdriver/install-sim.sh`,
//! and `tests/limiter/cuprobe.c` is compiled with `cc` against Debian's `cuda.h`. Every test runs
//! `cuprobe` with the limiter in `LD_PRELOAD` and private state under its own scratch directory.

mod common;

use common::{built, wait_for_line, GIB, KERNEL_US, MIB};

fn check_cap(path: &str) {
    let mut s = setup!(&format!("cap-{path}"));
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let p = s.run(&[path, "cap", "0", "100"]).ok();
    assert_eq!(
        p.u("ALLOC_TOTAL"),
        1000 * MIB,
        "{path}: ten 100 MiB chunks fit in 1 GiB, the 11th does not"
    );
    assert_eq!(p.u("OOM_RC"), 2, "{path}: CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(
        p.u("MEMINFO_TOTAL"),
        GIB,
        "{path}: cuMemGetInfo total is the cap"
    );
    assert_eq!(
        p.u("MEMINFO_FREE"),
        GIB - 1000 * MIB,
        "{path}: cuMemGetInfo free"
    );
    assert_eq!(p.u("TOTALMEM"), GIB, "{path}: cuDeviceTotalMem is the cap");
    assert!(
        p.stderr.is_empty(),
        "{path}: no warnings expected: {}",
        p.stderr
    );
}

#[test]
fn cap_enforced_and_reported_when_linked_directly() {
    check_cap("direct");
}

#[test]
fn cap_enforced_and_reported_through_dlopen_dlsym() {
    check_cap("dlopen");
}

#[test]
fn cap_enforced_and_reported_through_cu_get_proc_address() {
    check_cap("procaddr");
}

#[test]
fn cap_enforced_and_reported_through_cu_get_proc_address_v2() {
    check_cap("procaddr2");
}

#[test]
fn per_device_limit_applies_to_its_cuda_ordinal_only() {
    let mut s = setup!("per-device");
    s.set("CUDA_DEVICE_MEMORY_LIMIT_1", "512Mi");
    let d1 = s.run(&["direct", "cap", "1", "100"]).ok();
    assert_eq!(d1.u("ALLOC_TOTAL"), 500 * MIB, "device 1 capped at 512 MiB");
    assert_eq!(d1.u("MEMINFO_TOTAL"), 512 * MIB);
    let d0 = s.run(&["direct", "cap", "0", "1000"]).ok();
    assert_eq!(
        d0.u("ALLOC_TOTAL"),
        4000 * MIB,
        "device 0 uncapped (4 GiB simulated)"
    );
    assert_eq!(d0.u("MEMINFO_TOTAL"), 4096 * MIB);
}

#[test]
fn every_allocation_api_is_counted() {
    let mut s = setup!("kinds");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let p = s.run(&["procaddr2", "kinds", "1"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("PITCH_RC", 0, "cuMemAllocPitch 256 MiB fits"),
        ("MANAGED_RC", 0, "cuMemAllocManaged 256 MiB fits"),
        ("ASYNC_RC", 0, "cuMemAllocAsync 256 MiB fits"),
        (
            "POOL_RC",
            0,
            "cuMemAllocFromPoolAsync 256 MiB fills the cap",
        ),
        ("CREATE_OVER_RC", 2, "cuMemCreate over the cap is refused"),
        (
            "FREEASYNC_RC",
            0,
            "cuMemFreeAsync returns 256 MiB to the pool",
        ),
        (
            "SYNC_RC",
            0,
            "cuCtxSynchronize: the pool (release threshold 0) gives 256 MiB back",
        ),
        ("CREATE_RC", 0, "cuMemCreate 256 MiB now fits"),
        ("ALLOC_OVER_RC", 2, "cuMemAlloc over the cap is refused"),
        ("RELEASE_RC", 0, "cuMemRelease gives 256 MiB back"),
        ("ALLOC_AFTER_RELEASE_RC", 0, "cuMemAlloc 256 MiB now fits"),
    ];
    for (key, want, what) in rows {
        assert_eq!(p.u(key), *want, "{what}");
    }
    assert_eq!(p.u("MEMINFO_FREE"), 0);
}

#[test]
fn async_allocations_over_the_cap_are_refused() {
    for (path, pool) in [
        ("direct", "default"),
        ("procaddr2", "default"),
        ("direct", "created"),
        ("dlopen", "created"),
    ] {
        let mut s = setup!(&format!("capasync-{path}-{pool}"));
        s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
        let p = s.run(&[path, "capasync", "0", "100", pool]).ok();
        let created = pool == "created";
        let rows: &[(&str, u64, &str)] = &[
            ("ALLOC_TOTAL", 1000 * MIB, "ten 100 MiB chunks fit in 1 GiB"),
            ("OOM_RC", 2, "the 11th is CUDA_ERROR_OUT_OF_MEMORY"),
            ("MEMINFO_TOTAL", GIB, "cuMemGetInfo total is the cap"),
            ("MEMINFO_FREE", 24 * MIB, "cuMemGetInfo free counts the pool"),
            ("SYNC_RC", 0, "cuCtxSynchronize"),
            (
                "FREE_AFTER_SYNC",
                if created { 24 * MIB } else { GIB },
                "after frees and a synchronisation the pool keeps its memory only with a high release threshold",
            ),
        ];
        for (key, want, what) in rows {
            assert_eq!(p.u(key), *want, "{path} {pool}: {what}");
        }
        if created {
            assert_eq!(p.u("DESTROY_RC"), 0, "{path}: cuMemPoolDestroy");
            assert_eq!(
                p.u("FREE_AFTER_DESTROY"),
                GIB,
                "{path}: a destroyed pool's memory is no longer counted"
            );
        }
        assert!(p.stderr.is_empty(), "{path} {pool}: {}", p.stderr);
    }
}

#[test]
fn memory_a_pool_keeps_after_frees_counts_against_the_cap() {
    for (keep, path) in [(true, "direct"), (true, "procaddr"), (false, "direct")] {
        let mut s = setup!(&format!("pool-{keep}-{path}"));
        s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
        let p = s
            .run(&[path, "pool", "0", if keep { "1" } else { "0" }])
            .ok();
        for (key, want, what) in common::pool_rows(keep) {
            assert_eq!(p.u(key), want, "{path}, keep {keep}: {what}");
        }
        assert!(p.stderr.is_empty(), "{path}: {}", p.stderr);
    }
}

#[test]
fn cu_get_proc_address_hands_out_wrappers_and_rtld_next_still_works() {
    let mut s = setup!("self");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let p = s.run(&["direct", "self"]).ok();
    for key in [
        "SELF_IS_DLSYM_RESULT",
        "SELF_IS_DEFAULT",
        "PTSZ_IS_DEFAULT",
        "LEGACY_IS_DEFAULT",
        "RTLD_NEXT_MALLOC_OK",
    ] {
        assert_eq!(p.u(key), 1, "{key}");
    }
}

#[test]
fn nvml_query_reports_the_cap() {
    let mut s = setup!("nvml");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut holder = s.spawn(&["direct", "hold", "1", "600"]);
    wait_for_line(&mut holder, "HELD=1");
    let p = s.run(&["nvml"]).ok();
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        p.u("NVML1_TOTAL"),
        GIB,
        "nvmlDeviceGetMemoryInfo total is the cap"
    );
    assert_eq!(
        p.u("NVML1_USED"),
        600 * MIB,
        "used is the container's allocations"
    );
    assert_eq!(p.u("NVML1_FREE"), GIB - 600 * MIB);
    assert_eq!(p.u("NVML1_V2_TOTAL"), GIB, "_v2 too");
    assert_eq!(p.u("NVML1_V2_FREE"), GIB - 600 * MIB);
    assert_eq!(
        p.u("NVML0_TOTAL"),
        GIB,
        "device 0 capped before any CUDA use (NVML index = ordinal)"
    );
    assert_eq!(p.u("NVML0_USED"), 0);

    s.unset("CUDA_DEVICE_MEMORY_LIMIT");
    let inert = s.run(&["nvml"]).ok();
    assert_eq!(
        inert.u("NVML0_TOTAL"),
        4096 * MIB,
        "no limit: physical size"
    );
}

#[test]
fn two_processes_of_one_container_share_one_cap() {
    let mut s = setup!("share");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut a = s.spawn(&["direct", "hold", "0", "600"]);
    wait_for_line(&mut a, "HELD=1");
    let over = s.run(&["direct", "try", "0", "600"]).ok();
    let fits = s.run(&["dlopen", "try", "0", "300"]).ok();
    let _ = a.kill();
    let _ = a.wait();
    assert_eq!(
        over.u("RESULT"),
        2,
        "600 + 600 MiB exceeds the shared 1 GiB cap"
    );
    assert_eq!(fits.u("RESULT"), 0, "600 + 300 MiB fits");
}

#[test]
fn a_sigkilled_members_memory_comes_back() {
    let mut s = setup!("sigkill");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut a = s.spawn(&["direct", "hold", "0", "800"]);
    wait_for_line(&mut a, "HELD=1");
    assert_eq!(
        s.run(&["direct", "try", "0", "800"]).ok().u("RESULT"),
        2,
        "held while alive"
    );
    a.kill().expect("SIGKILL");
    a.wait().expect("reap");
    let after = s.run(&["direct", "try", "0", "800"]).ok();
    assert_eq!(
        after.u("RESULT"),
        0,
        "the killed process's 800 MiB were reclaimed"
    );
}

fn check_sm(dev: &str, key: &str, mode: &str) {
    let mut s = setup!(&format!("sm-{dev}-{mode}"));
    s.set(key, "30");
    let p = s.run(&["direct", "launch", dev, "3", mode]).ok();
    let util = p.u("LAUNCHES") as f64 * KERNEL_US / 1e6 / p.f("ELAPSED") * 100.0;
    eprintln!("device {dev} ({mode}): simulated SM use {util:.1}% under a 30% cap");
    assert!(
        (25.0..=35.0).contains(&util),
        "device {dev} ({mode}): simulated SM use {util:.1}% is not within 30±5% ({} launches in {} s)",
        p.u("LAUNCHES"),
        p.f("ELAPSED")
    );
}

#[test]
fn sm_cap_holds_on_device_0() {
    check_sm("0", "CUDA_DEVICE_SM_LIMIT", "kernel");
}

#[test]
fn sm_cap_holds_on_device_1_across_all_launch_paths() {
    check_sm("1", "CUDA_DEVICE_SM_LIMIT_1", "mixed");
}

#[test]
fn bad_env_values_warn_and_fall_back() {
    /// (description, env, expected warning, MiB allocatable in 1000 MiB chunks)
    type Row = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        u64,
    );
    let rows: &[Row] = &[
        (
            "unparsable cap: no cap",
            &[("CUDA_DEVICE_MEMORY_LIMIT", "lots")],
            "CUDA_DEVICE_MEMORY_LIMIT=\"lots\" is not a size",
            4000,
        ),
        (
            "bad indexed cap: device-wide cap",
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "12q"),
            ],
            "falls back to the device-wide memory cap",
            1000,
        ),
        (
            "SM share over 100",
            &[
                ("CUDA_DEVICE_SM_LIMIT", "150"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ],
            "not a percentage",
            2000,
        ),
        (
            "negative cap",
            &[("CUDA_DEVICE_MEMORY_LIMIT", "-1")],
            "is not a size",
            4000,
        ),
        (
            "bad simulated device list",
            &[
                ("GPUSHARE_SIM_DEVICES", "4096,x"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ],
            "GPUSHARE_SIM_DEVICES",
            1000,
        ),
    ];
    for (what, vars, warning, alloc_mib) in rows {
        let mut s = setup!("bad-env");
        for (k, v) in *vars {
            s.set(k, v);
        }
        let p = s.run(&["direct", "cap", "0", "1000"]);
        assert_eq!(
            p.code,
            Some(0),
            "{what}: must not crash; stderr {}",
            p.stderr
        );
        assert!(
            p.stderr.contains(warning),
            "{what}: expected a warning with {warning:?}, got {:?}",
            p.stderr
        );
        assert!(
            p.stderr.lines().all(|l| l.contains("warning")),
            "{what}: one-line warnings only: {}",
            p.stderr
        );
        // 1000 MiB chunks: the number that fits under the cap (or the 4 GiB device).
        assert_eq!(p.u("ALLOC_TOTAL"), alloc_mib * MIB, "{what}");
    }
}

#[test]
fn limits_file_is_read_when_env_has_no_limits() {
    let mut s = setup!("limits-file");
    let cache = s.dir.join("from-file-cache");
    std::fs::write(
        s.dir.join("limits"),
        format!(
            "# written by gpushare-hook\nCUDA_DEVICE_MEMORY_LIMIT_0=536870912\nCUDA_DEVICE_SM_LIMIT=50\nCUDA_DEVICE_MEMORY_SHARED_CACHE={}\n",
            cache.display()
        ),
    )
    .expect("write limits file");
    s.unset("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    let p = s.run(&["direct", "cap", "0", "100"]).ok();
    assert_eq!(p.u("ALLOC_TOTAL"), 500 * MIB, "file cap of 512 MiB");
    assert!(cache.exists(), "shared cache path taken from the file");

    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let env = s.run(&["direct", "cap", "0", "100"]).ok();
    assert_eq!(
        env.u("ALLOC_TOTAL"),
        1000 * MIB,
        "env limits win; the file is not read"
    );
}

#[test]
fn without_limits_the_library_is_inert() {
    let s = setup!("inert");
    let p = s.run(&["dlopen", "cap", "0", "1000"]).ok();
    assert_eq!(p.u("ALLOC_TOTAL"), 4000 * MIB);
    assert_eq!(p.u("MEMINFO_TOTAL"), 4096 * MIB);
    assert!(p.stderr.is_empty(), "no output: {}", p.stderr);
    assert!(!s.dir.join("cache").exists(), "no shared file created");
}

#[test]
fn unknown_free_is_passed_through_untouched() {
    let mut s = setup!("unknown-free");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let p = s.run(&["direct", "unknownfree", "0"]).ok();
    assert_eq!(
        p.u("UNKNOWN_FREE_RC"),
        1,
        "the driver's CUDA_ERROR_INVALID_VALUE, unchanged"
    );
    assert_eq!(p.u("ALLOC_RC"), 0);
    assert_eq!(p.u("FREE_RC"), 0);
    assert_eq!(p.u("MEMINFO_FREE"), GIB, "nothing left counted");
}

#[test]
fn a_mismatched_shared_file_refuses_allocations_with_a_message_not_a_crash() {
    let mut s = setup!("mismatch");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    std::fs::write(s.dir.join("cache"), vec![0xab; 4096]).expect("write");
    let p = s.run(&["direct", "cap", "0", "100"]).ok();
    assert!(
        p.stderr.contains("layout mismatch")
            && p.stderr.contains("refusing device-memory allocations"),
        "stderr: {}",
        p.stderr
    );
    assert_eq!(
        p.u("ALLOC_TOTAL"),
        0,
        "fail closed: nothing allocated rather than counted apart"
    );
    assert_eq!(p.u("OOM_RC"), 2, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(p.u("MEMINFO_FREE"), 0, "nothing reported free");
    assert_eq!(
        std::fs::read(s.dir.join("cache")).expect("read"),
        vec![0xab; 4096],
        "the file is not touched"
    );
}

#[test]
fn the_contexts_own_footprint_is_counted() {
    let mut s = setup!("footprint");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .set("GPUSHARE_SIM_CTX_MIB", "100");
    let p = s.run(&["direct", "cap", "0", "100"]).ok();
    assert_eq!(
        p.u("ALLOC_TOTAL"),
        900 * MIB,
        "100 MiB context + 9 x 100 MiB"
    );
    assert_eq!(p.u("MEMINFO_FREE"), GIB - 1000 * MIB);
}

#[test]
fn driver_errors_pass_through_and_are_not_counted() {
    let mut s = setup!("fault");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .set("GPUSHARE_SIM_FAIL", "cuMemAlloc_v2");
    let p = s.run(&["direct", "unknownfree", "0"]).ok();
    assert_eq!(
        p.u("ALLOC_RC"),
        999,
        "CUDA_ERROR_UNKNOWN from the driver, unchanged"
    );
    assert_eq!(
        p.u("MEMINFO_FREE"),
        GIB,
        "a failed allocation is not counted"
    );
}

#[test]
fn a_non_utf8_environment_does_not_crash() {
    use std::os::unix::ffi::OsStrExt;
    let mut s = setup!("non-utf8");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let mut c = s.command(&["direct", "cap", "0", "100"]);
    c.env(
        "GPUSHARE_TEST_BYTES",
        std::ffi::OsStr::from_bytes(b"\xff\xfe"),
    );
    c.env(
        "CUDA_DEVICE_SM_LIMIT",
        std::ffi::OsStr::from_bytes(b"3\xff"),
    );
    let p = common::Probe::from(c.output().expect("run cuprobe"), &["non-utf8"]).ok();
    assert_eq!(p.u("ALLOC_TOTAL"), 1000 * MIB, "memory cap still applies");
    assert!(
        p.stderr.contains("CUDA_DEVICE_SM_LIMIT"),
        "bad SM value reported: {}",
        p.stderr
    );
}

#[test]
fn two_processes_of_one_container_share_one_sm_cap() {
    let mut s = setup!("sm-shared");
    s.set("CUDA_DEVICE_SM_LIMIT", "30");
    let a = s.spawn(&["direct", "launch", "1", "4", "kernel"]);
    let b = s.run(&["dlopen", "launch", "1", "4", "mixed"]).ok();
    let a = common::Probe::from(a.wait_with_output().expect("first process"), &["a"]).ok();
    let util = (a.u("LAUNCHES") + b.u("LAUNCHES")) as f64 * KERNEL_US
        / 1e6
        / a.f("ELAPSED").max(b.f("ELAPSED"))
        * 100.0;
    eprintln!("two processes: simulated SM use {util:.1}% under one 30% cap");
    // Approximate by design (each process subtracts the others' measured share), so a wider
    // band than the single-process tests; two independent 30% caps would give about 60%.
    assert!((22.0..=40.0).contains(&util), "container total {util:.1}%");
}

#[test]
fn the_sm_watcher_asks_nvml_only_about_devices_that_exist() {
    let mut s = setup!("sm-one-gpu");
    // CUDA_DEVICE_SM_LIMIT caps all 16 ordinals; the machine has one GPU.
    s.set("CUDA_DEVICE_SM_LIMIT", "30")
        .set("GPUSHARE_SIM_DEVICES", "4096");
    let p = s.run(&["direct", "launch", "0", "1", "kernel"]).ok();
    assert!(p.stderr.is_empty(), "no warnings: {}", p.stderr);
    s.set("GPUSHARE_SIM_FAIL", "nvmlInit_v2");
    let p = s.run(&["direct", "launch", "0", "1", "kernel"]).ok();
    assert_eq!(
        p.stderr.lines().count(),
        1,
        "one warning, for the one device: {}",
        p.stderr
    );
    assert!(p.stderr.contains("CUDA device 0"), "{}", p.stderr);
}

#[test]
fn without_nvml_the_sm_cap_fails_open_with_a_warning() {
    let mut s = setup!("sm-no-nvml");
    s.set("CUDA_DEVICE_SM_LIMIT", "30")
        .set("GPUSHARE_SIM_FAIL", "nvmlInit_v2");
    let p = s.run(&["direct", "launch", "0", "1", "kernel"]).ok();
    let util = p.u("LAUNCHES") as f64 * KERNEL_US / 1e6 / p.f("ELAPSED") * 100.0;
    assert!(
        p.stderr.contains("SM cap is not enforced"),
        "stderr: {}",
        p.stderr
    );
    assert!(
        util > 80.0,
        "not throttled to an arbitrary rate: {util:.1}%"
    );
}

#[test]
fn rtld_next_keeps_its_meaning_for_a_later_interposer() {
    let mut s = setup!("interposer");
    s.set("CUDA_DEVICE_MEMORY_LIMIT", "1g");
    let b = built().expect("built");
    let mut c = s.command(&["puts"]);
    c.env(
        "LD_PRELOAD",
        format!("{} {}", b.limiter.display(), b.interposer.display()),
    );
    let p = common::Probe::from(c.output().expect("run cuprobe"), &["puts"]).ok();
    assert_eq!(p.u("INTERPOSED"), 1, "the interposer ran");
    assert_eq!(p.u("PUTS"), 1, "and reached libc's puts through RTLD_NEXT");
}
