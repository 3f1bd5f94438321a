//! Which backend enforces a container's memory cap: the driver's cgroup limits when the
//! container has a cgroup v2 of its own that the driver takes limits on for every GPU of the
//! plan; else gpushare's limiter. Pure: the facts the caller found on the host (the container's
//! cgroup, the driver's answer) in, an [`Enforcement`] out. The caller reads the files
//! (`/proc/<pid>/cgroup`, `/proc/self/mountinfo`) and asks the driver; nothing here does.

use crate::vocab::memcap::{Backend, Enforcement};

/// What the caller found out about the container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupFact {
    /// The container does not exist yet (a spec edit, before the runtime creates it): its
    /// createRuntime hook chooses the backend.
    NotCreated,
    /// The container's own cgroup v2 directory, as a full path on the host.
    Own(String),
    /// Why the container has no cgroup v2 of its own the driver could take (no pid, an
    /// unreadable cgroup, memory in cgroup v1 only, no cgroup2 mount showing it).
    NotOwn(String),
}

/// The host's facts the choice needs, as the caller gathers them. Each is asked only when the
/// choice needs it: a share without a cap asks neither, and the driver is asked only about a
/// cgroup of the container's own.
pub struct HostFacts<'a> {
    /// The container's cgroup.
    pub cgroup: &'a dyn Fn() -> CgroupFact,
    /// Whether the driver takes memory limits on a cgroup directory for GPU `index`: `Err`
    /// says why not.
    pub driver: &'a dyn Fn(u32, &str) -> Result<(), String>,
}

/// Why a plan without a memory cap names no backend.
const NO_CAP: &str = "no memory cap was asked";
/// Why a plan made before the container exists names no backend yet.
const NOT_CREATED: &str = "chosen by the createRuntime hook, once the container's cgroup exists";

fn limiter(why: String) -> Enforcement {
    Enforcement {
        backend: Backend::Limiter,
        cgroup: None,
        why: Some(why),
    }
}

/// The enforcement of a plan without a memory cap: nothing to enforce.
pub fn uncapped() -> Enforcement {
    limiter(NO_CAP.into())
}

/// Whether `e` is [`uncapped`]'s.
pub fn is_uncapped(e: &Enforcement) -> bool {
    *e == uncapped()
}

/// The enforcement of a capped plan made before the container exists ([`CgroupFact::NotCreated`]):
/// the limiter's account in the spec, the backend chosen by the createRuntime hook.
pub fn not_created() -> Enforcement {
    limiter(NOT_CREATED.into())
}

/// Whether `e` is [`not_created`]'s: the createRuntime hook still chooses the backend.
pub fn is_not_created(e: &Enforcement) -> bool {
    *e == not_created()
}

/// Chooses what enforces a memory cap of `cap` bytes on the GPUs `gpus` (their indices): the
/// driver on the container's own cgroup v2 when the driver takes limits there on every one of
/// them; else the limiter, saying why. Without a cap, [`uncapped`]; before the container
/// exists, [`not_created`].
pub fn choose(cap: Option<u64>, gpus: &[u32], facts: &HostFacts<'_>) -> Enforcement {
    if cap.is_none() {
        return uncapped();
    }
    let dir = match (facts.cgroup)() {
        CgroupFact::NotCreated => return not_created(),
        CgroupFact::NotOwn(why) => return limiter(why),
        CgroupFact::Own(dir) => dir,
    };
    for &index in gpus {
        if let Err(why) = (facts.driver)(index, &dir) {
            return limiter(format!(
                "the driver does not take limits on {dir} for GPU {index}: {why}"
            ));
        }
    }
    Enforcement {
        backend: Backend::Driver,
        cgroup: Some(dir),
        why: None,
    }
}

/// What the caller found of the image's C library: asked only for a capped `mps` or
/// `timeslice` share, which needs the limiter unless the driver enforces its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageFact {
    /// Not known: no root filesystem to look at (a dry run on a bundle without it); the
    /// limiter's own check refuses the share later if it cannot load.
    Unknown,
    /// The limiter loads into it.
    Loads,
    /// The limiter cannot load into it.
    Cannot {
        /// Why, said for people.
        libc: String,
        /// What to do instead: only what this node's policy serves.
        advice: String,
    },
}

/// A capped share in an image the limiter cannot load into, where only the limiter could
/// enforce the cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{libc}; {need}: {advice}")]
pub struct NeedsLimiter {
    /// The image's C library, as the caller found it.
    pub libc: String,
    /// What needed the limiter.
    pub need: String,
    /// What to do instead.
    pub advice: String,
}

