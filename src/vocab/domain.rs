//! MPS isolation domains: how containers are grouped onto MPS control daemons, and the limits a
//! domain's daemon enforces.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Policy `[mps] isolation`: which containers share one MPS control daemon on a GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// One domain per GPU, shared by every `mps` container on it.
    #[default]
    Gpu,
    /// One domain per `gpu.share.group`; a container without a group is alone.
    Group,
    /// One domain per container.
    Container,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Gpu => "gpu",
            Isolation::Group => "group",
            Isolation::Container => "container",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The limits a domain's daemon enforces on every client (its `set_default_*` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Active thread percentage, 1 to 100 (100: no cap).
    pub cores: u8,
    /// Pinned device memory per client in MiB (`None`: no cap).
    pub memory_mib: Option<u64>,
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cores {}%", self.cores)?;
        match self.memory_mib {
            Some(m) => write!(
                f,
                ", memory {}",
                super::size::human(m.saturating_mul(1 << 20))
            ),
            None => write!(f, ", memory unlimited"),
        }
    }
}

/// Domain key of the one domain of a GPU under [`Isolation::Gpu`].
pub const GPU_DOMAIN: &str = "gpu";
/// Prefix of the key of a named group's domain.
pub const GROUP_PREFIX: &str = "g-";
/// Prefix of the key of a one-container domain.
pub const CONTAINER_PREFIX: &str = "c-";

/// Whether `s` is a valid `gpu.share.group` name: `[a-z0-9][a-z0-9._-]{0,62}`.
pub fn is_group_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names() {
        let rows: &[(&str, &str, bool)] = &[
            ("simple", "team-a", true),
            ("digits first", "0ab", true),
            ("dots and underscores", "a.b_c", true),
            ("63 bytes", &"a".repeat(63), true),
            ("64 bytes", &"a".repeat(64), false),
            ("empty", "", false),
            ("upper case", "Team", false),
            ("leading dash", "-a", false),
            ("leading dot", ".a", false),
            ("slash", "a/b", false),
            ("space", "a b", false),
        ];
        for (what, name, ok) in rows {
            assert_eq!(is_group_name(name), *ok, "{what}");
        }
    }

    #[test]
    fn limits_print_sizes_for_people() {
        let l = |memory_mib| Limits {
            cores: 50,
            memory_mib,
        };
        assert_eq!(l(Some(8192)).to_string(), "cores 50%, memory 8.0 GiB");
        assert_eq!(l(Some(1536)).to_string(), "cores 50%, memory 1.5 GiB");
        assert_eq!(l(None).to_string(), "cores 50%, memory unlimited");
    }
}
