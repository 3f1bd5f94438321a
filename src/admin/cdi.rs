//! `gpushare-hook cdi generate`: the CDI spec of kind `gpushare.io/share`, one device per mode
//! and per `[profiles.<name>]`, so that CDI-capable engines take a share with
//! `--device gpushare.io/share=mps` beside NVIDIA's GPU device, with no runtime wrapper.
//!
//! Each device's edits are env (the profile's name, and for `mps` the pipe directory and the
//! profile's client limits) and gpushare's own `createRuntime` and `poststop` hooks; the hook
//! takes the request from `--profile`, which the container cannot change. The GPU comes from
//! the container's own devices (NVIDIA's CDI device or the engine's `--gpus`).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::admin::configure::{self, Change, ConfigureError};
use crate::admin::report::Report;
use crate::config::Config;
use crate::decide::profile::{self, ProfileError};
use crate::vocab::{quantity, Mode};

/// The spec's kind: devices are named `gpushare.io/share=<profile>`.
pub const KIND: &str = "gpushare.io/share";
/// The lowest CDI version whose fields the spec uses: env and hooks in device edits, a vendor
/// with a dot and a class without one, device names that start with a letter (0.3.0; a class
/// with a dot or device annotations would need 0.6.0, a device name starting with a digit
/// 0.5.0). Every CDI-capable engine reads it.
pub const CDI_VERSION: &str = "0.3.0";
/// Where engines look for generated (run-time) specs by default.
pub const DEFAULT_DIR: &str = "/var/run/cdi";
/// The file name, `<vendor>-<class>.json` as CDI's own tools name theirs.
pub const FILE_NAME: &str = "gpushare.io-share.json";
/// Where an MPS client looks for the control socket; the hook mounts the domain's pipe
/// directory there.
const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";

/// Why no spec was written.
#[derive(Debug, Error)]
pub enum CdiError {
    #[error("no CDI spec written: a profile cannot be served")]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Write(#[from] ConfigureError),
}

/// The spec for `cfg`, whose hooks run `cfg.runtime.hook` and hand on `policy` (a policy file
/// not at the default path) as `GPUSHARE_CONFIG`.
///
/// # Errors
/// [`ProfileError`] for a profile the policy would refuse (named with its key): no device is
/// offered that would then refuse every container.
pub fn spec(cfg: &Config, policy: Option<&Path>) -> Result<Value, ProfileError> {
    let hook = cfg.runtime.hook.display().to_string();
    let hook_env: Vec<String> = policy
        .map(|p| format!("{}={}", crate::config::ENV_PATH, p.display()))
        .into_iter()
        .collect();
    let mut devices = Vec::new();
    for (name, checked) in profile::check_all(cfg) {
        let req = match checked {
            Ok(r) => r,
            // A mode the policy does not allow is simply not offered.
            Err(ProfileError::Request { .. })
                if crate::config::BUILTIN_PROFILES.contains(&name.as_str()) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let mut env = vec![format!("{}={name}", profile::ENV)];
        if req.mode == Mode::Mps {
            env.push(format!("CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}"));
            if req.cores_explicit {
                env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}", req.cores));
            }
            if let Some(m) = req.memory {
                env.push(format!(
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
                    quantity::to_mib(m)
                ));
            }
        }
        let entry = |args: Vec<&str>| {
            let mut h = json!({"hookName": args[1], "path": hook, "args": args});
            if !hook_env.is_empty() {
                h["env"] = json!(hook_env);
            }
            h
        };
        devices.push(json!({
            "name": name,
            "containerEdits": {
                "env": env,
                "hooks": [
                    entry(vec!["gpushare-hook", "createRuntime", profile::FLAG, &name]),
                    entry(vec!["gpushare-hook", "poststop"]),
                ],
            },
        }));
    }
    Ok(json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices,
    }))
}

