//! One function per `gpushare-hook` command: each takes the loaded policy and returns what to
//! print and the exit code, or the error the binary prints as one line.

use std::io::Read;

use crate::admin::configure::{self, Engine};
use crate::admin::report::render;
use crate::admin::{doctor, gc, status};
use crate::config::{Config, Source};
use crate::container::error::Error;
use crate::container::hook::{self, Outcome};
use crate::container::prepare;
use crate::host::inventory::{self, Unavailable};
use crate::vocab::chain;

/// The policy and where it came from.
pub struct Ctx {
    pub cfg: Config,
    pub source: Source,
}

/// What a command prints on stdout, and its exit code.
#[derive(Debug, Default)]
pub struct Reply {
    pub stdout: Vec<u8>,
    pub code: u8,
}

impl Reply {
    fn text(s: String) -> Self {
        Reply {
            stdout: s.into_bytes(),
            code: 0,
        }
    }
}

/// `createRuntime` / `prestart`.
///
/// # Errors
/// [`Error`] for bad input, a refused request or a failed acquire (which undid itself).
pub fn create_runtime(ctx: &Ctx, stdin: impl Read, dry_run: bool) -> Result<Reply, Error> {
    let open = || inventory::open(&ctx.cfg);
    match hook::create_runtime(stdin, &ctx.cfg, dry_run, &open)? {
        Outcome::Nothing => Ok(Reply::default()),
        Outcome::Done(plan) if dry_run => Ok(Reply::text(format!(
            "{}\n",
            serde_json::to_string_pretty(&plan).expect("plan serialises")
        ))),
        Outcome::Done(plan) => {
            tracing::info!(container = %plan.container, mode = %plan.mode, gpus = ?plan.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), "acquired");
            Ok(Reply::default())
        }
    }
}

/// `poststop`: warnings go to the log; never fails because of gpushare's own state.
///
/// # Errors
/// Only for unreadable input.
pub fn poststop(ctx: &Ctx, stdin: impl Read) -> Result<Reply, Error> {
    let open = || inventory::open(&ctx.cfg);
    for w in hook::poststop(stdin, &ctx.cfg, &open)? {
        tracing::warn!("poststop: {w}");
    }
    Ok(Reply::default())
}

/// `precreate`: the edited config on stdout.
///
/// # Errors
/// [`Error`] for bad input or a refused request.
pub fn precreate(ctx: &Ctx, stdin: impl Read) -> Result<Reply, Error> {
    let open = || inventory::open(&ctx.cfg);
    let out = prepare::precreate(stdin, &ctx.cfg, ctx.source.to_hand_on(), &open)?;
    Ok(Reply {
        stdout: out,
        code: 0,
    })
}

/// `status`.
pub fn status(ctx: &Ctx, json: bool) -> Reply {
    let inv = inventory::open(&ctx.cfg).ok();
    Reply::text(render(&status::status(&ctx.cfg, inv.as_deref()), json))
}

/// `gc`; without NVML, compute modes are left alone but records are still cleaned.
pub fn gc(ctx: &Ctx, json: bool) -> Reply {
    let report = match inventory::open(&ctx.cfg) {
        Ok(inv) => gc::gc(&ctx.cfg, inv.as_ref()),
        Err(e) => gc::gc(&ctx.cfg, &Unavailable(chain(&e))),
    };
    Reply {
        stdout: render(&report, json).into_bytes(),
        code: u8::from(report.failed()),
    }
}

/// `configure <engine>`.
pub fn configure(ctx: &Ctx, engine: Engine) -> Reply {
    Reply::text(configure::snippet(
        engine,
        &ctx.cfg,
        ctx.source.to_hand_on().as_deref(),
    ))
}

/// `doctor`: exit 1 when a check failed.
pub fn doctor(ctx: &Ctx, json: bool) -> Reply {
    let checks = doctor::run(&ctx.cfg, &ctx.source.to_string());
    Reply {
        stdout: render(&checks, json).into_bytes(),
        code: u8::from(checks.failed()),
    }
}
