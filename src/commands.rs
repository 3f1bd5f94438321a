//! One function per `gpushare-hook` command: each takes the loaded policy and returns what to
//! print and the exit code, or the error the binary prints as one line.

use std::io::Read;

use crate::admin::configure::{self, ConfigureError, Engine};
use crate::admin::report::render;
use crate::admin::{doctor, gc, status};
use crate::config::{Config, ConfigError, Source};
use crate::container::error::Error;
use crate::container::hook::{self, Outcome};
use crate::container::prepare::{self, Precreated};
use crate::host::events::{self, Event};
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

/// The OCI state on stdin, kept as bytes so that a log line can name the container (at most
/// one byte past the cap is read; the hook stage refuses an oversized state).
fn read_state_input(stdin: impl Read) -> Result<Vec<u8>, Error> {
    let mut input = Vec::new();
    stdin
        .take(crate::container::intake::MAX_STATE_BYTES + 1)
        .read_to_end(&mut input)
        .map_err(crate::container::intake::IntakeError::ReadState)?;
    Ok(input)
}

/// `createRuntime` / `prestart`: logs the acquire, and a refusal with the container id (MPS
/// daemons started, stopped and restarted are logged by the host layer).
///
/// # Errors
/// [`Error`] for bad input, a refused request or a failed acquire (which undid itself).
pub fn create_runtime(
    ctx: &Ctx,
    stdin: impl Read,
    dry_run: bool,
    profile: Option<&str>,
    preread: Option<hook::Preread>,
) -> Result<Reply, Error> {
    let started = std::time::Instant::now();
    let input = read_state_input(stdin).inspect_err(|e| {
        tracing::error!(target: crate::logging::EXIT_TARGET, "refused: {}", chain(e));
    })?;
    let open = || inventory::open_for_planning(&ctx.cfg);
    let outcome = match hook::create_runtime(&input[..], &ctx.cfg, dry_run, profile, preread, &open)
    {
        Ok(o) => o,
        Err(e) => {
            // Parsed again only here: a container that asks for nothing pays nothing for it.
            let id = container_id(&input);
            tracing::error!(target: crate::logging::EXIT_TARGET, container = %id, gpus = %requested_gpus(&input), "refused: {}", chain(&e));
            if !dry_run {
                events::note(Event::Refusal {
                    container: id,
                    reason: refusal_reason(&e).to_owned(),
                    message: chain(&e),
                });
                count_request(ctx, started);
            }
            return Err(e);
        }
    };
    match outcome {
        Outcome::Nothing => Ok(Reply::default()),
        Outcome::Done(plan) if dry_run => Ok(Reply::text(format!(
            "{}\n",
            serde_json::to_string_pretty(&plan).expect("plan serialises")
        ))),
        Outcome::Done(plan) => {
            count_request(ctx, started);
            crate::logging::step("events written");
            let gpus: Vec<String> = plan.gpus.iter().map(|g| g.index.to_string()).collect();
            let memory = plan
                .memory
                .map_or_else(|| "-".to_owned(), crate::vocab::size::human);
            let cap = plan.cap.map_or_else(
                || "-".to_owned(),
                |c| {
                    format!(
                        "{} ({})",
                        crate::vocab::size::human(c),
                        plan.enforcement.backend
                    )
                },
            );
            tracing::info!(container = %plan.container, mode = %plan.mode, gpus = %gpus.join(","), memory = %memory, cap = %cap, cores = plan.cores, "acquired");
            let uuids: Vec<&str> = plan.gpus.iter().map(|g| g.uuid.as_str()).collect();
            let state = crate::host::state::StateDir::new(&ctx.cfg.state_dir);
            crate::host::reaper::ensure(&state, &ctx.source, &uuids);
            crate::logging::step("reaper checked");
            Ok(Reply::default())
        }
    }
}

/// Writes the events of a createRuntime that asked for a share, and counts the request and
/// its duration (never reached by a container that asks for nothing).
fn count_request(ctx: &Ctx, started: std::time::Instant) {
    let seconds = started.elapsed().as_secs_f64();
    events::flush(&ctx.cfg, |c| {
        c.requests += 1;
        c.create_runtime_seconds.observe(seconds);
    });
}

