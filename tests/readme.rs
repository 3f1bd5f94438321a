//! The README's and the install guide's shell examples, as written: every `gpushare-hook`
//! command in their ```sh blocks runs on a node whose policy selects the TEST-ONLY simulated
//! driver, in a private mount namespace (an overlay over /etc, a tmpfs on /run) so that the
//! node's own files are the test's. A command that a change of the CLI made wrong fails here.
//! The engine blocks of both (podman, docker, ctr, CDI, CRI-O, nvidia-container-runtime), every
//! line with the engines' own commands, are run as written by tests/engines/readme_engines.sh,
//! not here.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

/// The `gpushare-hook …` commands of the ```sh blocks of `file`, comments dropped, `&&` lists
/// split.
fn examples(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = line.split(" #").next().unwrap_or("");
        for part in code.split("&&") {
            let part = part.trim();
            if part.starts_with("gpushare-hook ") || part == "gpushare-hook" {
                out.push(part.to_owned());
            }
        }
    }
    out
}

#[test]
fn the_readme_and_install_examples_run_as_written_on_the_simulated_driver() {
    if !common::require(
        "README examples in a mount namespace",
        &["unshare", "mount"],
    ) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("\n******** SKIPPED: README examples: need root (mount namespace) ********\n");
        return;
    }
    let mut cmds = examples("README.md");
    let readme = cmds.len();
    cmds.extend(examples("docs/install.md"));
    assert!(
        readme >= 8 && cmds.len() > readme,
        "positive control: examples found: {cmds:?}"
    );
    let sb = common::Sandbox::new(1);
    let t = sb.path();
    for d in ["up", "work", "state", "vup", "vwork"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    let bin = common::hook_bin().parent().unwrap().to_owned();
    // The node's policy: the simulated driver, this test's state and log, the built binaries.
    let policy = format!(
        "state_dir = \"{t}/state\"\nlog_file = \"{t}/node.log\"\n[nvml]\nlibrary = \"{sim}\"\n[runtime]\nhook = \"{hook}\"\n[limit]\nlibrary = \"{bin}/libgpushare_limiter.so\"\n",
        t = t.display(),
        sim = common::simdriver().display(),
        hook = common::hook_bin().display(),
        bin = bin.display(),
    );
    let mut script = String::from(
        "set -u\nmount -t overlay overlay -o \"lowerdir=/etc,upperdir=$T/up,workdir=$T/work\" /etc || exit 90\nmount -t tmpfs gpushare-test /run || exit 90\nmount -t overlay overlay -o \"lowerdir=/var/lib,upperdir=$T/vup,workdir=$T/vwork\" /var/lib || exit 90\nmkdir -p /etc/gpushare && printf '%s' \"$POLICY\" > /etc/gpushare/config.toml\n",
    );
    for (i, c) in cmds.iter().enumerate() {
        // doctor exits 1 when a check fails on this machine; every other command exits 0.
        let ok = if c.starts_with("gpushare-hook doctor") {
            "[ $rc -le 1 ]"
        } else {
            "[ $rc -eq 0 ]"
        };
        script.push_str(&format!(
            "echo '== {i}: {c}'\n{c} > \"$T/out.{i}\" 2>&1; rc=$?\ncat \"$T/out.{i}\"\n{ok} || {{ echo \"FAILED ({{rc}}): {c}\"; exit 1; }}\n",
        ).replace("{rc}", "$rc"));
    }
    script.push_str("echo '== done'\n");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()),
        )
        .env("GPUSHARE_SIM_STATE", sb.sim_state())
        .env("T", t)
        .env("POLICY", policy)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let o = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{o}");
    assert!(out.status.success(), "exit {:?}:\n{o}", out.status);
    assert!(o.contains("== done"), "{o}");
    // What they did, on the simulated driver.
    assert!(
        o.contains("TEST-ONLY"),
        "doctor names the simulated driver: {o}"
    );
    assert!(o.contains("gpushare.io/share=mps"), "cdi generate: {o}");
    assert!(
        !Path::new("/etc/cdi/gpushare.io-share.json").exists()
            || std::fs::read_to_string("/etc/cdi/gpushare.io-share.json")
                .is_ok_and(|s| !s.contains(&t.display().to_string())),
        "the test wrote the host's /etc/cdi"
    );
}

/// Every relative link of the README and of docs/ names a file that exists (the README's
/// content moved to docs/; a link left behind would point nowhere).
#[test]
fn the_readme_and_docs_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    let mut checked = 0;
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = rest[..end].split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.contains(' ') {
                continue;
            }
            checked += 1;
            if !f.parent().unwrap().join(target).exists() {
                bad.push(format!("{}: {target}", f.display()));
            }
        }
    }
    assert!(checked >= 20, "positive control: {checked} links checked");
    assert!(bad.is_empty(), "links to nothing: {bad:?}");
}
