//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong writing or reading a trace.
///
/// Every variant that comes from reading names the file, and stream errors
/// name the byte offset at which the problem was found.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// An I/O error on a file of the trace.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The stream is malformed at `offset`.
    #[error("{}: corrupt trace stream at byte {offset}: {what}", path.display())]
    Corrupt {
        /// The stream file.
        path: PathBuf,
        /// Byte offset of the record (or field) that is wrong.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The stream ends in the middle of a record or before its end record.
    #[error("{}: truncated trace stream at byte {offset}: {what}", path.display())]
    Truncated {
        /// The stream file.
        path: PathBuf,
        /// Byte offset where data ran out.
        offset: u64,
        /// What was being read.
        what: String,
    },
    /// `info.json` is missing, malformed or from an unknown format version.
    #[error("{}: {what}", path.display())]
    Info {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A line of `symbols.tsv` is malformed.
    #[error("{}:{line}: {what}", path.display())]
    Symbols {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// A file of the trace is not a regular file (a FIFO, a device, a
    /// directory...): refused before anything is read from it.
    #[error("{}: not a regular file but {kind}: refused (reading it could block or have effects)", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What it is (`a FIFO`, `a character device`, ...).
        kind: &'static str,
    },
    /// The caller passed something unusable (bad filter pattern, …).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TraceError {
        TraceError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
