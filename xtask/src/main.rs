//! `cargo run -p xtask -- docs OUTDIR`: man pages (`OUTDIR/man/*.1`, one per command, from
//! `clap_mangen`; `gpushare-runtime.1` from the wrapper's own help text; `gpushare-config.5`,
//! every policy key with its default, from `Config::default()`) and shell completions
//! (`OUTDIR/completions/`, bash, zsh and fish, from `clap_complete`), generated from the code
//! so that they cannot drift from it, for the packages.

mod keys;
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
        [task] if task == "keys" => match write_keys(&repo()) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo run -p xtask -- docs OUTDIR | keys");
            ExitCode::from(2)
        }
    }
}

/// The repository.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the repository")
        .to_owned()
}

/// The repository's files generated from the key description: `docs/configuration.md`'s key
/// reference and `packaging/config.toml.example`, as they should be.
///
/// # Errors
/// `docs/configuration.md` cannot be read or lacks its markers.
fn keys_files(repo: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let doc_path = repo.join("docs/configuration.md");
    let doc = std::fs::read_to_string(&doc_path)
        .map_err(|e| format!("cannot read {}: {e}", doc_path.display()))?;
    Ok(vec![
        (doc_path, keys::with_reference(&doc)?),
        (
            repo.join("packaging/config.toml.example"),
            keys::example_toml(),
        ),
    ])
}

/// `keys`: rewrites the files of [`keys_files`]; returns them.
fn write_keys(repo: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for (path, text) in keys_files(repo)? {
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        out.push(path);
    }
    Ok(out)
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
        if shell == Shell::Fish {
            let text = std::fs::read_to_string(&f)?;
            std::fs::write(&f, fix_fish(&text, &cmd))?;
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

/// clap_complete's fish script offers hidden subcommands (`reap`) and completes no positional
/// value: hidden ones taken out, `configure`'s engine names added.
fn fix_fish(script: &str, cmd: &clap::Command) -> String {
    let hidden: Vec<&str> = cmd
        .get_subcommands()
        .filter(|c| c.is_hide_set())
        .map(|c| c.get_name())
        .collect();
    let mut out: String = script
        .lines()
        .filter(|l| {
            !hidden.iter().any(|h| {
                l.contains(&format!("-a \"{h}\"")) || l.contains(&format!("using_subcommand {h}\""))
            })
        })
        .map(|l| {
            let mut l = l.to_owned();
            for h in &hidden {
                l = l.replace(&format!(" {h} "), " ");
            }
            l + "\n"
        })
        .collect();
    let engines: Vec<&str> = gpushare::admin::engines::ENGINES
        .iter()
        .map(|e| e.name())
        .collect();
    out.push_str(&format!(
        "complete -c gpushare-hook -n \"__fish_gpushare_hook_using_subcommand configure\" -f -a \"{}\" -d 'engine'\n",
        engines.join(" ")
    ));
    out
}

#[cfg(test)]
mod tests;
