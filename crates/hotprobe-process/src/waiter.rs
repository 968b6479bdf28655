//! A blocking `waitpid` with a deadline, without any signal handler: a stop
//! of a tracee wakes the tracer at once (instead of after the nap of a
//! polling loop, 20 µs – 2 ms, which made each trap hit of a recording
//! session cost ~200 µs instead of ~10 µs), and library code installs no
//! process-wide handler (a host such as Python keeps its own).
//!
//! One waiter thread per process blocks in `waitid(P_ALL, WEXITED |
//! WSTOPPED | WNOWAIT | __WALL)` while some tracer thread waits with a
//! deadline. Without `__WNOTHREAD` it sees the children and tracees of
//! every thread of the process, and `WNOWAIT` leaves the status where it
//! is: the waiter consumes nothing, it only tells the waiting tracers
//! (a generation counter under a condition variable). A tracer then takes
//! its own status with `waitpid(-1, WNOHANG | __WNOTHREAD)`. When what
//! woke the waiter was not the tracer's (another thread's child, a zombie
//! its owner has not reaped yet), the tracer polls with short naps until
//! its deadline, as it would without a waiter.
//!
//! The waiter consumes nothing, so no status is ever lost or stolen from
//! another thread; it waits only while asked to (`wanted`), so a status
//! nobody takes costs one wake-up per timed wait, not a spinning thread.

use crate::os::Waited;
use crate::sys;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The waiter's state, shared with the tracers.
struct State {
    /// Bumped each time the waiter's `waitid` returns.
    generation: u64,
    /// A tracer waits with a deadline: the waiter should block in `waitid`.
    wanted: bool,
    /// The waiter thread was started (or could not be: `failed`).
    started: bool,
    /// The waiter thread could not be started.
    failed: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    generation: 0,
    wanted: false,
    started: false,
    failed: false,
});
static CHANGED: Condvar = Condvar::new();

/// The waiter thread's loop.
fn run() {
    loop {
        {
            let Ok(mut s) = STATE.lock() else { return };
            while !s.wanted {
                s = match CHANGED.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
        }
        // SAFETY: a zeroed siginfo_t is valid; waitid only writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out pointer; WNOWAIT leaves the status in place.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WSTOPPED | libc::WNOWAIT | libc::__WALL,
            )
        };
        if r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // A status is there, or no child at all (ECHILD): either way the
        // tracers look for themselves.
        let Ok(mut s) = STATE.lock() else { return };
        s.generation = s.generation.wrapping_add(1);
        s.wanted = false;
        CHANGED.notify_all();
    }
}

/// Asks the waiter to block in `waitid` (starting it the first time);
/// returns the generation to wait past, or `None` without a waiter.
fn arm() -> Option<u64> {
    let mut s = STATE.lock().ok()?;
    if !s.started {
        s.started = true;
        let spawned = std::thread::Builder::new()
            .name("hotprobe-waiter".into())
            .spawn(run);
        s.failed = spawned.is_err();
    }
    if s.failed {
        return None;
    }
    s.wanted = true;
    CHANGED.notify_all();
    Some(s.generation)
}

/// Blocks until the waiter's generation moves past `g0` or `deadline`;
/// whether it moved.
fn woken(g0: u64, deadline: Instant) -> bool {
    let Ok(mut s) = STATE.lock() else {
        return false;
    };
    loop {
        if s.generation != g0 {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        s = match CHANGED.wait_timeout(s, deadline - now) {
            Ok((s, _)) => s,
            Err(_) => return false,
        };
    }
}

/// `waitpid(pid, flags)` blocking for about `d` at most: `Some(Ok(None))`
/// when it ran out; `None` when no waiter thread can be had (the caller
/// polls instead).
pub(crate) fn waitpid_for(pid: i32, flags: i32, d: Duration) -> Option<Waited> {
    let deadline = Instant::now() + d;
    let g0 = arm()?;
    // Armed first: a status arriving from here on wakes the waiter (it is
    // level-triggered), so none is missed between this look and the wait.
    match sys::waitpid(pid, flags | libc::WNOHANG) {
        Ok(None) => {}
        other => return Some(other),
    }
    if !woken(g0, deadline) {
        return Some(Ok(None));
    }
    // Woken: ours, or someone else's status (then poll to the deadline).
    let mut nap = Duration::from_micros(20);
    loop {
        match sys::waitpid(pid, flags | libc::WNOHANG) {
            Ok(None) => {}
            other => return Some(other),
        }
        let now = Instant::now();
        if now >= deadline {
            return Some(Ok(None));
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(2));
    }
}
