//! The checks a policy passes beyond its TOML shape: ranges, names, sizes, paths.

use std::path::Path;

use super::{Config, ConfigError, ProfileConfig, BUILTIN_PROFILES};
use crate::vocab::domain::is_group_name;
use crate::vocab::quantity;

impl Config {
    pub(super) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |what: &str| ConfigError::Invalid {
            path: path.to_owned(),
            what: what.to_owned(),
        };
        if let Some(m) = &self.policy.max_memory {
            quantity::parse_memory(m).map_err(|source| ConfigError::MaxMemory {
                path: path.to_owned(),
                source,
            })?;
        }
        if !(1..=100).contains(&self.policy.max_cores) {
            return Err(invalid("[policy] max_cores must be 1 to 100"));
        }
        if !(1..=100).contains(&self.policy.default_cores) {
            return Err(invalid("[policy] default_cores must be 1 to 100"));
        }
        if self.policy.default_cores > self.policy.max_cores {
            return Err(invalid("[policy] default_cores is above max_cores"));
        }
        let oc = self.policy.memory_overcommit;
        if !(oc.is_finite() && (0.1..=100.0).contains(&oc)) {
            return Err(invalid(&format!(
                "[policy] memory_overcommit {oc} must be a number from 0.1 to 100 (1.0: caps add up to at most the GPU's memory)"
            )));
        }
        if self.lock_timeout_seconds == 0 || self.lock_timeout_seconds > 3600 {
            return Err(invalid("lock_timeout_seconds must be 1 to 3600"));
        }
        if !self.state_dir.is_absolute() {
            return Err(invalid("state_dir must be an absolute path"));
        }
        if !quantity::parse_memory(&self.mps.shm_size).is_ok_and(|b| b >= 1 << 20) {
            return Err(invalid(&format!(
                "[mps] shm_size {:?} is not a size of at least 1Mi like 64Mi",
                self.mps.shm_size
            )));
        }
        for (name, g) in &self.mps.groups {
            if !is_group_name(name) {
                return Err(invalid(&format!(
                    "[mps.groups.{name}]: a group name is [a-z0-9][a-z0-9._-]{{0,62}}"
                )));
            }
            if let Some(c) = g.cores {
                if !(1..=100).contains(&c) {
                    return Err(invalid(&format!(
                        "[mps.groups.{name}] cores must be 1 to 100"
                    )));
                }
            }
            if let Some(m) = &g.memory {
                quantity::parse_memory(m).map_err(|_| {
                    invalid(&format!(
                        "[mps.groups.{name}] memory {m:?} is not a size like 4Gi or 512Mi"
                    ))
                })?;
            }
        }
        for (group, namespaces) in &self.mps.group_namespaces {
            if !is_group_name(group)
                || namespaces.is_empty()
                || !namespaces
                    .iter()
                    .all(|n| crate::vocab::names::is_namespace(n))
            {
                return Err(invalid(&format!(
                    "[mps] group_namespaces: {group:?} must be a group name bound to a list of Kubernetes namespaces, like team-a = [\"team-a\"]"
                )));
            }
        }
        for (name, p) in &self.profiles {
            validate_profile(name, p).map_err(|what| invalid(&what))?;
        }
        if self.serve.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "[serve] listen must be an address and port, like 127.0.0.1:9401 or [::1]:9401",
            ));
        }
        if !(1..=86400).contains(&self.serve.gc_interval_seconds) {
            return Err(invalid("[serve] gc_interval_seconds must be 1 to 86400"));
        }
        if self
            .serve
            .events_file
            .as_deref()
            .is_some_and(|p| !p.is_absolute())
        {
            return Err(invalid("[serve] events_file must be an absolute path"));
        }
        if self.runtime.next.is_empty() {
            return Err(invalid("[runtime] next must name at least one runtime"));
        }
        Ok(())
    }
}