/// The spec file in `dir` as it is and as `cfg` needs it.
///
/// # Errors
/// [`CdiError`] for a profile that cannot be served or a file that cannot be read.
pub fn plan(cfg: &Config, policy: Option<&Path>, dir: &Path) -> Result<Change, CdiError> {
    let mut after = serde_json::to_string_pretty(&spec(cfg, policy)?).expect("spec serialises");
    after.push('\n');
    let path = dir.join(FILE_NAME);
    let before = match std::fs::read_to_string(&path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(ConfigureError::Read { path, source }.into()),
    };
    Ok(Change {
        path,
        before,
        after,
        mode: 0o644,
    })
}

/// What `cdi generate` did.
#[derive(Debug, Clone, Serialize)]
pub struct CdiReport {
    pub path: String,
    pub kind: &'static str,
    pub devices: Vec<String>,
    #[serde(flatten)]
    pub outcome: configure::Outcome,
}

impl Report for CdiReport {
    fn human(&self) -> String {
        use configure::Outcome;
        let what = match &self.outcome {
            Outcome::Unchanged => "unchanged".to_owned(),
            Outcome::WouldChange { diff } => format!("would change:\n{diff}"),
            _ => "written".to_owned(),
        };
        let names: Vec<String> = self
            .devices
            .iter()
            .map(|d| format!("{}={d}", self.kind))
            .collect();
        format!("{}: {what}\ndevices: {}\n", self.path, names.join(" "))
    }
}

