//! Driver-API conformance of libgpushare_limiter.so on the TEST-ONLY simulated driver, through
//! `tests/limiter/conformance.c`. The oracle is the simulated driver itself: a probe run with
//! the limiter under a 1 GiB cap on a 4 GiB device must print exactly what the same probe
//! prints without the limiter on a 1 GiB device (the simulated driver frees on context
//! destruction, rounds pitches and arrays like a GPU and counts pools' reserved memory, as a
//! real driver does). Harness: `common/mod.rs`.

mod common;

use common::{Probe, Scratch, GIB, MIB};
use std::collections::BTreeMap;
use std::time::Duration;

/// Row alignment of pitched memory and arrays in these runs: coarser than the 512 bytes the
/// limiter assumes before the call, so that only the driver's own figures add up.
const PITCH_ALIGN: &str = "4096";

/// The two runs: (limiter, 1 GiB cap, 4 GiB device) and (no limiter, 1 GiB device).
fn pair(name: &str) -> Option<(Scratch, Scratch)> {
    let b = match common::built() {
        Ok(b) => b,
        Err(why) => {
            common::skip(name, why);
            return None;
        }
    };
    let mut lim = Scratch::new(b, &format!("{name}-limiter"));
    lim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .set("GPUSHARE_SIM_DEVICES", "4096")
        .set("GPUSHARE_SIM_PITCH_ALIGN", PITCH_ALIGN);
    let mut oracle = Scratch::new(b, &format!("{name}-oracle"));
    oracle.preload = false;
    oracle
        .set("GPUSHARE_SIM_DEVICES", "1024")
        .set("GPUSHARE_SIM_PITCH_ALIGN", PITCH_ALIGN);
    Some((lim, oracle))
}

fn sorted(p: &Probe) -> BTreeMap<String, String> {
    p.vals.clone().into_iter().collect()
}

const PATHS: &[&str] = &[
    "alloc",
    "pitch",
    "managed",
    "async",
    "pool",
    "create",
    "array",
    "array3d",
    "mipmapped",
];

#[test]
fn every_allocation_path_at_the_cap_edges_matches_a_device_of_the_caps_size() {
    let Some((lim, oracle)) = pair("edges") else {
        return;
    };
    let mut checked = 0;
    for path in PATHS {
        let mut edges = vec!["below", "exact", "over", "zero", "overflow"];
        if *path == "pitch" {
            edges.extend(["rows", "tallrows"]);
        }
        if *path == "mipmapped" {
            edges.push("mip2");
        }
        for edge in edges {
            let got = lim.conform(&["edge", path, edge]).ok();
            let want = oracle.conform(&["edge", path, edge]).ok();
            assert_eq!(
                sorted(&got),
                sorted(&want),
                "{path} at {edge}: limiter under a 1 GiB cap vs a 1 GiB device; limiter stderr: {}",
                got.stderr
            );
            assert_eq!(
                got.u("FREE_AFTER"),
                GIB,
                "{path} at {edge}: everything back"
            );
            assert!(got.stderr.is_empty(), "{path} {edge}: {}", got.stderr);
            checked += 1;
        }
    }
    // The edges themselves, so that both sides cannot agree on nonsense.
    let p = lim.conform(&["edge", "alloc", "below"]).ok();
    assert_eq!(
        (p.u("RC"), p.u("FREE")),
        (0, MIB),
        "cap - 1 MiB leaves 1 MiB"
    );
    let p = lim.conform(&["edge", "alloc", "exact"]).ok();
    assert_eq!((p.u("RC"), p.u("FREE")), (0, 0), "exactly the cap fits");
    let p = lim.conform(&["edge", "alloc", "over"]).ok();
    assert_eq!(
        (p.u("RC"), p.u("FREE")),
        (2, GIB),
        "one byte over is refused"
    );
    let p = lim.conform(&["edge", "pitch", "rows"]).ok();
    assert_eq!(
        (p.u("RC"), p.u("FREE")),
        (0, GIB - 200_000 * 4096),
        "pitched rows are charged at the driver's 4096-byte pitch"
    );
    let p = lim.conform(&["edge", "pitch", "tallrows"]).ok();
    assert_eq!(p.u("RC"), 2, "300000 rows of 4096 bytes exceed the cap");
    let p = lim.conform(&["edge", "array", "below"]).ok();
    assert_eq!(
        (p.u("RC"), p.u("FREE")),
        (0, MIB),
        "a 1023 MiB array is counted"
    );
    assert!(checked >= 47, "{checked} edge rows");
}

