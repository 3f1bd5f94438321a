//! `gpushare-runtime`: a drop-in wrapper for runc (docs/design.md "The runtime wrapper").
//!
//! For `create` and `run` it finds the bundle (`--bundle`/`-b`, else the working directory),
//! edits its `config.json` atomically through [`crate::container::prepare::edit_config`], then execs the
//! next runtime (the first found of `[runtime] next`, never itself) with the argv unchanged.
//! For `exec --process FILE` into a container that was given a share, it adds the share's env
//! (as the spec edit put it into the container's `config.json`) to the process file, so that
//! `kubectl exec`, `docker exec` and `ctr task exec` processes get what the main process got.
//! Every other command is exec'd straight through. A container that asks for nothing leaves
//! `config.json` (and any process file) byte-for-byte alone.
//!
//! Its parts: [`args`] reads the command line, [`chain`] finds the next runtime, [`bundle`]
//! edits the bundle, [`next`] runs the next runtime (signals forwarded), [`log`] writes the
//! `--log` line.

mod args;
mod bundle;
mod chain;
mod log;
mod next;
pub mod wrapper_error;

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use crate::config::Config;

pub use args::{parse_args, Args};
pub use bundle::{bundle_may_ask, edit_bundle, edit_exec_process};
pub use chain::{find_next, is_looping, signature, LOOP_GUARD};
pub use log::{log_error, log_line, rfc3339};
pub use next::{exec_next, run_next_child};
pub use wrapper_error::RuntimeError;

/// How a wrapper call ended, when this process did not become the next runtime.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The wrapper failed before the next runtime ran: the one-line message.
    Failed(String),
    /// The next runtime ran as a child and exited with this status (ours to exit with).
    Next(u8),
}

/// The whole wrapper. Usually this process becomes the next runtime (exec) and this returns
/// only on failure. For a `create` whose edit made the container's per-container directory, the
/// next runtime runs as a child instead (signals forwarded, its exit status returned), so that
/// the directory can be removed when the create fails before any hook of the container ran.
/// A policy file that cannot be loaded fails only the containers that may ask for sharing; the
/// others run with the default `[runtime] next`.
pub fn run(argv: &[OsString], args: &Args) -> Ended {
    if is_looping(argv) {
        return Ended::Failed(RuntimeError::Loop("started by itself".into()).to_string());
    }
    // GPUSHARE_CONFIG, else the default file; the wrapper has no flags of its own.
    let source = crate::config::Source::resolve(None);
    let loaded = Config::load_from(&source);
    let cfg = loaded.as_ref().cloned().unwrap_or_default();
    let me = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let next = match find_next(&cfg.runtime.next, &me, std::env::var_os("PATH").as_deref()) {
        Ok(n) => n,
        Err(e) => return Ended::Failed(crate::vocab::chain(&e)),
    };
    if wants_edit(args) {
        match &loaded {
            Ok(cfg) => {
                let open = || crate::host::inventory::open_for_planning(cfg);
                let dir = made_here(args, cfg);
                let had = dir.as_ref().is_some_and(|d| d.exists());
                if let Err(e) = edit_bundle(args, cfg, source.to_hand_on(), &open) {
                    // Nothing runs this container: a directory made for it goes too.
                    if let Some(d) = dir.filter(|d| !had && d.exists()) {
                        let _ = crate::host::mounts::remove_container_dir(&d);
                    }
                    let message = crate::vocab::chain(&e);
                    // No hook of this container runs: the refusal is counted and written here.
                    crate::container::error::record_refusal(
                        cfg,
                        args.id.as_deref().unwrap_or("?"),
                        e.reason(),
                        &message,
                    );
                    return Ended::Failed(message);
                }
                if let Some(dir) = dir.filter(|d| !had && d.exists()) {
                    return match run_next_child(&next, argv) {
                        Ok(0) => Ended::Next(0),
                        Ok(code) => {
                            // The create failed: no container has this id, so nothing will
                            // ever release the directory this call made for it.
                            let _ = crate::host::mounts::remove_container_dir(&dir);
                            Ended::Next(code)
                        }
                        Err(e) => {
                            let _ = crate::host::mounts::remove_container_dir(&dir);
                            Ended::Failed(crate::vocab::chain(&e))
                        }
                    };
                }
            }
            Err(e) if bundle_may_ask(args) => {
                let message = crate::vocab::chain(e);
                crate::container::error::record_refusal(
                    &cfg,
                    args.id.as_deref().unwrap_or("?"),
                    "policy",
                    &message,
                );
                return Ended::Failed(message);
            }
            Err(_) => {}
        }
    }
    if args.command.as_deref() == Some("exec") {
        if let Err(e) = edit_exec_process(argv, args, &next) {
            return Ended::Failed(crate::vocab::chain(&e));
        }
    }
    Ended::Failed(crate::vocab::chain(&exec_next(&next, argv)))
}

