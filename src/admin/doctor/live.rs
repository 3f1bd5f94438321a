//! Doctor asks each running engine what it has loaded, instead of trusting its files: Docker
//! through `docker info`, containerd through `ctr plugins ls` (is the CRI plugin up?) and the
//! CRI runtime status (`crictl info`: the runtimes in the config containerd runs with), CRI-O
//! through `crio status config` (the config it runs with). Each says plainly "not installed"
//! or "not running". The engine programs are found on this process's `$PATH` (then the safe
//! PATH), as an operator's shell finds them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::probes::{first_line, run_bounded, TOOL_TIMEOUT};
use super::{check, Check, Verdict};

/// `name` on `$PATH`, else on the safe PATH.
pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::env::split_paths(crate::host::mps::SAFE_PATH))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn ask(bin: &Path, args: &[&str]) -> Result<Output, String> {
    let mut c = Command::new(bin);
    c.args(args).current_dir("/");
    run_bounded(&mut c, TOOL_TIMEOUT)
}

/// Docker: `docker info` answers with the runtimes dockerd has loaded and its default.
pub fn docker() -> Check {
    let name = "docker daemon";
    let Some(cli) = find_tool("docker") else {
        return match find_tool("dockerd") {
            None => check(name, Verdict::Ok, "docker not installed"),
            Some(_) => check(
                name,
                Verdict::Warn,
                "docker: dockerd is installed but the docker CLI is not; cannot ask it what it loaded",
            ),
        };
    };
    let format = r#"{"runtimes":{{json .Runtimes}},"default":{{json .DefaultRuntime}}}"#;
    let o = match ask(&cli, &["info", "--format", format]) {
        Err(e) => return check(name, Verdict::Warn, format!("docker: {e}")),
        Ok(o) => o,
    };
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    if !o.status.success() || !v["runtimes"].is_object() {
        return check(
            name,
            Verdict::Warn,
            format!(
                "docker: not running ({}); only daemon.json was checked, not what dockerd loads",
                first_line(&o)
            ),
        );
    }
    docker_answer(&v)
}

/// The verdict on `docker info`'s `{"runtimes": …, "default": …}` (pure).
fn docker_answer(v: &Value) -> Check {
    let name = "docker daemon";
    let default = v["default"].as_str().unwrap_or("?");
    let runtimes = v["runtimes"].as_object().cloned().unwrap_or_default();
    let ours = runtimes.iter().find_map(|(k, e)| {
        let p = e["path"].as_str()?;
        crate::admin::configure::is_ours(p, "gpushare-runtime").then(|| (k.clone(), p.to_owned()))
    });
    match ours {
        Some((k, p)) => check(
            name,
            Verdict::Ok,
            format!("dockerd has loaded runtime {k:?} ({p}); default runtime {default}"),
        ),
        None => check(
            name,
            Verdict::Warn,
            format!(
                "docker: the running dockerd has no gpushare runtime (it has {}; default {default}); run `gpushare-hook configure docker`, then `systemctl restart docker`",
                runtimes.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

/// containerd's socket: `$CONTAINERD_ADDRESS`, else the default.
fn containerd_socket() -> String {
    std::env::var("CONTAINERD_ADDRESS")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/run/containerd/containerd.sock".into())
}

/// containerd: running, its CRI plugin loaded, and the gpushare handler in the runtime config
/// the CRI plugin reports.
pub fn containerd() -> Check {
    let name = "containerd daemon";
    let ctr = find_tool("ctr");
    if ctr.is_none() && find_tool("containerd").is_none() {
        return check(name, Verdict::Ok, "containerd not installed");
    }
    let sock = containerd_socket();
    if !Path::new(&sock).exists() {
        return check(
            name,
            Verdict::Warn,
            format!("containerd: not running (no socket at {sock}); only config.toml was checked, not what containerd loads"),
        );
    }
    let Some(ctr) = ctr else {
        return check(
            name,
            Verdict::Warn,
            "containerd: ctr is not installed; cannot ask containerd what it loaded",
        );
    };
    let o = match ask(&ctr, &["--address", &sock, "plugins", "ls"]) {
        Err(e) => return check(name, Verdict::Warn, format!("containerd: {e}")),
        Ok(o) if !o.status.success() => {
            return check(
                name,
                Verdict::Warn,
                format!("containerd: not running ({})", first_line(&o)),
            )
        }
        Ok(o) => o,
    };
    if let Some(c) = cri_plugin(&String::from_utf8_lossy(&o.stdout)) {
        return c;
    }
    let Some(crictl) = find_tool("crictl") else {
        return check(
            name,
            Verdict::Warn,
            format!("containerd runs with its CRI plugin; whether it has loaded the gpushare handler needs crictl (cri-tools), which is not installed: `crictl --runtime-endpoint unix://{sock} info` shows its runtimes"),
        );
    };
    let endpoint = format!("unix://{sock}");
    match ask(&crictl, &["--runtime-endpoint", &endpoint, "info"]) {
        Err(e) => check(name, Verdict::Warn, format!("containerd: {e}")),
        Ok(o) if !o.status.success() => check(
            name,
            Verdict::Warn,
            format!("containerd: crictl info failed ({})", first_line(&o)),
        ),
        Ok(o) => containerd_answer(&serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)),
    }
}

/// The verdict on `ctr plugins ls`'s table when the CRI plugin is not up; `None` when it is.
/// containerd 1.x lists `io.containerd.grpc.v1 cri`; 2.x also `io.containerd.cri.v1 runtime`.
fn cri_plugin(table: &str) -> Option<Check> {
    let name = "containerd daemon";
    let row = table.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri")
            .then(|| f[f.len() - 1].to_owned())
    });
    match row.as_deref() {
        Some("ok") => None,
        Some(status) => Some(check(
            name,
            Verdict::Fail,
            format!("containerd: its CRI plugin did not load (status {status}): no pod runs; see `journalctl -u containerd` (often a config.toml error)"),
        )),
        None => Some(check(
            name,
            Verdict::Fail,
            "containerd: runs without a CRI plugin (is \"cri\" in disabled_plugins?): no pod runs",
        )),
    }
}

/// The verdict on `crictl info`'s JSON: a runtime whose `options.BinaryName` is ours anywhere
/// in a `runtimes` table of the config containerd runs with (pure).
fn containerd_answer(v: &Value) -> Check {
    let name = "containerd daemon";
    let mut found = None;
    find_runtimes(v, &mut |k, rt| {
        let bin = rt["options"]["BinaryName"].as_str().unwrap_or("");
        if found.is_none() && crate::admin::configure::is_ours(bin, "gpushare-runtime") {
            found = Some((k.to_owned(), bin.to_owned()));
        }
    });
    match found {
        Some((k, bin)) => check(
            name,
            Verdict::Ok,
            format!("containerd has loaded handler {k:?} ({bin})"),
        ),
        None => check(
            name,
            Verdict::Warn,
            "containerd: the running containerd has no gpushare handler; run `gpushare-hook configure containerd`, then `systemctl restart containerd`",
        ),
    }
}

fn find_runtimes(v: &Value, f: &mut impl FnMut(&str, &Value)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "runtimes" {
                    if let Some(rts) = x.as_object() {
                        for (name, rt) in rts {
                            f(name, rt);
                        }
                    }
                }
                find_runtimes(x, f);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| find_runtimes(x, f)),
        _ => {}
    }
}

