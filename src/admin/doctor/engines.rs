//! Doctor's engine checks: each engine's own files parsed (`toml`, `serde_json`), the gpushare
//! entries found in them, whether what they will execute exists and runs, and which policy file
//! each entry will load. Every hint names the engine.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{check, Check, Verdict};
use crate::config::{Config, Source};
use crate::host::mps::find_binary;

const DOCKER_FILE: &str = "/etc/docker/daemon.json";
const CONTAINERD_FILE: &str = "/etc/containerd/config.toml";
const PODMAN_CONFS: &[&str] = &[
    "/usr/share/containers/containers.conf",
    "/etc/containers/containers.conf",
    "/etc/containers/containers.conf.d",
];
const CRIO_CONFS: &[&str] = &["/etc/crio/crio.conf", "/etc/crio/crio.conf.d"];

pub(super) fn checks() -> Vec<Check> {
    vec![
        podman(PODMAN_CONFS),
        docker(Path::new(DOCKER_FILE)),
        super::live::docker(),
        containerd(Path::new(CONTAINERD_FILE)),
        super::live::containerd(),
        crio(CRIO_CONFS),
        super::live::crio(),
    ]
}

/// `path` exists, is an executable file, and answers `args` (its first line shown).
pub(super) fn executable_check(name: &str, path: &Path, args: &[&str], what: &str) -> Check {
    match executable(path) {
        Err(e) => check(name, Verdict::Fail, format!("{e} ({what})")),
        Ok(()) => {
            let out = std::process::Command::new(path)
                .args(args)
                .env_clear()
                .env("PATH", crate::host::mps::SAFE_PATH)
                .stdin(std::process::Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    let text = String::from_utf8_lossy(&o.stdout);
                    let first = text.lines().next().unwrap_or("").trim();
                    check(name, Verdict::Ok, format!("{}: {first}", path.display()))
                }
                Ok(o) => check(
                    name,
                    Verdict::Fail,
                    format!(
                        "{} {} exited with {} ({what})",
                        path.display(),
                        args.join(" "),
                        o.status
                    ),
                ),
                Err(e) => check(
                    name,
                    Verdict::Fail,
                    format!("cannot run {}: {e} ({what})", path.display()),
                ),
            }
        }
    }
}

/// Whether `path` is an existing executable file.
fn executable(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!("{} is not a file", path.display())),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => {
            Err(format!("{} is not executable", path.display()))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{} cannot be used: {e}", path.display())),
    }
}

/// The advice for an entry whose policy file does not load: `configure` would refuse it too.
const POLICY_FIX: &str = "fix that policy file first (`gpushare-hook configure` refuses it too)";

/// `e`, followed by the advice to run `configure` unless the fix is the policy file's.
fn advise(e: &str, cmd: &str) -> String {
    if e.ends_with(POLICY_FIX) {
        e.to_owned()
    } else {
        format!("{e}; run `gpushare-hook configure {cmd}`")
    }
}

/// The policy file an entry will load: `GPUSHARE_CONFIG` from its env (a hook file) or from
/// the launcher it runs; else the default. `Err` when that file does not load.
fn policy_of(env: Option<&str>) -> Result<String, String> {
    let source = Source::pick(None, env.map(std::ffi::OsStr::new));
    match Config::load_from(&source) {
        Ok(_) => Ok(source.to_string()),
        Err(e) => Err(format!(
            "{source}: {}; {POLICY_FIX}",
            crate::vocab::chain(&e)
        )),
    }
}

/// `GPUSHARE_CONFIG` set by a launcher written by `configure` (a shell script).
fn launcher_policy(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    if !text.starts_with("#!") {
        return None;
    }
    text.lines().find_map(|l| {
        let v = l.strip_prefix(&format!("{}=", crate::config::ENV_PATH))?;
        Some(v.trim().trim_matches('\'').replace(r"'\''", "'"))
    })
}

/// A runtime entry's binary: executable, and the policy it will load.
fn runtime_entry(path: &Path) -> Result<String, String> {
    executable(path)?;
    let policy = policy_of(launcher_policy(path).as_deref())?;
    Ok(format!("runs {}, policy {policy}", path.display()))
}

fn installed(engine: &str) -> bool {
    super::live::find_tool(engine).is_some()
}