#[test]
fn many_threads_at_the_cap_never_get_more_than_the_cap_from_the_driver() {
    let Some((lim, _)) = pair("threads") else {
        return;
    };
    for path in ["alloc", "pitch", "managed", "create", "array", "async"] {
        let p = lim.conform(&["threads", path, "16", "1"]).ok();
        eprintln!(
            "{path}: {} allocations, {} refused, peak {} MiB underneath",
            p.u("OK"),
            p.u("OOM"),
            p.u("PEAK") / MIB
        );
        assert!(
            p.u("PEAK") <= GIB,
            "{path}: the driver handed out {} MiB under a 1 GiB cap",
            p.u("PEAK") / MIB
        );
        assert!(
            p.u("OK") > 0 && p.u("OOM") > 0,
            "{path}: contention expected"
        );
        assert_eq!(p.u("OTHER"), 0, "{path}: only successes and OOM");
        assert_eq!(p.u("FREE_AFTER"), GIB, "{path}: everything back");
    }
}

#[test]
fn processes_killed_midway_leave_nothing_counted() {
    let Some((lim, _)) = pair("killed") else {
        return;
    };
    for (i, delay_ms) in [50u64, 150, 300, 500].into_iter().enumerate() {
        let path = ["alloc", "array", "async", "create"][i];
        let mut child = lim
            .program(&lim.b.conformance, &["threads", path, "16", "30"])
            .spawn()
            .expect("spawn");
        common::wait_for_line(&mut child, "STARTED=1");
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let p = lim.conform(&["edge", "alloc", "exact"]).ok();
        assert_eq!(
            p.u("RC"),
            0,
            "{path}, killed after {delay_ms} ms: the whole cap is usable again"
        );
    }
}

