//! The exit of gpushare's command binaries: the reply on stdout, or one error line on stderr,
//! logged, and the exit status.

use std::error::Error as StdError;
use std::io::Write;

use gpushare::commands::Reply;
use gpushare::config::ConfigError;
use gpushare::{logging, vocab};

/// An exit status.
pub type ExitCode = u8;

/// Writes the reply's output; a closed stdout is a failure.
pub fn print(reply: &Reply) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(&reply.stdout).and_then(|()| out.flush()) {
        Ok(()) => reply.code,
        Err(e) => fail(&e),
    }
}

/// Prints the one-line error, logs it, exits 1.
pub fn fail(e: &dyn StdError) -> ExitCode {
    let line = vocab::chain(e);
    tracing::error!(target: logging::EXIT_TARGET, "{line}");
    eprintln!("gpushare-hook: {line}");
    1
}

/// [`fail`] for a policy file, followed by the parser's own diagnostic when there is one (for
/// the admin commands, which people run in a terminal).
pub fn fail_config(e: &ConfigError) -> ExitCode {
    let code = fail(e);
    if let Some(d) = e.diagnostic() {
        eprintln!("{d}");
    }
    code
}
