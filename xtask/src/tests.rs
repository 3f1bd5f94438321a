//! The generated pages and completions against the code: every policy key documented with its
//! default, the runtime page from its help, and bash completion that completes subcommands and
//! their flags (zsh and fish syntax-checked).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::pages::{config_page, defaults, runtime_page, KEYS, OPTIONAL};

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
    let out = std::env::temp_dir().join(format!("gpushare-xtask-{}", std::process::id()));
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
            "policy key {k} has no entry in xtask/src/pages.rs KEYS"
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
