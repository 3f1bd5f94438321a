//! The state of a container an OCI runtime passes to a hook on stdin (runtime-spec
//! `runtime.md`, "State"): six fields, read with serde.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// "The state of a container MUST include, at least, the following properties": `ociVersion`,
/// `id`, `status`, `bundle`; `pid` "on Linux ... MUST" be there once created; `annotations`
/// MAY be. Missing members read as empty here; [`crate::decide::input::parse_state`] refuses a
/// state without an id or a bundle.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    #[serde(default)]
    pub oci_version: String,
    #[serde(default)]
    pub id: String,
    /// `creating`, `created`, `running`, `stopped`, or another value a runtime defines ("MAY").
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub pid: Option<i32>,
    #[serde(default)]
    pub bundle: PathBuf,
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
}

impl State {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bundle(&self) -> &Path {
        &self.bundle
    }

    pub fn pid(&self) -> &Option<i32> {
        &self.pid
    }

    pub fn annotations(&self) -> &Option<HashMap<String, String>> {
        &self.annotations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_states_runtimes_write() {
        let rows: &[(&str, &str, State)] = &[
            (
                "runc at createRuntime",
                r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/b","annotations":{"gpu.share":"mps"}}"#,
                State {
                    oci_version: "1.0.2".into(),
                    id: "c1".into(),
                    status: "creating".into(),
                    pid: Some(42),
                    bundle: "/b".into(),
                    annotations: Some([("gpu.share".to_owned(), "mps".to_owned())].into()),
                },
            ),
            (
                "poststop: no pid, no annotations",
                r#"{"ociVersion":"1.2.0","id":"c1","status":"stopped","bundle":"/b"}"#,
                State {
                    oci_version: "1.2.0".into(),
                    id: "c1".into(),
                    status: "stopped".into(),
                    bundle: "/b".into(),
                    ..State::default()
                },
            ),
            (
                "a status the runtime defines itself",
                r#"{"ociVersion":"1.0.2","id":"c1","status":"paused","bundle":"/b","x":1}"#,
                State {
                    oci_version: "1.0.2".into(),
                    id: "c1".into(),
                    status: "paused".into(),
                    bundle: "/b".into(),
                    ..State::default()
                },
            ),
        ];
        for (what, text, want) in rows {
            let got: State = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(&got, want, "{what}");
            assert_eq!(got.id(), want.id, "{what}");
            assert_eq!(got.bundle(), want.bundle, "{what}");
            assert_eq!(got.pid(), &want.pid, "{what}");
            assert_eq!(got.annotations(), &want.annotations, "{what}");
        }
        for (what, text) in [
            ("pid not a number", r#"{"id":"c","bundle":"/b","pid":"42"}"#),
            (
                "annotation not a string",
                r#"{"id":"c","bundle":"/b","annotations":{"a":1}}"#,
            ),
            ("id not a string", r#"{"id":1,"bundle":"/b"}"#),
        ] {
            assert!(serde_json::from_str::<State>(text).is_err(), "{what}");
        }
    }
}