fn not_configured(name: &str, engine: &str, cmd: &str, why: &str) -> Check {
    if installed(engine) {
        check(
            name,
            Verdict::Warn,
            format!("{why}; run `gpushare-hook configure {cmd}`"),
        )
    } else {
        check(name, Verdict::Ok, format!("{engine} not installed"))
    }
}

/// Docker: `runtimes.<name>.path` in daemon.json naming gpushare-runtime.
pub fn docker(file: &Path) -> Check {
    let name = "docker";
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(_) => {
            return not_configured(
                name,
                "dockerd",
                "docker",
                &format!("docker: {} missing", file.display()),
            )
        }
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!(
                    "docker: {} is not valid JSON ({e}); dockerd will not start",
                    file.display()
                ),
            )
        }
    };
    let entry = v["runtimes"].as_object().and_then(|r| {
        r.iter().find_map(|(k, e)| {
            let p = e["path"].as_str()?;
            crate::admin::configure::is_ours(p, "gpushare-runtime")
                .then(|| (k.clone(), p.to_owned()))
        })
    });
    let Some((runtime, path)) = entry else {
        return not_configured(
            name,
            "dockerd",
            "docker",
            &format!(
                "docker: no gpushare-runtime in \"runtimes\" of {}",
                file.display()
            ),
        );
    };
    let path = resolve(&path);
    match runtime_entry(&path) {
        Ok(d) => check(name, Verdict::Ok, format!("runtime {runtime:?} {d}")),
        Err(e) => check(
            name,
            Verdict::Fail,
            advise(
                &format!("docker: runtime {runtime:?} in {}: {e}", file.display()),
                "docker",
            ),
        ),
    }
}

/// A bare name (Docker allows one) resolved on the safe PATH.
fn resolve(p: &str) -> PathBuf {
    find_binary(p).unwrap_or_else(|| PathBuf::from(p))
}

/// containerd: a CRI runtime (version 2 or 3 layout) whose `options.BinaryName` is ours, with
/// the gpu.share annotations passed through.
pub fn containerd(file: &Path) -> Check {
    let name = "containerd";
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(_) => {
            return not_configured(
                name,
                "containerd",
                "containerd",
                &format!("containerd: {} missing", file.display()),
            )
        }
    };
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => {
            return check(
                name,
                Verdict::Fail,
                format!(
                    "containerd: {} is not valid TOML ({}); containerd will not start",
                    file.display(),
                    e.message()
                ),
            )
        }
    };
    let runtimes = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"]
        .iter()
        .filter_map(|p| {
            doc.get("plugins")?
                .get(p)?
                .get("containerd")?
                .get("runtimes")?
                .as_table()
        })
        .flat_map(|t| t.iter())
        .find_map(|(k, rt)| {
            let bin = rt.get("options")?.get("BinaryName")?.as_str()?;
            crate::admin::configure::is_ours(bin, "gpushare-runtime")
                .then(|| (k.clone(), bin.to_owned(), rt.clone()))
        });
    let Some((handler, bin, rt)) = runtimes else {
        return not_configured(
            name,
            "containerd",
            "containerd",
            &format!(
                "containerd: no runtime with BinaryName gpushare-runtime in {}",
                file.display()
            ),
        );
    };
    let passes = rt
        .get("pod_annotations")
        .and_then(|a| a.as_array())
        .is_some_and(|a| {
            a.iter()
                .any(|v| v.as_str().is_some_and(|s| s.starts_with("gpu.share")))
        });
    match runtime_entry(Path::new(&bin)) {
        Err(e) => check(
            name,
            Verdict::Fail,
            advise(
                &format!("containerd: runtime {handler:?} in {}: {e}", file.display()),
                "containerd",
            ),
        ),
        Ok(d) if !passes => check(
            name,
            Verdict::Warn,
            format!("containerd: runtime {handler:?} {d}, but its pod_annotations lack gpu.share*: pods' requests do not reach it; run `gpushare-hook configure containerd`"),
        ),
        Ok(d) => check(name, Verdict::Ok, format!("runtime {handler:?} {d}")),
    }
}

/// The TOML files of an engine's main file and drop-in dir, in the order they apply.
fn toml_files(paths: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        let p = Path::new(p);
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|f| f.extension().is_some_and(|e| e == "conf"))
                .collect();
            v.sort();
            out.extend(v);
        } else if p.is_file() {
            out.push(p.to_owned());
        }
    }
    out
}

