//! `sys::waitpid_restart` sees its child's status even when a signal
//! handled without `SA_RESTART` (as `--duration`'s SIGALRM is) interrupts
//! the wait, where plain `sys::waitpid` fails with EINTR ("waitpid failed
//! … Interrupted system call", issue 22). Synchronised on the waiter being
//! in wait4 (/proc/self/task/TID/syscall), not on sleeps.

use hotprobe_process::sys;
use std::time::{Duration, Instant};

extern "C" fn on_alarm(_: libc::c_int) {}

/// Waits until thread `tid` of this process is blocked in wait4 (61);
/// false when `done` says it ended instead.
fn in_wait4(tid: i32, done: &dyn Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return false;
        }
        let s =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap_or_default();
        if s.split_whitespace().next() == Some("61") {
            return true;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never in wait4: {s}"
        );
        std::thread::yield_now();
    }
}

/// Forks a child that exits with 7 once a byte arrives on a pipe; runs
/// `wait` for it on a thread, interrupts that thread's wait with SIGALRM
/// twice, then lets the child exit; returns what `wait` returned.
/// A wait for a pid: `sys::waitpid` or `sys::waitpid_restart`.
type Wait = fn(i32) -> Result<Option<(i32, i32)>, sys::SysError>;

fn interrupted(wait: Wait) -> Result<i32, i32> {
    // SAFETY: a zeroed sigaction is valid; the handler does nothing; no
    // SA_RESTART, as hotprobe's own handlers.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
    let mut fds = [0i32; 2];
    // SAFETY: a valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only calls async-signal-safe functions.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut b = 0u8;
        // SAFETY: reading one byte into a live local, then _exit.
        unsafe {
            libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
            libc::_exit(7);
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        wait(child)
    });
    let tid = rx.recv().unwrap();
    let pthread = {
        use std::os::unix::thread::JoinHandleExt;
        waiter.as_pthread_t()
    };
    for _ in 0..2 {
        if !in_wait4(tid, &|| waiter.is_finished()) {
            break;
        }
        // SAFETY: a live thread of this process; the handler does nothing.
        unsafe { libc::pthread_kill(pthread, libc::SIGALRM) };
        // The signal is taken (the thread left wait4) before the next.
        let start = Instant::now();
        while std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("SigPnd:") && !l.ends_with("0000000000000000"))
            })
            .unwrap_or(false)
        {
            assert!(start.elapsed() < Duration::from_secs(30));
            std::thread::yield_now();
        }
    }
    // SAFETY: writing one byte from a live local to the pipe.
    unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
    let r = waiter.join().unwrap();
    // SAFETY: closing our ends of the pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    match r {
        Ok(Some((p, st))) => {
            assert_eq!(p, child);
            Ok(libc::WEXITSTATUS(st))
        }
        Ok(None) => panic!("no status"),
        Err(e) => {
            // Reap the child the interrupted wait left.
            let _ = sys::waitpid_restart(child, 0);
            Err(e.errno())
        }
    }
}

#[test]
fn an_interrupted_wait_is_retried() {
    let _ = sys::take_deferred_interrupt();
    // The waiter thread retried; the interruption is kept for its next
    // main wait (this thread's flag is untouched).
    assert_eq!(
        interrupted(|p| {
            let r = sys::waitpid_restart(p, 0);
            assert!(sys::take_deferred_interrupt(), "the interruption is kept");
            assert!(!sys::take_deferred_interrupt(), "and taken once");
            r
        }),
        Ok(7)
    );
    assert!(!sys::take_deferred_interrupt());
    // Plain waitpid is what the signal interrupts.
    assert_eq!(interrupted(|p| sys::waitpid(p, 0)), Err(libc::EINTR));
}
