//! gpushare's CRI-O files load in CRI-O: the packaged drop-in, what `configure crio` writes, and
//! the hook files in every dir they list, checked against CRI-O v1.37.0's own rules as written
//! down by hand in `tests/fixtures/crio/v1.37.0-rules.toml` (sources named there).

mod common;

use std::path::{Path, PathBuf};

use common::Sandbox;
use serde_json::Value;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// CRI-O's rules (the fixture).
struct Rules(toml::Table);

impl Rules {
    fn load() -> Self {
        let t = std::fs::read_to_string(repo("tests/fixtures/crio/v1.37.0-rules.toml")).unwrap();
        Rules(t.parse().unwrap())
    }

    fn list(&self, key: &str) -> Vec<&str> {
        self.0[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect()
    }

    fn keys(&self, table: &str) -> Vec<&str> {
        self.0["keys"][table]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect()
    }

    /// What CRI-O would refuse in a drop-in, in CRI-O's words where it has some.
    fn dropin_problems(&self, text: &str) -> Vec<String> {
        let doc: toml::Table = match text.parse() {
            Ok(d) => d,
            Err(e) => return vec![format!("unable to decode configuration: {e}")],
        };
        let mut out = Vec::new();
        let Some(rt) = doc
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.as_table())
        else {
            return out;
        };
        let known = self.keys("crio.runtime");
        out.extend(
            rt.keys()
                .filter(|k| !known.contains(&k.as_str()))
                .map(|k| format!("crio.runtime.{k}: not a key CRI-O reads")),
        );
        let handler_keys = self.keys("crio.runtime.runtimes.*");
        let allowed = self.list("allowed_annotations");
        let types = self.list("runtime_types");
        for (name, h) in rt
            .get("runtimes")
            .and_then(|r| r.as_table())
            .into_iter()
            .flatten()
        {
            let h = h.as_table().unwrap();
            out.extend(
                h.keys()
                    .filter(|k| !handler_keys.contains(&k.as_str()))
                    .map(|k| format!("runtime handler {name:?}: {k}: not a key CRI-O reads")),
            );
            if let Some(t) = h.get("runtime_type").and_then(|v| v.as_str()) {
                if !t.is_empty() && !types.contains(&t) {
                    out.push(format!(
                        "runtime handler {name:?}: invalid runtime_type {t}"
                    ));
                }
            }
            for a in h
                .get("allowed_annotations")
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
            {
                let a = a.as_str().unwrap_or("(not a string)");
                if !allowed.contains(&a) {
                    out.push(format!(
                        "Runtime handler {name:?} is being ignored due to: invalid allowed_annotation: {a}"
                    ));
                }
            }
        }
        out
    }

    /// What CRI-O would refuse in a hook file.
    fn hook_problems(&self, path: &Path) -> Vec<String> {
        let h: Value = match serde_json::from_str(&std::fs::read_to_string(path).unwrap()) {
            Ok(h) => h,
            Err(e) => return vec![format!("{}: version check: {e}", path.display())],
        };
        let mut out = Vec::new();
        let v = h["version"].as_str().unwrap_or("");
        if !self.list("hook_versions").contains(&v) {
            out.push(format!(
                "{}: unrecognized hook version: {v:?}",
                path.display()
            ));
        }
        let stages = self.list("hook_stages");
        for s in h["stages"].as_array().into_iter().flatten() {
            let s = s.as_str().unwrap_or("");
            if !stages.contains(&s) {
                out.push(format!("{}: unknown stage {s:?}", path.display()));
            }
        }
        out
    }

    /// What CRI-O would refuse among the `*.json` files of the hooks dirs `doc` lists.
    fn hooks_dirs_problems(&self, doc: &toml::Table) -> Vec<String> {
        let mut out = Vec::new();
        for d in hooks_dirs(doc) {
            for e in std::fs::read_dir(&d).into_iter().flatten() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "json") {
                    out.extend(self.hook_problems(&p));
                }
            }
        }
        out
    }
}

fn hooks_dirs(doc: &toml::Table) -> Vec<PathBuf> {
    doc["crio"]["runtime"]["hooks_dir"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| PathBuf::from(v.as_str().unwrap()))
        .collect()
}

/// The drop-in that configure wrote before it followed CRI-O's rules.
const OLD_DROPIN: &str = r#"[crio.runtime]
hooks_dir = ["/usr/share/containers/oci/hooks.d"]
[crio.runtime.runtimes.gpushare]
runtime_path = "/usr/bin/gpushare-runtime"
runtime_type = "oci"
runtime_root = "/run/runc"
allowed_annotations = ["gpu.share", "gpu.share.devices", "gpu.share.memory", "gpu.share.cores", "gpu.share.timeslice", "gpu.share.group"]
"#;