/// createRuntime when the policy file cannot be loaded: the refusal is counted and written (to
/// the state and event log the file names where it can be read), once.
pub fn count_policy_refusal(ctx: &Ctx, err: &ConfigError, stdin: impl Read) {
    let input = read_state_input(stdin).unwrap_or_default();
    crate::container::error::record_refusal(&ctx.cfg, &container_id(&input), "policy", &chain(err));
}

/// The reason label of a refusal, for `gpushare_refusals_total`.
fn refusal_reason(e: &Error) -> &'static str {
    e.reason()
}

/// The GPUs a container was given (`NVIDIA_VISIBLE_DEVICES` of its bundle's config), for log
/// lines (`?` when unreadable, `-` when unset).
fn requested_gpus(state: &[u8]) -> String {
    let Ok(st) = crate::container::intake::read_state(state) else {
        return "?".into();
    };
    let Ok(bytes) = crate::container::intake::read_config_bytes(st.bundle()) else {
        return "?".into();
    };
    match crate::decide::input::parse_spec(&bytes, &st.bundle().join("config.json")) {
        Ok(spec) => crate::decide::request::env_lookup(&spec.process.env, "NVIDIA_VISIBLE_DEVICES")
            .unwrap_or("-")
            .chars()
            .take(256)
            .collect(),
        Err(_) => "?".into(),
    }
}

/// The container id of an OCI state, for log lines (`?` when unreadable).
fn container_id(state: &[u8]) -> String {
    crate::container::intake::read_state(state).map_or_else(|_| "?".into(), |s| s.id().to_owned())
}

/// `poststop`: warnings go to the log; never fails because of gpushare's own state.
///
/// # Errors
/// Only for unreadable input.
pub fn poststop(ctx: &Ctx, stdin: impl Read) -> Result<Reply, Error> {
    let input = read_state_input(stdin)?;
    let open = || inventory::open_on_first_use(&ctx.cfg);
    let warnings = hook::poststop(&input[..], &ctx.cfg, &open)?;
    events::flush_if_any(&ctx.cfg);
    if !warnings.is_empty() {
        let id = container_id(&input);
        for w in warnings {
            tracing::warn!(container = %id, "poststop: {w}");
        }
    }
    Ok(Reply::default())
}

/// `precreate`: the edited config on stdout; a refusal is logged and carried to the
/// createRuntime hook (podman drops this hook's stderr).
///
/// # Errors
/// [`Error`] for unreadable input, or a refusal that cannot be carried.
pub fn precreate(ctx: &Ctx, stdin: impl Read) -> Result<Reply, Error> {
    let bytes = prepare::read_precreate_input(stdin)?;
    let open = || inventory::open_for_planning(&ctx.cfg);
    let out = match prepare::precreate(bytes, &ctx.cfg, ctx.source.to_hand_on(), &open)? {
        Precreated::Config(c) => c,
        Precreated::Refused { config, message } => {
            // Logged once, with the container, by the createRuntime hook that reports it.
            tracing::debug!("precreate: refused: {message}");
            config
        }
    };
    Ok(Reply {
        stdout: out,
        code: 0,
    })
}

/// `precreate` when the policy file cannot be loaded: a container that asks for nothing passes
/// unchanged; one that asks is refused through its createRuntime hook with the policy error.
///
/// # Errors
/// [`Error`] for unreadable input, or a refusal that cannot be carried.
pub fn precreate_without_policy(err: &ConfigError, stdin: impl Read) -> Result<Reply, Error> {
    let bytes = prepare::read_precreate_input(stdin)?;
    let message = chain(err);
    if !prepare::asks_without_policy(&bytes) {
        tracing::warn!("{message} (containers that ask for no GPU share are passed through)");
        return Ok(Reply {
            stdout: bytes,
            code: 0,
        });
    }
    let hook =
        std::env::current_exe().unwrap_or_else(|_| crate::config::RuntimeConfig::default().hook);
    let out = prepare::mark_refused(&bytes, &hook, None, &message, "policy")?;
    tracing::debug!("precreate: refused: {message} (the createRuntime hook reports it)");
    Ok(Reply {
        stdout: out,
        code: 0,
    })
}

