//! CRI-O: the drop-in `/etc/crio/crio.conf.d/10-gpushare.conf` with the runtime handler
//! `gpushare` and the hooks dir of gpushare's OCI hook files; doctor reads CRI-O's files and
//! asks the running crio for the configuration it runs with (`GET /config` on its socket).

use std::path::Path;

use toml_edit::Table;

use super::check::{
    advise, agree, check, find_tool, installed, last_value, not_configured, runtime_entry,
    toml_files, Check, Verdict,
};
use super::edit::{
    array_mut, ensure_in_array, finish_toml, parse_toml, read, remove_dirs, remove_runtime,
    set_str, str_at, table, table_at, toml_file, HANDLER,
};
use super::hooks::{self, OCI_HOOKS_DIR};
use super::setup::{is_ours, Change, ConfigureError, Edit, Options, Order, Setup};
use super::EngineDef;

/// gpushare's CRI-O drop-in.
pub const CRIO_FILE: &str = "/etc/crio/crio.conf.d/10-gpushare.conf";
/// CRI-O's main file and drop-in dir, as doctor reads them.
const CRIO_CONFS: &[&str] = &["/etc/crio/crio.conf", "/etc/crio/crio.conf.d"];

pub(super) struct Crio;

impl EngineDef for Crio {
    fn name(&self) -> &'static str {
        "crio"
    }

    fn files(&self) -> &'static [&'static str] {
        &[CRIO_FILE]
    }

    fn plan(
        &self,
        main: &Path,
        setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Change>, ConfigureError> {
        let (oci, _) = hooks::dirs(opts);
        let mut out = vec![plan(main, setup, &oci)?];
        out.extend(hooks::plan(setup, &oci, None)?);
        Ok(out)
    }

    fn remove(
        &self,
        main: &Path,
        _setup: &Setup,
        opts: &Options,
    ) -> Result<Vec<Edit>, ConfigureError> {
        let (oci, _) = hooks::dirs(opts);
        let mut out: Vec<Edit> = toml_file(main, |doc| {
            let Some(rt) = table(doc.as_table_mut(), &["crio", "runtime"]) else {
                return;
            };
            remove_runtime(rt, "runtimes", |t| {
                str_at(t, "runtime_path").is_some_and(|p| is_ours(p, "gpushare-runtime"))
            });
            remove_dirs(rt, "hooks_dir", &[&oci], &[OCI_HOOKS_DIR]);
        })?
        .into_iter()
        .collect();
        let other = hooks::still_used(self.name(), &oci, main);
        out.extend(hooks::remove(&[&oci], other.as_deref())?);
        Ok(out)
    }

    fn runs_hook(&self) -> bool {
        true
    }

    fn merged(&self) -> bool {
        false
    }

    fn restart(&self, _order: Order) -> &'static str {
        "restart CRI-O to load it: systemctl restart crio"
    }

    fn doctor(&self) -> Vec<Check> {
        agree(file_check(CRIO_CONFS), live(), "crio")
    }

    fn check_file(&self, path: &Path) -> Option<Check> {
        Some(file_check(&[&path.to_string_lossy()]))
    }
}

/// CRI-O: the drop-in with the hooks dir and the runtime handler `gpushare`.
///
/// Written to what CRI-O v1.37.0 accepts (`pkg/config/config.go`, `RuntimeHandler.Validate`):
/// a handler whose `allowed_annotations` names anything outside CRI-O's own list
/// (`pkg/annotations/v2/annotations.go`, `AllAllowedAnnotations`) is dropped with a warning, so
/// the handler lists none. Our `gpu.share*` keys need no allow-listing: CRI-O filters only its own
/// annotations and copies the pod's annotations into every container's spec
/// (`internal/factory/container/container.go`). `allowed_annotations` entries naming our keys,
/// left by an earlier version, are taken out.
///
/// `hooks_dir` holds only the dir our `oci/` hook files go to (CRI-O creates a listed dir that is
/// missing and reads every file in it), never the podman-only precreate dir.
fn plan(path: &Path, setup: &Setup, oci_hooks: &Path) -> Result<Change, ConfigureError> {
    let before = read(path)?;
    let (mut doc, header) = parse_toml(path, before.as_deref().unwrap_or(""))?;
    let rt = table_at(doc.as_table_mut(), &["crio", "runtime"], path)?;
    let oci = oci_hooks.to_string_lossy();
    ensure_in_array(rt, "hooks_dir", &[], &[&oci], path)?;
    let h = table_at(rt, &["runtimes", HANDLER], path)?;
    set_str(h, "runtime_path", &setup.runtime_entry().to_string_lossy());
    set_str(h, "runtime_type", "oci");
    set_str(h, "runtime_root", "/run/runc");
    crio_drop_our_annotations(h, path)?;
    Ok(finish_toml(path, before, &header, &doc))
}

/// Takes our annotation keys out of the handler's `allowed_annotations` (CRI-O refuses the
/// handler for them), and the key itself when nothing else is left in it.
fn crio_drop_our_annotations(h: &mut Table, path: &Path) -> Result<(), ConfigureError> {
    if !h.contains_key("allowed_annotations") {
        return Ok(());
    }
    let ours = crate::decide::request::annotation_keys();
    let a = array_mut(h, "allowed_annotations", &[], path)?;
    if a.iter()
        .any(|v| v.as_str().is_some_and(|s| ours.contains(&s)))
    {
        a.retain(|v| !v.as_str().is_some_and(|s| ours.contains(&s)));
        a.fmt();
    }
    if a.is_empty() {
        h.remove("allowed_annotations");
    }
    Ok(())
}

