//! podman: the drop-in `/etc/containers/containers.conf.d/50-gpushare.conf` with the hooks
//! dirs of gpushare's hook files (createRuntime, poststop, and the podman-only precreate) and
//! the named runtime `gpushare`; doctor reads containers.conf and the hooks dirs it names.

use std::path::Path;

use toml_edit::{Array, Item};

use super::check::{advise, check, last_value, not_configured, toml_files, Check, Verdict};
use super::edit::{
    ensure_in_array, finish_toml, parse_toml, read, remove_dirs, table, table_at, toml_file,
    HANDLER,
};
use super::hooks::{self, ETC_HOOKS_DIR, OCI_HOOKS_DIR};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Order, Setup};
use super::EngineDef;

/// gpushare's containers.conf drop-in.
pub const PODMAN_FILE: &str = "/etc/containers/containers.conf.d/50-gpushare.conf";
/// containers.conf and its drop-in dir, in the order podman reads them.
const PODMAN_CONFS: &[&str] = &[
    "/usr/share/containers/containers.conf",
    "/etc/containers/containers.conf",
    "/etc/containers/containers.conf.d",
];

pub(super) struct Podman;

impl EngineDef for Podman {
    fn name(&self) -> &'static str {
        "podman"
    }

    fn files(&self) -> &'static [&'static str] {
        &[PODMAN_FILE]
    }

    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError> {
        let (oci, podman) = hooks::dirs(opts);
        let mut out = vec![plan(main, setup, &oci, &podman)?];
        out.extend(hooks::plan(setup, &oci, Some(&podman))?);
        Ok(out)
    }

    fn remove(
        &self,
        main: &Path,
        _setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Edit>, ConfigureError> {
        let (oci, podman) = hooks::dirs(opts);
        let mut out: Vec<Edit> = toml_file(main, |doc| {
            let Some(e) = table(doc.as_table_mut(), &["engine"]) else {
                return;
            };
            if let Some(r) = e.get_mut("runtimes").and_then(Item::as_table_like_mut) {
                let ours = r.get(HANDLER).and_then(Item::as_array).is_some_and(|a| {
                    a.iter()
                        .any(|v| v.as_str().is_some_and(|p| is_ours(p, "gpushare-runtime")))
                });
                if ours {
                    r.remove(HANDLER);
                }
                if r.is_empty() {
                    e.remove("runtimes");
                }
            }
            remove_dirs(
                e,
                "hooks_dir",
                &[&oci, &podman],
                &[OCI_HOOKS_DIR, ETC_HOOKS_DIR],
            );
        })?
        .into_iter()
        .collect();
        let other = hooks::still_used(self.name(), &oci, main);
        out.extend(hooks::remove(&[&oci], other.as_deref())?);
        out.extend(hooks::remove(&[&podman], None)?);
        Ok(out)
    }

    fn runs_hook(&self) -> bool {
        true
    }

    fn merged(&self) -> bool {
        false
    }

    fn restart(&self, _order: Order) -> &'static str {
        "nothing to restart: podman reads containers.conf and the hooks dirs at every run"
    }

    fn doctor(&self) -> Vec<Check> {
        vec![file_check(PODMAN_CONFS)]
    }

    fn check_file(&self, path: &Path) -> Option<Check> {
        Some(file_check(&[&path.to_string_lossy()]))
    }
}

/// podman: both hooks dirs in `[engine] hooks_dir` (podman's defaults kept, as setting the key
/// replaces them) and the named runtime `gpushare`.
fn plan(
    path: &Path,
    setup: &Setup,
    oci_hooks: &Path,
    podman_hooks: &Path,
) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let (mut doc, header) = parse_toml(path, before.as_deref().unwrap_or(""))?;
    let engine = table_at(doc.as_table_mut(), &["engine"], path)?;
    ensure_in_array(
        engine,
        "hooks_dir",
        &[OCI_HOOKS_DIR, ETC_HOOKS_DIR],
        &[
            &oci_hooks.to_string_lossy(),
            &podman_hooks.to_string_lossy(),
        ],
        path,
    )?;
    let runtimes = table_at(engine, &["runtimes"], path)?;
    let entry = setup.runtime_entry().display().to_string();
    let want = [entry.as_str()];
    let is = runtimes
        .get(HANDLER)
        .and_then(Item::as_array)
        .is_some_and(|a| {
            a.iter()
                .map(|v| v.as_str())
                .eq(want.iter().map(|s| Some(*s)))
        });
    if !is {
        runtimes.insert(HANDLER, toml_edit::value(Array::from_iter(want)));
    }
    Ok(finish_toml(path, before, &header, &doc))
}

