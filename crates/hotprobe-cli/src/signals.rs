//! Ctrl-C and friends: SIGINT/SIGTERM set a flag that the event loop
//! ([`hotprobe::Session::run_until`]) polls, so the session can detach
//! cleanly instead of dying with probes in the target.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

/// Raised by a signal or by the `--duration` timer; the event loop returns
/// when it becomes true.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Why [`STOP`] was raised: 0 not yet, otherwise the signal number, or
/// [`BY_TIMER`].
static REASON: AtomicU8 = AtomicU8::new(0);

/// [`REASON`] value for the `--duration` timer.
const BY_TIMER: u8 = 255;

/// Why the loop was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A signal (SIGINT, SIGTERM) with its number.
    Signal(i32),
    /// `--duration` elapsed.
    Timer,
}

/// The reason [`STOP`] was raised, if it was.
pub fn stop_reason() -> Option<StopReason> {
    match REASON.load(Ordering::SeqCst) {
        0 => None,
        BY_TIMER => Some(StopReason::Timer),
        s => Some(StopReason::Signal(i32::from(s))),
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work: two atomic stores.
    let _ = REASON.compare_exchange(0, sig as u8, Ordering::SeqCst, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// Install the SIGINT/SIGTERM handler (without `SA_RESTART`, so a blocking
/// system call returns `EINTR` and the loop notices the flag at once).
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // only performs atomic stores, which are async-signal-safe.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_wake(_sig: libc::c_int) {}

/// Raise [`STOP`] after `d` (for `--duration`), then interrupt the calling
/// thread's blocking wait with SIGALRM (handled without `SA_RESTART`).
pub fn stop_after(d: Duration) {
    // SAFETY: a zeroed sigaction is valid; the handler does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
    // SAFETY: pthread_self has no preconditions.
    let waiter = unsafe { libc::pthread_self() };
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let _ = REASON.compare_exchange(0, BY_TIMER, Ordering::SeqCst, Ordering::SeqCst);
        STOP.store(true, Ordering::SeqCst);
        // SAFETY: the waiting thread lives as long as the process's event loop.
        unsafe { libc::pthread_kill(waiter, libc::SIGALRM) };
    });
}