/// The syntax of one `[profiles.<name>]`; whether the policy allows what it asks is checked
/// like any request (`decide::profile`).
fn validate_profile(name: &str, p: &ProfileConfig) -> Result<(), String> {
    if !is_group_name(name) {
        return Err(format!(
            "[profiles.{name}]: a profile name is [a-z0-9][a-z0-9._-]{{0,62}}"
        ));
    }
    if BUILTIN_PROFILES.contains(&name) {
        return Err(format!(
            "[profiles.{name}]: {name} is a mode and already a device of its own; name the profile otherwise"
        ));
    }
    if let Some(c) = p.cores {
        if !(1..=100).contains(&c) {
            return Err(format!("[profiles.{name}] cores must be 1 to 100"));
        }
    }
    if let Some(m) = &p.memory {
        if quantity::parse_memory(m).is_err() {
            return Err(format!(
                "[profiles.{name}] memory {m:?} is not a size like 4Gi or 512Mi"
            ));
        }
    }
    if let Some(g) = &p.group {
        if !is_group_name(g) {
            return Err(format!(
                "[profiles.{name}] group {g:?} is not [a-z0-9][a-z0-9._-]{{0,62}}"
            ));
        }
    }
    if let Some(t) = &p.timeslice {
        if !matches!(t.as_str(), "default" | "short" | "medium" | "long") {
            return Err(format!(
                "[profiles.{name}] timeslice {t:?} is not default, short, medium or long"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Mode;

    #[test]
    fn bad_configs_are_refused() {
        let rows = [
            ("unknown key", "bogus = 1"),
            ("bad max memory", "[policy]\nmax_memory = \"12XB\""),
            ("cores above 100", "[policy]\nmax_cores = 101"),
            (
                "default above max",
                "[policy]\nmax_cores = 50\ndefault_cores = 60",
            ),
            ("relative state dir", "state_dir = \"run\""),
            ("unknown mode", "[policy]\nmodes = [\"turbo\"]"),
            ("zero lock timeout", "lock_timeout_seconds = 0"),
        ];
        for (what, text) in rows {
            assert!(Config::parse(text, Path::new("t")).is_err(), "{what}");
        }
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_key() {
        let rows = [
            (
                "no mode",
                "[profiles.small]\ncores = 25",
                "missing field `mode`",
            ),
            (
                "cores out of range",
                "[profiles.small]\nmode = \"mps\"\ncores = 0",
                "[profiles.small] cores",
            ),
            (
                "bad memory",
                "[profiles.small]\nmode = \"mps\"\nmemory = \"lots\"",
                "[profiles.small] memory",
            ),
            (
                "bad group",
                "[profiles.small]\nmode = \"mps\"\ngroup = \"A B\"",
                "[profiles.small] group",
            ),
            (
                "bad timeslice",
                "[profiles.t]\nmode = \"timeslice\"\ntimeslice = \"forever\"",
                "[profiles.t] timeslice",
            ),
            (
                "name of a mode",
                "[profiles.mps]\nmode = \"mps\"",
                "[profiles.mps]: mps is a mode",
            ),
            (
                "bad name",
                "[profiles.Big]\nmode = \"mps\"",
                "[profiles.Big]: a profile name",
            ),
            (
                "unknown key",
                "[profiles.small]\nmode = \"mps\"\nsize = 1",
                "unknown field `size`",
            ),
        ];
        for (what, text, expect) in rows {
            let e = Config::parse(text, Path::new("t")).expect_err(what);
            assert!(e.to_string().contains(expect), "{what}: {e}");
        }
        // Positive control: a well-formed profile is read as written.
        let cfg = Config::parse(
            "[profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"10Gi\"",
            Path::new("t"),
        )
        .unwrap();
        let p = &cfg.profiles["small"];
        assert_eq!(
            (p.mode, p.cores, p.memory.as_deref()),
            (Mode::Mps, Some(25), Some("10Gi"))
        );
    }
}
