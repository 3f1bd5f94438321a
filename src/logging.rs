//! Logging set-up for the binaries: `tracing` to stderr (warnings) and to the log file (info).
//! A log file that cannot be opened is skipped: logging never fails a hook. With
//! `GPUSHARE_LOG=debug`, the steps of a create also say when each was done ([`step`]).

use std::path::Path;

use tracing_subscriber::filter::{filter_fn, LevelFilter};
use tracing_subscriber::prelude::*;

/// Target of error lines for the log file only: the final error line, which the binary prints
/// itself, and refusals logged with their container id before it.
pub const EXIT_TARGET: &str = "gpushare::exit";

/// Target of the [`step`] lines.
pub const STEP_TARGET: &str = "gpushare::step";

static CLOCK: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Starts the clock [`step`] reads: first thing in a binary's `main`.
pub fn start_clock() {
    let _ = CLOCK.set(std::time::Instant::now());
}

/// Logs at debug level that step `name` of a create is done, with the milliseconds since
/// [`start_clock`] (`step="record saved" ms=0.512`): where a hook's time goes on this node, with
/// its own driver, daemons and mount tables (`GPUSHARE_LOG=debug` shows them on stderr; the hook
/// benchmark prints their medians). Costs one level check when debug is off.
pub fn step(name: &'static str) {
    if tracing::enabled!(target: STEP_TARGET, tracing::Level::DEBUG) {
        let ms = CLOCK.get().map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        tracing::debug!(target: STEP_TARGET, step = name, ms = format_args!("{ms:.3}"));
    }
}

/// Installs the global subscriber. `GPUSHARE_LOG=debug` raises the stderr level.
pub fn init(log_file: Option<&Path>) {
    let stderr_level = match std::env::var("GPUSHARE_LOG").as_deref() {
        Ok("debug") => LevelFilter::DEBUG,
        Ok("info") => LevelFilter::INFO,
        _ => LevelFilter::WARN,
    };
    // Colour only for a person at a terminal: engines and log collectors get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_target(false)
        .without_time()
        .with_filter(stderr_level)
        .with_filter(filter_fn(|m| m.target() != EXIT_TARGET));
    let file = log_file.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    });
    let file_layer = file.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::sync::Mutex::new(f))
            .with_ansi(false)
            .with_filter(LevelFilter::INFO)
    });
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file_layer)
        .try_init();
}