/// createRuntime with a refusal carried from precreate ([`prepare::REFUSED_ENV`]): the error to
/// fail with, logged (after `init_log`) with the container id from the state on `stdin`.
/// `None`: no refusal (nothing read, nothing set up).
pub fn refused_by_precreate(
    stdin: impl Read,
    cfg: &Config,
    init_log: impl FnOnce(),
) -> Option<Error> {
    let message = std::env::var(prepare::REFUSED_ENV).ok()?;
    init_log();
    let mut input = Vec::new();
    let _ = stdin
        .take(crate::container::intake::MAX_STATE_BYTES + 1)
        .read_to_end(&mut input);
    let id = container_id(&input);
    tracing::error!(target: crate::logging::EXIT_TARGET, container = %id, gpus = %requested_gpus(&input), "refused: {message}");
    // Counted and written here, once: precreate only carried it.
    let reason = std::env::var(prepare::REFUSED_REASON_ENV).ok();
    crate::container::error::record_refusal(
        cfg,
        &id,
        crate::container::error::carried_reason(reason.as_deref()),
        &message,
    );
    Some(Error::RefusedAtPrecreate(message))
}

/// `status`: exit 1 when the state dir cannot be read.
pub fn status(ctx: &Ctx, json: bool) -> Reply {
    let inv = inventory::open(&ctx.cfg).ok();
    let st = status::status(&ctx.cfg, inv.as_deref());
    Reply {
        stdout: render(&st, json).into_bytes(),
        code: u8::from(st.error.is_some()),
    }
}

/// `gc`; without NVML, compute modes are left alone but records are still cleaned. Exit 1 when
/// the state dir cannot be read.
pub fn gc(ctx: &Ctx, json: bool) -> Reply {
    let report = match inventory::open(&ctx.cfg) {
        Ok(inv) => gc::gc(&ctx.cfg, inv.as_ref()),
        Err(e) => gc::gc(&ctx.cfg, &Unavailable::new(e)),
    };
    for a in &report.actions {
        tracing::info!("gc: {a}");
    }
    events::note_gc(&report.actions);
    events::flush_if_any(&ctx.cfg);
    Reply {
        stdout: render(&report, json).into_bytes(),
        code: u8::from(report.failed()),
    }
}

/// `reap UUID`: the reaper of one GPU (see [`crate::host::reaper`]); returns when no client of
/// the GPU is left to watch.
///
/// # Errors
/// [`crate::host::reaper::ReaperError`] when its lock or watch cannot be set up, or the GPU is
/// not a safe name.
pub fn reap(ctx: &Ctx, uuid: &str) -> Result<Reply, crate::host::reaper::ReaperError> {
    if !crate::vocab::is_safe_name(uuid) {
        return Err(crate::host::reaper::ReaperError::BadGpu(uuid.to_owned()));
    }
    // NVML is loaded by the first call of a release step that needs it (a compute mode to put
    // back, a driver limit to clear); dropping a client of a GPU that others keep loads none.
    let open = || -> Box<dyn crate::vocab::Inventory> {
        Box::new(inventory::OnFirstUse::new(&ctx.cfg.nvml.library))
    };
    crate::host::reaper::run(&ctx.cfg, uuid, &open, crate::host::reaper::IDLE_LINGER)?;
    Ok(Reply::default())
}

/// `configure <engine>`: exit 0 whether or not anything changed.
///
/// # Errors
/// [`ConfigureError`] for an engine file that cannot be read, parsed or written.
pub fn configure(
    ctx: &Ctx,
    engine: Engine,
    opts: &configure::Options,
    policy_at: Option<std::path::PathBuf>,
    cdi_dir: Option<&std::path::Path>,
    print: bool,
    json: bool,
) -> Result<Reply, ConfigureError> {
    // An installer writing a node's files from elsewhere (`--policy-at`) sees them under other
    // paths than the node's doctor will: nothing to record.
    let from_elsewhere = policy_at.is_some();
    let source = match &policy_at {
        Some(p) => format!("{} (read from {})", p.display(), ctx.source),
        None => ctx.source.to_string(),
    };
    let setup = configure::Setup::new(
        &ctx.cfg,
        policy_at.or_else(|| ctx.source.to_hand_on()),
        source,
    );
    if print {
        return Ok(Reply::text(configure::print(engine, &setup, opts)?));
    }
    let mut report = configure::run(engine, &setup, opts)?;
    if !opts.dry_run && !from_elsewhere {
        record_configured(ctx, engine, &setup, opts, &report);
    }
    report
        .files
        .extend(configure_cdi(ctx, &setup, opts, cdi_dir));
    if !opts.dry_run && report.changed() {
        let what = if opts.remove {
            "removed gpushare from"
        } else {
            "configured"
        };
        tracing::info!(
            "{what} {}: wrote {}",
            engine.name(),
            report.written().join(", ")
        );
    }
    Ok(Reply::text(render(&report, json)))
}

