//! `configure`: `--remove` undoes each engine's configure (atomic, with a backup, a second run
//! changes nothing); a relative `--path` works; a replaced gpushare entry is reported with its
//! old value; a runtime that does not exist is refused unless `--allow-missing`.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::Sandbox;

/// Debian 12's stock /etc/containerd/config.toml (package containerd 1.6), as shipped.
const DEBIAN_CONTAINERD: &str = r#"version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"#;

/// A daemon.json as admins have it: another runtime, a log driver.
const DAEMON_JSON: &str = r#"{
  "log-driver": "journald",
  "runtimes": {
    "nvidia": {
      "path": "nvidia-container-runtime"
    }
  }
}
"#;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A sandbox whose `[runtime] hook` is the built binary (so gpushare-runtime exists next to it).
fn sandbox() -> Sandbox {
    let sb = Sandbox::new(1);
    sb.write_config(&format!("[runtime]\nhook = {:?}\n", common::hook_bin()));
    sb
}

/// `gpushare-hook ARGS` in the sandbox's env, from directory `cwd`.
fn hook_in(sb: &Sandbox, cwd: &Path, args: &[&str]) -> Output {
    Command::new(common::hook_bin())
        .args(args)
        .env_clear()
        .envs(sb.env())
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run gpushare-hook")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn backups(dir: &Path, name: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{name}.bak-"))
        })
        .count()
}

#[test]
fn a_relative_path_is_written_and_reported_as_the_file_it_is() {
    let sb = sandbox();
    std::fs::write(sb.path().join("daemon.json"), DAEMON_JSON).unwrap();
    let out = hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", "daemon.json"],
    );
    let o = ok(&out);
    let abs = sb.path().join("daemon.json");
    assert!(
        o.contains(&format!("written {} (backup", abs.display())),
        "{o}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&abs).unwrap()).unwrap();
    assert!(v["runtimes"]["gpushare"]["path"]
        .as_str()
        .unwrap()
        .contains("gpushare-runtime"));
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(
        log.contains(&format!("configured docker: wrote {}", abs.display())),
        "the log line names the file: {log}"
    );
}

#[test]
fn a_replaced_entry_is_reported_with_its_old_value() {
    let sb = sandbox();
    let f = sb.path().join("daemon.json");
    std::fs::write(
        &f,
        r#"{"runtimes": {"gpushare": {"path": "/opt/old/gpushare-runtime", "runtimeArgs": ["--debug"]}}}"#,
    )
    .unwrap();
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", f.to_str().unwrap()],
    ));
    assert!(
        o.contains(&format!(
            "replaced runtimes.gpushare in {}; it was: {{\"path\":\"/opt/old/gpushare-runtime\",\"runtimeArgs\":[\"--debug\"]}}",
            f.display()
        )),
        "{o}"
    );
    // A second run replaces nothing and says nothing about it.
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", f.to_str().unwrap()],
    ));
    assert!(!o.contains("replaced"), "{o}");
}

#[test]
fn a_runtime_that_does_not_exist_is_refused_unless_allowed() {
    let sb = Sandbox::new(1);
    sb.write_config("[runtime]\nhook = \"/nonexistent/bin/gpushare-hook\"\n");
    let f = sb.path().join("daemon.json");
    std::fs::write(&f, DAEMON_JSON).unwrap();
    let fs = f.to_str().unwrap();
    let out = hook_in(&sb, sb.path(), &["configure", "docker", "--path", fs]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(
        text(&out.stderr),
        "gpushare-hook: /nonexistent/bin/gpushare-runtime does not exist, and the engine's entry would run it; install gpushare there, fix [runtime] hook in the policy, or pass --allow-missing to write it anyway\n"
    );
    assert_eq!(
        std::fs::read_to_string(&f).unwrap(),
        DAEMON_JSON,
        "untouched"
    );
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", fs, "--allow-missing"],
    ));
    assert!(o.contains("written"), "{o}");
    // The entry runs the launcher of this (non-default) policy, which runs the missing runtime.
    let launcher = sb.path().join("gpushare-runtime-config");
    assert!(std::fs::read_to_string(&f)
        .unwrap()
        .contains(launcher.to_str().unwrap()));
    assert!(std::fs::read_to_string(&launcher)
        .unwrap()
        .contains("'/nonexistent/bin/gpushare-runtime'"));
}

