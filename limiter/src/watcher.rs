//! The SM cap's watcher thread: refills the token buckets of [`crate::sm`] every 20 ms and
//! every 100 ms reads NVML per-process utilisation of the container's processes. It estimates
//! the GPU time one launch costs from this process's utilisation and launch count, and sets
//! the refill rate to `(cap − other container processes' utilisation) / cost per launch`.

use crate::driver;
use crate::limits::MAX_DEVICES;
use crate::sm::{Bucket, WATCHER_STARTED};
use crate::state::Limiter;
use crate::sys;
use std::sync::atomic::Ordering;

const TICK_NS: u64 = 20_000_000;
const MEASURE_EVERY: u32 = 5;
const INITIAL_RATE: f64 = 1000.0;
const MAX_RATE: f64 = 1e9;
/// Measurements (of 100 ms) with launches but no utilisation sample after which the SM cap is
/// given up as unmeasurable: 1 s, several of NVML's sampling periods.
const BLIND_LIMIT: u32 = 10;

/// The SM cap of `ord` cannot be measured: enforce nothing rather than an arbitrary fixed
/// launch rate, and say so once.
fn fail_open(c: &mut Ctl, ord: usize, why: &str) {
    sys::warn(&format!(
        "{why} for CUDA device {ord}; its SM cap is not enforced"
    ));
    c.handle = None;
    c.rate = MAX_RATE;
}

/// Starts the watcher thread of this process unless it runs already.
pub fn start(l: &'static Limiter) {
    if WATCHER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpushare-sm".into())
        .spawn(move || watch(l));
    if spawned.is_err() {
        sys::warn("cannot start the SM watcher thread; SM cap not enforced");
        for b in &l.sm.buckets {
            b.open();
        }
    }
}

/// Controller state of one device (watcher-thread local).
struct Ctl {
    handle: Option<*mut std::ffi::c_void>,
    tried_handle: bool,
    last_seen: u64,
    rate: f64,
    cost: f64,
    carry: f64,
    last_measure: u64,
    /// Integral correction on the container's measured utilisation vs the cap.
    corr: f64,
    /// Consecutive measurements in which this process launched but NVML had no sample.
    blind: u32,
    /// Launches counted since the last measurement.
    launched: u64,
    /// The bucket's launch count as the watcher last saw it.
    last_taken: i64,
}

impl Ctl {
    /// The bucket has counted `taken` launches now: the launches since the last look.
    fn saw(&mut self, taken: i64) {
        self.launched += u64::try_from(taken.saturating_sub(self.last_taken)).unwrap_or(0);
        self.last_taken = taken;
    }
}

fn watch(l: &'static Limiter) {
    // Only devices that exist: the caps may name all 16 ordinals. Before `cuInit` (a launch
    // cannot come first) the count is unknown: then every capped ordinal is watched.
    let devices = driver::cuda::device_count().unwrap_or(MAX_DEVICES);
    // Become a member of the container in the shared file, so that the others count our
    // utilisation as the container's (and we theirs) even without any memory cap.
    let _ = l.slot();
    let mut ctl: Vec<Ctl> = (0..MAX_DEVICES)
        .map(|ord| Ctl {
            handle: None,
            tried_handle: false,
            last_seen: 0,
            rate: INITIAL_RATE,
            cost: 0.0,
            carry: 0.0,
            last_measure: sys::now_ns(),
            corr: 1.0,
            blind: 0,
            launched: 0,
            // Launches before the watcher started are not counted.
            last_taken: l.sm.buckets[ord].taken.load(Ordering::Acquire),
        })
        .collect();
    let mut last = sys::now_ns();
    let mut tick: u32 = 0;
    loop {
        sys::sleep_ns(TICK_NS);
        let now = sys::now_ns();
        let dt = (now - last) as f64 / 1e9;
        last = now;
        tick = tick.wrapping_add(1);
        for (ord, (b, c)) in l.sm.buckets.iter().zip(ctl.iter_mut()).enumerate() {
            if b.target == 0 || ord >= devices {
                continue;
            }
            if tick.is_multiple_of(MEASURE_EVERY) {
                measure(l, ord, b, c, now);
            }
            let add = c.rate * dt + c.carry;
            let whole = add.floor();
            c.carry = add - whole;
            let burst = (c.rate * TICK_NS as f64 / 1e9).max(1.0) as i64;
            let refill = |t: i64| t.saturating_add(whole as i64).min(burst.max(t));
            // Only this thread writes `granted`, and never lowers it (the refill never takes
            // tokens away); launches counted after `taken` was read draw on the new grant.
            let taken = b.taken.load(Ordering::Acquire);
            let granted = b.granted.load(Ordering::Acquire);
            c.saw(taken);
            let tokens = granted.saturating_sub(taken);
            let new = taken.saturating_add(refill(tokens));
            if new > granted {
                b.granted.store(new, Ordering::Release);
            }
        }
    }
}

