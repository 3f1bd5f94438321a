//! Whether the limiter can load into an image: its C library, read from the image's files
//! through the rootfs handle (every path resolved inside the root, never followed out of it)
//! before `/etc/ld.so.preload` is written.
//!
//! The limiter is a glibc library built against glibc [`BASELINE`]'s symbol versions. In an
//! image without glibc (no C library at all, or musl, whose loader also honours `LD_PRELOAD`
//! and then fails to start every program) or with an older glibc, every dynamically linked
//! program would fail to start, so such a request is refused with one line naming the image's
//! C library. [`inspect`] reads; [`judge`] decides.

use std::fmt;
use std::path::Path;

use thiserror::Error;

use super::rootfs;

/// The oldest glibc the limiter and the node binaries are built for (`.cargo/config.toml`).
pub const BASELINE: GlibcVersion = GlibcVersion {
    major: 2,
    minor: 17,
};

/// glibc's dynamic loader on x86-64 (every glibc program's `PT_INTERP`).
pub const GLIBC_LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
/// musl's dynamic loader on x86-64.
pub const MUSL_LOADER: &str = "/lib/ld-musl-x86_64.so.1";
/// Where images keep `libc.so.6`, in the order looked at (Debian/Ubuntu multiarch, then
/// RHEL-style `lib64`, then plain `lib`).
pub const LIBC_PATHS: [&str; 6] = [
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/lib64/libc.so.6",
    "/usr/lib64/libc.so.6",
    "/lib/libc.so.6",
    "/usr/lib/libc.so.6",
];
/// glibc's own libraries the limiter needs besides `libc.so.6` (linked for glibc 2.17, where
/// `dlopen` lives in libdl and `pthread_create` in libpthread; every glibc since ships them,
/// since 2.34 as stubs). Looked for in the directories of [`LIBC_PATHS`].
pub const GLIBC_COMPANIONS: [&str; 2] = ["libpthread.so.0", "libdl.so.2"];
/// Largest `libc.so.6` read (glibc's is about 2 MiB).
const MAX_LIBC: u64 = 32 * 1024 * 1024;

/// A glibc release, as its symbol versions name it (`GLIBC_2.31` is 2.31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GlibcVersion {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What the image's files say about its C library.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// [`GLIBC_LOADER`] is a regular file (after symlinks inside the root).
    pub glibc_loader: bool,
    /// The first of [`LIBC_PATHS`] that is a regular file, and the newest `GLIBC_x.y` version it
    /// defines (`None`: it defines none, so it is not glibc's).
    pub libc: Option<(String, Option<GlibcVersion>)>,
    /// [`MUSL_LOADER`] is a regular file.
    pub musl_loader: bool,
    /// Those of [`GLIBC_COMPANIONS`] found in none of the library directories.
    pub missing: Vec<&'static str>,
}

/// Why the limiter cannot serve an image.
#[derive(Debug, Error)]
pub enum LibcError {
    #[error("the image's C library is musl ({MUSL_LOADER}), which cannot load gpushare's limiter (built for glibc {BASELINE} or newer)")]
    Musl,
    #[error("the image has no C library gpushare can load its limiter with (no {GLIBC_LOADER} and no libc.so.6 in /lib, /lib64, /usr/lib or their x86_64-linux-gnu directories; the limiter needs glibc {BASELINE} or newer)")]
    NoLibc,
    #[error("the image's C library is unusable: {libc} without glibc's loader {GLIBC_LOADER}, so no dynamic program can load gpushare's limiter (it needs glibc {BASELINE} or newer with its loader)")]
    NoLoader { libc: String },
    #[error("the image's {libc} defines no GLIBC_ symbol versions, so it is not glibc, and gpushare's limiter needs glibc {BASELINE} or newer")]
    NotGlibc { libc: String },
    #[error("the image's C library is glibc {version} ({libc}), older than glibc {BASELINE}: gpushare's limiter needs glibc {BASELINE} or newer")]
    Old { libc: String, version: GlibcVersion },
    #[error("the image's C library is glibc {version} ({libc}) without {}, which glibc ships and gpushare's limiter needs (restore them in the image: package libc6 or glibc)", missing.join(" and "))]
    Incomplete {
        libc: String,
        version: GlibcVersion,
        missing: Vec<&'static str>,
    },
    #[error(
        "cannot read {path} in the image to check its C library: fix or remove it in the image"
    )]
    Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Decides from what [`inspect`] found: the image's glibc version, or why the limiter cannot