/// configure, then `--remove` twice: the file is back to what it held (other entries kept),
/// the removal made a backup, and the second removal changes nothing.
fn round_trip(sb: &Sandbox, engine: &str, file: &Path, original: &str, extra: &[&str]) {
    let fs = file.to_str().unwrap();
    std::fs::write(file, original).unwrap();
    let mut args = vec!["configure", engine, "--path", fs];
    args.extend_from_slice(extra);
    ok(&hook_in(sb, sb.path(), &args));
    let configured = std::fs::read_to_string(file).unwrap();
    assert_ne!(
        configured, original,
        "{engine}: positive control: configure wrote"
    );
    let before = backups(
        file.parent().unwrap(),
        file.file_name().unwrap().to_str().unwrap(),
    );
    args.push("--remove");
    let o = ok(&hook_in(sb, sb.path(), &args));
    assert!(
        o.contains(&format!("written {fs} (backup")),
        "{engine}: {o}"
    );
    let after = std::fs::read_to_string(file).unwrap();
    assert_eq!(
        after, original,
        "{engine}: back to the original, byte for byte"
    );
    assert_eq!(
        backups(
            file.parent().unwrap(),
            file.file_name().unwrap().to_str().unwrap()
        ),
        before + 1,
        "{engine}: a backup of the configured file"
    );
    let o = ok(&hook_in(sb, sb.path(), &args));
    assert!(o.contains("nothing to remove"), "{engine}: {o}");
    assert_eq!(std::fs::read_to_string(file).unwrap(), original);
}

#[test]
fn remove_undoes_docker_containerd_and_nvidia_chaining() {
    let sb = sandbox();
    let d = sb.path().join("daemon.json");
    round_trip(&sb, "docker", &d, DAEMON_JSON, &[]);
    let c = sb.path().join("containerd.toml");
    round_trip(&sb, "containerd", &c, DEBIAN_CONTAINERD, &[]);
    round_trip(
        &sb,
        "containerd",
        &c,
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = \"runc\"\n",
        &[],
    );
    let n = sb.path().join("nvidia.toml");
    round_trip(
        &sb,
        "nvidia-container-runtime",
        &n,
        "[nvidia-container-runtime]\nruntimes = [\"docker-runc\", \"runc\"]\n",
        &["--order", "nvidia-first"],
    );
    // An entry someone else owns (not gpushare-runtime) is left alone.
    let theirs = "{\"runtimes\": {\"gpushare\": {\"path\": \"/usr/bin/other-runtime\"}}}\n";
    std::fs::write(&d, theirs).unwrap();
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &[
            "configure",
            "docker",
            "--path",
            d.to_str().unwrap(),
            "--remove",
        ],
    ));
    assert!(o.contains("nothing to remove"), "{o}");
    assert_eq!(std::fs::read_to_string(&d).unwrap(), theirs);
}

#[test]
fn remove_undoes_podman_and_crio_with_their_hook_files() {
    let sb = sandbox();
    let hooks = sb.path().join("hooks");
    let hs = hooks.to_str().unwrap();
    let pc = sb.path().join("50-gpushare.conf");
    let pcs = pc.to_str().unwrap();
    ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "podman", "--path", pcs, "--hooks-dir", hs],
    ));
    let files = [
        hooks.join("hooks.d/gpushare-createRuntime.json"),
        hooks.join("hooks.d/gpushare-poststop.json"),
        hooks.join("hooks.d-podman/gpushare-precreate.json"),
    ];
    assert!(files.iter().all(|f| f.exists()), "positive control");
    // A second configure with another policy path rewrites them: backups beside each.
    let other = sb.path().join("other.toml");
    std::fs::copy(sb.config_path(), &other).unwrap();
    ok(&hook_in(
        &sb,
        sb.path(),
        &[
            "configure",
            "podman",
            "--path",
            pcs,
            "--hooks-dir",
            hs,
            "--policy-at",
            other.to_str().unwrap(),
        ],
    ));
    assert_eq!(
        backups(&hooks.join("hooks.d-podman"), "gpushare-precreate.json"),
        1,
        "positive control: a backup was made"
    );
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &[
            "configure",
            "podman",
            "--path",
            pcs,
            "--hooks-dir",
            hs,
            "--remove",
        ],
    ));
    assert!(o.contains(&format!("removed {pcs}")), "{o}");
    // Nothing of gpushare's is left in its directories: no backups either.
    for d in [hooks.join("hooks.d"), hooks.join("hooks.d-podman")] {
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", d.display());
    }
    for f in &files {
        assert!(!f.exists(), "{} removed: {o}", f.display());
        assert!(o.contains(&format!("removed {}", f.display())), "{o}");
    }
    assert!(!pc.exists(), "the drop-in, left empty, is removed");
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &[
            "configure",
            "podman",
            "--path",
            pcs,
            "--hooks-dir",
            hs,
            "--remove",
        ],
    ));
    assert!(o.contains("nothing to remove"), "{o}");

    // CRI-O: a drop-in that also holds the admin's own setting keeps it.
    let cc = sb.path().join("10-gpushare.conf");
    let ccs = cc.to_str().unwrap();
    std::fs::write(&cc, "[crio.runtime]\nlog_level = \"info\"\n").unwrap();
    ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "crio", "--path", ccs, "--hooks-dir", hs],
    ));
    assert!(files[0].exists(), "positive control");
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &[
            "configure",
            "crio",
            "--path",
            ccs,
            "--hooks-dir",
            hs,
            "--remove",
        ],
    ));
    assert!(!files[0].exists() && !files[1].exists(), "{o}");
    let left: toml::Table = std::fs::read_to_string(&cc).unwrap().parse().unwrap();
    assert_eq!(
        left,
        "[crio.runtime]\nlog_level = \"info\"\n"
            .parse::<toml::Table>()
            .unwrap(),
        "only gpushare's part removed"
    );
}