fn measure(l: &Limiter, ord: usize, b: &Bucket, c: &mut Ctl, now: u64) {
    if !c.tried_handle {
        c.tried_handle = true;
        c.handle = driver::nvml::handle_for_ordinal(ord);
        if c.handle.is_none() {
            // Without utilisation figures a fixed rate would be an arbitrary cap: fail open,
            // loudly.
            fail_open(c, ord, "NVML (libnvidia-ml.so.1) does not answer");
        }
    }
    let window = (now - c.last_measure) as f64 / 1e9;
    c.last_measure = now;
    c.saw(b.taken.load(Ordering::Acquire));
    let launched = std::mem::take(&mut c.launched);
    let Some(h) = c.handle else {
        return;
    };
    // SAFETY: `h` came from the real nvmlDeviceGetHandleByUUID.
    let samples = match unsafe { driver::nvml::process_util(h, c.last_seen) } {
        Ok(s) if !s.is_empty() => {
            c.blind = 0;
            s
        }
        Err(driver::nvml::NOT_SUPPORTED) => {
            fail_open(
                c,
                ord,
                "NVML does not report per-process utilisation (NOT_SUPPORTED, as under MIG)",
            );
            return;
        }
        // No sample (NOT_FOUND, or another error): fine while idle; launches NVML never
        // sees mean the cap cannot be measured.
        _ => {
            if launched > 0 {
                c.blind += 1;
                if c.blind >= BLIND_LIMIT {
                    fail_open(
                        c,
                        ord,
                        "NVML reports no per-process utilisation for this process's launches",
                    );
                }
            }
            return;
        }
    };
    if c.last_seen == 0 {
        // The first answer covers an unknown span: it only sets the timestamp baseline.
        c.last_seen = samples.iter().map(|s| s.time_stamp).max().unwrap_or(0);
        return;
    }
    let own = sys::getpid();
    let members = l.member_pids();
    let mut per_pid: Vec<(u32, u32, u32)> = Vec::new(); // pid, sum, count
    for s in &samples {
        c.last_seen = c.last_seen.max(s.time_stamp);
        match per_pid.iter_mut().find(|p| p.0 == s.pid) {
            Some(p) => {
                p.1 += s.sm_util;
                p.2 += 1;
            }
            None => per_pid.push((s.pid, s.sm_util, 1)),
        }
    }
    let avg = |p: &(u32, u32, u32)| f64::from(p.1) / f64::from(p.2.max(1));
    let mut own_util = per_pid.iter().find(|p| p.0 == own).map(avg);
    let matched: Vec<&(u32, u32, u32)> =
        per_pid.iter().filter(|p| members.contains(&p.0)).collect();
    let container = if matched.is_empty() {
        // Pids not visible as the container sees them (PID namespace): count the device.
        per_pid.iter().map(avg).sum::<f64>()
    } else {
        matched.iter().map(|p| avg(p)).sum::<f64>()
    };
    if own_util.is_none() && matched.is_empty() {
        own_util = Some(container);
    }
    let own_util = own_util.unwrap_or(0.0);
    let target = f64::from(b.target) / 100.0;
    if launched > 0 && window > 0.0 {
        if own_util > 0.5 {
            let sample = own_util / 100.0 * window / launched as f64;
            c.cost = if c.cost == 0.0 {
                sample
            } else {
                0.5 * c.cost + 0.5 * sample
            };
        } else {
            // Launches that leave no measurable trace: the kernels got cheaper (or NVML has
            // no samples); let the rate grow.
            c.cost = if c.cost < 1e-12 { 0.0 } else { c.cost * 0.5 };
        }
    }
    let others = ((container - own_util) / 100.0).max(0.0);
    let budget = (target - others).max(target * 0.1);
    if c.cost > 0.0 && container > 0.5 {
        // Estimation bias and the other processes' lag: nudge toward the cap itself.
        let err = (target * 100.0 - container) / (target * 100.0);
        c.corr = (c.corr * (1.0 + 0.3 * err).clamp(0.8, 1.2)).clamp(0.5, 1.5);
    }
    if c.cost > 0.0 {
        c.rate = (c.corr * budget / c.cost).min(MAX_RATE);
    } else if launched > 0 {
        c.rate = (c.rate * 2.0).min(MAX_RATE);
    }
}