/// Notes the engine's main file this run configured (or took gpushare out of) in the record
/// doctor reads ([`crate::admin::engines::record`]). A record that cannot be written is logged;
/// the configuration itself is done.
fn record_configured(
    ctx: &Ctx,
    engine: Engine,
    setup: &configure::Setup,
    opts: &configure::Options,
    report: &configure::ConfigureReport,
) {
    use crate::admin::engines::record::{path_for, Record};
    let main = engine.def().main_file(setup, &opts.absolute());
    let Some(f) = report
        .files
        .iter()
        .find(|f| std::path::Path::new(&f.path) == main)
    else {
        return;
    };
    let configured = !opts.remove
        && matches!(
            f.outcome,
            configure::Outcome::Created
                | configure::Outcome::Written { .. }
                | configure::Outcome::Unchanged
        );
    // A policy that is not a file of its own (`--config /dev/null`, as package scripts run
    // `--remove`) has no place for a record beside it.
    if ctx.source.to_hand_on().is_some_and(|p| !p.is_file()) {
        return;
    }
    let at = path_for(&ctx.source);
    let mut record = Record::load(&at);
    record.note(engine.name(), &main, configured);
    if let Err(e) = record.save(&at) {
        tracing::warn!(
            "cannot record the files configure wrote in {}: {e}",
            at.display()
        );
    }
}

/// gpushare's CDI specs after `configure`: the node-wide ones follow the policy only when this
/// run configured the node's own engine files with the node's own policy; otherwise they are
/// left alone and the report says what this policy would write there. `cdi_dir` is written in
/// every case.
fn configure_cdi(
    ctx: &Ctx,
    setup: &configure::Setup,
    opts: &configure::Options,
    cdi_dir: Option<&std::path::Path>,
) -> Vec<configure::FileReport> {
    use crate::admin::cdi;
    use configure::CdiAction;
    let node_own = opts.path.is_none()
        && opts.hooks_dir.is_none()
        && setup.policy.is_none()
        && matches!(ctx.source, crate::config::Source::Default);
    let node_dirs = cdi::SPEC_DIRS.map(std::path::Path::new);
    let explicit = cdi_dir.map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_owned()));
    let actions = configure::cdi_actions(node_own, explicit.as_deref(), &node_dirs, |d| {
        d.join(cdi::FILE_NAME).exists()
    });
    let hand_on = setup.policy.clone();
    actions
        .into_iter()
        .map(|action| {
            let (dir, preview) = match &action {
                CdiAction::Write(d) => (d, false),
                CdiAction::Preview(d) => (d, true),
            };
            let path = dir.join(cdi::FILE_NAME).display().to_string();
            let outcome =
                match cdi::generate(&ctx.cfg, hand_on.as_deref(), dir, opts.dry_run || preview) {
                    Ok(r) if preview => configure::Outcome::LeftAlone {
                        why: "node-wide: only `configure` of the node's own engine files with the node's own policy rewrites it; pass --cdi-dir to write it with this one".into(),
                        diff: match r.outcome {
                            configure::Outcome::WouldChange { diff } => Some(diff),
                            _ => None,
                        },
                    },
                    Ok(r) => r.outcome,
                    Err(e) => configure::Outcome::Kept {
                        why: format!("not brought up to date with the policy: {}", chain(&e)),
                    },
                };
            configure::FileReport { path, outcome }
        })
        .collect()
}