/// For a capped `mps` or `timeslice` share: `Ok(None)` when the limiter serves it (or it
/// needs no limiter), `Ok(Some(why))` when it is served without the limiter because the
/// driver enforces its cap, or the createRuntime hook still chooses ([`not_created`]); the
/// image's fact is asked only then. `limit` mode's own check is the injection's.
///
/// # Errors
/// [`NeedsLimiter`] when only the limiter could enforce the cap and the image cannot load it.
pub fn without_limiter(
    mode: crate::vocab::Mode,
    cap: Option<u64>,
    enforcement: &Enforcement,
    image: &dyn Fn() -> ImageFact,
) -> Result<Option<String>, NeedsLimiter> {
    if mode == crate::vocab::Mode::Limit || cap.is_none() {
        return Ok(None);
    }
    let (libc, advice) = match image() {
        ImageFact::Unknown | ImageFact::Loads => return Ok(None),
        ImageFact::Cannot { libc, advice } => (libc, advice),
    };
    match enforcement.backend {
        Backend::Limiter if !is_not_created(enforcement) => Err(NeedsLimiter {
            libc,
            need: format!(
                "gpu.share.memory needs the limiter here, because the driver cannot enforce the cap for this container ({})",
                enforcement.why.as_deref().unwrap_or("no driver limits")
            ),
            advice,
        }),
        _ => Ok(Some(libc)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    const CG: &str = "/sys/fs/cgroup/system.slice/docker-abc.scope";

    /// Runs [`choose`] on the given facts and records which of them it asked.
    struct Run {
        got: Enforcement,
        cgroup_asked: bool,
        driver_asked: Vec<(u32, String)>,
    }

    fn run(cap: Option<u64>, gpus: &[u32], cgroup: CgroupFact, refuses: &[u32]) -> Run {
        let cgroup_asked = RefCell::new(false);
        let driver_asked = RefCell::new(Vec::new());
        let cg = || {
            *cgroup_asked.borrow_mut() = true;
            cgroup.clone()
        };
        let drv = |index: u32, dir: &str| {
            driver_asked.borrow_mut().push((index, dir.to_owned()));
            if refuses.contains(&index) {
                Err("Not Supported".to_owned())
            } else {
                Ok(())
            }
        };
        let got = choose(
            cap,
            gpus,
            &HostFacts {
                cgroup: &cg,
                driver: &drv,
            },
        );
        Run {
            got,
            cgroup_asked: cgroup_asked.into_inner(),
            driver_asked: driver_asked.into_inner(),
        }
    }

    #[test]
    fn an_image_without_the_limiters_libc_is_served_only_where_the_driver_enforces_the_cap() {
        use crate::vocab::Mode;
        let no_glibc = || ImageFact::Cannot {
            libc: "musl".into(),
            advice: "use glibc".into(),
        };
        let limiter_why = limiter("memory in cgroup v1 only".into());
        // (mode, cap, enforcement, image, expected)
        type Row<'a> = (
            Mode,
            Option<u64>,
            Enforcement,
            &'a dyn Fn() -> ImageFact,
            Result<Option<String>, &'a str>,
        );
        let rows: Vec<Row> = vec![
            (
                Mode::Mps,
                Some(1 << 30),
                driver(CG),
                &no_glibc,
                Ok(Some("musl".into())),
            ),
            (
                Mode::Timeslice,
                Some(1 << 30),
                driver(CG),
                &no_glibc,
                Ok(Some("musl".into())),
            ),
            (
                Mode::Mps,
                Some(1 << 30),
                not_created(),
                &no_glibc,
                Ok(Some("musl".into())),
            ),
            (
                Mode::Mps,
                Some(1 << 30),
                limiter_why.clone(),
                &no_glibc,
                Err("memory in cgroup v1 only"),
            ),
            (
                Mode::Timeslice,
                Some(1 << 30),
                limiter_why.clone(),
                &|| ImageFact::Loads,
                Ok(None),
            ),
            (
                Mode::Mps,
                Some(1 << 30),
                limiter_why.clone(),
                &|| ImageFact::Unknown,
                Ok(None),
            ),
        ];
        let mut failed = Vec::new();
        for (i, (mode, cap, e, image, want)) in rows.iter().enumerate() {
            let got = without_limiter(*mode, *cap, e, *image);
            let ok = match (&got, want) {
                (Ok(a), Ok(b)) => a == b,
                (Err(n), Err(why)) => {
                    n.libc == "musl" && n.need.contains(why) && n.advice == "use glibc"
                }
                _ => false,
            };
            if !ok {
                failed.push(format!("row {i}: {got:?}, want {want:?}"));
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
        // Without a cap, or in limit mode (its injection checks), the image is not even asked.
        let asked = std::cell::Cell::new(false);
        let ask = || {
            asked.set(true);
            ImageFact::Cannot {
                libc: "musl".into(),
                advice: "use glibc".into(),
            }
        };
        assert_eq!(
            without_limiter(Mode::Mps, None, &uncapped(), &ask),
            Ok(None)
        );
        assert_eq!(
            without_limiter(Mode::Limit, Some(1 << 30), &limiter_why, &ask),
            Ok(None)
        );
        assert!(!asked.get());
        // Positive control: a capped share does ask.
        let _ = without_limiter(Mode::Mps, Some(1 << 30), &limiter_why, &ask);
        assert!(asked.get());
    }

    fn driver(dir: &str) -> Enforcement {
        Enforcement {
            backend: Backend::Driver,
            cgroup: Some(dir.to_owned()),
            why: None,
        }
    }

    #[test]
    fn the_driver_enforces_a_cap_only_on_an_own_cgroup_v2_that_takes_limits_on_every_gpu() {
        let own = || CgroupFact::Own(CG.into());
        let v1 =
            || CgroupFact::NotOwn("the node accounts memory in cgroup v1 (\"/docker/abc\")".into());
        // Rows: (what, cap, GPUs, cgroup, GPUs whose driver refuses, expected).
        type Row = (
            &'static str,
            Option<u64>,
            Vec<u32>,
            CgroupFact,
            Vec<u32>,
            Enforcement,
        );
        let rows: Vec<Row> = vec![
            // Positive control: every fact in favour, the driver enforces on that cgroup.
            (
                "v2, driver takes limits",
                Some(1 << 30),
                vec![0],
                own(),
                vec![],
                driver(CG),
            ),
            (
                "v2, driver takes limits on both GPUs",
                Some(1 << 30),
                vec![0, 1],
                own(),
                vec![],
                driver(CG),
            ),
            (
                "v2, driver has no limits",
                Some(1 << 30),
                vec![0],
                own(),
                vec![0],
                limiter(format!(
                    "the driver does not take limits on {CG} for GPU 0: Not Supported"
                )),
            ),
            (
                "v2, driver refuses the second GPU",
                Some(1 << 30),
                vec![0, 1],
                own(),
                vec![1],
                limiter(format!(
                    "the driver does not take limits on {CG} for GPU 1: Not Supported"
                )),
            ),
            (
                "cgroup v1, driver would take limits",
                Some(1 << 30),
                vec![0],
                v1(),
                vec![],
                limiter("the node accounts memory in cgroup v1 (\"/docker/abc\")".into()),
            ),
            (
                "cgroup v1, driver has no limits",
                Some(1 << 30),
                vec![0],
                v1(),
                vec![0],
                limiter("the node accounts memory in cgroup v1 (\"/docker/abc\")".into()),
            ),
            (
                "before the container exists",
                Some(1 << 30),
                vec![0],
                CgroupFact::NotCreated,
                vec![],
                not_created(),
            ),
            (
                "no cap, v2, driver takes limits",
                None,
                vec![0],
                own(),
                vec![],
                uncapped(),
            ),
            ("no cap, v1", None, vec![0], v1(), vec![0], uncapped()),
        ];
        for (what, cap, gpus, cgroup, refuses, want) in rows {
            let r = run(cap, &gpus, cgroup, &refuses);
            assert_eq!(r.got, want, "{what}");
        }
    }

    #[test]
    fn facts_are_asked_only_when_the_choice_needs_them() {
        // Positive control: a capped share on its own cgroup asks both, the driver once per GPU
        // on that cgroup.
        let r = run(Some(1), &[2, 3], CgroupFact::Own(CG.into()), &[]);
        assert!(r.cgroup_asked);
        assert_eq!(r.driver_asked, vec![(2, CG.to_owned()), (3, CG.to_owned())]);
        // Stops at the first GPU the driver refuses.
        let r = run(Some(1), &[2, 3], CgroupFact::Own(CG.into()), &[2]);
        assert_eq!(r.driver_asked, vec![(2, CG.to_owned())]);
        // No cap: neither is asked (no /proc read, no NVML call).
        let r = run(None, &[2], CgroupFact::Own(CG.into()), &[]);
        assert!(!r.cgroup_asked);
        assert!(r.driver_asked.is_empty());
        // No cgroup of its own, or none yet: the driver is not asked.
        for cg in [CgroupFact::NotOwn("x".into()), CgroupFact::NotCreated] {
            let r = run(Some(1), &[2], cg.clone(), &[]);
            assert!(r.cgroup_asked, "{cg:?}");
            assert!(r.driver_asked.is_empty(), "{cg:?}");
        }
    }

    #[test]
    fn the_markers_tell_their_states_apart() {
        assert!(is_uncapped(&uncapped()));
        assert!(is_not_created(&not_created()));
        assert!(!is_uncapped(&not_created()));
        assert!(!is_not_created(&uncapped()));
        let real = run(Some(1), &[0], CgroupFact::NotOwn("no pid".into()), &[]).got;
        assert_eq!(real.backend, Backend::Limiter);
        assert!(!is_uncapped(&real) && !is_not_created(&real));
        assert!(!is_uncapped(&driver(CG)) && !is_not_created(&driver(CG)));
    }
}