/// load in it.
///
/// # Errors
/// [`LibcError`] naming the image's C library.
pub fn judge(found: &Found) -> Result<GlibcVersion, LibcError> {
    match (&found.libc, found.glibc_loader) {
        (Some((libc, Some(version))), true) if *version >= BASELINE => {
            if found.missing.is_empty() {
                Ok(*version)
            } else {
                Err(LibcError::Incomplete {
                    libc: libc.clone(),
                    version: *version,
                    missing: found.missing.clone(),
                })
            }
        }
        (Some((libc, Some(version))), true) => Err(LibcError::Old {
            libc: libc.clone(),
            version: *version,
        }),
        _ if found.musl_loader => Err(LibcError::Musl),
        (Some((libc, None)), _) => Err(LibcError::NotGlibc { libc: libc.clone() }),
        (Some((libc, Some(_))), false) => Err(LibcError::NoLoader { libc: libc.clone() }),
        (None, _) => Err(LibcError::NoLibc),
    }
}

/// Reads the image's loaders and `libc.so.6` through the rootfs handle.
///
/// # Errors
/// [`LibcError::Read`] for a file that exists but cannot be read (a directory or device on a
/// loader's path counts as absent).
pub fn inspect(rootfs_dir: &Path) -> Result<Found, LibcError> {
    inspect_with(rootfs_dir, |path| {
        let bytes = rootfs::read_image_file_max(rootfs_dir, path, MAX_LIBC)
            .map_err(|source| LibcError::Read { path, source })?;
        Ok(bytes.map(|b| glibc_release(&b)))
    })
}

/// [`inspect`] with the release of a present `libc.so.6` at `path` given by `release_of`
/// (`Some(None)`: not glibc's; `None`: gone meanwhile, the next path is tried), so that a cache
/// can answer for the file without a second copy of the walk.
///
/// # Errors
/// [`LibcError::Read`] for a file that exists but cannot be read, or what `release_of` returns.
pub fn inspect_with(
    rootfs_dir: &Path,
    mut release_of: impl FnMut(&'static str) -> Result<Option<Option<GlibcVersion>>, LibcError>,
) -> Result<Found, LibcError> {
    let present = |path: &'static str| {
        rootfs::image_file_exists(rootfs_dir, path)
            .map_err(|source| LibcError::Read { path, source })
    };
    let mut found = Found {
        glibc_loader: present(GLIBC_LOADER)?,
        musl_loader: present(MUSL_LOADER)?,
        libc: None,
        missing: Vec::new(),
    };
    for path in LIBC_PATHS {
        if !present(path)? {
            continue;
        }
        let Some(release) = release_of(path)? else {
            continue;
        };
        found.libc = Some((path.to_owned(), release));
        break;
    }
    for lib in GLIBC_COMPANIONS {
        let mut seen = false;
        for path in LIBC_PATHS {
            let candidate = format!("{}{lib}", path.trim_end_matches("libc.so.6"));
            seen = rootfs::image_file_exists(rootfs_dir, &candidate)
                .map_err(|source| LibcError::Read { path: lib, source })?;
            if seen {
                break;
            }
        }
        if !seen {
            found.missing.push(lib);
        }
    }
    Ok(found)
}

/// [`inspect`] then [`judge`].
///
/// # Errors
/// [`LibcError`].
pub fn check(rootfs_dir: &Path) -> Result<GlibcVersion, LibcError> {
    judge(&inspect(rootfs_dir)?)
}

/// The glibc release of the `libc.so.6` at `path` (a host path, e.g. the node's
/// `/lib/x86_64-linux-gnu/libc.so.6`): the newest `GLIBC_x.y` version it defines; `None` when
/// it is not glibc's.
///
/// # Errors
/// The read error.
pub fn glibc_version_of(path: &Path) -> std::io::Result<Option<GlibcVersion>> {
    Ok(glibc_release(&std::fs::read(path)?))
}