/// The last value of `keys` among `files` (later files override), or a parse failure.
fn last_value(files: &[PathBuf], keys: &[&str]) -> Result<Option<toml::Value>, String> {
    let mut found = None;
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            format!("{} is not valid TOML ({})", f.display(), e.message())
        })?;
        let mut cur = Some(toml::Value::Table(doc));
        for k in keys {
            cur = cur.and_then(|v| v.get(k).cloned());
        }
        if cur.is_some() {
            found = cur;
        }
    }
    Ok(found)
}

/// One stage of one of our hook files: (stage, file, hook path, GPUSHARE_CONFIG of its env).
type HookEntry = (String, PathBuf, String, Option<String>);

/// Our hook files in `dirs`, or a file that does not parse.
fn our_hooks(dirs: &[String]) -> Result<Vec<HookEntry>, String> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        for e in rd.flatten() {
            let f = e.path();
            if f.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| format!("hook file {} is not valid JSON ({e})", f.display()))?;
            let Some(path) = v["hook"]["path"].as_str() else {
                continue;
            };
            if !crate::admin::configure::is_ours(path, "gpushare-hook") {
                continue;
            }
            let env = v["hook"]["env"].as_array().and_then(|a| {
                a.iter().find_map(|x| {
                    x.as_str()?
                        .strip_prefix(&format!("{}=", crate::config::ENV_PATH))
                        .map(str::to_owned)
                })
            });
            for s in v["stages"].as_array().into_iter().flatten() {
                if let Some(s) = s.as_str() {
                    out.push((s.to_owned(), f.clone(), path.to_owned(), env.clone()));
                }
            }
        }
    }
    Ok(out)
}

