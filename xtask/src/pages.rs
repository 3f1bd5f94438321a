//! The man pages that are not a clap command: `gpushare-runtime(1)` (the wrapper's own help
//! text, its environment and files) and `gpushare-config(5)` (every policy key, its default from
//! `Config::default()`, and what it does, from [`crate::keys`]).

use std::ffi::OsString;

use clap_mangen::roff::{bold, italic, roman, Roff};

use crate::keys::{default_of, sections};

/// gpushare-config(5).
pub fn config_page() -> String {
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "GPUSHARE-CONFIG",
            "5",
            "",
            &format!("gpushare {}", gpushare::VERSION),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman("gpushare-config - the gpushare policy file")]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold(gpushare::config::DEFAULT_PATH),
        roman(" (or $GPUSHARE_CONFIG, or --config FILE)"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman("A TOML file. Every key is optional; a missing file means every default. An unknown key, a bad value or a file that is not TOML is refused with its line and column (gpushare-hook doctor shows where); status, gc and poststop then run on what can be read of it and the defaults for the rest.")]);
    for (sec, keys) in sections() {
        r.control(
            "SH",
            [if sec.is_empty() {
                "TOP-LEVEL KEYS".to_owned()
            } else {
                format!("[{sec}]")
            }
            .as_str()],
        );
        for (key, what) in keys {
            let name = key.split_once('.').map_or(key, |(_, n)| n);
            r.control("TP", []);
            r.text([
                bold(name),
                roman(" (default: "),
                italic(default_of(key)),
                roman(")"),
            ]);
            r.text([roman(what)]);
        }
    }
    r.control("SH", ["SEE ALSO"]);
    r.text([roman(
        "gpushare-hook(1), gpushare-runtime(1); docs/configuration.md",
    )]);
    r.render()
}

/// gpushare-runtime(1).
pub fn runtime_page() -> std::io::Result<String> {
    let argv = [OsString::from("--help")];
    let args = gpushare::container::runtime::parse_args(&argv);
    let help = gpushare::container::runtime::own_answer(&argv, &args)
        .ok_or_else(|| std::io::Error::other("gpushare-runtime --help has no text of its own"))?;
    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "GPUSHARE-RUNTIME",
            "1",
            "",
            &format!("gpushare {}", gpushare::VERSION),
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman(
        "gpushare-runtime - an OCI runtime wrapper that shares NVIDIA GPUs between containers",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        bold("gpushare-runtime"),
        roman(" ["),
        italic("runc global options"),
        roman("] "),
        italic("command"),
        roman(" ["),
        italic("arguments"),
        roman("]"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    for para in help.trim().split("\n\n") {
        r.control("PP", []);
        r.text([roman(para.replace('\n', " "))]);
    }
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []);
    r.text([bold(gpushare::config::ENV_PATH)]);
    r.text([roman(format!(
        "The policy file (default {}); see gpushare-config(5).",
        gpushare::config::DEFAULT_PATH
    ))]);
    r.control("SH", ["FILES"]);
    r.control("TP", []);
    r.text([bold(gpushare::config::DEFAULT_PATH)]);
    r.text([roman("The policy: [runtime] next names the runtime run next, [runtime] hook the hook put into containers.")]);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman("gpushare-hook(1), gpushare-config(5), runc(8)")]);
    Ok(r.render())
}
