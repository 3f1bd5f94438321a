//! The TEST-ONLY simulated driver's NVML contract, as the hook core relies on it (see
//! `simdriver/src/lib.rs`), checked through `tests/limiter/nvmlprobe.c` without the limiter.

mod common;

use common::MIB;

#[test]
fn devices_identities_and_errors_follow_the_contract() {
    let mut s = setup!("sim-show");
    s.preload = false;
    s.set("GPUSHARE_SIM_DEVICES", "1024,2048");
    let p = s.nvml(&["show"]).ok();
    let text: &[(&str, &str, &str)] = &[
        (
            "UUID0",
            "GPU-5a1e0000-0000-4000-8000-000000000000",
            "UUID of GPU 0",
        ),
        (
            "UUID1",
            "GPU-5a1e0000-0000-4000-8000-000000000001",
            "UUID of GPU 1",
        ),
        ("NAME1", "Simulated GPU (gpushare test driver)", "name"),
        ("PCI1", "00000000:02:00.0", "PCI bus id i+1"),
        ("DRIVER", "535.999.99-sim", "driver version"),
    ];
    for (k, want, what) in text {
        assert_eq!(p.vals.get(*k).map(String::as_str), Some(*want), "{what}");
    }
    let nums: &[(&str, u64, &str)] = &[
        ("PRE_INIT_RC", 1, "NVML_ERROR_UNINITIALIZED before init"),
        ("COUNT", 2, "one GPU per list entry"),
        ("TOTAL0", 1024 * MIB, "memory of GPU 0"),
        ("TOTAL1", 2048 * MIB, "memory of GPU 1"),
        ("INDEX1", 1, "index = i"),
        ("MINOR1", 1, "minor = i"),
        ("BYUUID1_SAME", 1, "handle by UUID is the stable handle"),
        (
            "BYPCI1_SAME",
            1,
            "handle by PCI bus id is the stable handle",
        ),
        (
            "BAD_INDEX_RC",
            2,
            "NVML_ERROR_INVALID_ARGUMENT for a bad index",
        ),
        ("BAD_HANDLE_RC", 2, "a foreign handle is rejected"),
        ("SMALL_BUF_RC", 7, "NVML_ERROR_INSUFFICIENT_SIZE"),
        ("CUDA_VERSION", 12020, "CUDA driver version"),
        ("SHUTDOWN_RC", 0, "shutdown"),
        (
            "AFTER_SHUTDOWN_RC",
            1,
            "uninitialised again after the last shutdown",
        ),
    ];
    for (k, want, what) in nums {
        assert_eq!(p.u(k), *want, "{what}");
    }
    assert!(p.stderr.is_empty(), "{}", p.stderr);
}

#[test]
fn compute_mode_persists_across_processes() {
    let mut s = setup!("sim-mode");
    s.preload = false;
    s.set("GPUSHARE_SIM_DEVICES", "1024,1024");
    assert_eq!(
        s.nvml(&["show"]).ok().u("MODE1"),
        0,
        "absent file = DEFAULT"
    );
    assert_eq!(s.nvml(&["set", "1", "3"]).ok().u("SET_RC"), 0);
    let p = s.nvml(&["show"]).ok();
    assert_eq!(p.u("MODE1"), 3, "EXCLUSIVE_PROCESS seen by another process");
    assert_eq!(p.u("MODE0"), 0, "other GPUs untouched");
    let file = s.dir.join("sim").join("compute_mode.1");
    assert_eq!(
        std::fs::read_to_string(file).expect("state file").trim(),
        "3"
    );
    assert_eq!(
        s.nvml(&["set", "1", "7"]).ok().u("SET_RC"),
        2,
        "invalid mode refused"
    );
}

#[test]
fn defaults_warnings_and_fault_injection() {
    let mut s = setup!("sim-env");
    s.preload = false;
    s.unset("GPUSHARE_SIM_DEVICES");
    let p = s.nvml(&["show"]).ok();
    assert_eq!(p.u("COUNT"), 1, "default: one GPU");
    assert_eq!(p.u("TOTAL0"), 81920 * MIB, "default: 80 GiB");

    s.set("GPUSHARE_SIM_DEVICES", "eighty");
    let p = s.nvml(&["show"]).ok();
    assert_eq!(p.u("TOTAL0"), 81920 * MIB, "invalid value: default");
    assert_eq!(
        p.stderr.lines().count(),
        1,
        "one-line warning: {}",
        p.stderr
    );
    assert!(p.stderr.contains("GPUSHARE_SIM_DEVICES"), "{}", p.stderr);

    s.set("GPUSHARE_SIM_DEVICES", "1024")
        .set("GPUSHARE_SIM_FAIL", "nvmlInit_v2");
    assert_eq!(
        s.nvml(&["show"]).ok().u("INIT_RC"),
        999,
        "NVML_ERROR_UNKNOWN injected"
    );
}

#[test]
fn pools_grow_keep_memory_up_to_the_release_threshold_and_trim() {
    for keep in [true, false] {
        let mut s = setup!(&format!("sim-pool-{keep}"));
        s.preload = false;
        s.set("GPUSHARE_SIM_DEVICES", "1024");
        let p = s
            .run(&["direct", "pool", "0", if keep { "1" } else { "0" }])
            .ok();
        for (key, want, what) in common::pool_rows(keep) {
            assert_eq!(p.u(key), want, "keep {keep}: {what}");
        }
    }
}
