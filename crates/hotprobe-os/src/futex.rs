//! Futex waits and wakes on a word of a shared mapping. Not
//! `FUTEX_PRIVATE_FLAG`: the waker is another process (the agent in the
//! target, the plugin in QEMU) mapping the same memory.

use crate::OsError;
use rustix::thread::futex;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Why a [`futex_wait`] returned: each is normal, the caller looks at the
/// word again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutexWaited {
    /// Woken by a [`futex_wake`] (or spuriously).
    Woken,
    /// The word did not hold the expected value: no sleep.
    Changed,
    /// The timeout ran out.
    TimedOut,
    /// A signal interrupted the sleep.
    Interrupted,
}

/// Sleeps while `word` holds `expected`, for `timeout` at most (None: no
/// limit), until a [`futex_wake`] on it (`FUTEX_WAIT`).
pub fn futex_wait(
    word: &AtomicU32,
    expected: u32,
    timeout: Option<Duration>,
) -> Result<FutexWaited, OsError> {
    let ts = timeout.map(|d| futex::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos().into(),
    });
    match futex::wait(word, futex::Flags::empty(), expected, ts.as_ref()) {
        Ok(()) => Ok(FutexWaited::Woken),
        Err(rustix::io::Errno::AGAIN) => Ok(FutexWaited::Changed),
        Err(rustix::io::Errno::TIMEDOUT) => Ok(FutexWaited::TimedOut),
        Err(rustix::io::Errno::INTR) => Ok(FutexWaited::Interrupted),
        Err(e) => Err(OsError::new("futex(FUTEX_WAIT)", e)),
    }
}

/// Wakes up to `n` waiters sleeping on `word` (`FUTEX_WAKE`); returns how
/// many it woke.
pub fn futex_wake(word: &AtomicU32, n: u32) -> Result<usize, OsError> {
    futex::wake(word, futex::Flags::empty(), n).map_err(|e| OsError::new("futex(FUTEX_WAKE)", e))
}