/// Checks hook entries: each hook binary executable and each policy loadable.
fn hook_entries(engine: &str, hooks: &[HookEntry]) -> Result<String, String> {
    let mut policies = Vec::new();
    for (stage, file, path, env) in hooks {
        executable(Path::new(path))
            .map_err(|e| format!("{engine}: {stage} hook in {}: {e}", file.display()))?;
        let p = policy_of(env.as_deref())
            .map_err(|e| format!("{engine}: {stage} hook in {}: {e}", file.display()))?;
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    Ok(policies.join(", "))
}

/// podman: the hooks dirs containers.conf names (podman's defaults when none), with our
/// createRuntime, poststop and precreate hooks.
pub fn podman(confs: &[&str]) -> Check {
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
    let hooks = match our_hooks(&dirs) {
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
    let policies = match hook_entries("podman", &hooks) {
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

/// CRI-O: a runtime handler running gpushare-runtime, or our hooks in its hooks_dir (without
/// a precreate file, which would make CRI-O drop the whole dir).
pub fn crio(confs: &[&str]) -> Check {
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
            crate::admin::configure::is_ours(p, "gpushare-runtime")
                .then(|| (k.clone(), p.to_owned()))
        })
    });
    let dirs: Vec<String> = match last_value(&files, &["crio", "runtime", "hooks_dir"]) {
        Ok(Some(toml::Value::Array(a))) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => vec!["/usr/share/containers/oci/hooks.d".into()],
    };
    let hooks = our_hooks(&dirs).unwrap_or_default();
    if hooks.iter().any(|h| h.0 == "precreate") {
        return check(name, Verdict::Fail, format!("cri-o: a precreate hook file is in a CRI-O hooks dir {dirs:?}; CRI-O then ignores the whole dir. Move it to /etc/containers/oci/hooks.d-podman"));
    }
    match handler {
        Some((k, p)) => match runtime_entry(Path::new(&p)) {
            Ok(d) => check(name, Verdict::Ok, format!("runtime handler {k:?} {d}")),
            Err(e) => check(name, Verdict::Fail, advise(&format!("cri-o: runtime handler {k:?}: {e}"), "crio")),
        },
        None if hooks.iter().any(|h| h.0 == "createRuntime") => match hook_entries("cri-o", &hooks) {
            Ok(p) => check(name, Verdict::Warn, format!("cri-o: hooks only (policy {p}): no env injection; run `gpushare-hook configure crio` for the runtime handler")),
            Err(e) => check(name, Verdict::Fail, e),
        },
        None => not_configured(name, "crio", "crio", "cri-o: no gpushare runtime handler or hooks"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_files_are_parsed_not_grepped() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("gpushare-runtime");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let daemon = t.path().join("daemon.json");
        let rows: &[(&str, String, Verdict, &str)] = &[
            (
                "word in a comment-like key",
                r#"{"x-gpushare": 1}"#.into(),
                Verdict::Warn,
                "no gpushare-runtime",
            ),
            (
                "invalid JSON",
                "{\"runtimes\": {".into(),
                Verdict::Fail,
                "not valid JSON",
            ),
            (
                "missing binary",
                r#"{"runtimes": {"gs": {"path": "/nonexistent/gpushare-runtime"}}}"#.into(),
                Verdict::Fail,
                "cannot be used",
            ),
            (
                "ours",
                format!(
                    r#"{{"runtimes": {{"gs": {{"path": "{}"}}}}}}"#,
                    exe.display()
                ),
                Verdict::Ok,
                "runs",
            ),
        ];
        for (what, text, verdict, needle) in rows {
            std::fs::write(&daemon, text).unwrap();
            let c = docker(&daemon);
            if *verdict == Verdict::Warn && !installed("dockerd") {
                assert_eq!(c.verdict, Verdict::Ok, "{what}: {c:?}");
                continue;
            }
            assert_eq!(c.verdict, *verdict, "{what}: {c:?}");
            assert!(c.detail.contains(needle), "{what}: {c:?}");
            assert!(
                c.detail.starts_with("docker") || c.verdict == Verdict::Ok,
                "{what}: names the engine: {c:?}"
            );
        }
        let conf = t.path().join("config.toml");
        std::fs::write(&conf, format!("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gs]\npod_annotations = [\"gpu.share*\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gs.options]\nBinaryName = \"{}\"\n", exe.display())).unwrap();
        assert_eq!(
            containerd(&conf).verdict,
            Verdict::Ok,
            "{:?}",
            containerd(&conf)
        );
        std::fs::write(&conf, "version = 2\n[plugins\n").unwrap();
        assert_eq!(containerd(&conf).verdict, Verdict::Fail);

        // podman: hooks dir from containers.conf; a hook whose binary is missing fails.
        let hooks = t.path().join("hooks");
        std::fs::create_dir(&hooks).unwrap();
        let cc = t.path().join("containers.conf");
        std::fs::write(&cc, format!("[engine]\nhooks_dir = [{:?}]\n", hooks)).unwrap();
        let hook = |stage: &str, path: &str| {
            std::fs::write(
                hooks.join(format!("{stage}.json")),
                format!(r#"{{"version":"1.0.0","hook":{{"path":"{path}","env":["GPUSHARE_CONFIG=/nonexistent/p.toml"]}},"when":{{"always":true}},"stages":["{stage}"]}}"#),
            )
            .unwrap();
        };
        let ccs = cc.to_str().unwrap();
        hook("createRuntime", "/nonexistent/gpushare-hook");
        let c = podman(&[ccs]);
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.detail.starts_with("podman: createRuntime hook"), "{c:?}");
        let real = t.path().join("gpushare-hook");
        std::fs::copy(&exe, &real).unwrap();
        hook("createRuntime", real.to_str().unwrap());
        let c = podman(&[ccs]);
        assert_eq!(c.verdict, Verdict::Fail, "policy file missing: {c:?}");
        assert!(c.detail.contains("/nonexistent/p.toml"), "{c:?}");

        // A policy file that does not load: fix it; `configure` would refuse it too.
        let broken = t.path().join("broken.toml");
        std::fs::write(&broken, "[polcy]\n").unwrap();
        let launcher = t.path().join("gpushare-runtime-broken");
        std::fs::write(
            &launcher,
            format!("#!/bin/sh\nGPUSHARE_CONFIG='{}'\n", broken.display()),
        )
        .unwrap();
        std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            &daemon,
            format!(
                r#"{{"runtimes": {{"gs": {{"path": "{}"}}}}}}"#,
                launcher.display()
            ),
        )
        .unwrap();
        let c = docker(&daemon);
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.detail.contains("unknown field `polcy`"), "{c:?}");
        assert!(c.detail.ends_with(POLICY_FIX), "{c:?}");
        assert!(
            !c.detail.contains("run `gpushare-hook configure docker`"),
            "{c:?}"
        );
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
        let c = crio(&[conf.to_str().unwrap()]);
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert_eq!(c.detail, "crio not installed");
    }
}
