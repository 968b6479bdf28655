//! The host kernel as a source of events in a process timeline.
//!
//! [`KernelRecorder`] follows a process's threads through `perf_event_open`
//! (perf-event-open-sys): the `raw_syscalls:sys_enter` and `sys_exit`
//! tracepoints (ids from tracefs) and the threads' context switches
//! (`attr.context_switch`, PERF_RECORD_SWITCH), on CLOCK_MONOTONIC
//! (`use_clockid`), inherited by the threads and processes they create.
//! The records are read from mmap'd rings by a parser written here
//! ([`records`]: the ring's content is untrusted input, fuzzed), records
//! the kernel lost (PERF_RECORD_LOST) are counted, and
//! [`KernelRecorder::finish`] pairs them into [`KernelSpan`]s: syscalls
//! (number, return value, start, end) and off-CPU intervals.
//!
//! The events only observe: nothing is written into the process, no
//! handler runs in it, no register is changed; the file descriptors are
//! closed (and rings unmapped) when the recorder is dropped.
//!
//! Without root (CAP_PERFMON and a readable tracefs) or with tracefs not
//! mounted, [`check_access`] and [`KernelRecorder::open`] return a
//! [`KernelError`] naming what is missing and how to get it.
#![deny(missing_docs)]

mod error;
mod perf;
mod recorder;
pub mod records;
mod spans;
pub mod tracefs;

pub use error::{paranoid_level, KernelError, PARANOID_FILE};
/// x86-64 syscall and errno names (shared with the guest's decoder).
pub use hotprobe_target::syscalls::{errno_name, syscall_name};
pub use recorder::{
    check_access, online_cpus, Draining, KernelCapture, KernelOptions, KernelRecorder, KernelStats,
};
pub use spans::{pair, KernelSpan, PairCounts, SpanKind};
