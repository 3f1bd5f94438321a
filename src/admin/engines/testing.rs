//! What the engines' tests share: a setup, planning against a file, and a second run that must
//! change nothing.

use std::path::{Path, PathBuf};

use super::{Change, ConfigureError, Engine, Options, Setup};

pub const DOCKER: Engine = Engine(&super::docker::Docker);
pub const CONTAINERD: Engine = Engine(&super::containerd::Containerd);
pub const CRIO: Engine = Engine(&super::crio::Crio);
pub const PODMAN: Engine = Engine(&super::podman::Podman);
pub const NVIDIA: Engine = Engine(&super::nvidia::NvidiaContainerRuntime);

pub use crate::admin::configure::apply;

pub fn setup(policy: Option<&str>) -> Setup {
    Setup {
        hook: "/opt/gs/bin/gpushare-hook".into(),
        runtime: "/opt/gs/bin/gpushare-runtime".into(),
        policy: policy.map(PathBuf::from),
        source: "test".into(),
    }
}

/// Plans `engine` against `file` (written with `text` first, when given), hook files under
/// `hooks/` beside it.
pub fn plan_text(
    engine: Engine,
    file: &Path,
    text: Option<&str>,
    s: &Setup,
) -> Result<Vec<Change>, ConfigureError> {
    if let Some(t) = text {
        std::fs::write(file, t).unwrap();
    }
    let t = file.parent().unwrap().join("hooks");
    super::plan(
        engine,
        s,
        &Options {
            path: Some(file.to_owned()),
            hooks_dir: Some(t),
            containerd_version: Some(2),
            ..Options::default()
        },
    )
}

/// Applies a plan, then plans again: the second plan changes nothing.
pub fn apply_and_replan(engine: Engine, file: &Path, s: &Setup) -> String {
    for c in plan_text(engine, file, None, s).unwrap() {
        apply(&c).unwrap();
    }
    let again = plan_text(engine, file, None, s).unwrap();
    assert!(
        again.iter().all(|c| !c.changes()),
        "{engine:?}: second run changes {again:?}"
    );
    std::fs::read_to_string(file).unwrap()
}