/// `cdi generate`: exit 0 whether or not the spec changed.
///
/// # Errors
/// [`crate::admin::cdi::CdiError`] for a profile that cannot be served or a spec that cannot
/// be written (nothing is written then).
pub fn cdi_generate(
    ctx: &Ctx,
    output: &std::path::Path,
    dry_run: bool,
    json: bool,
) -> Result<Reply, crate::admin::cdi::CdiError> {
    let hand_on = ctx.source.to_hand_on();
    let report = crate::admin::cdi::generate(&ctx.cfg, hand_on.as_deref(), output, dry_run)?;
    if !dry_run && !matches!(report.outcome, configure::Outcome::Unchanged) {
        tracing::info!(path = %report.path, devices = %report.devices.join(","), "CDI spec written");
    }
    Ok(Reply::text(render(&report, json)))
}

/// `doctor`: exit 1 when a check failed.
pub fn doctor(ctx: &Ctx, json: bool) -> Reply {
    let mut checks = doctor::run(&ctx.cfg, doctor::config_ok(&ctx.source));
    let record = crate::admin::engines::record::Record::load(
        &crate::admin::engines::record::path_for(&ctx.source),
    );
    crate::admin::engines::doctor_recorded(&mut checks.0, &record);
    let hand_on = ctx.source.to_hand_on();
    let dirs = crate::admin::cdi::SPEC_DIRS.map(std::path::Path::new);
    for (name, verdict, detail) in
        crate::admin::cdi::doctor_findings(&ctx.cfg, hand_on.as_deref(), &dirs)
    {
        let verdict = match verdict {
            0 => doctor::Verdict::Ok,
            1 => doctor::Verdict::Warn,
            _ => doctor::Verdict::Fail,
        };
        checks.0.push(doctor::check(&name, verdict, detail));
    }
    Reply {
        stdout: render(&checks, json).into_bytes(),
        code: u8::from(checks.failed()),
    }
}

/// `doctor` when the policy file cannot be loaded: that check fails (with the parser's
/// diagnostic), the rest run with what could be read of it and the defaults for the rest.
pub fn doctor_without_policy(ctx: &Ctx, err: &ConfigError, json: bool) -> Reply {
    let checks = doctor::run(&ctx.cfg, doctor::config_failed(&ctx.source, err));
    Reply {
        stdout: render(&checks, json).into_bytes(),
        code: u8::from(checks.failed()),
    }
}

/// `metrics`: the exposition on stdout; exit 1 when the state dir cannot be read (the output
/// then says so with `gpushare_state_readable 0`).
pub fn metrics(ctx: &Ctx, openmetrics: bool) -> Reply {
    use crate::admin::metrics::{render, Format};
    let inv = inventory::open(&ctx.cfg).ok();
    let format = if openmetrics {
        Format::OpenMetrics
    } else {
        Format::Text
    };
    let text = render(&ctx.cfg, inv.as_deref(), format);
    Reply {
        code: u8::from(crate::admin::status::unreadable(&ctx.cfg).is_some()),
        stdout: text.into_bytes(),
    }
}

/// `serve`: runs until SIGTERM; says where it listens on stdout first.
///
/// # Errors
/// [`crate::admin::serve::ServeError`] when it cannot listen.
pub fn serve(
    ctx: &Ctx,
    listen: Option<std::net::SocketAddr>,
) -> Result<Reply, crate::admin::serve::ServeError> {
    let mut cfg = ctx.cfg.clone();
    if let Some(a) = listen {
        cfg.serve.listen = a.to_string();
    }
    crate::admin::serve::serve(&cfg, |addr| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "gpushare-hook serve: listening on http://{addr}");
        let _ = out.flush();
    })?;
    Ok(Reply::default())
}

/// `events [--follow]`: the event log for people, straight to stdout (with `--follow`, until
/// SIGTERM or SIGINT).
///
/// # Errors
/// [`crate::admin::events::EventsError`] when the log cannot be read or stdout is closed.
pub fn events(ctx: &Ctx, follow: bool) -> Result<Reply, crate::admin::events::EventsError> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, std::sync::Arc::clone(&stop));
    }
    let mut out = std::io::stdout().lock();
    crate::admin::events::print(&ctx.cfg.events_file(), &mut out, follow, &stop)?;
    Ok(Reply::default())
}