#[test]
fn the_rules_catch_what_crio_refused() {
    let r = Rules::load();
    // Positive controls: the handler CRI-O v1.37.0 was seen dropping, and a precreate hook.
    let p = r.dropin_problems(OLD_DROPIN);
    assert!(
        p.iter()
            .any(|l| l.ends_with("invalid allowed_annotation: gpu.share")),
        "{p:?}"
    );
    let p = r.hook_problems(&repo("hooks/podman-precreate/gpushare-precreate.json"));
    assert!(
        p.iter().any(|l| l.ends_with("unknown stage \"precreate\"")),
        "{p:?}"
    );
    let p = r.dropin_problems("[crio.runtime]\nhook_dir = [\"/x\"]\n");
    assert_eq!(p, ["crio.runtime.hook_dir: not a key CRI-O reads"]);
    // CRI-O's own names are fine.
    let ok = OLD_DROPIN.replace(
        r#"["gpu.share", "gpu.share.devices", "gpu.share.memory", "gpu.share.cores", "gpu.share.timeslice", "gpu.share.group"]"#,
        r#"["io.kubernetes.cri-o.Devices"]"#,
    );
    assert_eq!(r.dropin_problems(&ok), Vec::<String>::new());
}

#[test]
fn the_packaged_dropin_and_oci_hooks_load_in_crio() {
    let r = Rules::load();
    let text = std::fs::read_to_string(repo("packaging/crio/10-gpushare.conf")).unwrap();
    assert_eq!(r.dropin_problems(&text), Vec::<String>::new());
    let doc: toml::Table = text.parse().unwrap();
    assert!(
        doc["crio"]["runtime"]["runtimes"]["gpushare"]["runtime_path"].is_str(),
        "the handler is there"
    );
    assert_eq!(
        hooks_dirs(&doc),
        [PathBuf::from("/etc/containers/oci/hooks.d")]
    );
    // What packaging installs there: hooks/oci/*.json.
    let mut n = 0;
    for e in std::fs::read_dir(repo("hooks/oci")).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(r.hook_problems(&p), Vec::<String>::new());
        n += 1;
    }
    assert_eq!(n, 2, "createRuntime and poststop checked");
}

fn sandbox() -> Sandbox {
    let sb = Sandbox::new(1);
    sb.write_config(&format!("[runtime]\nhook = {:?}\n", common::hook_bin()));
    sb
}

fn configure(sb: &Sandbox, engine: &str, file: &Path, hooks: &Path) {
    let out = sb.hook(
        &[
            "configure",
            engine,
            "--path",
            file.to_str().unwrap(),
            "--hooks-dir",
            hooks.to_str().unwrap(),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "configure {engine}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn configure_crio_writes_a_handler_crio_loads_and_no_precreate_where_crio_reads() {
    let r = Rules::load();
    let sb = sandbox();
    let hooks = sb.path().join("hooks");
    // podman first, into the same hooks root: its precreate file must stay out of CRI-O's dirs.
    configure(&sb, "podman", &sb.path().join("containers.conf"), &hooks);
    let pre = hooks.join("hooks.d-podman/gpushare-precreate.json");
    assert!(pre.exists(), "podman's precreate hook was written");
    assert!(
        !r.hook_problems(&pre).is_empty(),
        "the precreate file is one CRI-O would refuse"
    );

    let f = sb.path().join("10-gpushare.conf");
    configure(&sb, "crio", &f, &hooks);
    let text = std::fs::read_to_string(&f).unwrap();
    assert_eq!(r.dropin_problems(&text), Vec::<String>::new(), "{text}");
    let doc: toml::Table = text.parse().unwrap();
    let h = &doc["crio"]["runtime"]["runtimes"]["gpushare"];
    assert!(h["runtime_path"].is_str(), "{text}");
    assert!(h.get("allowed_annotations").is_none(), "{text}");
    // Only the dir configure wrote the oci hooks to: not the system dir, not podman's.
    assert_eq!(hooks_dirs(&doc), [hooks.join("hooks.d")]);
    assert!(hooks.join("hooks.d/gpushare-createRuntime.json").exists());
    assert_eq!(r.hooks_dirs_problems(&doc), Vec::<String>::new());
}

#[test]
fn configure_crio_takes_our_annotations_out_of_an_old_handler() {
    let r = Rules::load();
    let sb = sandbox();
    let hooks = sb.path().join("hooks");
    let f = sb.path().join("10-gpushare.conf");
    // Ours only: the key goes.
    std::fs::write(&f, OLD_DROPIN).unwrap();
    assert!(
        !r.dropin_problems(OLD_DROPIN).is_empty(),
        "positive control"
    );
    configure(&sb, "crio", &f, &hooks);
    let text = std::fs::read_to_string(&f).unwrap();
    assert_eq!(r.dropin_problems(&text), Vec::<String>::new(), "{text}");
    assert!(!text.contains("allowed_annotations"), "{text}");
    // Someone else's CRI-O name stays.
    let mixed = OLD_DROPIN.replace(
        "[\"gpu.share\",",
        "[\"io.kubernetes.cri-o.Devices\", \"gpu.share\",",
    );
    std::fs::write(&f, &mixed).unwrap();
    configure(&sb, "crio", &f, &hooks);
    let text = std::fs::read_to_string(&f).unwrap();
    assert_eq!(r.dropin_problems(&text), Vec::<String>::new(), "{text}");
    let doc: toml::Table = text.parse().unwrap();
    assert_eq!(
        doc["crio"]["runtime"]["runtimes"]["gpushare"]["allowed_annotations"],
        toml::Value::Array(vec!["io.kubernetes.cri-o.Devices".into()])
    );
}