/// Writes (atomically, keeping the previous file as a backup) or, with `dry_run`, diffs the
/// spec in `dir`. A second run changes nothing.
///
/// # Errors
/// [`CdiError`]; nothing is written when it fails.
pub fn generate(
    cfg: &Config,
    policy: Option<&Path>,
    dir: &Path,
    dry_run: bool,
) -> Result<CdiReport, CdiError> {
    let change = plan(cfg, policy, dir)?;
    let devices = serde_json::from_str::<Value>(&change.after)
        .ok()
        .and_then(|v| v["devices"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect();
    let outcome = if dry_run {
        if change.changes() {
            configure::Outcome::WouldChange {
                diff: configure::diff(&change),
            }
        } else {
            configure::Outcome::Unchanged
        }
    } else if !change.changes() {
        configure::Outcome::Unchanged
    } else {
        // Derived from the policy alone: rewritten atomically, with no backup beside it (a
        // spec directory is read by every engine; it should hold specs, nothing else).
        let err = |source| ConfigureError::Write {
            path: change.path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        crate::host::state::write_atomic(&change.path, change.after.as_bytes(), 0o644)
            .map_err(err)?;
        std::fs::set_permissions(
            &change.path,
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .map_err(err)?;
        if change.before.is_some() {
            configure::Outcome::Regenerated
        } else {
            configure::Outcome::Created
        }
    };
    Ok(CdiReport {
        path: change.path.display().to_string(),
        kind: KIND,
        devices,
        outcome,
    })
}

/// One profile as `status` and `doctor` list it: what it asks for, or why it is refused.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileStatus {
    /// The CDI device `gpushare.io/share=<name>`.
    pub name: String,
    pub mode: Option<Mode>,
    pub cores: Option<u8>,
    pub memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// Every profile of the policy, checked like a request.
pub fn profiles(cfg: &Config) -> Vec<ProfileStatus> {
    profile::check_all(cfg)
        .into_iter()
        .map(|(name, checked)| match checked {
            Ok(r) => ProfileStatus {
                name,
                mode: Some(r.mode),
                cores: (r.mode != Mode::Timeslice).then_some(r.cores),
                memory: r.memory,
                refused: None,
            },
            Err(e) => ProfileStatus {
                name,
                mode: None,
                cores: None,
                memory: None,
                refused: Some(crate::vocab::chain(&e)),
            },
        })
        .collect()
}

/// `profiles: mps, small (mps, cores 25%, memory 10 GiB), …` and a line per refused one.
pub fn render_profiles(list: &[ProfileStatus]) -> String {
    let served: Vec<String> = list
        .iter()
        .filter(|p| p.refused.is_none())
        .map(|p| {
            let mut what: Vec<String> = Vec::new();
            if !crate::config::BUILTIN_PROFILES.contains(&p.name.as_str()) {
                what.extend(p.mode.map(|m| m.to_string()));
                what.extend(p.cores.map(|c| format!("cores {c}%")));
                what.extend(
                    p.memory
                        .map(|m| format!("memory {}", crate::vocab::size::human(m))),
                );
            }
            if what.is_empty() {
                p.name.clone()
            } else {
                format!("{} ({})", p.name, what.join(", "))
            }
        })
        .collect();
    let mut out = format!("profiles (CDI {KIND}=<name>): {}\n", served.join(", "));
    for p in list {
        if let Some(why) = &p.refused {
            out.push_str(&format!("  profile {} refused: {why}\n", p.name));
        }
    }
    out
}

/// The directories `doctor` looks in for an installed spec (where engines read them).
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", DEFAULT_DIR];

/// What `doctor` says of the CDI side: the profiles (a refused one fails), and each installed
/// spec: up to date with the policy, or stale (regenerate). `(name, verdict, detail)` with
/// verdict 0 ok, 1 warn, 2 fail.
pub fn doctor_findings(
    cfg: &Config,
    policy: Option<&Path>,
    dirs: &[&Path],
) -> Vec<(String, u8, String)> {
    let list = profiles(cfg);
    let refused: Vec<String> = list
        .iter()
        .filter_map(|p| p.refused.as_ref().map(|why| format!("{}: {why}", p.name)))
        .collect();
    let mut out = vec![if refused.is_empty() {
        (
            "profiles".to_owned(),
            0,
            render_profiles(&list).trim_end().to_owned(),
        )
    } else {
        (
            "profiles".to_owned(),
            2,
            format!(
                "refused by this node's policy (fix [profiles] or the policy's limits): {}",
                refused.join("; ")
            ),
        )
    }];
    let mut any = false;
    for dir in dirs {
        let Ok(change) = plan(cfg, policy, dir) else {
            continue;
        };
        let Some(_) = &change.before else {
            continue;
        };
        any = true;
        let path = change.path.display();
        out.push(if change.changes() {
            (
                "cdi spec".to_owned(),
                1,
                format!("{path} does not match the policy (profiles or paths changed); run `gpushare-hook cdi generate --output {}`", dir.display()),
            )
        } else {
            ("cdi spec".to_owned(), 0, format!("{path} is up to date with the policy"))
        });
    }
    if !any {
        out.push((
            "cdi spec".to_owned(),
            1,
            format!(
                "no {FILE_NAME} in {}: CDI engines cannot take --device {KIND}=…; run `gpushare-hook cdi generate`",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" or ")
            ),
        ));
    }
    out
}

/// The default output directory.
pub fn default_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Config {
        Config::parse(text, Path::new("t.toml")).unwrap()
    }

    fn device<'a>(spec: &'a Value, name: &str) -> &'a Value {
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("no device {name} in {spec:#}"))
    }

    #[test]
    fn one_device_per_mode_and_profile_with_hooks_and_env() {
        let cfg = policy(
            "[runtime]\nhook = \"/opt/gs/gpushare-hook\"\n\
             [profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"10Gi\"\n",
        );
        let s = spec(&cfg, Some(Path::new("/etc/gs.toml"))).unwrap();
        assert_eq!(
            (s["cdiVersion"].as_str(), s["kind"].as_str()),
            (Some("0.3.0"), Some(KIND))
        );
        let names: Vec<&str> = s["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["mps", "timeslice", "limit", "small"]);
        let small = &device(&s, "small")["containerEdits"];
        assert_eq!(
            small["env"],
            json!([
                "GPUSHARE_PROFILE=small",
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"
            ])
        );
        assert_eq!(
            small["hooks"],
            json!([
                {"hookName": "createRuntime", "path": "/opt/gs/gpushare-hook",
                 "args": ["gpushare-hook", "createRuntime", "--profile", "small"],
                 "env": ["GPUSHARE_CONFIG=/etc/gs.toml"]},
                {"hookName": "poststop", "path": "/opt/gs/gpushare-hook",
                 "args": ["gpushare-hook", "poststop"],
                 "env": ["GPUSHARE_CONFIG=/etc/gs.toml"]}
            ])
        );
        let limit = &device(&s, "limit")["containerEdits"];
        assert_eq!(limit["env"], json!(["GPUSHARE_PROFILE=limit"]));
        let default = spec(&cfg, None).unwrap();
        let hook = &device(&default, "limit")["containerEdits"]["hooks"][0];
        assert!(
            hook.get("env").is_none(),
            "default policy: nothing handed on: {hook}"
        );
    }

    #[test]
    fn modes_the_policy_forbids_are_left_out_and_bad_profiles_refused() {
        let cfg = policy("[policy]\nmodes = [\"mps\"]\n");
        let s = spec(&cfg, None).unwrap();
        assert_eq!(s["devices"].as_array().unwrap().len(), 1);
        assert_eq!(s["devices"][0]["name"], "mps");
        let cfg = policy("[policy]\nmax_cores = 50\ndefault_cores = 50\n[profiles.big]\nmode = \"mps\"\ncores = 80\n");
        let e = spec(&cfg, None).unwrap_err();
        assert!(crate::vocab::chain(&e).contains("profile big"), "{e}");
    }

    #[test]
    fn doctor_says_whether_the_installed_spec_is_stale() {
        let t = tempfile::tempdir().unwrap();
        let cfg = policy("[profiles.small]\nmode = \"mps\"\ncores = 25\n");
        let dirs = [t.path()];
        let names = |f: &[(String, u8, String)]| {
            f.iter()
                .map(|(n, v, _)| (n.clone(), *v))
                .collect::<Vec<_>>()
        };
        let none = doctor_findings(&cfg, None, &dirs);
        assert_eq!(
            names(&none),
            [("profiles".into(), 0), ("cdi spec".into(), 1)],
            "{none:?}"
        );
        assert!(none[0].2.contains("small (mps, cores 25%)"), "{none:?}");
        generate(&cfg, None, t.path(), false).unwrap();
        let fresh = doctor_findings(&cfg, None, &dirs);
        assert_eq!(names(&fresh)[1], ("cdi spec".into(), 0), "{fresh:?}");
        let changed = policy("[profiles.big]\nmode = \"mps\"\ncores = 50\n");
        let stale = doctor_findings(&changed, None, &dirs);
        assert_eq!(names(&stale)[1], ("cdi spec".into(), 1), "{stale:?}");
        assert!(
            stale[1].2.contains("does not match the policy"),
            "{stale:?}"
        );
        let bad = policy("[policy]\nmax_cores = 50\ndefault_cores = 50\n[profiles.big]\nmode = \"mps\"\ncores = 80\n");
        let refused = doctor_findings(&bad, None, &dirs);
        assert_eq!(names(&refused)[0], ("profiles".into(), 2), "{refused:?}");
        assert!(refused[0].2.contains("big: profile big"), "{refused:?}");
    }

    #[test]
    fn generate_writes_once_and_then_changes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let cfg = policy("");
        let first = generate(&cfg, None, t.path(), false).unwrap();
        assert_eq!(first.outcome, configure::Outcome::Created);
        let path = t.path().join(FILE_NAME);
        let written = std::fs::read_to_string(&path).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        let second = generate(&cfg, None, t.path(), false).unwrap();
        assert_eq!(second.outcome, configure::Outcome::Unchanged);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written);
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()),
            ino,
            "an unchanged spec is not rewritten"
        );
        let changed = policy("[profiles.small]\nmode = \"limit\"\nmemory = \"1Gi\"\n");
        let third = generate(&changed, None, t.path(), false).unwrap();
        assert_eq!(third.outcome, configure::Outcome::Regenerated);
        assert!(third.devices.contains(&"small".to_owned()));
        // Nothing but the spec: no backup, no temp file left behind.
        let names: Vec<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [FILE_NAME], "{names:?}");
    }
}
