//! A remote call that survives the tracer's death (issue 23): for the
//! last calls of a detach (unloading an injected agent), where a tracer
//! killed meanwhile must not leave a thread returning to address 0.
//!
//! The caller writes, in the target, code that makes the calls it wants,
//! then sets a *done* word, spins a while, and at last restores the
//! thread's registers itself and jumps back to where it was (the
//! [`resume_context`], with an interrupted system call set up to restart,
//! as the kernel would). The thread runs that code from `entry` on a stack
//! carved below the red zone. While the tracer lives it sees the done
//! word, interrupts the thread (spinning, still inside the code) and
//! restores its registers as [`crate::remote_call::remote_call`] does;
//! should the tracer die first, the thread finds its way back alone.

use std::time::{Duration, Instant};

use hotprobe_target::{Registers, RuntimeAddr, Target, TargetError};

use crate::{sys, ProcessTarget};

/// The kernel's restart codes of an interrupted system call.
const ERESTARTSYS: i64 = -512;
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
const ERESTART_RESTARTBLOCK: i64 = -516;

/// The registers a thread stopped with `regs` must resume with when no
/// tracer restores them: an interrupted system call restarts (its `rip`
/// back on the 2-byte `syscall`, `rax` its number, or `restart_syscall`
/// for one with a restart block), as the kernel does when no signal
/// handler runs.
pub fn resume_context(regs: &Registers) -> Registers {
    let mut r = *regs;
    if (regs.orig_rax as i64) >= 0 {
        match regs.rax as i64 {
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
                r.rax = regs.orig_rax;
                r.rip = regs.rip.wrapping_sub(2);
            }
            ERESTART_RESTARTBLOCK => {
                r.rax = libc::SYS_restart_syscall as u64;
                r.rip = regs.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    r
}

/// The registers of the thread a [`remote_call_resumable`] will run on
/// (the first stopped thread), for [`resume_context`].
pub fn resumable_thread_registers(t: &mut ProcessTarget) -> Result<Registers, TargetError> {
    let tid = t
        .thread_for_remote()?
        .ok_or_else(|| TargetError::Protocol {
            target: t.describe(),
            why: "no stopped thread to run a remote call on: call stop_all first".into(),
        })?;
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    Ok(sys::regs_from_user(&saved))
}

/// The stack pointer a [`remote_call_resumable`] on a thread stopped with
/// `regs` starts with: below the red zone, 16-byte aligned. The 96 bytes
/// above it, below the red zone, are the code's to write (its results).
pub fn resumable_stack(regs: &Registers) -> u64 {
    (regs.rsp.wrapping_sub(256)) & !15
}

/// Runs the code at `entry` (inside `code`, an address range) on the
/// thread [`resumable_thread_registers`] names, with the stack pointer
/// [`resumable_stack`], until the word at `done` is not 0; then stops the
/// thread and restores its registers (unless it already left `code` on
/// its own). Other threads stay stopped, unless the word at `lend_once`
/// is not 0 and the code has run for
/// [`crate::remote_call::LET_OTHERS_RUN_AFTER`]: they then run until it
/// is done (see `lend.rs`: the code may wait for a lock one of them
/// holds). Fails after `timeout`, the thread interrupted and, if still in
/// `code`, restored.
pub fn remote_call_resumable(
    t: &mut ProcessTarget,
    entry: u64,
    code: (u64, u64),
    done: u64,
    lend_once: Option<u64>,
    timeout: Duration,
) -> Result<(), TargetError> {
    let mut lent = crate::lend::Lent::default();
    let r = run_resumable(t, entry, code, done, lend_once, timeout, &mut lent);
    if !lent.is_empty() {
        let stopped = t.take_back(lent);
        if r.is_ok() {
            stopped?;
        }
    }
    r
}

/// [`remote_call_resumable`], the threads it lends noted in `lent`.
fn run_resumable(
    t: &mut ProcessTarget,
    entry: u64,
    code: (u64, u64),
    done: u64,
    lend_once: Option<u64>,
    timeout: Duration,
    lent: &mut crate::lend::Lent,
) -> Result<(), TargetError> {
    let tid = t
        .thread_for_remote()?
        .ok_or_else(|| TargetError::Protocol {
            target: t.describe(),
            why: "no stopped thread to run a remote call on: call stop_all first".into(),
        })?;
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    // The whole extended state too (the code calls glibc, whose AVX
    // functions end with `vzeroupper`): given back with the registers.
    let xstate = t.sys.getxstate(tid).ok();
    let mut regs = saved;
    // Below the red zone, 16-byte aligned: the code calls functions.
    regs.rsp = resumable_stack(&sys::regs_from_user(&saved));
    regs.rip = entry;
    regs.orig_rax = u64::MAX;
    t.sys.setregs(tid, &regs).map_err(|e| t.sys_err(e))?;
    t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
    let start = Instant::now();
    let deadline = start + timeout;
    let mut interrupted = false;
    let mut finished = false;
    let mut lent_once = false;
    let result = loop {
        if !interrupted {
            let mut w = [0u8; 8];
            if t.read_memory(RuntimeAddr(done), &mut w).is_ok() && w != [0; 8] {
                finished = true;
            }
            if let Some(word) = lend_once.filter(|_| !finished && !lent_once) {
                let mut w = [0u8; 8];
                if start.elapsed() >= crate::remote_call::LET_OTHERS_RUN_AFTER
                    && t.read_memory(RuntimeAddr(word), &mut w).is_ok()
                    && w != [0; 8]
                {
                    lent_once = true;
                    *lent = t.lend_others(tid);
                }
            }
            if finished || Instant::now() >= deadline {
                t.sys.interrupt(tid).map_err(|e| t.sys_err(e))?;
                interrupted = true;
            }
        }
        let r = t
            .sys
            .waitpid(tid, libc::WNOHANG | libc::__WALL)
            .map_err(|e| t.sys_err(e))?;
        let Some((_, status)) = r else {
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
        if status >> 16 == libc::PTRACE_EVENT_STOP && interrupted {
            break match finished {
                true => Ok(()),
                false => Err(TargetError::Protocol {
                    target: t.describe(),
                    why: format!(
                        "remote call at {entry:#x} did not finish within {timeout:?} ({})",
                        t.held_up_by(tid, lent)
                    ),
                }),
            };
        }
        let after = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
        if status >> 16 != libc::PTRACE_EVENT_STOP
            && (sig == libc::SIGSEGV || sig == libc::SIGBUS || sig == libc::SIGILL)
        {
            t.sys.setregs(tid, &saved).map_err(|e| t.sys_err(e))?;
            if let Some(x) = &xstate {
                let _ = t.sys.setxstate(tid, x);
            }
            return Err(TargetError::Protocol {
                target: t.describe(),
                why: format!(
                    "remote call at {entry:#x} faulted (signal {sig}) at {:#x}",
                    after.rip
                ),
            });
        }
        if status >> 16 != libc::PTRACE_EVENT_STOP {
            // Any other signal: held for later delivery.
            t.hold_signal(tid, sig);
        }
        t.sys.cont(tid, 0).map_err(|e| t.sys_err(e))?;
    };
    // Stopped: still in the code (spinning, or not done), its registers
    // go back; gone on its own (the code's own restore), it is where the
    // program goes on.
    let now = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    if now.rip >= code.0 && now.rip < code.1 {
        t.sys.setregs(tid, &saved).map_err(|e| t.sys_err(e))?;
        if let Some(x) = &xstate {
            let _ = t.sys.setxstate(tid, x);
        }
    }
    if let Some(th) = t.threads.get_mut(&tid) {
        th.regs = None;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped_in(nr: u64, rax: i64) -> Registers {
        Registers {
            rax: rax as u64,
            orig_rax: nr,
            rip: 0x1002,
            rdi: 7,
            ..Registers::default()
        }
    }

    #[test]
    fn an_interrupted_system_call_restarts_on_its_syscall_instruction() {
        for code in [ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND] {
            let r = resume_context(&stopped_in(libc::SYS_read as u64, code));
            assert_eq!((r.rip, r.rax, r.rdi), (0x1000, libc::SYS_read as u64, 7));
        }
        let r = resume_context(&stopped_in(libc::SYS_poll as u64, ERESTART_RESTARTBLOCK));
        assert_eq!((r.rip, r.rax), (0x1000, libc::SYS_restart_syscall as u64));
    }

    #[test]
    fn other_stops_resume_as_they_are() {
        // A finished system call's result, an error, or no system call.
        for (nr, rax) in [(0, 5), (0, -(libc::EINTR as i64)), (u64::MAX, ERESTARTSYS)] {
            let regs = stopped_in(nr, rax);
            assert_eq!(resume_context(&regs), regs);
        }
    }
}