/// CRI-O: a runtime handler running gpushare-runtime, or our hooks in its hooks_dir (without
/// a precreate file, which would make CRI-O drop the whole dir).
pub fn file_check(confs: &[&str]) -> Check {
    let name = "cri-o";
    if !installed("crio") {
        // Its default hooks dir is podman's: our podman hooks there are not CRI-O's business.
        return check(name, Verdict::Ok, "crio not installed");
    }
    let files = toml_files(confs);
    let runtimes = match last_value(&files, &["crio", "runtime", "runtimes"]) {
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!("cri-o: {e}; crio will not start"),
            )
        }
        Ok(v) => v,
    };
    let handler = runtimes.as_ref().and_then(|r| r.as_table()).and_then(|t| {
        t.iter().find_map(|(k, v)| {
            let p = v.get("runtime_path")?.as_str()?;
            is_ours(p, "gpushare-runtime").then(|| (k.clone(), p.to_owned()))
        })
    });
    let dirs: Vec<String> = match last_value(&files, &["crio", "runtime", "hooks_dir"]) {
        Ok(Some(toml::Value::Array(a))) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => vec!["/usr/share/containers/oci/hooks.d".into()],
    };
    let hooks = hooks::ours(&dirs).unwrap_or_default();
    if hooks.iter().any(|h| h.0 == "precreate") {
        return check(name, Verdict::Fail, format!("cri-o: a precreate hook file is in a CRI-O hooks dir {dirs:?}; CRI-O then ignores the whole dir. Move it to /etc/containers/oci/hooks.d-podman"));
    }
    match handler {
        Some((k, p)) => match runtime_entry(Path::new(&p)) {
            Ok(d) => check(name, Verdict::Ok, format!("runtime handler {k:?} {d}")),
            Err(e) => check(name, Verdict::Fail, advise(&format!("cri-o: runtime handler {k:?}: {e}"), "crio")),
        },
        None if hooks.iter().any(|h| h.0 == "createRuntime") => match hooks::check_entries("cri-o", &hooks) {
            Ok(p) => check(name, Verdict::Warn, format!("cri-o: hooks only (policy {p}): no env injection; run `gpushare-hook configure crio` for the runtime handler")),
            Err(e) => check(name, Verdict::Fail, e),
        },
        None => not_configured(name, "crio", "crio", "cri-o: no gpushare runtime handler or hooks"),
    }
}

/// CRI-O: `crio status config` prints the config the running crio uses.
pub fn live() -> Check {
    let name = "cri-o daemon";
    if find_tool("crio").is_none() {
        return check(name, Verdict::Ok, "crio not installed");
    }
    let sock = super::crio_api::SOCKET;
    if !Path::new(sock).exists() {
        return check(
            name,
            Verdict::Warn,
            format!("cri-o: not running (no socket at {sock}); only its files were checked"),
        );
    }
    match super::crio_api::running_config(Path::new(sock), super::check::TOOL_TIMEOUT) {
        Err(e) => check(name, Verdict::Warn, format!("cri-o: not running ({e})")),
        Ok(text) => crio_answer(&text),
    }
}

/// The verdict on the TOML of CRI-O's `GET /config` (what `crio status config` prints) (pure).
fn crio_answer(text: &str) -> Check {
    let name = "cri-o daemon";
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => {
            return check(
                name,
                Verdict::Warn,
                format!(
                    "cri-o: its running configuration (GET /config) is not TOML ({})",
                    e.message()
                ),
            )
        }
    };
    let ours = doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("runtimes"))
        .and_then(|r| r.as_table())
        .and_then(|t| {
            t.iter().find_map(|(k, v)| {
                let p = v.get("runtime_path")?.as_str()?;
                is_ours(p, "gpushare-runtime").then(|| (k.clone(), p.to_owned()))
            })
        });
    match ours {
        Some((k, p)) => check(
            name,
            Verdict::Ok,
            format!("crio has loaded runtime handler {k:?} ({p})"),
        ),
        None => check(
            name,
            Verdict::Warn,
            "cri-o: the running crio has no gpushare runtime handler; run `gpushare-hook configure crio`, then `systemctl restart crio`",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_a_running_crio() {
        let crio = "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\n";
        assert_eq!(crio_answer(crio).verdict, Verdict::Warn);
        let with = format!("{crio}[crio.runtime.runtimes.gpushare]\nruntime_path = \"/usr/libexec/gpushare/gpushare-runtime\"\n");
        assert_eq!(crio_answer(&with).verdict, Verdict::Ok);
    }

    #[test]
    fn crio_not_installed_is_said_so_whatever_podman_put_in_the_shared_hooks_dir() {
        if installed("crio") {
            eprintln!("\n******** SKIPPED: crio is installed here ********\n");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let hooks = t.path().join("hooks.d");
        std::fs::create_dir(&hooks).unwrap();
        std::fs::write(
            hooks.join("gpushare.json"),
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/gpushare-hook","args":["gpushare-hook","createRuntime"]},"when":{"annotations":{"^gpu\.share$":".+"}},"stages":["createRuntime"]}"#,
        )
        .unwrap();
        let conf = t.path().join("crio.conf");
        std::fs::write(
            &conf,
            format!("[crio.runtime]\nhooks_dir = [{:?}]\n", hooks),
        )
        .unwrap();
        let c = file_check(&[conf.to_str().unwrap()]);
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert_eq!(c.detail, "crio not installed");
    }
}
