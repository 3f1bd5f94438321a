//! The launcher `configure` writes next to a non-default policy file: a shell script running
//! `gpushare-runtime` with `GPUSHARE_CONFIG` set, since engines' runtime entries carry no env.

use std::path::Path;

use super::edit::{change, read, sh_quote};
use super::setup::{launcher_path, Change, ConfigureError, Edit};

/// The first lines of a launcher `configure` wrote.
const LAUNCHER_MARK: &str = "# Written by `gpushare-hook configure`";

/// The launcher that runs `gpushare-runtime` with a non-default policy file.
pub fn plan(policy: &Path, runtime: &Path) -> Result<Change, ConfigureError> {
    let path = launcher_path(policy);
    let before = read(&path)?;
    let after = format!(
        "#!/bin/sh\n{LAUNCHER_MARK}: gpushare-runtime with the policy file {}.\n{}={}\nexport {}\nexec {} \"$@\"\n",
        policy.display(),
        crate::config::ENV_PATH,
        sh_quote(&policy.to_string_lossy()),
        crate::config::ENV_PATH,
        sh_quote(&runtime.to_string_lossy()),
    );
    Ok(change(&path, before, after, 0o755))
}

/// The launcher for a non-default policy: deleted when none of `files` (as `edits` leave
/// them) names it any more.
pub fn remove(
    policy: &Path,
    edits: &[Edit],
    files: &[&Path],
) -> Result<Option<Edit>, ConfigureError> {
    let path = launcher_path(policy);
    let Some(text) = read(&path)? else {
        return Ok(None);
    };
    if !text
        .lines()
        .nth(1)
        .is_some_and(|l| l.starts_with(LAUNCHER_MARK))
    {
        return Ok(None);
    }
    let needle = path.to_string_lossy().into_owned();
    let edited = |f: &Path| edits.iter().find(|e| e.path() == f);
    for &f in files {
        let still = match edited(f) {
            Some(Edit::Write(c)) => c.after.contains(&needle),
            Some(Edit::Delete { .. }) => false,
            Some(Edit::Keep { .. }) | None => {
                std::fs::read_to_string(f).is_ok_and(|t| t.contains(&needle))
            }
        };
        if still {
            return Ok(Some(Edit::Keep {
                path,
                why: format!("{} still runs it", f.display()),
            }));
        }
    }
    Ok(Some(Edit::Delete { path, before: text }))
}
