//! `gpushare-hook configure <engine>`: prints the configuration that wires gpushare into an
//! engine (the snippets of `packaging/`, with this installation's paths), to be merged into the
//! engine's own files. It never edits an engine's configuration itself.

use std::path::{Path, PathBuf};

use crate::config::Config;

/// Engines gpushare knows how to configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Podman,
    Crio,
    Containerd,
    Docker,
    NvidiaContainerRuntime,
}

const PODMAN: &str = include_str!("../../packaging/podman/containers.conf");
const CRIO: &str = include_str!("../../packaging/crio/10-gpushare.conf");
const CONTAINERD: &str = include_str!("../../packaging/containerd/config.toml");
const DOCKER: &str = include_str!("../../packaging/docker/daemon.json");
const HOOK_CREATE: &str = include_str!("../../hooks/oci/gpushare-createRuntime.json");
const HOOK_POSTSTOP: &str = include_str!("../../hooks/oci/gpushare-poststop.json");
const HOOK_PRECREATE: &str = include_str!("../../hooks/podman-precreate/gpushare-precreate.json");

/// `gpushare-runtime` of this installation: next to the configured hook.
pub fn runtime_path(cfg: &Config) -> PathBuf {
    cfg.runtime.hook.with_file_name("gpushare-runtime")
}

fn paths(text: &str, cfg: &Config) -> String {
    text.replace(
        "/usr/bin/gpushare-runtime",
        &runtime_path(cfg).to_string_lossy(),
    )
    .replace(
        "/usr/bin/gpushare-hook",
        &cfg.runtime.hook.to_string_lossy(),
    )
}

/// A hook file with this installation's paths; `GPUSHARE_CONFIG` added to its env when the
/// policy file is not at the default path.
fn hook_file(text: &str, cfg: &Config, config_path: Option<&Path>) -> String {
    let text = paths(text, cfg);
    let Some(p) = config_path.filter(|p| *p != Path::new(crate::config::DEFAULT_PATH)) else {
        return text;
    };
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return text;
    };
    if let Some(env) = v["hook"]["env"].as_array_mut() {
        env.push(format!("{}={}", crate::config::ENV_PATH, p.display()).into());
    }
    serde_json::to_string_pretty(&v).unwrap_or(text)
}

fn file(out: &mut String, path: &str, body: &str) {
    out.push_str(&format!("# ---- {path}\n{}", body.trim_end()));
    out.push('\n');
}

/// The configuration for `engine`, as text: one or more files, each introduced by a
/// `# ---- <where it goes>` line.
pub fn snippet(engine: Engine, cfg: &Config, config_path: Option<&Path>) -> String {
    let mut out = String::new();
    let hooks = |out: &mut String, precreate: bool| {
        file(
            out,
            "/usr/share/containers/oci/hooks.d/gpushare-createRuntime.json",
            &hook_file(HOOK_CREATE, cfg, config_path),
        );
        file(
            out,
            "/usr/share/containers/oci/hooks.d/gpushare-poststop.json",
            &hook_file(HOOK_POSTSTOP, cfg, config_path),
        );
        if precreate {
            file(
                out,
                "/etc/containers/oci/hooks.d-podman/gpushare-precreate.json (podman only: never in a CRI-O hooks dir)",
                &hook_file(HOOK_PRECREATE, cfg, config_path),
            );
        }
    };
    match engine {
        Engine::Podman => {
            file(
                &mut out,
                "/etc/containers/containers.conf (merge)",
                &paths(PODMAN, cfg),
            );
            hooks(&mut out, true);
        }
        Engine::Crio => {
            file(
                &mut out,
                "/etc/crio/crio.conf.d/10-gpushare.conf",
                &paths(CRIO, cfg),
            );
            hooks(&mut out, false);
        }
        Engine::Containerd => file(
            &mut out,
            "/etc/containerd/config.toml (merge)",
            &paths(CONTAINERD, cfg),
        ),
        Engine::Docker => file(
            &mut out,
            "/etc/docker/daemon.json (merge)",
            &paths(DOCKER, cfg),
        ),
        Engine::NvidiaContainerRuntime => {
            let policy = config_path.map_or_else(
                || crate::config::DEFAULT_PATH.to_owned(),
                |p| p.display().to_string(),
            );
            file(
                &mut out,
                &format!("{policy} (merge)"),
                "[runtime]\nnext = [\"nvidia-container-runtime\", \"runc\"]",
            );
            out.push_str(&format!(
                "# Then register {} with the engine in place of nvidia-container-runtime\n# (Docker daemon.json \"runtimes\", containerd BinaryName, CRI-O runtime_path).\n",
                runtime_path(cfg).display()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(text: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("# ---- ") {
                out.push((name.to_owned(), String::new()));
            } else if let Some(last) = out.last_mut() {
                last.1.push_str(line);
                last.1.push('\n');
            }
        }
        out
    }

    #[test]
    fn every_engine_gets_parsable_files_with_our_paths() {
        let mut cfg = Config::default();
        cfg.runtime.hook = "/opt/gs/bin/gpushare-hook".into();
        let engines = [
            Engine::Podman,
            Engine::Crio,
            Engine::Containerd,
            Engine::Docker,
            Engine::NvidiaContainerRuntime,
        ];
        for engine in engines {
            let text = snippet(engine, &cfg, None);
            assert!(!text.contains("/usr/bin/gpushare"), "{engine:?}: {text}");
            for (name, body) in files(&text) {
                if name.contains(".json") {
                    let v: serde_json::Value = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("{engine:?} {name}: {e}"));
                    let s = v.to_string();
                    assert!(s.contains("/opt/gs/bin/gpushare-"), "{engine:?} {name}");
                } else {
                    body.parse::<toml::Table>()
                        .unwrap_or_else(|e| panic!("{engine:?} {name}: {e}"));
                }
            }
        }
        let crio = snippet(Engine::Crio, &cfg, None);
        assert!(
            !crio.contains("\"precreate\""),
            "CRI-O must not get the precreate hook"
        );
        assert!(snippet(Engine::Podman, &cfg, None).contains("\"precreate\""));
        let with_policy = snippet(Engine::Podman, &cfg, Some(Path::new("/etc/x.toml")));
        assert_eq!(
            with_policy.matches("GPUSHARE_CONFIG=/etc/x.toml").count(),
            3
        );
    }
}