/// The per-container directory a `create` of a known, safe id may make (`None` for other
/// commands, where the runtime is exec'd as always).
fn made_here(args: &Args, cfg: &Config) -> Option<PathBuf> {
    let id = args
        .id
        .as_deref()
        .filter(|id| crate::vocab::is_safe_name(id))?;
    (args.command.as_deref() == Some("create"))
        .then(|| crate::host::state::StateDir::new(&cfg.state_dir).container_dir(id))
}

/// What the wrapper prints itself before the next runtime answers `--version`/`-v` or
/// `--help`/`-h`/`help` (given before any command): its own version or help first.
pub fn own_answer(argv: &[OsString], args: &Args) -> Option<String> {
    let before_command: Vec<&OsStr> = argv
        .iter()
        .map(OsString::as_os_str)
        .take_while(|a| a.to_string_lossy().starts_with('-'))
        .collect();
    let has = |f: &[&str]| before_command.iter().any(|a| f.iter().any(|x| a == x));
    if args.command.is_none() && has(&["--version", "-v"]) {
        return Some(format!("gpushare-runtime version {}\n", crate::VERSION));
    }
    if has(&["--help", "-h"]) || (args.command.as_deref() == Some("help") && argv.len() == 1) {
        return Some(format!(
            "gpushare-runtime {}: a runc wrapper that shares NVIDIA GPUs between containers.\n\
             For `create` and `run` it edits the bundle's config.json for a container that asks\n\
             for a share (gpu.share* annotations, or GPU_SHARE* env), then runs the next runtime\n\
             ([runtime] next of the policy file: $GPUSHARE_CONFIG, else {}) with the same\n\
             arguments. Every other command goes straight to the next runtime.\n\
             It has no options of its own; the next runtime's help follows.\n\n",
            crate::VERSION,
            crate::config::DEFAULT_PATH
        ));
    }
    None
}

