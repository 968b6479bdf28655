//! hotprobe trace files: recording, reading, analysing and exporting
//! function traces. Pure: no ptrace, no target.
//!
//! * [`TraceWriter`] takes the events the agent recorded ([`TraceEvent`],
//!   e.g. from [`TraceEvent::from_abi`]), runs the source [`Filter`]s,
//!   aggregates an entry and its exit with nothing between into one call
//!   record, and writes a trace directory: `info.json`, `symbols.tsv` and
//!   one varint-compressed stream per thread (docs/TRACE_FORMAT.md).
//! * [`TraceReader`] opens a directory; [`ThreadStream`] decodes a thread's
//!   [`Record`]s with absolute ns times, returning an error naming the file
//!   and byte offset on corrupt or truncated input.
//! * [`analysis`]: [`replay`], [`report`], [`report_phases`].
//! * [`export`]: Chrome Trace Event JSON, CTF 1.8, folded stacks.
#![deny(missing_docs)]

pub mod analysis;
mod error;
mod event;
pub mod export;
pub mod filter;
pub mod format;
mod info;
mod reader;
mod symbols;
pub mod varint;
mod writer;

pub use analysis::{
    replay, report, report_phases, CallStack, Phase, PhaseReport, PhaseSpec, Progress, Report,
    ReportRow, Step,
};
pub use error::{Result, TraceError};
pub use event::{Args, EventKind, Record, TimeBase, TraceEvent, MAX_ARGS};
pub use export::{
    export_chrome, export_ctf, export_folded, ChromeStats, CtfStats, FoldedOptions, FoldedValue,
};
pub use filter::{CompiledFilter, Filter, FilterStats, ThreadFilter};
pub use format::KindCounts;
pub use info::{Info, ThreadInfo, WriteStats, FORMAT_NAME, FORMAT_VERSION};
pub use reader::{StreamFile, ThreadStream, TraceReader};
pub use symbols::{ProbeKind, Symbol, SymbolTable};
pub use writer::{stream_file_name, TraceMeta, TraceWriter, INFO_FILE, SYMBOLS_FILE};