#[test]
fn fork_after_cu_init_keeps_parent_and_child_apart() {
    let Some((lim, _)) = pair("fork") else {
        return;
    };
    let p = lim.conform(&["fork"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("PARENT_HELD_RC", 0, "the parent holds 600 MiB"),
        ("CHILD_OVER_RC", 2, "the child sees the parent's 600 MiB"),
        ("CHILD_FITS_RC", 0, "and may use the rest"),
        ("CHILD_EXIT", 0, "the child exits cleanly"),
        (
            "PARENT_OVER_RC",
            2,
            "the child's free of the inherited pointer did not give the parent's memory away",
        ),
        ("PARENT_FITS_RC", 0, "the exited child's 300 MiB came back"),
    ];
    for (k, want, what) in rows {
        assert_eq!(p.u(k), *want, "{what}; stderr {}", p.stderr);
    }
}

#[test]
fn frees_the_limiter_did_not_count_reach_the_driver_untouched() {
    let Some((lim, oracle)) = pair("frees") else {
        return;
    };
    let got = lim.conform(&["frees"]).ok();
    let want = oracle.conform(&["frees"]).ok();
    assert_eq!(sorted(&got), sorted(&want), "the driver's own answers");
    for k in [
        "UNKNOWN_SEEN",
        "INTERIOR_SEEN",
        "DOUBLE_SEEN",
        "ASYNC_UNKNOWN_SEEN",
    ] {
        assert_eq!(got.u(k), 1, "{k}: the driver got the very pointer");
    }
    assert_eq!(got.u("DOUBLE_RC"), 1, "a double free is the driver's error");
    assert_eq!(got.u("FREE_AFTER"), GIB, "and nothing stays counted");
}

#[test]
fn destroying_a_context_gives_its_memory_back() {
    let Some((mut lim, mut oracle)) = pair("contexts") else {
        return;
    };
    lim.set("GPUSHARE_SIM_CTX_MIB", "100");
    oracle.set("GPUSHARE_SIM_CTX_MIB", "100");
    let got = lim.conform(&["contexts"]).ok();
    let want = oracle.conform(&["contexts"]).ok();
    assert_eq!(sorted(&got), sorted(&want), "limiter vs the driver alone");
    let rows: &[(&str, u64, &str)] = &[
        (
            "CTX_FREE",
            GIB - 800 * MIB,
            "context 100 + 600 + array 100 MiB",
        ),
        (
            "AFTER_DESTROY_FREE",
            GIB - 100 * MIB,
            "cuCtxDestroy gave 700 MiB back",
        ),
        ("AFTER_DESTROY_ALLOC_RC", 0, "so 900 MiB fit again"),
        (
            "PRIMARY_STILL_OVER_RC",
            2,
            "a primary context retained twice lives on",
        ),
        (
            "AFTER_RELEASE_FREE",
            GIB - 100 * MIB,
            "its last release gave everything back",
        ),
        ("AFTER_RELEASE_ALLOC_RC", 0, "so 900 MiB fit again"),
        (
            "AFTER_RESET_FREE",
            GIB - 100 * MIB,
            "cuDevicePrimaryCtxReset too",
        ),
        ("AFTER_RESET_ALLOC_RC", 0, "so 900 MiB fit again"),
        (
            "V3_FREE",
            GIB - 100 * MIB,
            "cuCtxCreate_v3's footprint is counted",
        ),
        ("V3_ALLOC_RC", 0, "and its memory"),
        (
            "V4_FREE",
            GIB - 100 * MIB,
            "cuCtxCreate_v4 too, after v3's destruction",
        ),
        ("V4_ALLOC_RC", 0, "and 900 MiB fit in it"),
        (
            "TWO_ONE_LEFT_FREE",
            GIB - 100 * MIB,
            "with one of two contexts left, the context memory stays",
        ),
        (
            "TWO_NEXT_FREE",
            GIB - 100 * MIB,
            "after both, a new context is measured again (not twice)",
        ),
    ];
    for (k, want, what) in rows {
        assert_eq!(got.u(k), *want, "{what}; stderr {}", got.stderr);
    }
}

/// `PA form symbol version flags rc=… status=… name=… lib=…` lines by their first five fields.
fn proc_table(p: &Probe) -> BTreeMap<String, BTreeMap<String, String>> {
    p.stdout
        .lines()
        .filter(|l| l.starts_with("PA "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let key = f[..5].join(" ");
            let vals = f[5..]
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (key, vals)
        })
        .collect()
}

#[test]
fn cu_get_proc_address_with_every_version_and_flag_hands_out_exactly_the_wrappers() {
    let Some((lim, oracle)) = pair("procaddr") else {
        return;
    };
    let got = proc_table(&lim.conform(&["procaddr"]).ok());
    let want = proc_table(&oracle.conform(&["procaddr"]).ok());
    let intercepted: Vec<&str> = gpushare_limiter::driver::SLOTS
        .iter()
        .filter_map(|s| s.name.to_str().ok())
        .collect();
    let limiter_lib = "libgpushare_limiter.so";
    assert_eq!(got.len(), want.len());
    assert!(got.len() > 2000, "{} combinations", got.len());
    let mut wrapped = 0;
    for (key, w) in &want {
        let g = &got[key];
        assert_eq!(g["rc"], w["rc"], "{key}: result");
        assert_eq!(g["status"], w["status"], "{key}: symbol status");
        assert_eq!(g["name"], w["name"], "{key}: the same entry point");
        let ours = intercepted.contains(&w["name"].as_str());
        let from = if ours { limiter_lib } else { w["lib"].as_str() };
        assert_eq!(g["lib"], from, "{key}: {} handed out by", w["name"]);
        wrapped += usize::from(ours);
    }
    assert!(wrapped > 500, "{wrapped} lookups answered with a wrapper");
}

#[test]
fn a_dlsym_through_an_unrelated_library_returns_that_librarys_function() {
    let Some((lim, _)) = pair("foreign") else {
        return;
    };
    let foreign = lim.b.foreign.display().to_string();
    let p = lim.conform(&["foreign", &foreign]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("FOREIGN_IS_ITS_OWN", 1, "the library's own cuMemAlloc_v2"),
        ("FOREIGN_CALL_RC", 77, "which answers as it does"),
        (
            "LINKED_RC",
            0,
            "the program's linked calls still reach the driver",
        ),
        ("LINKED_OVER_RC", 2, "through the limiter"),
        ("FREE", GIB - 600 * MIB, "and are counted"),
    ];
    for (k, want, what) in rows {
        assert_eq!(p.u(k), *want, "{what}; stderr {}", p.stderr);
    }
}

#[test]
fn a_shared_file_of_another_layout_refuses_allocations_with_a_message() {
    let Some((mut lim, _)) = pair("layout") else {
        return;
    };
    // At attach: a file another program (or version) wrote.
    let cache = lim.dir.join("cache");
    let mut hami = vec![0u8; 8 << 20];
    hami[..4].copy_from_slice(&19_920_718u32.to_le_bytes());
    std::fs::write(&cache, &hami).expect("write foreign file");
    let p = lim.conform(&["edge", "alloc", "below"]).ok();
    assert_eq!(p.u("RC"), 2, "refused (fail closed), not counted apart");
    assert_eq!(p.u("FREE"), 0, "cuMemGetInfo shows nothing free");
    assert!(
        p.stderr.contains("refusing device-memory allocations")
            && p.stderr.contains(&cache.display().to_string()),
        "one clear message: {}",
        p.stderr
    );
    assert_eq!(
        std::fs::read(&cache).expect("read"),
        hami,
        "the foreign file is left as it was"
    );
    // While running: another program rewrites the file in its own layout.
    lim.set(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        &lim.dir.join("cache2").display().to_string(),
    );
    let p = lim.conform(&["rewrite"]).ok();
    assert_eq!(p.u("BEFORE_RC"), 0);
    assert_eq!(p.u("AFTER_RC"), 2, "refused once the layout changed");
    assert_eq!(p.u("FREE"), 0);
    assert!(
        p.stderr.contains("refusing device-memory allocations"),
        "{}",
        p.stderr
    );
    assert_eq!(p.stderr.lines().count(), 1, "said once: {}", p.stderr);
}

// ---- Paths real frameworks use. The oracle here is what the simulated driver holds
// underneath the limiter (`gpushare_sim_mem_used`, `gpushare_sim_mem_peak`), never what the
// limiter itself reports. ----

/// The limiter under a 1 GiB cap on two 4 GiB devices, with the simulated driver's default
/// layout (rows padded to 512 bytes).
fn capped(name: &str) -> Option<Scratch> {
    let b = match common::built() {
        Ok(b) => b,
        Err(why) => {
            common::skip(name, why);
            return None;
        }
    };
    let mut lim = Scratch::new(b, &format!("{name}-capped"));
    lim.set("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .set("GPUSHARE_SIM_DEVICES", "4096,4096");
    Some(lim)
}

fn check_rows(p: &common::Probe, rows: &[(&str, u64, &str)]) {
    for (k, want, what) in rows {
        assert_eq!(p.u(k), *want, "{k}: {what}; stderr {}", p.stderr);
    }
}

#[test]
fn the_legacy_entry_points_are_capped_credited_and_report_the_cap() {
    let Some(lim) = capped("legacy") else {
        return;
    };
    let p = lim.conform(&["legacy"]).ok();
    eprintln!("{}", p.stdout);
    let rows: &[(&str, u64, &str)] = &[
        (
            "ALLOC_OK",
            1,
            "600 MiB through cuMemAlloc (no _v2) fits once",
        ),
        ("ALLOC_HELD_MIB", 600, "and the driver holds no more"),
        ("INFO_RC", 0, "legacy cuMemGetInfo answers"),
        ("INFO_TOTAL", GIB, "with the cap as total"),
        ("INFO_FREE", GIB - 600 * MIB, "and the cap's rest as free"),
        ("TOTALMEM", GIB, "legacy cuDeviceTotalMem reports the cap"),
        ("FREED_HELD_MIB", 0, "legacy cuMemFree freed it"),
        ("FREED_FREE", GIB, "and the limiter gave it back"),
        (
            "PITCH_OK",
            1,
            "legacy cuMemAllocPitch: 585 MiB of rows at a 512-byte pitch fit once",
        ),
        ("PITCH_HELD_MIB", 585, "and the driver holds no more"),
        (
            "ARRAY_OK",
            3,
            "legacy cuArrayCreate: three 293 MiB arrays fit",
        ),
        ("ARRAY_HELD_MIB", 879, "and the driver holds no more"),
        ("FREED2_HELD_MIB", 0, "all freed"),
        ("FREED2_FREE", GIB, "and credited"),
        ("CTX_ALLOC_RC", 0, "900 MiB in a context"),
        ("AFTER_DESTROY_HELD_MIB", 0, "legacy cuCtxDestroy freed it"),
        ("AFTER_DESTROY_ALLOC_RC", 0, "so 900 MiB fit again"),
        (
            "AFTER_RESET_HELD_MIB",
            0,
            "legacy cuDevicePrimaryCtxReset freed it",
        ),
        ("AFTER_RESET_ALLOC_RC", 0, "so 900 MiB fit again"),
        (
            "AFTER_RELEASE_HELD_MIB",
            0,
            "legacy cuDevicePrimaryCtxRelease freed it",
        ),
        ("AFTER_RELEASE_ALLOC_RC", 0, "so 900 MiB fit again"),
    ];
    check_rows(&p, rows);
    assert!(p.u("PEAK_MIB") <= 1024, "peak {} MiB", p.u("PEAK_MIB"));
}

#[test]
fn a_device_whose_uuid_cannot_be_read_refuses_allocations_with_one_line() {
    let Some(mut lim) = capped("uuid") else {
        return;
    };
    lim.set("GPUSHARE_SIM_FAIL", "cuDeviceGetUuid");
    let p = lim.conform(&["edge", "alloc", "below"]).ok();
    assert_eq!(
        p.u("RC"),
        2,
        "refused, not counted apart; stderr {}",
        p.stderr
    );
    assert_eq!(p.u("FREE"), 0, "cuMemGetInfo shows nothing free");
    let lines: Vec<&str> = p.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", p.stderr);
    assert!(lines[0].contains("cuDeviceGetUuid"), "{}", p.stderr);
}

#[test]
fn nvml_before_any_cuda_call_reports_the_cap_under_cuda_visible_devices() {
    let Some(mut lim) = capped("nvml-visible") else {
        return;
    };
    lim.unset("CUDA_DEVICE_MEMORY_LIMIT")
        .set("CUDA_DEVICE_MEMORY_LIMIT_0", "1g");
    let cases: &[(&str, &str, u64, u64)] = &[
        ("index 0", "0", GIB, 4 * GIB),
        ("index 1 is CUDA device 0", "1", 4 * GIB, GIB),
        (
            "a UUID",
            "GPU-5a1e0000-0000-4000-8000-000000000001",
            4 * GIB,
            GIB,
        ),
        ("both, reordered", "1,0", 4 * GIB, GIB),
    ];
    for (what, visible, want0, want1) in cases {
        lim.set("CUDA_VISIBLE_DEVICES", visible);
        let p = lim.nvml(&["show"]).ok();
        assert_eq!(
            (p.u("TOTAL0"), p.u("TOTAL1")),
            (*want0, *want1),
            "{what}: NVML devices 0 and 1; stderr {}",
            p.stderr
        );
    }
}

#[test]
fn without_process_utilisation_the_sm_cap_warns_once_and_does_not_clamp() {
    let Some(mut lim) = capped("sm-mig") else {
        return;
    };
    lim.unset("CUDA_DEVICE_MEMORY_LIMIT")
        .set("CUDA_DEVICE_SM_LIMIT", "30")
        .set("GPUSHARE_SIM_DEVICES", "4096");
    // NVML_ERROR_NOT_SUPPORTED (3) and NVML_ERROR_NOT_FOUND (6), as on MIG.
    for code in ["3", "6"] {
        lim.set(
            "GPUSHARE_SIM_FAIL",
            &format!("nvmlDeviceGetProcessUtilization={code}"),
        );
        // 4 s: NOT_FOUND is given up after 1 s of launches without a sample.
        let p = lim.run(&["direct", "launch", "0", "4", "kernel"]).ok();
        let util = p.u("LAUNCHES") as f64 * common::KERNEL_US / 1e6 / p.f("ELAPSED") * 100.0;
        eprintln!("code {code}: {} launches, {util:.1}%", p.u("LAUNCHES"));
        let warnings: Vec<&str> = p.stderr.lines().filter(|l| l.contains("SM cap")).collect();
        assert_eq!(warnings.len(), 1, "code {code}: one warning: {}", p.stderr);
        assert!(
            util > 80.0,
            "code {code}: not clamped to a fixed launch rate: {util:.1}%"
        );
    }
}

#[test]
fn arrays_are_charged_what_the_driver_lays_out() {
    let Some(lim) = capped("arrays") else {
        return;
    };
    // (kind, arrays that fit under 1 GiB, what each takes underneath in MiB, about)
    let kinds: &[(&str, u64)] = &[
        ("array", 3),
        ("array3d", 3),
        ("mipmapped", 3),
        ("bc1", 8),
        ("bc7", 4),
    ];
    for (kind, fit) in kinds {
        let p = lim.conform(&["arrays", kind]).ok();
        eprintln!(
            "{kind}: {} created, {} MiB held, peak {} MiB",
            p.u("OK"),
            p.u("HELD_MIB"),
            p.u("PEAK_MIB")
        );
        assert!(
            p.u("PEAK_MIB") <= 1024,
            "{kind}: the driver handed out {} MiB under a 1 GiB cap",
            p.u("PEAK_MIB")
        );
        assert_eq!(
            p.u("OK"),
            *fit,
            "{kind}: as many as fit; stderr {}",
            p.stderr
        );
        assert_eq!(p.u("FREED_HELD_MIB"), 0, "{kind}: all destroyed");
        assert_eq!(p.u("FREE_AFTER"), GIB, "{kind}: and all credited");
    }
    let p = lim.conform(&["arrays", "deferred"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        (
            "OK",
            3,
            "three deferred-mapping arrays of 400 MiB of elements",
        ),
        ("HELD_MIB", 0, "take no memory"),
        ("DEFERRED_ALLOC_RC", 0, "so 900 MiB still fit"),
        ("FREE_AFTER", GIB, "and nothing stays counted"),
    ];
    check_rows(&p, rows);
}

#[test]
fn vmm_memory_is_credited_only_when_released_and_unmapped() {
    let Some(lim) = capped("vmm") else {
        return;
    };
    let p = lim.conform(&["vmm"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("CREATE1_RC", 0, "600 MiB created"),
        ("MAP1_RC", 0, "mapped"),
        ("RELEASE1_RC", 0, "and released while mapped"),
        ("CREATE2_RC", 2, "so another 600 MiB does not fit"),
        ("MAPPED_HELD_MIB", 600, "the driver still holds the first"),
        ("UNMAP1_RC", 0, "unmapped"),
        ("UNMAPPED_HELD_MIB", 0, "the driver gave it back"),
        ("CREATE3_RC", 0, "so 600 MiB fit again"),
        ("MAP2A_RC", 0, "mapped twice"),
        ("MAP2B_RC", 0, "mapped twice"),
        ("RELEASE2_RC", 0, "released"),
        ("UNMAP2A_RC", 0, "one mapping gone"),
        (
            "HALF_UNMAPPED_CREATE_RC",
            2,
            "the other still holds the memory",
        ),
        ("UNMAP2B_RC", 0, "the last mapping gone"),
        ("ALL_UNMAPPED_CREATE_RC", 0, "and the memory is back"),
        ("FREED_HELD_MIB", 0, "nothing held"),
        ("FREE_AFTER", GIB, "nothing counted"),
    ];
    check_rows(&p, rows);
    assert!(p.u("PEAK_MIB") <= 1024, "peak {} MiB", p.u("PEAK_MIB"));
}

#[test]
fn stream_ordered_memory_is_charged_to_the_streams_device_and_its_real_reuse() {
    let Some(lim) = capped("async") else {
        return;
    };
    let p = lim.conform(&["async", "otherdev"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("FIRST_RC", 0, "900 MiB on a stream of device 1"),
        ("SECOND_RC", 2, "another 900 MiB there does not fit"),
        ("HELD1_MIB", 900, "device 1's pool holds the first"),
        ("HELD0_MIB", 0, "device 0 holds nothing"),
        ("AFTER_HELD1_MIB", 0, "freed and synchronised"),
        ("AFTER_RC", 0, "so 900 MiB fit again"),
    ];
    check_rows(&p, rows);
    assert!(p.u("PEAK1_MIB") <= 1024, "peak {} MiB", p.u("PEAK1_MIB"));

    // Reuse attributes off: memory freed on one stream is not reused on another before a
    // synchronisation, so the pool would grow past the cap.
    let p = lim.conform(&["async", "reuse-off"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("FIRST_RC", 0, "900 MiB on stream 1"),
        ("FREE_RC", 0, "freed on stream 1"),
        (
            "OTHER_STREAM_RC",
            2,
            "900 MiB on stream 2 would grow the pool",
        ),
        ("HELD_MIB", 900, "the pool still holds the first"),
        ("SYNCED_HELD_MIB", 0, "released at the synchronisation"),
        ("AFTER_SYNC_RC", 0, "so 900 MiB fit"),
        ("FREE_AFTER", GIB, "nothing counted"),
    ];
    check_rows(&p, rows);
    assert!(p.u("PEAK_MIB") <= 1024, "peak {} MiB", p.u("PEAK_MIB"));
    // Positive control: with reuse on (the default) the same request reuses the freed memory.
    let p = lim.conform(&["async", "reuse-on"]).ok();
    let rows: &[(&str, u64, &str)] = &[
        ("OTHER_STREAM_RC", 0, "reused across streams"),
        ("HELD_MIB", 900, "without growing"),
        ("FREE_AFTER", GIB, "nothing counted"),
    ];
    check_rows(&p, rows);
}

#[test]
fn graph_memory_is_charged_at_launch_and_credited_at_trim() {
    let Some(lim) = capped("graph") else {
        return;
    };
    for kind in ["nodes", "capture"] {
        let p = lim.conform(&["graph", kind]).ok();
        let rows: &[(&str, u64, &str)] = &[
            ("LAUNCH_RC", 0, "a graph allocating 900 MiB launches"),
            ("LAUNCHED_HELD_MIB", 900, "the driver holds its memory"),
            ("LAUNCHED_FREE", GIB - 900 * MIB, "cuMemGetInfo shows it"),
            ("ALLOC_RC", 2, "so 900 MiB more do not fit"),
            ("ALLOC_HELD_MIB", 900, "and the driver was not asked"),
            ("FREED_HELD_MIB", 900, "freed, the graph pool keeps it"),
            ("FREED_ALLOC_RC", 2, "so it stays counted"),
            ("TRIM_RC", 0, "cuDeviceGraphMemTrim"),
            ("TRIMMED_HELD_MIB", 0, "gives it back"),
            ("TRIMMED_ALLOC_RC", 0, "so 900 MiB fit again"),
            ("EXEC_DESTROY_RC", 0, "the instantiated graph destroyed"),
            ("GRAPH_DESTROY_RC", 0, "the graph destroyed"),
            ("FREE_AFTER", GIB, "nothing counted"),
        ];
        eprintln!("{kind}: {}", p.stdout.replace('\n', " "));
        check_rows(&p, rows);
        assert!(
            p.u("PEAK_MIB") <= 1024,
            "{kind}: peak {} MiB",
            p.u("PEAK_MIB")
        );
    }
    let p = lim.conform(&["graph", "capture"]).ok();
    assert_eq!(p.u("CAPTURED_RC"), 0, "captured: no memory yet");
    assert_eq!(p.u("CAPTURED_HELD_MIB"), 0, "captured: no memory yet");
    // Capture allocates nothing, so it is not refused; the launch is.
    let p = lim.conform(&["graph", "capture-held"]).ok();
    assert_eq!(p.u("CAPTURED_RC"), 0, "captured while 600 MiB are held");
    assert_eq!(
        p.u("CAPTURED_HELD_MIB"),
        600,
        "nothing allocated by the capture"
    );
    assert_eq!(p.u("LAUNCH_RC"), 2, "the launch would exceed the cap");
    assert_eq!(
        p.u("LAUNCHED_HELD_MIB"),
        600,
        "and the driver was not asked"
    );
    let p = lim.conform(&["graph", "over"]).ok();
    assert_eq!(
        p.u("LAUNCH_RC"),
        2,
        "1800 MiB of graph memory is refused at launch"
    );
    assert_eq!(p.u("LAUNCHED_HELD_MIB"), 0, "before the driver allocates");
    assert!(p.u("PEAK_MIB") <= 1024, "peak {} MiB", p.u("PEAK_MIB"));
}
