//! Which gpushare entries a `configure` run replaces, with their old values, so that an entry
//! someone wrote by hand (or an older install) is never overwritten silently. Pure.

use serde_json::Value;

use super::Change;

/// The handler, runtime and hook entries of gpushare in a file's text, by key path.
fn entries(path: &std::path::Path, text: &str) -> Vec<(String, String)> {
    let json = path.extension().is_some_and(|e| e == "json");
    if json {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        if v.get("hook").is_some() {
            // A hook file: what it runs, with which env.
            return vec![(
                "hook".into(),
                serde_json::to_string(&v["hook"]).unwrap_or_default(),
            )];
        }
        return v["runtimes"]
            .get("gpushare")
            .map(|e| {
                vec![(
                    "runtimes.gpushare".into(),
                    serde_json::to_string(e).unwrap_or_default(),
                )]
            })
            .unwrap_or_default();
    }
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&toml::Value::Table(doc), String::new(), &mut out);
    out
}

fn walk(v: &toml::Value, at: String, out: &mut Vec<(String, String)>) {
    let Some(t) = v.as_table() else { return };
    for (k, x) in t {
        let here = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        if k == "gpushare" && at.ends_with("runtimes") {
            let shown = match x {
                toml::Value::Table(t) => {
                    toml::to_string(t).map_or_else(|_| x.to_string(), |s| one_line(&s))
                }
                _ => x.to_string(),
            };
            out.push((here, shown));
        } else {
            walk(x, here, out);
        }
    }
}

/// A small TOML table on one line (`key = value; …`).
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `(file, key, old value)` for each gpushare entry `c` replaces with another value.
pub fn replaced(c: &Change) -> Vec<(String, String, String)> {
    let Some(before) = c.before.as_deref() else {
        return Vec::new();
    };
    if !c.changes() {
        return Vec::new();
    }
    let after = entries(&c.path, &c.after);
    entries(&c.path, before)
        .into_iter()
        .filter(|(k, old)| after.iter().any(|(k2, new)| k2 == k && new != old))
        .map(|(k, old)| (c.path.display().to_string(), k, old))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_entry_is_named_with_its_old_value() {
        let c = Change {
            path: "/etc/docker/daemon.json".into(),
            before: Some(
                r#"{"runtimes": {"gpushare": {"path": "/opt/old/gpushare-runtime"}}}"#.into(),
            ),
            after: r#"{"runtimes": {"gpushare": {"path": "/usr/bin/gpushare-runtime"}}}"#.into(),
            mode: 0o644,
        };
        let r = replaced(&c);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].1, "runtimes.gpushare");
        assert!(r[0].2.contains("/opt/old/gpushare-runtime"), "{r:?}");
        let c = Change {
            path: "/etc/containerd/config.toml".into(),
            before: Some("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpushare.options]\nBinaryName = \"/old/gpushare-runtime\"\n".into()),
            after: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpushare.options]\nBinaryName = \"/new/gpushare-runtime\"\n".into(),
            mode: 0o644,
        };
        let r = replaced(&c);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].1.ends_with("containerd.runtimes.gpushare"), "{r:?}");
        assert!(r[0].2.contains("/old/gpushare-runtime"), "{r:?}");
        // A new entry replaces nothing.
        let c = Change {
            before: Some("version = 2\n".into()),
            ..c
        };
        assert!(replaced(&c).is_empty());
    }
}
