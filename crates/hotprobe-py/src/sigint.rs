//! Ctrl-C during `Session.run()`: a SIGINT handler of the run's own.

use std::sync::atomic::{AtomicBool, Ordering};

/// Raised by SIGINT while `Session.run()` waits for the targets.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Python's SIGINT handler only flags the signal for the interpreter,
/// which does not run while the targets do: for the length of a run, a
/// handler of our own raises [`INTERRUPTED`] and, installed without
/// `SA_RESTART`, interrupts the loop's blocking wait. Python's comes back
/// on drop.
pub(crate) struct SigintGuard {
    old: libc::sigaction,
}

impl SigintGuard {
    /// Installs the handler (clearing [`INTERRUPTED`]); `None` if it
    /// cannot be.
    pub(crate) fn install() -> Option<SigintGuard> {
        INTERRUPTED.store(false, Ordering::Relaxed);
        // SAFETY: zeroed sigaction structs are valid starting values; the
        // handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(libc::SIGINT, &sa, &mut old) == 0).then_some(SigintGuard { old })
        }
    }
}

impl Drop for SigintGuard {
    fn drop(&mut self) {
        // SAFETY: puts back the action read at install.
        unsafe { libc::sigaction(libc::SIGINT, &self.old, std::ptr::null_mut()) };
    }
}
