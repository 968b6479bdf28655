//! [`KernelError`]: what can go wrong opening and reading the events.

use std::path::PathBuf;

use crate::tracefs::MOUNT_HINT;

/// Where the kernel's paranoia level is.
pub const PARANOID_FILE: &str = "/proc/sys/kernel/perf_event_paranoid";

/// Errors of the host-kernel event source.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No tracefs with the `raw_syscalls` tracepoints.
    #[error(
        "tracefs is not mounted (no events/raw_syscalls under /sys/kernel/tracing nor \
         /sys/kernel/debug/tracing): mount it as root with `{MOUNT_HINT}`"
    )]
    TracefsMissing,
    /// tracefs is there but not readable by this user.
    #[error(
        "{}: {source}: the tracepoints' ids in tracefs are readable by root only: \
         run hotprobe as root (or with CAP_DAC_READ_SEARCH and CAP_PERFMON)",
        path.display()
    )]
    TracefsDenied {
        /// The file or directory refused.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A tracefs file could not be read.
    #[error("{}: {source}", path.display())]
    Tracefs {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A tracepoint `format` file this crate does not understand.
    #[error("{}: {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: crate::tracefs::FormatError,
    },
    /// `perf_event_open` refused the tracepoints for lack of permission.
    #[error(
        "the kernel refused the syscall tracepoints to perf_event_open ({source}); \
         {PARANOID_FILE} is {}: tracepoint samples need root (CAP_PERFMON) or a \
         perf_event_paranoid of -1: run hotprobe as root, or as root \
         `sysctl kernel.perf_event_paranoid=-1`",
        paranoid.map_or("unreadable".to_string(), |p| p.to_string())
    )]
    PerfDenied {
        /// The paranoia level read, if it could be.
        paranoid: Option<i32>,
        /// The OS error (EACCES or EPERM).
        source: std::io::Error,
    },
    /// The process has no thread left to follow.
    #[error("pid {pid} has no thread left to follow")]
    NoThread {
        /// The process.
        pid: i32,
    },
    /// The threads of a process could not be listed.
    #[error("cannot list the threads of pid {pid}: {source}")]
    Threads {
        /// The process.
        pid: i32,
        /// The OS error.
        source: std::io::Error,
    },
    /// `perf_event_open` failed for another reason.
    #[error("perf_event_open of raw_syscalls:{what} for thread {tid} on CPU {cpu}: {source}")]
    Open {
        /// `sys_enter` or `sys_exit`.
        what: &'static str,
        /// The thread.
        tid: i32,
        /// The CPU.
        cpu: i32,
        /// The OS error.
        source: std::io::Error,
    },
    /// The ring of a CPU could not be mapped.
    #[error("cannot map the perf ring of CPU {cpu} ({bytes} bytes): {source}")]
    Mmap {
        /// The CPU.
        cpu: i32,
        /// Size asked for.
        bytes: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// An ioctl on an event failed.
    #[error("{what} on a perf event: {source}")]
    Ioctl {
        /// `enable`, `disable`, `set output`.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The thread draining the rings could not be started.
    #[error("cannot start the thread draining the kernel's rings: {0}")]
    Spawn(std::io::Error),
    /// The thread draining the rings died.
    #[error("the thread draining the kernel's rings panicked")]
    DrainPanicked,
}

impl KernelError {
    /// True when the error is a missing permission or a missing tracefs
    /// (something the user must change, said in the message).
    pub fn is_permission(&self) -> bool {
        matches!(
            self,
            KernelError::TracefsMissing
                | KernelError::TracefsDenied { .. }
                | KernelError::PerfDenied { .. }
        )
    }
}

/// The paranoia level, if readable.
pub fn paranoid_level() -> Option<i32> {
    std::fs::read_to_string(PARANOID_FILE)
        .ok()?
        .trim()
        .parse()
        .ok()
}
