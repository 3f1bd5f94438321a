//! `cargo run -p xtask -- docs OUTDIR`: man pages (`OUTDIR/man/*.1`, one per command, from
//! `clap_mangen`; `gpushare-runtime.1` from the wrapper's own help text; `gpushare-config.5`,
//! every policy key with its default, from `Config::default()`) and shell completions
//! (`OUTDIR/completions/`, bash, zsh and fish, from `clap_complete`), generated from the code
//! so that they cannot drift from it, for the packages.

mod pages;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [task, out] if task == "docs" => match docs(Path::new(out)) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask: cannot write into {out}: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo run -p xtask -- docs OUTDIR");
            ExitCode::from(2)
        }
    }
}

/// Writes the man pages and completions; returns the files written.
fn docs(out: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    let cmd = gpushare::cli::Cli::command();
    clap_mangen::generate_to(cmd.clone(), &man)?;
    std::fs::write(man.join("gpushare-runtime.1"), pages::runtime_page()?)?;
    std::fs::write(man.join("gpushare-config.5"), pages::config_page())?;
    for e in std::fs::read_dir(&man)? {
        written.push(e?.path());
    }
    let comp = out.join("completions");
    std::fs::create_dir_all(&comp)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut c = cmd.clone();
        let f = clap_complete::generate_to(shell, &mut c, "gpushare-hook", &comp)?;
        if shell == Shell::Bash {
            let text = std::fs::read_to_string(&f)?;
            std::fs::write(&f, fix_bash(&text, "gpushare-hook"))?;
        }
        written.push(f);
    }
    written.sort();
    Ok(written)
}

/// clap_complete's bash script names a subcommand's state `gpushare__hook__subcmd__X` where it
/// sets it but `gpushare__subcmd__hook__subcmd__X` where it matches it (a `-` in the program
/// name is escaped two ways), so nothing after the subcommand completes: one spelling for both.
fn fix_bash(script: &str, bin: &str) -> String {
    script.replace(&bin.replace('-', "__subcmd__"), &bin.replace('-', "__"))
}

#[cfg(test)]
mod tests;
