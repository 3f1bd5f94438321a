//! The files `configure` wrote, by engine, so that `doctor` checks them wherever they are
//! (`--path`), not only at each engine's usual place. Kept beside the policy's own state:
//! `/var/lib/gpushare/configured.json` for the node's default policy, `<policy
//! dir>/gpushare-configured.json` for a policy file given with `--config` or
//! `$GPUSHARE_CONFIG`. Written atomically; a record that does not parse counts as empty.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Source;

/// The record for the node's default policy.
pub const DEFAULT_RECORD: &str = "/var/lib/gpushare/configured.json";

/// The engines' files `configure` wrote: (engine, absolute path).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub files: BTreeSet<(String, PathBuf)>,
}

/// Where the record of the policy `source` is.
pub fn path_for(source: &Source) -> PathBuf {
    match source.to_hand_on() {
        Some(p) => p.with_file_name("gpushare-configured.json"),
        None => PathBuf::from(DEFAULT_RECORD),
    }
}

impl Record {
    /// The record at `path`; empty when there is none or it does not parse.
    pub fn load(path: &Path) -> Record {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The files recorded for `engine`.
    pub fn of<'a>(&'a self, engine: &'a str) -> impl Iterator<Item = &'a Path> + 'a {
        self.files
            .iter()
            .filter(move |(e, _)| e == engine)
            .map(|(_, p)| p.as_path())
    }

    /// `engine` wrote `file` (`written`), or took itself out of it.
    pub fn note(&mut self, engine: &str, file: &Path, written: bool) {
        let key = (engine.to_owned(), file.to_owned());
        if written {
            self.files.insert(key);
        } else {
            self.files.remove(&key);
        }
    }

    /// Writes the record to `path` (atomically; the file goes when the record is empty).
    ///
    /// # Errors
    /// The directory cannot be made or the file written.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if self.files.is_empty() {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let text = serde_json::to_vec_pretty(self).expect("the record serialises");
        crate::host::state::write_atomic(path, &text, 0o644)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_saves_loads_and_goes_when_empty() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("lib/configured.json");
        let mut r = Record::load(&p);
        assert!(r.files.is_empty());
        r.note("docker", Path::new("/x/daemon.json"), true);
        r.note("crio", Path::new("/y/10-gpushare.conf"), true);
        r.save(&p).unwrap();
        let back = Record::load(&p);
        assert_eq!(back, r, "positive control: it was written");
        assert_eq!(
            back.of("docker").collect::<Vec<_>>(),
            [Path::new("/x/daemon.json")]
        );
        let mut r = back;
        r.note("docker", Path::new("/x/daemon.json"), false);
        r.note("crio", Path::new("/y/10-gpushare.conf"), false);
        r.save(&p).unwrap();
        assert!(!p.exists(), "an empty record leaves no file");
        std::fs::write(&p, "not json").unwrap();
        assert!(Record::load(&p).files.is_empty());
        assert_eq!(
            path_for(&Source::Flag("/etc/gs/p.toml".into())),
            Path::new("/etc/gs/gpushare-configured.json")
        );
        assert_eq!(path_for(&Source::Default), Path::new(DEFAULT_RECORD));
    }
}