#[test]
fn remove_dry_run_writes_nothing() {
    let sb = sandbox();
    let d = sb.path().join("daemon.json");
    std::fs::write(&d, DAEMON_JSON).unwrap();
    let ds = d.to_str().unwrap();
    ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", ds],
    ));
    let configured = std::fs::read_to_string(&d).unwrap();
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", ds, "--remove", "--dry-run"],
    ));
    assert!(o.contains("-    \"gpushare\""), "{o}");
    assert_eq!(std::fs::read_to_string(&d).unwrap(), configured);
}

/// The node-wide CDI spec follows the policy only when `configure` runs on the node's own
/// engine files with the node's own policy. Run in a private mount namespace whose /etc is an
/// overlay and /run a tmpfs, so that the node's /etc/cdi and /var/run/cdi are the test's own.
#[test]
fn configure_with_path_or_config_leaves_the_node_wide_cdi_spec_alone() {
    if !common::require(
        "node-wide CDI spec in a mount namespace",
        &["unshare", "mount"],
    ) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "\n******** SKIPPED: node-wide CDI spec: needs root (mount namespace) ********\n"
        );
        return;
    }
    let host_spec = std::fs::read("/etc/cdi/gpushare.io-share.json").ok();
    let sb = Sandbox::with_policy(1, "[profiles.small]\nmode = \"mps\"\ncores = 25\n");
    let t = sb.path();
    for d in ["up", "work", "vup", "vwork"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    let script = r#"
set -eu
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$T/up,workdir=$T/work" /etc
mount -t tmpfs gpushare-test /run
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$T/vup,workdir=$T/vwork" /var/lib
H="$HOOK"
SPEC=/etc/cdi/gpushare.io-share.json
mkdir -p /etc/gpushare
printf 'state_dir = "%s/node-state"\nlog_file = "%s/node.log"\n' "$T" "$T" > /etc/gpushare/config.toml
node() { env -u GPUSHARE_CONFIG "$H" "$@"; }
node cdi generate --output /etc/cdi >/dev/null
cp "$SPEC" "$T/spec.0"
echo "== --path"
"$H" configure docker --path "$T/daemon.json" --allow-missing
cmp -s "$SPEC" "$T/spec.0" || { echo "CHANGED by --path"; exit 3; }
echo "== --config"
node --config "$GPUSHARE_CONFIG" configure docker --allow-missing
cmp -s "$SPEC" "$T/spec.0" || { echo "CHANGED by --config"; exit 3; }
echo "== --dry-run --path"
"$H" configure docker --path "$T/daemon.json" --allow-missing --dry-run
cmp -s "$SPEC" "$T/spec.0" || { echo "CHANGED by --dry-run"; exit 3; }
echo "== --path --cdi-dir"
"$H" configure docker --path "$T/daemon.json" --allow-missing --cdi-dir /etc/cdi
grep -q '"name": "small"' "$SPEC" || { echo "NOT WRITTEN with --cdi-dir"; exit 4; }
echo "== node's own"
printf '[profiles.nodes]\nmode = "timeslice"\n' >> /etc/gpushare/config.toml
node configure docker --allow-missing
grep -q '"name": "nodes"' "$SPEC" || { echo "NOT FOLLOWED by the node's own run"; exit 5; }
grep -q '"name": "small"' "$SPEC" && { echo "the node's own run kept the test policy"; exit 5; }
echo "== done"
"#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env_clear()
        .envs(sb.env())
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("T", t)
        .env("HOOK", common::hook_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let o = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "exit {:?}:\n{o}", out.status);
    assert!(o.contains("== done"), "{o}");
    // Each run that does not own the node says what it would write, and that it did not.
    let path_run = &o[o.find("== --path\n").unwrap()..o.find("== --config").unwrap()];
    assert!(
        path_run.contains("left alone /etc/cdi/gpushare.io-share.json") && path_run.contains("+"),
        "{path_run}"
    );
    assert!(
        path_run.contains("\"small\""),
        "the diff names the device: {path_run}"
    );
    assert_eq!(
        std::fs::read("/etc/cdi/gpushare.io-share.json").ok(),
        host_spec,
        "the test changed the host's /etc/cdi"
    );
}

/// A daemon.json that configure created holds nothing but gpushare's entry: `--remove` deletes
/// it instead of leaving `{}`.
#[test]
fn remove_deletes_a_daemon_json_that_configure_created() {
    let sb = sandbox();
    let f = sb.path().join("docker/daemon.json");
    let fs = f.to_str().unwrap();
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", fs],
    ));
    assert!(
        o.contains(&format!("created {fs}")),
        "positive control: {o}"
    );
    let o = ok(&hook_in(
        &sb,
        sb.path(),
        &["configure", "docker", "--path", fs, "--remove"],
    ));
    assert!(o.contains(&format!("removed {fs}")), "{o}");
    let left: Vec<_> = std::fs::read_dir(f.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}: {o}");
}
