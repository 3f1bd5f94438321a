//! What can go wrong in the runtime wrapper itself (the error every entry point returns is
//! [`crate::container::error::Error`]).

use std::path::PathBuf;

use thiserror::Error;

/// The wrapper could not do its job.
#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("no next runtime found among {0:?} ([runtime] next); install runc or set [runtime] next to its path")]
    NoNext(Vec<String>),
    #[error("[runtime] next leads back to gpushare-runtime ({0}); set it to the real runtime, e.g. \"runc\"")]
    Loop(String),
    #[error("cannot find the bundle: no --bundle and no working directory")]
    Bundle {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the exec process file {path}")]
    ReadProcess {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("exec process file {0} is larger than 16 MiB or not JSON")]
    BadProcess(PathBuf),
    #[error("cannot run {path}")]
    Exec {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
