//! `info.json`: what was recorded, how, and what the filters removed.

use serde::{Deserialize, Serialize};

use crate::event::TimeBase;
use crate::filter::{Filter, FilterStats};
use crate::format::KindCounts;

/// Format name in `info.json`.
pub const FORMAT_NAME: &str = "hotprobe-trace";
/// Format version in `info.json` (streams carry their own version too):
/// 2 added typed values, 3 the host kernel's events (`kernel`), 4 the
/// captured user stacks (`stacks.tsv`, [`crate::stacks`]), and the
/// processes a recording followed across exec (`processes`), 5 the stack
/// of each recorded call (`call_stacks.tsv`, [`crate::call_stacks`]), 6
/// each mechanism's calibrated cost a hit and each probe's mechanism
/// (`costs.tsv`, [`crate::ProbeCosts`]; a version 5 trace that has the
/// file, written before the bump, is read with it too).
pub const FORMAT_VERSION: u32 = 6;

/// A process a recording followed (`record -f` across exec): its pid, the
/// command name and the program of one of its images, and the probe ids of
/// that image's functions (version 4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// The process id (a single-threaded process's events carry it as
    /// their tid).
    pub pid: u32,
    /// The kernel's command name (15 characters at most).
    pub comm: String,
    /// The program it ran.
    pub program: String,
    /// The ids in `symbols.tsv` of the functions probed in this image.
    #[serde(default)]
    pub probes: Vec<u32>,
}

/// One thread's stream as listed in `info.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Linux thread id.
    pub tid: u32,
    /// Stream file name (`tid-<TID>.hpt`).
    pub file: String,
    /// Records written (end record excluded).
    pub records: u64,
    /// Function events they stand for.
    pub events: u64,
    /// File size in bytes.
    pub bytes: u64,
}

/// What [`TraceWriter::finish`](crate::TraceWriter::finish) returns, also stored in `info.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteStats {
    /// Events given to `write_event`.
    pub events_in: u64,
    /// Function events written (a call record stands for two).
    pub events_out: u64,
    /// Records written (end records excluded).
    pub records: u64,
    /// Bytes of all stream files (headers and end records included).
    pub bytes: u64,
    /// Records per type.
    pub kinds: KindCounts,
    /// What the filters removed.
    pub filtered: FilterStats,
    /// Events lost before reaching the writer (reported through `note_lost`).
    pub lost: u64,
    /// Threads (stream files).
    pub threads: u64,
    /// Function events the writer could not write: after a failed write
    /// (a full disk) it stops writing and ends each stream with a lost
    /// record counting them (and the events of the lost records it could
    /// not write, counted in `lost` already).
    #[serde(default)]
    pub dropped: u64,
    /// The write that failed (file and OS error), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_error: Option<String>,
}

impl WriteStats {
    /// Stream bytes per function event written (`NaN` when none).
    pub fn bytes_per_event(&self) -> f64 {
        self.bytes as f64 / self.events_out as f64
    }
}

/// Contents of `info.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// What was traced (executable path, `pid 42`, `guest`, …).
    pub target: String,
    /// Command line of the traced program, if spawned.
    #[serde(default)]
    pub command: Vec<String>,
    /// Process id, if known.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Unit of the stream timestamps.
    pub time_base: TimeBase,
    /// Wall-clock start of the recording, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Whether entry+exit pairs were aggregated into call records.
    pub aggregate: bool,
    /// Filter configuration.
    #[serde(default)]
    pub filter: Filter,
    /// Function names that mark phases (besides probes of kind `marker`).
    #[serde(default)]
    pub phase_markers: Vec<String>,
    /// Number of lines of `symbols.tsv` after its header.
    pub symbols: usize,
    /// False while recording (a crashed recorder leaves it false).
    pub complete: bool,
    /// Per-thread streams (filled at finish).
    #[serde(default)]
    pub threads: Vec<ThreadInfo>,
    /// Totals (filled at finish).
    #[serde(default)]
    pub stats: Option<WriteStats>,
    /// The host kernel's events (`record --kernel`; version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<crate::kernel::KernelInfo>,
    /// The processes followed across exec and their programs (version 4,
    /// `record -f`; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}
