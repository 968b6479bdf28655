//! hotprobe's OS layer: the system calls the tracer side makes, each
//! written once.
//!
//! - [`sys`] and [`ptrace`]: ptrace, wait, tgkill/kill and `/proc/PID/mem`
//!   of the process target, behind the [`ptrace::Os`] trait (real calls, a
//!   call log, and a scripted fake with the feature `fake`).
//! - [`shm`]: an RAII [`Memfd`] (executable and sealed, or sized) and an
//!   RAII shared [`Mapping`] of it: the shared memory of the fast path and
//!   of the QEMU plugin, and the embedded agent and plugin libraries.
//! - [`futex`]: wait and wake on a word of a shared mapping (not
//!   process-private: the other side is another process).
//! - [`exec_gate`]: fanotify `FAN_OPEN_EXEC_PERM`: execs of a program (or
//!   of any) held in the kernel until answered (`--exe`, `--comm`).
//! - [`clock`]: `CLOCK_MONOTONIC` and the TSC, and the rate between them.
//! - [`pidfd`]: a descriptor of another process, duplicated into ours.
//!
//! Built on rustix where it covers the call; ptrace and wait are on raw
//! libc (see [`sys`]). The in-target agent and the QEMU plugin cannot link
//! std and keep their own libc-only copies of the few calls they make.

pub mod clock;
pub mod exec_gate;
pub mod futex;
pub mod pidfd;
pub mod ptrace;
pub mod shm;
pub mod sys;
mod waiter;

pub use futex::{futex_wait, futex_wake, FutexWaited};
pub use shm::{Mapping, Memfd};
pub use waiter::{wake_on_child, ChildWake};

/// A failed system call of this layer (other than ptrace and wait, whose
/// errors are [`sys::SysError`]): which call, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct OsError {
    /// The call, e.g. `memfd_create`.
    pub call: &'static str,
    /// The OS error.
    pub source: std::io::Error,
}

impl OsError {
    /// `call` failed with `source` (a rustix or std error).
    pub(crate) fn new(call: &'static str, source: impl Into<std::io::Error>) -> Self {
        OsError {
            call,
            source: source.into(),
        }
    }

    /// The errno, if any.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(0)
    }
}
