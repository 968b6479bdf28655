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
//!
//! A tracer that sleeps on a futex word instead (serving shared-memory
//! handler calls, whose doorbell the target's agent rings) registers that
//! word with [`wake_on_child`]: the waiter's next `waitid` that returns
//! bumps and wakes it, so that one sleep ends on whichever comes first, a
//! handler call or a stop of a tracee. The bump (not a bare wake) means a
//! wake that comes before the tracer is asleep is not lost: its futex
//! compares the word and returns at once.

use crate::ptrace::Waited;
use crate::sys;
use std::sync::atomic::{AtomicU32, Ordering};
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
    /// The futex words of [`ChildWake`]s, by arm number, as addresses:
    /// each stays mapped while it is listed (its guard borrows it and
    /// takes it out, under this lock, when dropped).
    words: Vec<(u64, usize)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    arms: 0,
    woke: 0,
    wanted: false,
    started: false,
    failed: false,
    words: Vec::new(),
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
        // The words armed before this `waitid` began (a later one waits
        // for the next, as its tracer may have taken this status itself).
        for (_, addr) in s.words.iter().filter(|(k, _)| *k <= epoch) {
            // SAFETY: a listed address is a live `AtomicU32` (see
            // `State::words`); the lock is held, so its guard cannot
            // take it out (and its mapping go) meanwhile.
            let word = unsafe { &*(*addr as *const AtomicU32) };
            word.fetch_add(1, Ordering::SeqCst);
            let _ = crate::futex::futex_wake(word, u32::MAX >> 1);
        }
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
    arm_locked(&mut s)
}

/// [`arm`] under the lock held.
fn arm_locked(s: &mut State) -> Option<u64> {
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

/// A futex word the waiter bumps and wakes (`FUTEX_WAKE`) once a child or
/// tracee of this process has a wait status to take: made by
/// [`wake_on_child`], taken out of the waiter's list when dropped.
#[derive(Debug)]
pub struct ChildWake<'a> {
    arm: u64,
    word: std::marker::PhantomData<&'a AtomicU32>,
}

impl ChildWake<'_> {
    /// Whether the waiter has seen a wait status since this was made (the
    /// word was bumped for it). The status may be another thread's (a
    /// child of the host program's): the caller looks for its own.
    pub fn fired(&self) -> bool {
        STATE.lock().is_ok_and(|s| s.woke >= self.arm)
    }
}

impl Drop for ChildWake<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = STATE.lock() {
            s.words.retain(|(k, _)| *k != self.arm);
        }
    }
}

/// Has the waiter thread bump and wake `word` when a child or tracee of
/// any thread of this process has a wait status (a stop, an exit), one
/// already there included: once, for the first `waitid` that returns.
/// `None` when no waiter thread can be had (the caller polls instead).
/// The wait consumes nothing (`WNOWAIT`): the status stays for its owner.
pub fn wake_on_child(word: &AtomicU32) -> Option<ChildWake<'_>> {
    let mut s = STATE.lock().ok()?;
    // Listed under the same lock as the arm: the `waitid` that serves
    // this arm cannot begin before the word is there to bump.
    let arm = arm_locked(&mut s)?;
    s.words.push((arm, word as *const AtomicU32 as usize));
    Some(ChildWake {
        arm,
        word: std::marker::PhantomData,
    })
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
