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
/// [`REASON`] value for a reader of stdout that went away.
const BY_CLOSED_OUTPUT: u8 = 254;

/// Why the loop was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A signal (SIGINT, SIGTERM) with its number.
    Signal(i32),
    /// `--duration` elapsed.
    Timer,
    /// The reader of stdout went away (`hotprobe trace -p PID | head`).
    OutputClosed,
}

/// The reason [`STOP`] was raised, if it was.
pub fn stop_reason() -> Option<StopReason> {
    match REASON.load(Ordering::SeqCst) {
        0 => None,
        BY_TIMER => Some(StopReason::Timer),
        BY_CLOSED_OUTPUT => Some(StopReason::OutputClosed),
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

/// The calling thread, after SIGALRM was given a handler that does
/// nothing (without `SA_RESTART`): a wake-up for its blocking waits.
fn wakeable_caller() -> libc::pthread_t {
    // SAFETY: a zeroed sigaction is valid; the handler does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() }
}

/// Raises [`STOP`] for `reason` and interrupts `waiter`'s blocking wait.
fn stop_and_wake(reason: u8, waiter: libc::pthread_t) {
    let _ = REASON.compare_exchange(0, reason, Ordering::SeqCst, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: the waiting thread lives as long as the process's event loop.
    unsafe { libc::pthread_kill(waiter, libc::SIGALRM) };
}

/// Raise [`STOP`] after `d` (for `--duration`), then interrupt the calling
/// thread's blocking wait with SIGALRM (handled without `SA_RESTART`).
pub fn stop_after(d: Duration) {
    let waiter = wakeable_caller();
    std::thread::spawn(move || {
        std::thread::sleep(d);
        stop_and_wake(BY_TIMER, waiter);
    });
}

/// When stdout is a pipe or a socket: raise [`STOP`] as soon as its reader
/// goes away (`hotprobe trace -p PID | head`), so that the session ends
/// and detaches instead of holding the target until it exits. A thread
/// waits in `poll` for the error the kernel reports on the writing end.
pub fn stop_when_output_closes() {
    // SAFETY: a zeroed stat is a valid buffer for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 1 and a valid buffer.
    if unsafe { libc::fstat(1, &mut st) } != 0 {
        return;
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFIFO && kind != libc::S_IFSOCK {
        return;
    }
    let waiter = wakeable_caller();
    std::thread::spawn(move || loop {
        let mut p = libc::pollfd {
            fd: 1,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no timeout: the reader's end closing
        // (POLLERR on a pipe, POLLHUP on a socket) ends the wait.
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            stop_and_wake(BY_CLOSED_OUTPUT, waiter);
            return;
        }
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    });
}
