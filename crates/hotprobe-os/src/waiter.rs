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
//! (under a condition variable). A tracer then takes
//! its own status with `waitpid(-1, WNOHANG | __WNOTHREAD)`. When what
//! woke the waiter was not the tracer's (another thread's child, a zombie
//! its owner has not reaped yet), the tracer polls with short naps until
//! its deadline, as it would without a waiter.
//!
//! The waiter consumes nothing, so no status is ever lost or stolen from
//! another thread; it waits only while asked to (`wanted`), so a status
//! nobody takes costs one wake-up per timed wait, not a spinning thread.
//!
//! The hop through the waiter costs a wake-up on a loaded machine (20,000
//! signal stops of a raise loop: 8–140 µs a stop against 4–20 µs with the
//! old timer signal, under a load average of 10–12 on 2 cores). A timed
//! wait therefore first looks for a status itself for up to 30 µs,
//! yielding the CPU between looks (the tracee's next stop usually comes
//! within that): 4 µs a stop in the same runs, and at most 30 µs of CPU
//! per timed wait that finds nothing.

use crate::ptrace::Waited;
use crate::sys;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a timed wait looks for a status itself before it asks the
/// waiter (see [`waitpid_for`]).
const SPIN: Duration = Duration::from_micros(30);

/// The waiter's state, shared with the tracers.
struct State {
    /// Bumped by each tracer asking for a wake-up (an arm).
    arms: u64,
    /// The arm count when the waiter's last finished `waitid` began: a
    /// tracer armed at `k` is woken by a `waitid` begun at `k` or later
    /// (one begun before may have returned for a status that tracer took
    /// itself meanwhile).
    woke: u64,
    /// A tracer waits with a deadline: the waiter should block in `waitid`.
    wanted: bool,
    /// The waiter thread was started (or could not be: `failed`).
    started: bool,
    /// The waiter thread could not be started.
    failed: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    arms: 0,
    woke: 0,
    wanted: false,
    started: false,
    failed: false,
});
static CHANGED: Condvar = Condvar::new();

/// The waiter thread's loop.
fn run() {
    loop {
        let epoch = {
            let Ok(mut s) = STATE.lock() else { return };
            while !s.wanted {
                s = match CHANGED.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
            s.arms
        };
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
        s.woke = epoch;
        if s.arms == epoch {
            s.wanted = false;
        }
        // Else a tracer armed since this `waitid` began: the loop waits
        // again at once (a status still there returns it at once).
        CHANGED.notify_all();
    }
}

/// Asks the waiter to block in `waitid` (starting it the first time);
/// returns this arm's number, or `None` without a waiter.
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
    s.arms += 1;
    s.wanted = true;
    CHANGED.notify_all();
    Some(s.arms)
}

/// Blocks until a `waitid` begun at arm `k` or later returned, or
/// `deadline`; whether one did.
fn woken(k: u64, deadline: Instant) -> bool {
    let Ok(mut s) = STATE.lock() else {
        return false;
    };
    loop {
        if s.woke >= k {
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
    // A stop often follows the resume that precedes this wait within a
    // few microseconds: looked for first, yielding the CPU (to the tracee,
    // on a busy machine), so that it costs no hop through the waiter.
    let spin_end = Instant::now() + SPIN.min(d);
    loop {
        match sys::waitpid(pid, flags | libc::WNOHANG) {
            Ok(None) => {}
            other => return Some(other),
        }
        if Instant::now() >= spin_end {
            break;
        }
        std::thread::yield_now();
    }
    let k = arm()?;
    // Armed first: a status arriving from here on wakes the waiter (it is
    // level-triggered), so none is missed between this look and the wait.
    match sys::waitpid(pid, flags | libc::WNOHANG) {
        Ok(None) => {}
        other => return Some(other),
    }
    if !woken(k, deadline) {
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