/// The glibc release of a `libc.so.6` image: the one its banner names (`… stable release version
/// 2.31.`), else the newest `GLIBC_x.y` version it defines (a release that added no symbols,
/// such as 2.31, defines none of its own); `None` when it defines no `GLIBC_` version at all.
pub fn glibc_release(elf: &[u8]) -> Option<GlibcVersion> {
    let defined = newest_defined(elf)?;
    Some(
        banner_release(elf)
            .filter(|b| *b >= defined)
            .unwrap_or(defined),
    )
}

/// The release named by glibc's banner string in `bytes` (`release version 2.31`).
fn banner_release(bytes: &[u8]) -> Option<GlibcVersion> {
    const PAT: &[u8] = b"release version ";
    let at = bytes.windows(PAT.len()).position(|w| w == PAT)? + PAT.len();
    let tail = &bytes[at..bytes.len().min(at + 16)];
    let end = tail
        .iter()
        .position(|c| !(c.is_ascii_digit() || *c == b'.'))
        .unwrap_or(tail.len());
    let text = std::str::from_utf8(&tail[..end])
        .ok()?
        .trim_end_matches('.');
    parse_version(&format!("GLIBC_{text}"))
}

/// The newest `GLIBC_x.y` version an ELF shared object defines (its `.gnu.version_d`).
pub fn newest_defined(elf: &[u8]) -> Option<GlibcVersion> {
    let elf = goblin::elf::Elf::parse(elf).ok()?;
    let verdef = elf.verdef.as_ref()?;
    let names = verdef
        .iter()
        .flat_map(|d| d.iter().map(|a| a.vda_name).collect::<Vec<_>>())
        .filter_map(|off| elf.dynstrtab.get_at(off));
    newest(names)
}

/// The newest of the `GLIBC_x.y[.z]` names among `names`.
pub fn newest<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<GlibcVersion> {
    names.into_iter().filter_map(parse_version).max()
}

/// `GLIBC_2.31` → 2.31, `GLIBC_2.2.5` → 2.2; anything else (`GLIBC_PRIVATE`) → `None`.
pub fn parse_version(name: &str) -> Option<GlibcVersion> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(GlibcVersion { major, minor })
}

/// An image the limiter cannot load into, for a share that only the limiter could serve.
#[derive(Debug, Error)]
#[error("{libc}; {need}: {advice}")]
pub struct LimiterRefused {
    /// The image's C library, as [`judge`] found it.
    pub libc: LibcError,
    /// What needed the limiter.
    pub need: String,
    /// What to do instead: only what this node's policy serves.
    pub advice: String,
}

/// What a container refused for its image can ask for instead under `cfg`'s policy: an image
/// with glibc always; a share without a cap (mps or timeslice, which need no limiter) only
/// where the policy serves it without reserving anything, so that the next attempt is not
/// refused for it.
fn advice(cfg: &crate::config::Config) -> String {
    let mut out = format!("use an image with glibc {BASELINE} or newer");
    let modes: Vec<&str> = [crate::vocab::Mode::Mps, crate::vocab::Mode::Timeslice]
        .into_iter()
        .filter(|m| cfg.policy.modes.contains(m))
        .map(|m| m.as_str())
        .collect();
    if cfg.policy.uncapped == crate::vocab::memcap::Uncapped::Share && !modes.is_empty() {
        out.push_str(&format!(
            ", or gpu.share={} without gpu.share.memory (uncapped: it reserves no GPU memory and has no guarantee)",
            modes.join(" or ")
        ));
    }
    out
}

/// Refuses a share that needs the limiter (`limit` mode, or a cap the hook has not settled)
/// in an image that cannot load it.
pub fn refuse(
    libc: LibcError,
    cfg: &crate::config::Config,
    mode: crate::vocab::Mode,
) -> LimiterRefused {
    if mode == crate::vocab::Mode::Limit {
        LimiterRefused {
            libc,
            need: "gpu.share=limit runs in the limiter".into(),
            advice: advice(cfg),
        }
    } else {
        LimiterRefused {
            libc,
            need: "gpu.share.memory needs the limiter here".into(),
            advice: advice_for_cap(cfg),
        }
    }
}