/// CRI-O: `crio status config` prints the config the running crio uses.
pub fn crio() -> Check {
    let name = "cri-o daemon";
    let Some(crio) = find_tool("crio") else {
        return check(name, Verdict::Ok, "crio not installed");
    };
    let sock = "/var/run/crio/crio.sock";
    if !Path::new(sock).exists() {
        return check(
            name,
            Verdict::Warn,
            format!("cri-o: not running (no socket at {sock}); only its files were checked"),
        );
    }
    match ask(&crio, &["status", "--socket", sock, "config"]) {
        Err(e) => check(name, Verdict::Warn, format!("cri-o: {e}")),
        Ok(o) if !o.status.success() => check(
            name,
            Verdict::Warn,
            format!("cri-o: not running ({})", first_line(&o)),
        ),
        Ok(o) => crio_answer(&String::from_utf8_lossy(&o.stdout)),
    }
}

/// The verdict on the TOML `crio status config` prints (pure).
fn crio_answer(text: &str) -> Check {
    let name = "cri-o daemon";
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => {
            return check(
                name,
                Verdict::Warn,
                format!("cri-o: `crio status config` is not TOML ({})", e.message()),
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
                crate::admin::configure::is_ours(p, "gpushare-runtime")
                    .then(|| (k.clone(), p.to_owned()))
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
    use serde_json::json;

    #[test]
    fn answers_of_running_engines() {
        // Docker's `info` answer (the shape of `docker info --format '{{json .Runtimes}}'`).
        let c = docker_answer(
            &json!({"runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {"path": "runc"}}, "default": "runc"}),
        );
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.detail.contains("has no gpushare runtime"), "{c:?}");
        let c = docker_answer(
            &json!({"runtimes": {"gpushare": {"path": "/usr/bin/gpushare-runtime"}}, "default": "runc"}),
        );
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");

        // `ctr plugins ls` rows, 1.x layout.
        let table = "TYPE                                  ID                       PLATFORMS      STATUS\nio.containerd.grpc.v1                 cri                      linux/amd64    ok\n";
        assert!(cri_plugin(table).is_none());
        let c = cri_plugin(&table.replace("    ok", "    error")).unwrap();
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(cri_plugin("TYPE ID PLATFORMS STATUS\n").is_some());

        // `crictl info` (containerd 1.7 layout: config.containerd.runtimes).
        let info = json!({"config": {"containerd": {"defaultRuntimeName": "runc", "runtimes": {
            "runc": {"runtimeType": "io.containerd.runc.v2", "options": {"SystemdCgroup": true}},
            "gpushare": {"runtimeType": "io.containerd.runc.v2", "options": {"BinaryName": "/usr/bin/gpushare-runtime"}}}}}});
        assert_eq!(containerd_answer(&info).verdict, Verdict::Ok);
        let mut without = info.clone();
        without["config"]["containerd"]["runtimes"]
            .as_object_mut()
            .unwrap()
            .remove("gpushare");
        assert_eq!(containerd_answer(&without).verdict, Verdict::Warn);

        let crio = "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\n";
        assert_eq!(crio_answer(crio).verdict, Verdict::Warn);
        let with = format!("{crio}[crio.runtime.runtimes.gpushare]\nruntime_path = \"/usr/libexec/gpushare/gpushare-runtime\"\n");
        assert_eq!(crio_answer(&with).verdict, Verdict::Ok);
    }
}