/// podman: the hooks dirs containers.conf names (podman's defaults when none), with our
/// createRuntime, poststop and precreate hooks.
pub fn file_check(confs: &[&str]) -> Check {
    let name = "podman";
    let files = toml_files(confs);
    let dirs: Vec<String> = match last_value(&files, &["engine", "hooks_dir"]) {
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!("podman: {e}; podman will not run"),
            )
        }
        Ok(Some(toml::Value::Array(a))) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Ok(_) => vec![
            "/usr/share/containers/oci/hooks.d".into(),
            "/etc/containers/oci/hooks.d".into(),
        ],
    };
    let hooks = match hooks::ours(&dirs) {
        Ok(h) => h,
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!("podman: {e}; podman refuses to run containers"),
            )
        }
    };
    let has = |s: &str| hooks.iter().any(|h| h.0 == s);
    if !has("createRuntime") {
        return not_configured(
            name,
            "podman",
            "podman",
            &format!("podman: no gpushare createRuntime hook in its hooks dirs {dirs:?}"),
        );
    }
    let policies = match hooks::check_entries("podman", &hooks) {
        Ok(p) => p,
        Err(e) => return check(name, Verdict::Fail, advise(&e, "podman")),
    };
    if !has("poststop") {
        return check(name, Verdict::Fail, "podman: createRuntime hook without the poststop hook: shares are never released; run `gpushare-hook configure podman`");
    }
    if !has("precreate") {
        return check(name, Verdict::Warn, format!("podman: hooks found (policy {policies}) but no precreate hook: containers get no env (CUDA_MPS_PIPE_DIRECTORY, limits); run `gpushare-hook configure podman`"));
    }
    check(
        name,
        Verdict::Ok,
        format!("createRuntime, poststop and precreate hooks in {dirs:?}, policy {policies}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::engines::testing::{apply_and_replan, setup, CRIO, NVIDIA, PODMAN};
    use crate::admin::engines::Options;
    use serde_json::Value;

    #[test]
    fn podman_crio_and_nvidia_chaining() {
        let t = tempfile::tempdir().unwrap();
        let s = setup(None);
        let f = t.path().join("containers.conf");
        std::fs::write(&f, "[engine]\n# keep me\ncgroup_manager = \"cgroupfs\"\n").unwrap();
        let text = apply_and_replan(PODMAN, &f, &s);
        let doc: toml::Table = text.parse().unwrap();
        let dirs: Vec<&str> = doc["engine"]["hooks_dir"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            dirs[..2],
            [OCI_HOOKS_DIR, ETC_HOOKS_DIR],
            "podman's defaults kept"
        );
        assert!(dirs[2].ends_with("hooks/hooks.d") && dirs[3].ends_with("hooks/hooks.d-podman"));
        assert!(text.contains("# keep me"));
        let pre: Value = serde_json::from_str(
            &std::fs::read_to_string(
                t.path()
                    .join("hooks/hooks.d-podman/gpushare-precreate.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(pre["hook"]["path"], "/opt/gs/bin/gpushare-hook");

        let f = t.path().join("10-gpushare.conf");
        let text = apply_and_replan(CRIO, &f, &s);
        let doc: toml::Table = text.parse().unwrap();
        assert_eq!(
            doc["crio"]["runtime"]["runtimes"]["gpushare"]["runtime_path"].as_str(),
            Some("/opt/gs/bin/gpushare-runtime")
        );
        assert!(
            !t.path()
                .join("hooks/hooks.d/gpushare-precreate.json")
                .exists(),
            "CRI-O never gets the precreate hook"
        );

        let f = t.path().join("policy.toml");
        std::fs::write(&f, "# policy\n[runtime]\nnext = [\"runc\"]\n").unwrap();
        let text = apply_and_replan(NVIDIA, &f, &s);
        assert!(
            text.contains("next = [\"nvidia-container-runtime\", \"runc\"]"),
            "{text}"
        );
        crate::config::Config::parse(&text, &f).unwrap();

        let f = t.path().join("nvidia.toml");
        std::fs::write(
            &f,
            "[nvidia-container-runtime]\nruntimes = [\"docker-runc\", \"runc\"]\n",
        )
        .unwrap();
        let c = crate::admin::engines::plan(
            NVIDIA,
            &s,
            &Options {
                path: Some(f.clone()),
                order: Order::NvidiaFirst,
                ..Options::default()
            },
        )
        .unwrap();
        assert!(
            c[0].after.contains(
                "runtimes = [\"/opt/gs/bin/gpushare-runtime\", \"docker-runc\", \"runc\"]"
            ),
            "{}",
            c[0].after
        );
    }
}