/// What a capped share refused for its image can do instead: dropping the cap is offered only
/// where an uncapped share is served (`[policy] uncapped = "share"`).
pub(crate) fn advice_for_cap(cfg: &crate::config::Config) -> String {
    let mut out = format!("use an image with glibc {BASELINE} or newer");
    if cfg.policy.uncapped == crate::vocab::memcap::Uncapped::Share {
        out.push_str(", or run it without gpu.share.memory (uncapped: it reserves no GPU memory and has no guarantee)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glibc(path: &str, v: Option<(u32, u32)>) -> Option<(String, Option<GlibcVersion>)> {
        Some((
            path.into(),
            v.map(|(major, minor)| GlibcVersion { major, minor }),
        ))
    }

    #[test]
    fn versions_parse_as_glibc_names_them() {
        assert_eq!(
            parse_version("GLIBC_2.31"),
            Some(GlibcVersion {
                major: 2,
                minor: 31
            })
        );
        assert_eq!(
            parse_version("GLIBC_2.2.5"),
            Some(GlibcVersion { major: 2, minor: 2 })
        );
        for bad in ["GLIBC_PRIVATE", "GCC_3.0", "GLIBC_2", "GLIBC_x.1", ""] {
            assert_eq!(parse_version(bad), None, "{bad}");
        }
        assert_eq!(
            newest(["GLIBC_2.2.5", "GLIBC_2.9", "GLIBC_2.17", "GLIBC_PRIVATE"]),
            Some(GlibcVersion {
                major: 2,
                minor: 17
            })
        );
        assert_eq!(newest(["GLIBC_PRIVATE"]), None);
    }

    #[test]
    fn judge_names_the_images_libc() {
        const LIB: &str = "/lib/x86_64-linux-gnu/libc.so.6";
        let lib = LIB;
        let ok = Found {
            glibc_loader: true,
            libc: glibc(lib, Some((2, 31))),
            musl_loader: false,
            missing: Vec::new(),
        };
        assert_eq!(judge(&ok).unwrap().to_string(), "2.31");
        let at_baseline = Found {
            libc: glibc(lib, Some((2, 17))),
            ..ok.clone()
        };
        assert!(judge(&at_baseline).is_ok());
        // Rows: (found, words the one-line refusal must hold)
        let rows: Vec<(Found, &[&str])> = vec![
            (
                Found {
                    libc: glibc(lib, Some((2, 12))),
                    ..ok.clone()
                },
                &["glibc 2.12", LIB, "glibc 2.17 or newer"],
            ),
            (
                Found {
                    glibc_loader: false,
                    libc: None,
                    musl_loader: true,
                    missing: Vec::new(),
                },
                &["musl", MUSL_LOADER, "glibc 2.17 or newer"],
            ),
            (Found::default(), &["no C library", "glibc 2.17 or newer"]),
            (
                Found {
                    missing: vec!["libpthread.so.0", "libdl.so.2"],
                    ..ok.clone()
                },
                &["glibc 2.31", LIB, "without libpthread.so.0 and libdl.so.2"],
            ),
            (
                Found {
                    glibc_loader: false,
                    ..ok.clone()
                },
                &["without glibc's loader", LIB],
            ),
            (
                Found {
                    libc: glibc("/usr/lib/libc.so.6", None),
                    ..ok.clone()
                },
                &["/usr/lib/libc.so.6", "not glibc"],
            ),
            // musl beside a libc.so.6 that is not glibc's (musl's own name for itself).
            (
                Found {
                    glibc_loader: false,
                    libc: glibc("/usr/lib/libc.so.6", None),
                    musl_loader: true,
                    missing: Vec::new(),
                },
                &["musl"],
            ),
        ];
        for (found, words) in rows {
            let msg = judge(&found).expect_err("refused").to_string();
            assert!(!msg.contains('\n'), "{msg}");
            for w in words {
                assert!(msg.contains(w), "{found:?}: {msg} lacks {w}");
            }
        }
    }

    #[test]
    fn a_refusal_suggests_only_what_the_policy_serves() {
        use crate::vocab::memcap::Uncapped;
        use crate::vocab::Mode;
        let mut cfg = crate::config::Config::default();
        let limit = refuse(LibcError::Musl, &cfg, Mode::Limit).to_string();
        let cap = refuse(LibcError::NoLibc, &cfg, Mode::Mps).to_string();
        assert!(
            limit.contains("gpu.share=mps or timeslice without gpu.share.memory"),
            "{limit}"
        );
        assert!(cap.contains("without gpu.share.memory"), "{cap}");
        for strict in [Uncapped::Refuse, Uncapped::WholeGpu] {
            cfg.policy.uncapped = strict;
            for mode in [Mode::Limit, Mode::Mps, Mode::Timeslice] {
                let m = refuse(LibcError::Musl, &cfg, mode).to_string();
                assert!(!m.contains("without gpu.share.memory"), "{strict}: {m}");
                assert!(m.contains("glibc 2.17 or newer"), "{m}");
                assert!(!m.contains('\n'), "{m}");
            }
        }
        cfg.policy.uncapped = Uncapped::Share;
        cfg.policy.modes = vec![Mode::Limit];
        let m = refuse(LibcError::Musl, &cfg, Mode::Limit).to_string();
        assert!(
            !m.contains("gpu.share=mps"),
            "a mode the node does not serve: {m}"
        );
    }

    #[test]
    fn inspect_reads_inside_the_root_only() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Symlinks that point at the host's loader and libc resolve inside the root: absent.
        std::fs::create_dir_all(root.join("lib64")).unwrap();
        let host = "../../../../../../../../lib/x86_64-linux-gnu";
        symlink(format!("{host}/ld-linux-x86-64.so.2"), root.join("lib64/x")).unwrap();
        symlink("x", root.join("lib64/ld-linux-x86-64.so.2")).unwrap();
        symlink(format!("/{host}/libc.so.6"), root.join("lib64/libc.so.6")).unwrap();
        let found = inspect(root).unwrap();
        let nothing = Found {
            missing: GLIBC_COMPANIONS.to_vec(),
            ..Found::default()
        };
        assert_eq!(found, nothing, "nothing of the host's was read");
        assert!(matches!(judge(&found), Err(LibcError::NoLibc)));
        // A libc.so.6 that is not an ELF file defines no version: not glibc.
        std::fs::remove_file(root.join("lib64/libc.so.6")).unwrap();
        std::fs::write(root.join("lib64/libc.so.6"), b"not an ELF file").unwrap();
        std::fs::write(root.join("lib64/real-ld.so"), b"x").unwrap();
        std::fs::remove_file(root.join("lib64/x")).unwrap();
        symlink("real-ld.so", root.join("lib64/x")).unwrap();
        let found = inspect(root).unwrap();
        assert!(found.glibc_loader);
        assert_eq!(found.libc, glibc("/lib64/libc.so.6", None));
        // A directory on libc's path is skipped, not read.
        std::fs::create_dir_all(root.join("lib/x86_64-linux-gnu/libc.so.6")).unwrap();
        assert_eq!(inspect(root).unwrap().libc, glibc("/lib64/libc.so.6", None));
    }

    #[test]
    fn the_banner_names_the_release() {
        let v = |s: &[u8]| banner_release(s).map(|v| v.to_string());
        assert_eq!(
            v(b"GNU C Library (Debian GLIBC 2.31-13+deb11u11) stable release version 2.31.\n"),
            Some("2.31".into())
        );
        assert_eq!(
            v(b"x release version 2.17, by Roland McGrath"),
            Some("2.17".into())
        );
        assert_eq!(v(b"release version x"), None);
        assert_eq!(v(b"no banner"), None);
    }

    #[test]
    fn the_hosts_libc_defines_its_release() {
        // Positive control for the ELF reading: this machine's own glibc.
        let host = LIBC_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .expect("a host libc.so.6");
        let v = glibc_version_of(host).unwrap().expect("glibc versions");
        assert!(v >= BASELINE, "{v}");
    }
}