/// Whether the command edits a bundle.
pub fn wants_edit(args: &Args) -> bool {
    matches!(args.command.as_deref(), Some("create" | "run"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn args(s: &[&str]) -> Args {
        parse_args(&s.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn parses_runc_command_lines() {
        let rows: Vec<(&str, Vec<&str>, Args)> = vec![
            (
                "containerd shim",
                vec![
                    "--root",
                    "/r",
                    "--log",
                    "/b/log.json",
                    "--log-format",
                    "json",
                    "create",
                    "--bundle",
                    "/b",
                    "--pid-file",
                    "/b/pid",
                    "c1",
                ],
                Args {
                    log: Some("/b/log.json".into()),
                    log_format: Some("json".into()),
                    command: Some("create".into()),
                    bundle: Some("/b".into()),
                    id: Some("c1".into()),
                    command_at: Some(6),
                    ..Args::default()
                },
            ),
            (
                "docker style with = and -b",
                vec![
                    "--log=/l",
                    "run",
                    "-b",
                    "/b",
                    "-d",
                    "--console-socket",
                    "/s",
                    "c2",
                ],
                Args {
                    log: Some("/l".into()),
                    log_format: None,
                    command: Some("run".into()),
                    bundle: Some("/b".into()),
                    id: Some("c2".into()),
                    command_at: Some(1),
                    ..Args::default()
                },
            ),
            (
                "no bundle",
                vec!["create", "--bundle=/x", "c3"],
                Args {
                    log: None,
                    log_format: None,
                    command: Some("create".into()),
                    bundle: Some("/x".into()),
                    id: Some("c3".into()),
                    command_at: Some(0),
                    ..Args::default()
                },
            ),
            (
                "other command",
                vec!["--debug", "delete", "--force", "c4"],
                Args {
                    log: None,
                    log_format: None,
                    command: Some("delete".into()),
                    bundle: None,
                    id: Some("c4".into()),
                    command_at: Some(1),
                    ..Args::default()
                },
            ),
            ("nothing", vec![], Args::default()),
            (
                "containerd shim exec",
                vec![
                    "--root",
                    "/r",
                    "--log",
                    "/b/log.json",
                    "--log-format",
                    "json",
                    "exec",
                    "--process",
                    "/b/.p.json",
                    "--detach",
                    "--pid-file",
                    "/b/e.pid",
                    "c5",
                ],
                Args {
                    log: Some("/b/log.json".into()),
                    log_format: Some("json".into()),
                    command: Some("exec".into()),
                    id: Some("c5".into()),
                    process: Some("/b/.p.json".into()),
                    command_at: Some(6),
                    ..Args::default()
                },
            ),
            (
                "exec with a command line whose flags are not ours",
                vec![
                    "exec", "-e", "A=1", "--cwd", "/", "-t", "c6", "sh", "-c", "-b", "/x", "-p",
                    "/y",
                ],
                Args {
                    command: Some("exec".into()),
                    id: Some("c6".into()),
                    command_at: Some(0),
                    ..Args::default()
                },
            ),
            (
                "exec -p=FILE",
                vec!["exec", "-p=/f", "c7"],
                Args {
                    command: Some("exec".into()),
                    id: Some("c7".into()),
                    process: Some("/f".into()),
                    command_at: Some(0),
                    ..Args::default()
                },
            ),
        ];
        for (what, argv, want) in rows {
            assert_eq!(args(&argv), want, "{what}");
        }
    }

    #[test]
    fn next_runtime_is_never_itself() {
        let t = tempfile::tempdir().unwrap();
        let me = t.path().join("me");
        std::fs::write(&me, b"#!/bin/sh\n").unwrap();
        let link = t.path().join("runc");
        std::fs::hard_link(&me, &link).unwrap();
        let other = t.path().join("crun");
        std::fs::write(&other, b"#!/bin/sh\n").unwrap();
        let dir = t.path().as_os_str();
        // Only itself (under another name): a loop.
        let e = find_next(&["runc".into()], &me, Some(dir)).unwrap_err();
        assert!(matches!(e, RuntimeError::Loop(_)), "{e}");
        // Itself first, then a real one.
        assert_eq!(
            find_next(&["runc".into(), "crun".into()], &me, Some(dir)).unwrap(),
            other
        );
        // Nothing at all.
        let e = find_next(&["/nonexistent/runc".into()], &me, Some(dir)).unwrap_err();
        assert!(matches!(e, RuntimeError::NoNext(_)));
    }

    #[test]
    fn own_version_and_help_come_first() {
        let rows: &[(&str, &[&str], Option<&str>)] = &[
            (
                "--version",
                &["--version"],
                Some("gpushare-runtime version "),
            ),
            ("-v", &["-v"], Some("gpushare-runtime version ")),
            ("--help", &["--help"], Some("gpushare-runtime 0")),
            ("help command", &["help"], Some("gpushare-runtime 0")),
            ("a create", &["create", "--bundle", "/b", "c"], None),
            (
                "a container named -v? no: after the command",
                &["state", "-v"],
                None,
            ),
        ];
        for (what, argv, want) in rows {
            let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
            let got = own_answer(&argv, &parse_args(&argv));
            match want {
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.starts_with(w)),
                    "{what}: {got:?}"
                ),
                None => assert_eq!(got, None, "{what}"),
            }
        }
    }

    #[test]
    fn log_lines_in_both_formats() {
        let v: serde_json::Value = serde_json::from_str(&log_line("bad \"x\"", true)).unwrap();
        assert_eq!(v["level"], "error");
        assert!(v["msg"].as_str().unwrap().contains("bad \"x\""));
        let text = log_line("bad \"x\"", false);
        assert!(
            text.starts_with("time=\"") && text.contains(" level=error msg="),
            "{text}"
        );
        assert!(
            text.ends_with(r#"msg="gpushare-runtime: bad \"x\"""#),
            "{text}"
        );
        let a = parse_args(&[
            "--log-format=json".into(),
            "--log".into(),
            "/l".into(),
            "state".into(),
        ]);
        assert_eq!(a.log_format.as_deref(), Some("json"));
        assert_eq!(a.log.as_deref(), Some(Path::new("/l")));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3661), "2000-02-29T01:01:01Z");
        assert_eq!(rfc3339(1_795_321_481), "2026-11-22T04:24:41Z");
    }

    #[test]
    fn exec_process_files_get_the_share_env_of_edited_containers_only() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let bundle = t.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        // A next runtime that answers `state` for container c1 only, and checks it was given
        // the global flags.
        let next = t.path().join("runc");
        std::fs::write(
            &next,
            format!(
                "#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"--root /r state c1\" ] || exit 1\n\
                 echo '{{\"ociVersion\":\"1.0.2\",\"id\":\"c1\",\"status\":\"running\",\"bundle\":\"{}\"}}'\n",
                bundle.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
        let process = t.path().join("process.json");
        let original = br#"{"args":["sh"],"env":["PATH=/bin"],"cwd":"/"}"#;
        let argv = |id: &str, p: &Path| -> Vec<OsString> {
            ["--root", "/r", "exec", "--process"]
                .iter()
                .map(OsString::from)
                .chain([p.as_os_str().to_owned(), id.into()])
                .collect()
        };
        let run_exec = |id: &str| {
            let a = argv(id, &process);
            edit_exec_process(&a, &parse_args(&a), &next)
        };
        let edited = serde_json::json!({
            "process": {"env": ["PATH=/bin", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"]},
            "hooks": {"createRuntime": [{"path": "/usr/bin/gpushare-hook",
                                         "args": ["gpushare-hook", "createRuntime"]}]}
        });
        let plain = serde_json::json!({"process": {"env": ["PATH=/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"]}});

        // (description, bundle config, container id, changed)
        let rows: Vec<(&str, Option<&serde_json::Value>, &str, bool)> = vec![
            ("share container", Some(&edited), "c1", true),
            ("container without a share", Some(&plain), "c1", false),
            ("unknown container", Some(&edited), "c2", false),
            ("bundle without config.json", None, "c1", false),
        ];
        for (what, config, id, changed) in rows {
            let _ = std::fs::remove_file(bundle.join("config.json"));
            if let Some(c) = config {
                std::fs::write(bundle.join("config.json"), c.to_string()).unwrap();
            }
            std::fs::write(&process, original).unwrap();
            std::fs::set_permissions(&process, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(run_exec(id).unwrap(), changed, "{what}");
            let got = std::fs::read(&process).unwrap();
            if changed {
                let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
                assert_eq!(
                    v["env"],
                    serde_json::json!([
                        "PATH=/bin",
                        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"
                    ]),
                    "{what}"
                );
                assert_eq!(v["cwd"], "/", "{what}");
                let mode = std::fs::metadata(&process).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{what}: mode kept");
            } else {
                assert_eq!(got, original, "{what}: untouched");
            }
        }

        // A share container's process file that is not JSON: refused, left as it was.
        std::fs::write(bundle.join("config.json"), edited.to_string()).unwrap();
        std::fs::write(&process, b"{not json").unwrap();
        let e = run_exec("c1").unwrap_err();
        assert!(crate::vocab::chain(&e).contains("not JSON"), "{e}");
        assert_eq!(std::fs::read(&process).unwrap(), b"{not json");
        // No --process (runc exec with the command on its command line): nothing to do.
        let a: Vec<OsString> = ["exec", "c1", "sh"].iter().map(OsString::from).collect();
        assert!(!edit_exec_process(&a, &parse_args(&a), &next).unwrap());
        // Nothing left behind in the process file's directory but the files we made.
        let mut names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["bundle", "process.json", "runc"]);
    }
}
