//! Reading untrusted input: the OCI state on stdin and the bundle's `config.json`, both capped.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::runtime::State;
use serde::Deserialize;
use thiserror::Error;

use crate::vocab::read_capped;

/// Largest OCI state accepted on stdin.
pub const MAX_STATE_BYTES: u64 = 1 << 20;
/// Largest `config.json` accepted.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Input that cannot be used.
#[derive(Debug, Error)]
pub enum InputError {
    #[error("cannot read the OCI state from stdin")]
    ReadState(#[source] std::io::Error),
    #[error(
        "the OCI state on stdin is larger than 1 MiB; the runtime must pass the container state"
    )]
    StateTooLarge,
    #[error("the OCI state on stdin is not valid JSON; the hook must be run by an OCI runtime")]
    ParseState(#[source] serde_json::Error),
    #[error("container id {0:?} is not a safe name (letters, digits, '_', '-', '.', at most 128, not starting with '.')")]
    BadId(String),
    #[error("the OCI state has no bundle path; the hook must be run by an OCI runtime")]
    NoBundle,
    #[error("cannot read {path}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is larger than 16 MiB")]
    ConfigTooLarge { path: PathBuf },
    #[error("{path} is not a valid OCI config")]
    ParseConfig {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the OCI state has no valid pid for the container ({0}); it must be run at createRuntime or prestart")]
    BadPid(i64),
}

/// The parts of `config.json` the decision needs. Unknown fields are ignored here; the spec
/// editor works on the raw JSON so that they are preserved there.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SpecView {
    pub annotations: HashMap<String, String>,
    pub process: ProcessView,
    pub linux: LinuxView,
    pub root: Option<RootView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessView {
    pub env: Vec<String>,
    pub user: UserView,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct UserView {
    pub uid: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LinuxView {
    pub devices: Vec<DeviceView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DeviceView {
    pub path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RootView {
    pub path: PathBuf,
}

/// Reads and validates the OCI state a runtime passes to a hook.
///
/// # Errors
/// [`InputError`] for unreadable, oversized or malformed state, or an unsafe container id.
pub fn read_state(r: impl Read) -> Result<State, InputError> {
    let buf = read_capped(r, MAX_STATE_BYTES)
        .map_err(InputError::ReadState)?
        .ok_or(InputError::StateTooLarge)?;
    let state: State = serde_json::from_slice(&buf).map_err(InputError::ParseState)?;
    check_id(state.id())?;
    if state.bundle().as_os_str().is_empty() {
        return Err(InputError::NoBundle);
    }
    Ok(state)
}

/// Checks that a container id can safely become a file name.
///
/// # Errors
/// [`InputError::BadId`] otherwise.
pub fn check_id(id: &str) -> Result<(), InputError> {
    if crate::vocab::is_safe_name(id) {
        Ok(())
    } else {
        Err(InputError::BadId(id.chars().take(80).collect()))
    }
}

/// Reads raw bytes of `<bundle>/config.json`, capped.
///
/// # Errors
/// [`InputError`] when it cannot be read or is too large.
pub fn read_config_bytes(bundle: &Path) -> Result<Vec<u8>, InputError> {
    let path = bundle.join("config.json");
    let f = std::fs::File::open(&path).map_err(|source| InputError::ReadConfig {
        path: path.clone(),
        source,
    })?;
    read_capped(f, MAX_CONFIG_BYTES)
        .map_err(|source| InputError::ReadConfig {
            path: path.clone(),
            source,
        })?
        .ok_or(InputError::ConfigTooLarge { path })
}

/// Parses the decision's view of a config.
///
/// # Errors
/// [`InputError::ParseConfig`] when it is not a JSON object of the expected shape.
pub fn parse_spec(bytes: &[u8], path: &Path) -> Result<SpecView, InputError> {
    serde_json::from_slice(bytes).map_err(|source| InputError::ParseConfig {
        path: path.to_owned(),
        source,
    })
}

/// The container's rootfs as a host path, from `root.path` (relative to the bundle).
pub fn rootfs_of(spec: &SpecView, bundle: Option<&Path>) -> Option<PathBuf> {
    let p = &spec.root.as_ref()?.path;
    if p.is_absolute() {
        Some(p.clone())
    } else {
        bundle.map(|b| b.join(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_inputs() {
        let good = r#"{"ociVersion":"1.0.2","id":"abc-1","status":"creating","pid":42,"bundle":"/b","annotations":{"gpu.share":"mps"}}"#;
        let st = read_state(good.as_bytes()).unwrap();
        assert_eq!(st.id(), "abc-1");
        assert_eq!(st.pid(), &Some(42));

        let rows: Vec<(&str, String, &str)> = vec![
            ("not json", "{nope".into(), "not valid JSON"),
            ("empty", "".into(), "not valid JSON"),
            (
                "path id",
                r#"{"id":"../etc","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            (
                "slash id",
                r#"{"id":"a/b","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            (
                "empty id",
                r#"{"id":"","bundle":"/b"}"#.into(),
                "not a safe name",
            ),
            ("no bundle", r#"{"id":"a"}"#.into(), "no bundle"),
            (
                "huge",
                format!("{{\"id\":\"a\",\"x\":\"{}\"}}", "x".repeat(2 << 20)),
                "larger than 1 MiB",
            ),
        ];
        for (what, input, want) in rows {
            let err = read_state(input.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(want), "{what}: {err}");
        }
    }

    #[test]
    fn spec_view_ignores_unknown_fields() {
        let s = br#"{"ociVersion":"1.0","x-new":{"a":1},"process":{"env":["A=1"],"args":["sh"]},"linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}"#;
        let v = parse_spec(s, Path::new("c")).unwrap();
        assert_eq!(v.process.env, vec!["A=1"]);
        assert_eq!(v.linux.devices[0].path, "/dev/nvidia0");
        assert!(parse_spec(b"[1]", Path::new("c")).is_err());
    }
}
