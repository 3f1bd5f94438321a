//! `gpushare-runtime`: drop-in runc wrapper. For `create`/`run` it edits the bundle's
//! `config.json` (env, mounts, hooks) for containers that ask for a shared GPU, then execs the
//! next runtime with the argv unchanged. Thin: parse, call, report.

use std::ffi::OsString;
use std::process::ExitCode;

use gpushare::container::runtime;

fn main() -> ExitCode {
    // It ends in the next runtime's exec (or an error) soon after it last asks NVML.
    gpushare::leave_nvml_to_exit();
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let args = runtime::parse_args(&argv);
    if let Some(text) = runtime::own_answer(&argv, &args) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }
    // Returns only when the next runtime could not be started, or ran as a child.
    match runtime::run(&argv, &args) {
        runtime::Ended::Next(code) => ExitCode::from(code),
        runtime::Ended::Failed(msg) => {
            eprintln!("gpushare-runtime: {msg}");
            runtime::log_error(&args, &msg);
            ExitCode::from(1)
        }
    }
}
