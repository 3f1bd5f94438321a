//! Writing one planned file: a backup of the previous one, then temp file + fsync + rename;
//! and the unified diff `--dry-run` prints.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Change, ConfigureError};

/// What happened to a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// It already held what the engine needs.
    Unchanged,
    /// It did not exist and was written.
    Created,
    /// It was replaced; the previous file is at `backup`.
    Written { backup: String },
    /// `--dry-run`: it would change like this.
    WouldChange { diff: String },
    /// `--remove`: a file of gpushare's own (or one left with nothing in it), deleted with the
    /// `earlier_backups` configure had kept of it: nothing of it is left.
    Removed { earlier_backups: usize },
    /// `--remove`: left as it is, because `why`.
    Kept { why: String },
    /// A file gpushare derives from the policy (the CDI spec) was rewritten; nothing else is
    /// in it, so no backup is kept.
    Regenerated,
    /// A node-wide file (the CDI spec) this run does not own was left as it is, because
    /// `why`; `diff` is what this run's policy would write there (`None`: nothing).
    LeftAlone { why: String, diff: Option<String> },
}

/// Where the previous version of `path` is kept: `<path>.bak-<unix seconds>` (a suffix no
/// engine's drop-in or hooks dir reads: those read `*.conf`, `*.json`, `*.toml`).
pub fn backup_path(path: &Path) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".bak-{secs}"));
    let mut p = PathBuf::from(name);
    let mut n = 1;
    while p.exists() {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".bak-{secs}.{n}"));
        p = PathBuf::from(name);
        n += 1;
    }
    p
}

/// The unified diff from the file now to the file planned.
pub fn diff(c: &Change) -> String {
    let before = c.before.as_deref().unwrap_or("");
    let old = if c.before.is_some() {
        c.path.display().to_string()
    } else {
        "/dev/null".to_owned()
    };
    similar::TextDiff::from_lines(before, c.after.as_str())
        .unified_diff()
        .context_radius(3)
        .header(&old, &c.path.display().to_string())
        .to_string()
}

/// Writes `c` when it changes anything: parent dirs made (0755), the previous file copied to
/// [`backup_path`] (mode kept), then replaced atomically keeping its mode.
///
/// # Errors
/// [`ConfigureError::Write`] when a step fails; the file is then as it was.
pub fn apply(c: &Change) -> Result<Outcome, ConfigureError> {
    if !c.changes() {
        return Ok(Outcome::Unchanged);
    }
    let err = |source| ConfigureError::Write {
        path: c.path.clone(),
        source,
    };
    if let Some(dir) = c.path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let meta = std::fs::metadata(&c.path).ok();
    let mode = meta.as_ref().map_or(c.mode, |m| m.mode() & 0o7777);
    let backup = match &meta {
        Some(_) => {
            let b = backup_path(&c.path);
            std::fs::copy(&c.path, &b).map_err(err)?;
            std::fs::set_permissions(&b, std::fs::Permissions::from_mode(mode)).map_err(err)?;
            Some(b)
        }
        None => None,
    };
    crate::host::state::write_atomic(&c.path, c.after.as_bytes(), mode).map_err(err)?;
    // write_atomic's mode is filtered by the umask; the file must keep the previous one.
    std::fs::set_permissions(&c.path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    Ok(match backup {
        Some(b) => Outcome::Written {
            backup: b.display().to_string(),
        },
        None => Outcome::Created,
    })
}

/// Carries out one `--remove` edit: a rewrite as [`apply`], or a deletion after a backup.
///
/// # Errors
/// [`ConfigureError::Write`] when a step fails; the file is then as it was.
pub fn apply_edit(e: &super::Edit) -> Result<Outcome, ConfigureError> {
    use super::Edit;
    match e {
        Edit::Write(c) => apply(c),
        Edit::Keep { why, .. } => Ok(Outcome::Kept { why: why.clone() }),
        Edit::Delete { path, .. } => {
            let err = |source| ConfigureError::Write {
                path: path.clone(),
                source,
            };
            std::fs::remove_file(path).map_err(err)?;
            let earlier = backups_of(path);
            for b in &earlier {
                std::fs::remove_file(b).map_err(err)?;
            }
            Ok(Outcome::Removed {
                earlier_backups: earlier.len(),
            })
        }
    }
}

/// The backups [`backup_path`] made of `path` (`<path>.bak-<digits>[.<n>]`).
pub fn backups_of(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.bak-", name.to_string_lossy());
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix(&prefix)
                .is_some_and(|rest| {
                    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c == '.')
                })
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The unified diff of one `--remove` edit.
pub fn edit_diff(e: &super::Edit) -> Option<String> {
    use super::Edit;
    match e {
        Edit::Write(c) if c.changes() => Some(diff(c)),
        Edit::Write(_) | Edit::Keep { .. } => None,
        Edit::Delete { path, before } => Some(
            similar::TextDiff::from_lines(before.as_str(), "")
                .unified_diff()
                .context_radius(3)
                .header(&path.display().to_string(), "/dev/null")
                .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_with_a_backup_and_only_when_needed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sub/daemon.json");
        let mut c = Change {
            path: p.clone(),
            before: None,
            after: "{}\n".into(),
            mode: 0o644,
        };
        assert_eq!(apply(&c).unwrap(), Outcome::Created);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}\n");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        c.before = Some("{}\n".into());
        assert_eq!(apply(&c).unwrap(), Outcome::Unchanged);
        c.after = "{\"a\": 1}\n".into();
        let Outcome::Written { backup } = apply(&c).unwrap() else {
            panic!("not written")
        };
        assert_eq!(std::fs::read_to_string(&backup).unwrap(), "{}\n");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n");
        let mode = std::fs::metadata(&p).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode kept");
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temp files left");
        // A file of gpushare's own goes with its backups, and nothing else beside it.
        std::fs::write(p.with_file_name("daemon.json.bak-x"), "other").unwrap();
        std::fs::write(p.with_file_name("daemon.json.bak-12.1"), "ours").unwrap();
        let o = apply_edit(&super::super::Edit::Delete {
            path: p.clone(),
            before: String::new(),
        })
        .unwrap();
        assert_eq!(o, Outcome::Removed { earlier_backups: 2 });
        let left: Vec<String> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left,
            ["daemon.json.bak-x"],
            "only what is not a backup of it stays"
        );
        let d = diff(&Change {
            path: p.clone(),
            before: Some("a\nb\n".into()),
            after: "a\nc\n".into(),
            mode: 0o644,
        });
        assert!(
            d.contains("-b\n") && d.contains("+c\n") && d.starts_with("---"),
            "{d}"
        );
    }
}
