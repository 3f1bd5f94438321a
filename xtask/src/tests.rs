//! The generated pages and completions against the code: every policy key documented with its
//! default, the runtime page from its help, and bash completion that completes subcommands and
//! their flags (zsh and fish syntax-checked).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::keys::{defaults, KEYS, OPTIONAL};
use super::pages::{config_page, runtime_page};

fn skip_or_fail(what: &str) {
    let msg = format!("SKIPPED: {what}");
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{msg} (CI=true)"
    );
    eprintln!("\n******** {msg} ********\n");
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn generated() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("gpushare-xtask-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    super::docs(&out).expect("docs");
    out
}

#[test]
fn every_policy_key_is_documented_with_its_default() {
    let d = defaults();
    assert!(
        d.len() >= 15,
        "positive control: the defaults were read: {d:?}"
    );
    for (k, _) in &d {
        assert!(
            KEYS.iter().any(|(x, _)| x == k),
            "policy key {k} has no entry in xtask/src/keys.rs KEYS"
        );
    }
    for (k, _) in KEYS {
        let optional = OPTIONAL.iter().find(|(o, _)| o == k);
        assert!(
            d.iter().any(|(x, _)| x == k) || optional.is_some(),
            "KEYS names {k}, which the policy does not have"
        );
        if let Some((_, line)) = optional {
            let c = gpushare::config::Config::parse(line, Path::new("t.toml"))
                .unwrap_or_else(|e| panic!("{k}: {e}"));
            assert_ne!(c, gpushare::config::Config::default(), "{k} set");
        }
    }
    let page = config_page();
    for (k, v) in &d {
        let name = k.rsplit('.').next().unwrap();
        assert!(page.contains(&format!("\\fB{name}\\fR")), "{k}: {page}");
        assert!(
            page.contains(&v.replace('-', "\\-")) || page.contains(v),
            "{k} default {v}: {page}"
        );
    }
    assert!(
        page.contains("default_cores") && page.contains("(default: \\fI100\\fR)"),
        "{page}"
    );
}

#[test]
fn the_runtime_page_is_its_own_help() {
    let page = runtime_page().unwrap();
    assert!(page.contains(".TH GPUSHARE-RUNTIME 1"), "{page}");
    assert!(
        page.contains("a runc wrapper that shares NVIDIA GPUs"),
        "{page}"
    );
    assert!(page.contains("GPUSHARE_CONFIG"), "{page}");
}

/// Completions bash offers for the words `line` (the last one being completed).
fn bash_complete(script: &Path, line: &[&str]) -> Vec<String> {
    let words = line
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let prog = format!(
        "source '{}'; COMP_WORDS=({words}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; _gpushare__hook gpushare-hook '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        line.len() - 1,
        line.join(" "),
        line[line.len() - 1],
        line[line.len().saturating_sub(2)],
    );
    let out = Command::new("bash").args(["-c", &prog]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn completions_complete_subcommands_and_their_flags() {
    let out = generated();
    let comp = out.join("completions");
    if !have("bash") {
        skip_or_fail("bash completion: bash missing");
    } else {
        let script = comp.join("gpushare-hook.bash");
        let subs = bash_complete(&script, &["gpushare-hook", "con"]);
        assert_eq!(subs, ["configure"], "positive control: the script answers");
        let flags = bash_complete(&script, &["gpushare-hook", "configure", "--"]);
        for f in [
            "--remove",
            "--path",
            "--dry-run",
            "--allow-missing",
            "--json",
        ] {
            assert!(flags.iter().any(|x| x == f), "configure {f}: {flags:?}");
        }
        let flags = bash_complete(&script, &["gpushare-hook", "doctor", "--"]);
        assert!(
            flags.iter().any(|x| x == "--json"),
            "doctor --json: {flags:?}"
        );
        let engines = bash_complete(&script, &["gpushare-hook", "configure", "c"]);
        assert!(
            engines.iter().any(|x| x == "containerd") && engines.iter().any(|x| x == "crio"),
            "{engines:?}"
        );
    }
    for (shell, file) in [("zsh", "_gpushare-hook"), ("fish", "gpushare-hook.fish")] {
        if !have(shell) {
            skip_or_fail(&format!("{shell} completion syntax: {shell} missing"));
            continue;
        }
        let o = Command::new(shell)
            .arg("-n")
            .arg(comp.join(file))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{shell} -n {file}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The key reference in docs/ and the example policy are what the key description generates
/// (run `cargo run -p xtask -- keys` after changing a key), and the man page has one section
/// per table.
#[test]
fn the_docs_and_the_example_policy_are_generated_from_the_keys() {
    let repo = super::repo();
    let files = super::keys_files(&repo).unwrap();
    assert_eq!(files.len(), 2, "positive control: both files generated");
    for (path, want) in files {
        let have = std::fs::read_to_string(&path).unwrap();
        assert!(
            have == want,
            "{} differs from what xtask/src/keys.rs generates: run `cargo run -p xtask -- keys`",
            path.display()
        );
        for (k, _) in KEYS {
            let name = k.rsplit('.').next().unwrap();
            assert!(have.contains(name), "{}: {k}", path.display());
        }
    }
    let example = super::keys::example_toml();
    let cfg = gpushare::config::Config::parse(&example, Path::new("config.toml.example")).unwrap();
    assert_eq!(cfg, gpushare::config::Config::default());
    let page = config_page();
    assert_eq!(page.matches("TOP-LEVEL KEYS").count(), 1, "{page}");
    for sec in ["[mps]", "[policy]", "[serve]"] {
        assert_eq!(
            page.matches(&format!(".SH {sec}\n")).count(),
            1,
            "{sec}: {page}"
        );
    }
}

/// fish offers no hidden command and completes `configure`'s engine names.
#[test]
fn fish_completion_hides_reap_and_completes_engines() {
    if !have("fish") {
        skip_or_fail("fish completion: fish missing");
        return;
    }
    let out = generated();
    let script = out.join("completions/gpushare-hook.fish");
    let ask = |line: &str| {
        let o = Command::new("fish")
            .args([
                "--no-config",
                "-c",
                &format!("source {}; complete -C '{line}'", script.display()),
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.split('\t').next().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    let subs = ask("gpushare-hook ");
    assert!(
        subs.iter().any(|s| s == "configure"),
        "positive control: {subs:?}"
    );
    assert!(!subs.iter().any(|s| s == "reap"), "{subs:?}");
    let engines = ask("gpushare-hook configure ");
    for e in [
        "podman",
        "crio",
        "containerd",
        "docker",
        "nvidia-container-runtime",
    ] {
        assert!(engines.iter().any(|x| x == e), "{e}: {engines:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
