//! `gpushare-runtime`: drop-in runc wrapper. For `create`/`run` it edits the bundle's
//! `config.json` (env, mounts, hooks) for containers that ask for a shared GPU, then execs the
//! next runtime with the argv unchanged. Thin: parse, call, exec.

use std::ffi::OsString;
use std::process::ExitCode;

use gpushare::config::Config;
use gpushare::{error, hook, prepare, runtime};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let args = runtime::parse_args(&argv);
    let fail = |msg: String| {
        eprintln!("gpushare-runtime: {msg}");
        runtime::log_error(args.log.as_deref(), &msg);
        ExitCode::from(1)
    };
    if runtime::is_looping() {
        return fail(runtime::RuntimeError::Loop("started by itself".into()).to_string());
    }
    // GPUSHARE_CONFIG, else the default file; the wrapper has no flags of its own.
    let cfg = match Config::load(None) {
        Ok(c) => c,
        Err(e) => return fail(error::chain(&e)),
    };
    let me = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let next = match runtime::find_next(&cfg.runtime.next, &me, std::env::var_os("PATH").as_deref())
    {
        Ok(n) => n,
        Err(e) => return fail(error::chain(&e)),
    };
    if runtime::wants_edit(&args) {
        let open = || hook::nvml_inventory(&cfg);
        if let Err(e) = runtime::edit_bundle(&args, &cfg, prepare::config_path(None), &open) {
            return fail(error::chain(&e));
        }
    }
    let e = runtime::exec_next(&next, &argv);
    fail(error::chain(&e))
}
