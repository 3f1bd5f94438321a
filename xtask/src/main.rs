//! `cargo run -p xtask -- docs OUTDIR`: man pages (`OUTDIR/man/*.1`, one per command, from
//! `clap_mangen`) and shell completions (`OUTDIR/completions/`, bash, zsh and fish, from
//! `clap_complete`), both generated from `gpushare::cli::Cli`, for the packages.

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
    for e in std::fs::read_dir(&man)? {
        written.push(e?.path());
    }
    let comp = out.join("completions");
    std::fs::create_dir_all(&comp)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut c = cmd.clone();
        written.push(clap_complete::generate_to(
            shell,
            &mut c,
            "gpushare-hook",
            &comp,
        )?);
    }
    written.sort();
    Ok(written)
}
