//! Asking a running CRI-O which runtime handlers it loaded.
//!
//! CRI-O (v1.37.0, `server/inspect.go`) serves `GET /config` on its own socket: the configuration
//! in use as TOML, from which handlers that failed validation (`pkg/config/config.go`: "Runtime
//! handler … is being ignored due to: …") have been deleted. `crio status config` prints the same.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// CRI-O's default socket.
pub const SOCKET: &str = "/var/run/crio/crio.sock";

#[derive(Debug, thiserror::Error)]
pub enum CrioError {
    #[error("cannot reach CRI-O at {socket}: {source}")]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("CRI-O at {socket} answered GET /config with {status:?}, not 200")]
    Status { socket: PathBuf, status: String },
    #[error("CRI-O's /config is not TOML: {0}")]
    Toml(#[from] toml::de::Error),
}

/// Whether CRI-O's running configuration (the TOML of `GET /config`) holds the runtime handler
/// `name`.
///
/// # Errors
/// [`CrioError::Toml`] when the text is not TOML.
pub fn has_handler(config: &str, name: &str) -> Result<bool, CrioError> {
    let doc: toml::Table = config.parse()?;
    Ok(doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("runtimes"))
        .and_then(|r| r.get(name))
        .is_some())
}

/// The body of `GET /config` on CRI-O's socket.
///
/// # Errors
/// [`CrioError::Connect`] when the socket cannot be reached or read within `timeout`,
/// [`CrioError::Status`] on an answer other than 200.
pub fn running_config(socket: &Path, timeout: Duration) -> Result<String, CrioError> {
    let io = |source| CrioError::Connect {
        socket: socket.to_owned(),
        source,
    };
    let mut s = UnixStream::connect(socket).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    // HTTP/1.0: the answer is not chunked and ends when CRI-O closes the connection.
    s.write_all(b"GET /config HTTP/1.0\r\nHost: crio\r\n\r\n")
        .map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(CrioError::Status {
            socket: socket.to_owned(),
            status,
        });
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A one-shot server that answers like CRI-O's inspect endpoint and hands back the request.
    fn serve(
        answer: &'static str,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<String>) {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join("crio.sock");
        let l = UnixListener::bind(&sock).unwrap();
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = [0u8; 512];
            let n = c.read(&mut req).unwrap();
            c.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&req[..n]).into_owned()
        });
        (t, sock, h)
    }

    #[test]
    fn reads_the_running_config_and_finds_the_handler() {
        let (_t, sock, h) = serve(
            "HTTP/1.0 200 OK\r\nContent-Type: application/toml\r\n\r\n[crio.runtime.runtimes.runc]\nruntime_type = \"oci\"\n[crio.runtime.runtimes.gpushare]\nruntime_path = \"/usr/bin/gpushare-runtime\"\n",
        );
        let cfg = running_config(&sock, Duration::from_secs(5)).unwrap();
        assert!(h.join().unwrap().starts_with("GET /config HTTP/1.0\r\n"));
        assert!(has_handler(&cfg, "gpushare").unwrap());
        assert!(!has_handler(&cfg, "kata").unwrap());
        // A CRI-O that dropped the handler lists only the others.
        assert!(!has_handler("[crio.runtime.runtimes.runc]\n", "gpushare").unwrap());
    }

    #[test]
    fn says_what_went_wrong() {
        let (_t, sock, h) = serve("HTTP/1.0 404 Not Found\r\n\r\nno\n");
        let e = running_config(&sock, Duration::from_secs(5)).unwrap_err();
        h.join().unwrap();
        assert!(e.to_string().contains("\"HTTP/1.0 404 Not Found\""), "{e}");
        let e = running_config(Path::new("/nonexistent/crio.sock"), Duration::from_secs(1))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot reach CRI-O at /nonexistent/crio.sock"),
            "{e}"
        );
    }
}
