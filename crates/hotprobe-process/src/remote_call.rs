//! Function calls and system calls made inside a stopped target thread, for
//! injecting an agent into a running process (`dlopen` then the agent's
//! attach function).
//!
//! A call runs the thread from the function's first instruction on a stack
//! carved below the red zone. Where it can, [`remote_call`] makes a call
//! that a tracer killed in its midst does not leave half done (issue 22
//! item 3): its return address is [`crate::remote_frame::RETURN_STUB`],
//! in an executable page mapped for the call (and unmapped after it),
//! above a signal frame holding the thread's own state, and the thread
//! runs to its system-call stops (`PTRACE_SYSCALL`). The tracer takes the
//! result at the stub's `rt_sigreturn` entry stop, skips that system call
//! and sets the registers back itself; should the tracer die first, the
//! thread runs the stub, and `rt_sigreturn` takes it back to where it was.
//! The function's own system calls (a `dlopen` makes a few dozen) stop
//! too, and go on at once. Elsewhere (a process we spawned, which dies
//! with us while traced anyway; a vfork's calls; no extended state to put
//! in a frame, no page) the return address is 0: the `ret` then
//! faults at address 0, which the tracer sees as a SIGSEGV stop with
//! `rip == 0` and swallows, and a tracer's death meanwhile kills the
//! program. The thread's registers are restored afterwards (including
//! `orig_rax`, so a system call it was blocked in restarts).
//! Other threads stay stopped while the call runs. A call of
//! [`remote_call`] that has not returned after [`LET_OTHERS_RUN_AFTER`]
//! may wait for a lock a stopped thread holds (the loader's, the thread
//! stack cache's, a malloc arena's: with 2,000 threads and threads made
//! all the time, `dlopen` of the agent waited so in most attaches), so the
//! other parked threads are resumed until the call returns, then stopped
//! again (their events are queued as a `stop_all`'s). Interrupting the
//! call instead left the lock held by the call's thread for good: the
//! program hung. Calls are still bounded by a timeout, and the thread is
//! interrupted when it expires.

use std::time::{Duration, Instant};

use hotprobe_target::{Target, TargetError};

use crate::{sys, ProcessTarget};

/// How long a remote call runs with the other threads stopped before they
/// are let run (see the module docs).
pub const LET_OTHERS_RUN_AFTER: Duration = Duration::from_millis(100);

/// Runs system call `nr` with up to six arguments on a stopped thread of
/// `t`; returns the raw result (a negative errno on failure).
pub fn remote_syscall(t: &mut ProcessTarget, nr: u64, args: &[u64]) -> Result<u64, TargetError> {
    let tid = stopped(t)?;
    crate::remote::syscall(t, tid, nr, args)
}

fn stopped(t: &mut ProcessTarget) -> Result<i32, TargetError> {
    t.thread_for_remote()?.ok_or_else(|| TargetError::Protocol {
        target: t.describe(),
        why: "no stopped thread to run a remote call on: call stop_all first".into(),
    })
}

/// Calls the function at `func` with up to six integer arguments on a
/// stopped thread of `t` (all threads should be stopped) and returns its
/// `rax`. Fails after `timeout` (the thread is then interrupted and its
/// registers restored; the callee's side effects are not undone).
pub fn remote_call(
    t: &mut ProcessTarget,
    func: u64,
    args: &[u64],
    timeout: Duration,
) -> Result<u64, TargetError> {
    let tid = stopped(t)?;
    remote_call_with(t, tid, func, args, timeout, true)
}

/// How a remote function call comes back to the tracer.
#[derive(Clone, Copy)]
enum Return {
    /// To address 0: a SIGSEGV stop with `rip` 0.
    ToZero,
    /// Into the return stub at `stub`, over a signal frame: the stub's
    /// `rt_sigreturn` entry stop, the result in `rdi`.
    Stub { stub: u64 },
}

impl Return {
    /// Runs thread `tid` on to its next stop of the kind this return
    /// needs.
    fn resume(self, t: &mut ProcessTarget, tid: i32) -> Result<(), TargetError> {
        match self {
            Return::ToZero => t.sys.cont(tid, 0),
            Return::Stub { .. } => t.sys.syscall_resume(tid, 0),
        }
        .map_err(|e| t.sys_err(e))
    }
}

