//! A blocking `waitpid` with a deadline: a one-shot per-thread POSIX timer
//! whose signal (handled without `SA_RESTART`) interrupts the wait. A stop
//! of a tracee wakes the tracer at once, instead of after the nap of a
//! polling loop (20 µs – 2 ms, longer on a loaded machine), which made each
//! trap hit of a recording session cost ~200 µs instead of ~10 µs.

use std::cell::Cell;
use std::sync::Once;
use std::time::Duration;

/// The signal the timer sends: a real-time one, past those glibc keeps.
fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

extern "C" fn on_wake(_sig: libc::c_int) {}

/// A thread's timer, deleted when the thread ends.
struct ThreadTimer(Cell<Option<libc::timer_t>>);

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        if let Some(id) = self.0.get() {
            // SAFETY: a timer this thread created and nobody else uses.
            unsafe { libc::timer_delete(id) };
        }
    }
}

thread_local! {
    /// This thread's timer, created at its first timed wait.
    static TIMER: ThreadTimer = const { ThreadTimer(Cell::new(None)) };
}

/// This thread's timer, or `None` if one cannot be made (the caller polls).
fn timer() -> Option<libc::timer_t> {
    static HANDLER: Once = Once::new();
    HANDLER.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler does nothing
        // (async-signal-safe). No SA_RESTART: the wait returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(wake_signal(), &sa, std::ptr::null_mut());
        }
    });
    // None while the thread's locals are being torn down.
    TIMER
        .try_with(|t| {
            let t = &t.0;
            if t.get().is_none() {
                // SAFETY: a zeroed sigevent is valid; the fields set make it
                // signal this thread.
                let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
                ev.sigev_notify = libc::SIGEV_THREAD_ID;
                ev.sigev_signo = wake_signal();
                // SAFETY: gettid has no preconditions.
                ev.sigev_notify_thread_id = unsafe { libc::gettid() };
                let mut id: libc::timer_t = std::ptr::null_mut();
                // SAFETY: valid pointers to a sigevent and a timer id.
                if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) } == 0 {
                    t.set(Some(id));
                }
            }
            t.get()
        })
        .ok()
        .flatten()
}

fn set(id: libc::timer_t, d: Duration) -> bool {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: a timer of this thread and a valid itimerspec.
    unsafe { libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) == 0 }
}

/// `waitpid(pid, flags)` blocking for at most `d` (about): `Ok(None)` when
/// it ran out or a signal interrupted it (the wait is over either way);
/// `None` when no timer is available (the caller polls instead).
pub(crate) fn waitpid_for(
    pid: i32,
    flags: i32,
    d: Duration,
) -> Option<Result<Option<(i32, i32)>, crate::sys::SysError>> {
    let id = timer()?;
    // A zero it_value would disarm: at least 1 µs.
    if !set(id, d.max(Duration::from_micros(1))) {
        return None;
    }
    let r = crate::sys::waitpid(pid, flags);
    set(id, Duration::ZERO);
    Some(match r {
        Err(e) if e.errno() == libc::EINTR => Ok(None),
        r => r,
    })
}
