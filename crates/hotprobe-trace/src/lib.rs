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
//! * [`analysis`]: [`replay`], [`report`], [`report_phases`], per thread
//!   ([`report_by_thread`]), two traces compared ([`ReportDiff`]), latency
//!   [`Histogram`]s; all of them over the calls a [`Query`] keeps
//!   (function, depth, duration, thread and time filters, [`query`]).
//! * [`summarize`]: what `hotprobe info` prints.
//! * [`export`]: Chrome Trace Event JSON, CTF 1.8, folded stacks; with
//!   features, flame graphs (`flamegraph`: SVG, HTML), OpenTelemetry
//!   protobuf (`otlp`, with `OtlpEndpoint`, its blocking OTLP/HTTP
//!   client) and Parquet (`parquet`).
#![deny(missing_docs)]

pub mod analysis;
pub mod call_stacks;
mod decoder;
mod error;
mod event;
pub mod export;
mod files;
pub mod filter;
pub mod format;
pub mod graph;
mod hist;
mod info;
pub mod kernel;
mod lz4;
mod overhead;
mod phase_order;
pub mod query;
mod reader;
mod replay;
mod report;
pub mod stacks;
mod stacks_tsv;
mod summary;
mod symbols;
mod trap_marks;
mod values;
pub mod varint;
mod writer;

pub use analysis::{
    fmt_duration, histograms, replay, replay_filtered, replay_with, report, report_by_thread,
    report_filtered, report_phases, report_phases_filtered, visit_threads, CallStack, DiffRow,
    Phase, PhaseReport, PhaseSpec, Progress, ReplayField, ReplayOptions, Report, ReportDiff,
    ReportRow, SortKey, Step, ThreadReport,
};
pub use error::{Result, TraceError};
pub use event::{Args, EventKind, Record, TimeBase, TraceEvent, MAX_ARGS};
#[cfg(feature = "flamegraph")]
pub use export::{draw_flamegraph, export_flamegraph, FlameOptions, FlameStats};
pub use export::{
    export_chrome, export_chrome_filtered, export_ctf, export_ctf_filtered, export_folded,
    export_folded_filtered, folded_stacks, value_string, ChromeStats, CtfStats, FoldedOptions,
    FoldedValue,
};
#[cfg(feature = "otlp")]
pub use export::{export_otlp, OtlpOptions, OtlpSignal, OtlpStats};
#[cfg(feature = "parquet")]
pub use export::{export_parquet, ParquetStats};
#[cfg(feature = "otlp")]
pub use export::{OtlpEndpoint, OtlpEndpointError, OTLP_HTTP_PORT};
pub use filter::{CompiledFilter, Filter, FilterStats, ThreadFilter};
pub use format::KindCounts;
pub use hist::{fmt_bound, Bucket, Histogram};
/// Shapes of typed values (`types.tsv`), from hotprobe-dwarf.
pub use hotprobe_dwarf::{Shape, ShapeItem};
pub use info::{Info, ProcessInfo, ThreadInfo, WriteStats, FORMAT_NAME, FORMAT_VERSION};
pub use kernel::{
    kernel_file_name, KernelEvent, KernelInfo, KernelKind, KernelThreadInfo, ThreadKernel,
};
pub use overhead::{MechanismCost, ProbeCosts, UncalibratedMechanism, COSTS_FILE};
pub use query::{CompiledQuery, Query, QueryStack, StepStack};
pub use reader::{StreamFile, ThreadStream, TraceReader};
pub use summary::{rfc3339, summarize, ThreadSummary, TraceSummary};
pub use symbols::{ProbeKind, Symbol, SymbolTable};
pub use trap_marks::{mark_column, trap_legend, TrapMarks, TRAP_MARK};
pub use values::{values_file_name, ThreadValues, ValueTypes, MAX_VALUES_LEN, TYPES_FILE};
pub use writer::{
    stream_file_name, TraceMeta, TraceWriter, FLUSH_EVERY, IDLE_FLUSH, INFO_FILE, SYMBOLS_FILE,
};
