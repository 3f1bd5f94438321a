//! The error line written to the caller's `--log` file, in its `--log-format`.

use super::Args;

/// The line written to the `--log` file for an error, in the runtime's log format: JSON (what
/// containerd's shim asks for and reads; its `time` must be RFC 3339) or runc's logfmt text.
pub fn log_line(msg: &str, json: bool) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let msg = format!("gpushare-runtime: {msg}");
    if json {
        serde_json::json!({"level": "error", "msg": msg, "time": rfc3339(secs)}).to_string()
    } else {
        // logfmt: the message quoted like a JSON string.
        format!(
            "time={:?} level=error msg={}",
            rfc3339(secs),
            serde_json::Value::String(msg)
        )
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, UTC, whole seconds) for seconds since the epoch.
pub fn rfc3339(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Appends an error line to the `--log` file in its `--log-format`; best effort.
pub fn log_error(args: &Args, msg: &str) {
    use std::io::Write;
    let json = args.log_format.as_deref() == Some("json");
    if let Some(p) = &args.log {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{}", log_line(msg, json));
        }
    }
}
