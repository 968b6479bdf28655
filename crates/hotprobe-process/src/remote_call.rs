//! Function calls and system calls made inside a stopped target thread, for
//! injecting an agent into a running process (`dlopen` then the agent's
//! attach function).
//!
//! A call runs the thread from the function's first instruction on a stack
//! carved below the red zone, with a return address of 0: the `ret` then
//! faults at address 0, which the tracer sees as a SIGSEGV stop with
//! `rip == 0` and swallows. The thread's registers are restored afterwards
//! (including `orig_rax`, so a system call it was blocked in restarts).
//! Other threads stay stopped: a call that needs a lock held by a stopped
//! thread (the loader lock, a malloc arena) would wait forever, so calls are
//! bounded by a timeout and the thread is interrupted when it expires.

use std::time::{Duration, Instant};

use hotprobe_target::{Target, TargetError};

use crate::{sys, ProcessTarget};

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
    remote_call_on(t, tid, func, args, timeout)
}

/// As [`remote_call`], on stopped thread `tid` (a vfork child at its
/// first stop, its parent at the end of its vfork), its x87/SSE state
/// kept as well: the callee may use the vector registers, which a
/// thread stopped between two instructions of its own may hold live.
pub(crate) fn remote_call_on(
    t: &mut ProcessTarget,
    tid: i32,
    func: u64,
    args: &[u64],
    timeout: Duration,
) -> Result<u64, TargetError> {
    let fp = t.sys.getfpregs(tid).map_err(|e| t.sys_err(e))?;
    let r = remote_call_regs(t, tid, func, args, timeout);
    let _ = t.sys.setfpregs(tid, &fp);
    r
}

fn remote_call_regs(
    t: &mut ProcessTarget,
    tid: i32,
    func: u64,
    args: &[u64],
    timeout: Duration,
) -> Result<u64, TargetError> {
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    let mut regs = saved;
    // Below the red zone, 16-byte aligned, then the fake return address 0:
    // at the callee's first instruction rsp ≡ 8 (mod 16) as the ABI wants.
    let sp = (saved.rsp.wrapping_sub(256)) & !15;
    let sp = sp - 8;
    t.write_memory(hotprobe_target::RuntimeAddr(sp), &0u64.to_le_bytes())?;
    regs.rsp = sp;
    regs.rip = func;
    regs.rax = 0;
    regs.orig_rax = u64::MAX;
    crate::remote::set_args(&mut regs, args, crate::remote::ArgConvention::Function);
    t.sys.setregs(tid, &regs).map_err(|e| t.sys_err(e))?;
    t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
    let deadline = Instant::now() + timeout;
    let mut interrupted = false;
    let result = loop {
        let r = t
            .sys
            .waitpid(tid, libc::WNOHANG | libc::__WALL)
            .map_err(|e| t.sys_err(e))?;
        let Some((_, status)) = r else {
            if !interrupted && Instant::now() >= deadline {
                t.sys.interrupt(tid).map_err(|e| t.sys_err(e))?;
                interrupted = true;
            }
            std::thread::sleep(Duration::from_micros(200));
            continue;
        };
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(TargetError::Gone {
                target: t.describe(),
                status: crate::exit_status(status),
            });
        }
        let sig = libc::WSTOPSIG(status);
        let after = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
        if sig == libc::SIGSEGV && after.rip == 0 {
            break Ok(after.rax);
        }
        if status >> 16 == libc::PTRACE_EVENT_STOP {
            if interrupted {
                break Err(TargetError::Protocol {
                    target: t.describe(),
                    why: format!("remote call of {func:#x} did not return within {timeout:?}"),
                });
            }
            t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
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
            t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
            continue;
        }
        if sig == libc::SIGTRAP && t.is_sig_site(after.rip.wrapping_sub(1)) {
            // A signal-state system call of the program's code the call
            // runs through (see `sigtrap.rs`): made, noted, run on.
            t.emulate_sig_site(tid, after.rip - 1)?;
            t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
            continue;
        }
        // Any other signal: hold it for later delivery, keep running the call.
        if let Some(th) = t.threads.get_mut(&tid) {
            th.held_signals.push_back(sig);
        }
        t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
    };
    t.sys.setregs(tid, &saved).map_err(|e| t.sys_err(e))?;
    if let Some(th) = t.threads.get_mut(&tid) {
        th.regs = None;
    }
    result
}
