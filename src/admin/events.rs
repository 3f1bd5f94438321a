//! `gpushare-hook events [--follow]`: the event log (`[serve] events_file`) for people, one
//! line per event: UTC time, event, then its fields as `key=value`.

use std::io::{BufRead, BufReader, Seek, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use thiserror::Error;

/// The event log cannot be read.
#[derive(Debug, Error)]
pub enum EventsError {
    #[error("cannot read the event log {path}: {source}; it is written once a share is acquired or refused ([serve] events_file)")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the events")]
    Write(#[source] std::io::Error),
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of seconds since the epoch.
pub fn utc(ts: f64) -> String {
    let ms = (ts * 1000.0).round().max(0.0) as u64;
    let (secs, ms) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One line of the log for people; a line that is not an event is shown as it is, marked.
pub fn human(line: &str) -> String {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(line) else {
        return format!("? {}", line.trim_end());
    };
    let ts = map
        .get("ts")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0);
    let event = map.get("event").and_then(|e| e.as_str()).unwrap_or("?");
    let mut out = format!("{} {event}", utc(ts));
    for (k, v) in map.iter().filter(|(k, _)| *k != "ts" && *k != "event") {
        let v = match v {
            serde_json::Value::String(s) if !s.contains(char::is_whitespace) && !s.is_empty() => {
                s.clone()
            }
            serde_json::Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        out.push_str(&format!(" {k}={v}"));
    }
    out
}

/// Prints the log at `path` to `out`; with `follow`, then waits for more (across a rotation:
/// a new file at the path is read from its start) until `stop` is set.
///
/// # Errors
/// [`EventsError`] when the log cannot be opened (without `follow`) or `out` is closed.
pub fn print(
    path: &Path,
    out: &mut impl Write,
    follow: bool,
    stop: &AtomicBool,
) -> Result<(), EventsError> {
    let open = || std::fs::File::open(path);
    let mut file = match open() {
        Ok(f) => Some(f),
        Err(e) if follow && e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(EventsError::Read {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let mut pos = 0u64;
    let mut partial = String::new();
    loop {
        if let Some(f) = file.as_mut() {
            let _ = f.seek(std::io::SeekFrom::Start(pos));
            let mut r = BufReader::new(&mut *f);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        pos += n as u64;
                        if !line.ends_with('\n') {
                            // A line being written: wait for its end.
                            partial.push_str(&line);
                            break;
                        }
                        let whole = std::mem::take(&mut partial) + &line;
                        writeln!(out, "{}", human(&whole)).map_err(EventsError::Write)?;
                    }
                }
            }
            out.flush().map_err(EventsError::Write)?;
        }
        if !follow || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
        // Rotated (a new file at the path) or truncated: start over on the new file.
        use std::os::unix::fs::MetadataExt;
        let now = std::fs::metadata(path).ok();
        let cur = file.as_ref().and_then(|f| f.metadata().ok());
        let replaced = match (&now, &cur) {
            (Some(n), Some(c)) => n.ino() != c.ino() || n.dev() != c.dev() || n.len() < pos,
            (Some(_), None) => true,
            _ => false,
        };
        if replaced {
            file = open().ok();
            pos = 0;
            partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_795_969_393.5), "2026-11-29T16:23:13.500Z");
        assert_eq!(utc(951_782_400.0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn lines_for_people() {
        let l = r#"{"ts":0.25,"event":"acquire","container":"c1","mode":"mps","gpus":["GPU-1","GPU-2"],"cores":50,"k8s_pod":"p"}"#;
        assert_eq!(
            human(l),
            "1970-01-01T00:00:00.250Z acquire container=c1 mode=mps gpus=GPU-1,GPU-2 cores=50 k8s_pod=p"
        );
        let r = r#"{"ts":0,"event":"refusal","container":"c","reason":"busy","message":"GPU 0 serves mps"}"#;
        assert!(
            human(r).ends_with(r#"message="GPU 0 serves mps""#),
            "{}",
            human(r)
        );
        assert_eq!(human("garbage\n"), "? garbage");
    }

    #[test]
    fn follow_reads_appends_and_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ev.jsonl");
        std::fs::write(&p, "{\"ts\":0,\"event\":\"release\",\"container\":\"a\"}\n").unwrap();
        let stop = AtomicBool::new(false);
        let out = std::sync::Mutex::new(Vec::<u8>::new());
        std::thread::scope(|s| {
            s.spawn(|| {
                struct W<'a>(&'a std::sync::Mutex<Vec<u8>>);
                impl Write for W<'_> {
                    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                        self.0.lock().unwrap().extend_from_slice(b);
                        Ok(b.len())
                    }
                    fn flush(&mut self) -> std::io::Result<()> {
                        Ok(())
                    }
                }
                print(&p, &mut W(&out), true, &stop).unwrap();
            });
            let seen = |n: usize| {
                let end = std::time::Instant::now() + Duration::from_secs(10);
                while String::from_utf8_lossy(&out.lock().unwrap())
                    .lines()
                    .count()
                    < n
                {
                    assert!(
                        std::time::Instant::now() < end,
                        "timed out waiting for {n} lines"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            };
            seen(1);
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(b"{\"ts\":0,\"event\":\"release\",\"container\":\"b\"}\n")
                .unwrap();
            seen(2);
            // logrotate: the file is moved away and a new one written.
            std::fs::rename(&p, dir.path().join("ev.jsonl.1")).unwrap();
            std::fs::write(&p, "{\"ts\":0,\"event\":\"release\",\"container\":\"c\"}\n").unwrap();
            seen(3);
            stop.store(true, Ordering::Relaxed);
        });
        let text = String::from_utf8(out.into_inner().unwrap()).unwrap();
        let ids: Vec<&str> = text
            .lines()
            .map(|l| l.rsplit('=').next().unwrap())
            .collect();
        assert_eq!(ids, ["a", "b", "c"], "{text}");
    }
}