/// Maps an executable page in the target, with
/// [`crate::remote_frame::RETURN_STUB`] at its start; None where it cannot
/// be had.
fn map_return_stub(t: &mut ProcessTarget, tid: i32) -> Option<u64> {
    let page = crate::remote::syscall(
        t,
        tid,
        libc::SYS_mmap as u64,
        &[
            0,
            4096,
            (libc::PROT_READ | libc::PROT_EXEC) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )
    .ok()?;
    if (page as i64) < 0 {
        return None;
    }
    let stub = &crate::remote_frame::RETURN_STUB;
    if t.write_memory(hotprobe_target::RuntimeAddr(page), stub)
        .is_err()
    {
        unmap_return_stub(t, tid, page);
        return None;
    }
    Some(page)
}

/// Unmaps the page of [`map_return_stub`] (best effort: a page left is
/// 4 KiB of the program's address space, nothing it runs).
fn unmap_return_stub(t: &mut ProcessTarget, tid: i32, page: u64) {
    let _ = crate::remote::syscall(t, tid, libc::SYS_munmap as u64, &[page, 4096]);
}

/// As [`remote_call`], on stopped thread `tid` (a vfork child at its
/// first stop, its parent at the end of its vfork), its whole extended
/// state kept as well (x87, SSE, the upper halves of the AVX registers;
/// the x87/SSE part alone where the kernel gives no `NT_X86_XSTATE`):
/// the callee may use the vector registers (`memcpy`, `strlen` in
/// `dlopen`), which a thread stopped between two instructions of its own
/// may hold live.
pub(crate) fn remote_call_on(
    t: &mut ProcessTarget,
    tid: i32,
    func: u64,
    args: &[u64],
    timeout: Duration,
) -> Result<u64, TargetError> {
    remote_call_with(t, tid, func, args, timeout, false)
}

/// [`remote_call_on`]; with `let_others_run`, the other parked threads run
/// while the call has not returned after [`LET_OTHERS_RUN_AFTER`].
fn remote_call_with(
    t: &mut ProcessTarget,
    tid: i32,
    func: u64,
    args: &[u64],
    timeout: Duration,
    let_others_run: bool,
) -> Result<u64, TargetError> {
    // The extended state holds the x87/SSE state too: that alone is kept
    // only where the kernel gives no extended state.
    let xstate = t.sys.getxstate(tid).ok();
    let fp = match xstate {
        Some(_) => None,
        None => Some(t.sys.getfpregs(tid).map_err(|e| t.sys_err(e))?),
    };
    let mut lent = crate::lend::Lent::default();
    let r = remote_call_regs(t, tid, func, args, timeout, let_others_run, &mut lent);
    if !lent.is_empty() {
        // Stopped again as `stop_all` stops them (the call's thread is
        // parked: its stop was taken above).
        let stopped = t.take_back(lent);
        if r.is_ok() {
            stopped?;
        }
    }
    match (&xstate, &fp) {
        (Some(x), _) => {
            let _ = t.sys.setxstate(tid, x);
        }
        (None, Some(fp)) => {
            let _ = t.sys.setfpregs(tid, fp);
        }
        (None, None) => {}
    }
    r
}

/// Runs the call on `tid`; the threads it let run (`let_others_run`) are
/// in `lent`.
fn remote_call_regs(
    t: &mut ProcessTarget,
    tid: i32,
    func: u64,
    args: &[u64],
    timeout: Duration,
    let_others_run: bool,
    lent: &mut crate::lend::Lent,
) -> Result<u64, TargetError> {
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    let mut regs = saved;
    // The frame of a call that survives the tracer, for a process we
    // attached to. A process we spawned dies with us while traced anyway,
    // and the call there (the preloaded agent's attach) cost each of its
    // later threads' starts about 8 µs of CPU through it (count of an
    // 8-thread start, `hotprobe-bench threadstart`: 1.51× native against
    // 1.25× without). The vfork calls, which do not let others run, keep
    // the older way too.
    let stub = if let_others_run && !t.spawned {
        map_return_stub(t, tid)
    } else {
        None
    };
    let frame = stub.and_then(|s| {
        crate::remote::write_frame(t, tid, &saved, s, crate::remote_frame::FrameFor::Call)
    });
    let ret = match (stub, frame) {
        (Some(stub), Some(at)) => {
            regs.rsp = at;
            Return::Stub { stub }
        }
        _ => {
            if let Some(page) = stub {
                unmap_return_stub(t, tid, page);
            }
            // Below the red zone, 16-byte aligned, then the fake return
            // address 0: at the callee's first instruction rsp ≡ 8 (mod
            // 16) as the ABI wants.
            let sp = ((saved.rsp.wrapping_sub(256)) & !15) - 8;
            t.write_memory(hotprobe_target::RuntimeAddr(sp), &0u64.to_le_bytes())?;
            regs.rsp = sp;
            Return::ToZero
        }
    };
    regs.rip = func;
    regs.rax = 0;
    regs.orig_rax = u64::MAX;
    crate::remote::set_args(&mut regs, args, crate::remote::ArgConvention::Function);
    let lent = let_others_run.then_some(lent);
    let mut at_syscall_exit = false;
    let result = call_and_wait(t, tid, regs, ret, timeout, lent, &mut at_syscall_exit);
    match (ret, &result) {
        (Return::Stub { .. }, Ok(_)) => crate::remote::restore_at_syscall_stop(t, tid, &saved)?,
        _ if at_syscall_exit => crate::remote::restore_at_syscall_stop(t, tid, &saved)?,
        _ => t.sys.setregs(tid, &saved).map_err(|e| t.sys_err(e))?,
    }
    if let Some(th) = t.threads.get_mut(&tid) {
        th.regs = None;
    }
    if let Return::Stub { stub } = ret {
        unmap_return_stub(t, tid, stub);
    }
    result
}

/// Runs thread `tid` with `regs` (at a function's first instruction, its
/// stack set up for `ret`) until the call returns, faults or times out;
/// the result. The thread is left stopped, its registers the call's. With
/// `lent`, the other threads run after [`LET_OTHERS_RUN_AFTER`] (see
/// `lend.rs`) and are noted there. `at_syscall_exit` is set when a timed
/// out call left the thread at a system call's exit stop.
fn call_and_wait(
    t: &mut ProcessTarget,
    tid: i32,
    regs: libc::user_regs_struct,
    ret: Return,
    timeout: Duration,
    mut lent: Option<&mut crate::lend::Lent>,
    at_syscall_exit: &mut bool,
) -> Result<u64, TargetError> {
    let func = regs.rip;
    t.sys.setregs(tid, &regs).map_err(|e| t.sys_err(e))?;
    ret.resume(t, tid)?;
    let start = Instant::now();
    // A stop follows a resume within microseconds, most often: the first
    // look that finds none yields, later ones sleep.
    let mut looked_in_vain = false;
    let mut lent_once = false;
    let deadline = start + timeout;
    let mut interrupted = false;
    let result = loop {
        let r = t
            .sys
            .waitpid(tid, libc::WNOHANG | libc::__WALL)
            .map_err(|e| t.sys_err(e))?;
        let Some((_, status)) = r else {
            if let Some(lent) = lent.as_deref_mut() {
                if !lent_once && start.elapsed() >= LET_OTHERS_RUN_AFTER {
                    lent_once = true;
                    *lent = t.lend_others(tid);
                }
            }
            if !interrupted && Instant::now() >= deadline {
                t.sys.interrupt(tid).map_err(|e| t.sys_err(e))?;
                interrupted = true;
            }
            if looked_in_vain {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
            looked_in_vain = true;
            continue;
        };
        looked_in_vain = false;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(TargetError::Gone {
                target: t.describe(),
                status: crate::exit_status(status),
            });
        }
        let sig = libc::WSTOPSIG(status);
        let after = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
        if matches!(ret, Return::ToZero) && sig == libc::SIGSEGV && after.rip == 0 {
            break Ok(after.rax);
        }
        if sig == libc::SIGTRAP | 0x80 && status >> 16 == 0 {
            match ret {
                Return::Stub { stub }
                    if after.rip == stub + crate::remote_frame::RETURN_STUB.len() as u64
                        && after.orig_rax == libc::SYS_rt_sigreturn as u64 =>
                {
                    skip_to_exit_stop(t, tid, after)?;
                    break Ok(after.rdi);
                }
                // Interrupted inside a system call of the function's: with
                // PTRACE_SYSCALL in effect the interrupt is reported as a
                // system-call stop, not an event stop, and resuming lost it
                // (a call blocked in a system call never timed out). It
                // ends at that call's exit stop.
                _ if interrupted => {
                    to_syscall_exit_stop(t, tid, after)?;
                    *at_syscall_exit = true;
                    break Err(timed_out(t, tid, func, timeout, lent.as_deref()));
                }
                // One of the function's own system calls.
                _ => {
                    ret.resume(t, tid)?;
                    continue;
                }
            }
        }
        if status >> 16 == libc::PTRACE_EVENT_STOP {
            if interrupted {
                break Err(timed_out(t, tid, func, timeout, lent.as_deref()));
            }
            ret.resume(t, tid)?;
            continue;
        }
        if sig == libc::SIGSEGV || sig == libc::SIGBUS || sig == libc::SIGILL {
            break Err(TargetError::Protocol {
                target: t.describe(),
                why: format!(
                    "remote call of {func:#x} faulted (signal {sig}) at {:#x}",
                    after.rip
                ),
            });
        }
        if sig == libc::SIGTRAP && t.is_rendezvous_trap(after.rip) {
            // The call (a dlopen) went through the loader's rendezvous:
            // keep its state, step over it. Not reported: the caller knows.
            t.rendezvous_hit();
            let mut r = sys::regs_from_user(&after);
            r.rip -= 1;
            t.emulate_return(tid, &mut r)?;
            ret.resume(t, tid)?;
            continue;
        }
        if sig == libc::SIGTRAP && t.is_sig_site(after.rip.wrapping_sub(1)) {
            // A signal-state system call of the program's code the call
            // runs through (see `sigtrap.rs`): made, noted, run on.
            t.emulate_sig_site(tid, after.rip - 1)?;
            ret.resume(t, tid)?;
            continue;
        }
        // Any other signal: hold it for later delivery, keep running the call.
        t.hold_signal(tid, sig);
        ret.resume(t, tid)?;
    };
    result
}

/// The error of a call of `func` on `tid` that did not return within
/// `timeout`, with what the other threads did meanwhile (`lent`).
fn timed_out(
    t: &ProcessTarget,
    tid: i32,
    func: u64,
    timeout: Duration,
    lent: Option<&crate::lend::Lent>,
) -> TargetError {
    let held = lent.map_or_else(String::new, |l| format!(" ({})", t.held_up_by(tid, l)));
    TargetError::Protocol {
        target: t.describe(),
        why: format!("remote call of {func:#x} did not return within {timeout:?}{held}"),
    }
}

/// From a system-call stop of `tid` (registers `at`) to that call's exit
/// stop: an entry stop (rax holds -ENOSYS there, as the kernel sets it
/// before the stop) has its call skipped first.
fn to_syscall_exit_stop(
    t: &mut ProcessTarget,
    tid: i32,
    at: libc::user_regs_struct,
) -> Result<(), TargetError> {
    if at.rax as i64 == -(libc::ENOSYS as i64) {
        skip_to_exit_stop(t, tid, at)?;
    }
    Ok(())
}

/// At the entry stop of the return stub's `rt_sigreturn` (registers
/// `at_entry`): skips that system call (the tracer sets the registers back
/// itself) and runs the thread to its exit stop, where registers set are
/// the ones it resumes with.
fn skip_to_exit_stop(
    t: &mut ProcessTarget,
    tid: i32,
    mut at_entry: libc::user_regs_struct,
) -> Result<(), TargetError> {
    at_entry.orig_rax = u64::MAX;
    t.sys.setregs(tid, &at_entry).map_err(|e| t.sys_err(e))?;
    loop {
        t.sys.syscall_resume(tid, 0).map_err(|e| t.sys_err(e))?;
        let Some((_, status)) = t.sys.waitpid_restart(tid, 0).map_err(|e| t.sys_err(e))? else {
            continue;
        };
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(TargetError::Gone {
                target: t.describe(),
                status: crate::exit_status(status),
            });
        }
        if status >> 16 == 0 && libc::WSTOPSIG(status) == libc::SIGTRAP | 0x80 {
            return Ok(());
        }
        if status >> 16 == 0 {
            // A signal that came meanwhile: for later delivery.
            t.hold_signal(tid, libc::WSTOPSIG(status));
        }
    }
}
