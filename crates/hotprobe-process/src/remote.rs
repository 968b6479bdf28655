//! System calls made inside the target on one of its stopped threads: the
//! thread's registers are saved, pointed at a `syscall` instruction found in
//! the target's own code (no text is written), single-stepped once, and
//! restored. Used to map and unmap scratch pages near the probed code.

use crate::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target, TargetError};

/// How a remote system call runs its thread through the `syscall`
/// instruction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Through {
    /// One single-step (its trap resets what the thread blocks or
    /// ignores: see `sigtrap.rs`).
    Step,
    /// `PTRACE_SYSCALL`: the entry stop, then the exit stop; no trap
    /// signal is raised.
    SyscallStops,
}

/// Runs system call `nr` with `args` on stopped thread `tid` from a
/// `syscall` instruction of the target's, `through` either way: the
/// registers the thread had, the raw result, and the signals that came
/// meanwhile (to be delivered on its next continue).
fn run_remote(
    t: &mut ProcessTarget,
    tid: i32,
    nr: u64,
    args: &[u64],
    through: Through,
) -> Result<(libc::user_regs_struct, u64, Vec<i32>), TargetError> {
    let insn = find_syscall_insn(t)?;
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    let mut regs = saved;
    regs.rip = insn;
    regs.rax = nr;
    // Not inside a system call any more: no restart logic for ours.
    regs.orig_rax = u64::MAX;
    set_args(&mut regs, args, ArgConvention::Syscall);
    t.sys.setregs(tid, &regs).map_err(|e| t.sys_err(e))?;
    let mut held = Vec::new();
    // Stepped: one trap past the instruction. Through system-call stops:
    // the entry stop, then the exit stop, both with rip past the
    // instruction (a signal stop before it runs has rip at it).
    let wanted = if through == Through::Step { 1 } else { 2 };
    let mut past = 0;
    let result = loop {
        match through {
            Through::Step => t.sys.step(tid, 0),
            Through::SyscallStops => t.sys.syscall_resume(tid, 0),
        }
        .map_err(|e| t.sys_err(e))?;
        let Some((_, status)) = t.sys.waitpid_restart(tid, 0).map_err(|e| t.sys_err(e))? else {
            continue;
        };
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Err(TargetError::Gone {
                target: t.describe(),
                status: crate::exit_status(status),
            });
        }
        if status >> 16 == libc::PTRACE_EVENT_STOP {
            // A pending interrupt was consumed; go on.
            if let Some(th) = t.threads.get_mut(&tid) {
                th.interrupt_pending = false;
            }
            continue;
        }
        if through == Through::SyscallStops && status >> 16 != 0 {
            continue;
        }
        let sig = libc::WSTOPSIG(status);
        if sig == libc::SIGTRAP {
            let after = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
            if after.rip == insn + 2 {
                past += 1;
                if past == wanted {
                    break after.rax;
                }
            }
            if through == Through::Step || after.rip == insn + 2 {
                continue;
            }
        }
        held.push(sig);
    };
    Ok((saved, result, held))
}

/// Puts `back` into thread `tid` after a remote system call, with the
/// signals `held` meanwhile for its next continue.
fn put_back(
    t: &mut ProcessTarget,
    tid: i32,
    back: &libc::user_regs_struct,
    held: Vec<i32>,
) -> Result<(), TargetError> {
    t.sys.setregs(tid, back).map_err(|e| t.sys_err(e))?;
    if let Some(th) = t.threads.get_mut(&tid) {
        th.held_signals.extend(held);
        th.regs = None;
    }
    Ok(())
}

/// Run system call `nr` with up to six arguments on stopped thread `tid`;
/// returns the raw result (a negative errno on failure).
pub(crate) fn syscall(
    t: &mut ProcessTarget,
    tid: i32,
    nr: u64,
    args: &[u64],
) -> Result<u64, TargetError> {
    let (saved, result, held) = run_remote(t, tid, nr, args, Through::Step)?;
    put_back(t, tid, &saved, held)?;
    // The step's trap reset what the thread blocks or ignores.
    t.note_forced_trap(tid);
    Ok(result)
}

/// As [`syscall`], but run through `PTRACE_SYSCALL` stops instead of a
/// single-step: no trap signal is raised, so a thread that blocks or
/// ignores `SIGTRAP` keeps its state (see `sigtrap.rs`). For the calls
/// that put that state back.
pub(crate) fn syscall_quiet(
    t: &mut ProcessTarget,
    tid: i32,
    nr: u64,
    args: &[u64],
) -> Result<u64, TargetError> {
    let (saved, result, held) = run_remote(t, tid, nr, args, Through::SyscallStops)?;
    // Restored at a system-call exit stop, not a signal stop: the kernel
    // runs no restart logic on the way out, so a system call the thread
    // was interrupted in (`-ERESTARTSYS` and the like) is set up to
    // restart here, as the kernel would have.
    let back = crate::remote_resumable::resume_context(&crate::sys::regs_from_user(&saved));
    let mut back = crate::sys::regs_to_user(&back);
    if back.rip != saved.rip {
        back.orig_rax = u64::MAX;
    }
    put_back(t, tid, &back, held)?;
    Ok(result)
}

/// Where the fourth integer argument goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgConvention {
    /// System V function calls: rdi, rsi, rdx, rcx, r8, r9.
    Function,
    /// Linux system calls: rdi, rsi, rdx, r10, r8, r9.
    Syscall,
}

/// Load up to six integer arguments (missing ones are 0).
pub(crate) fn set_args(regs: &mut libc::user_regs_struct, args: &[u64], conv: ArgConvention) {
    let a = |i: usize| args.get(i).copied().unwrap_or(0);
    regs.rdi = a(0);
    regs.rsi = a(1);
    regs.rdx = a(2);
    match conv {
        ArgConvention::Function => regs.rcx = a(3),
        ArgConvention::Syscall => regs.r10 = a(3),
    }
    regs.r8 = a(4);
    regs.r9 = a(5);
}

/// The address of a `syscall` instruction (0f 05) in the target's code: in
/// the vDSO if it has one, else in any executable mapping.
fn find_syscall_insn(t: &mut ProcessTarget) -> Result<u64, TargetError> {
    if let Some(a) = t.syscall_insn {
        return Ok(a);
    }
    let text = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap_or_default();
    let lines = crate::parse_maps_lines(&text);
    let mut candidates: Vec<&crate::MapLine> = lines.iter().filter(|l| l.exec).collect();
    candidates.sort_by_key(|l| if l.name == "[vdso]" { 0 } else { 1 });
    for l in candidates {
        let len = (l.end - l.start).min(4 << 20) as usize;
        let mut buf = vec![0u8; len];
        if t.read_memory(RuntimeAddr(l.start), &mut buf).is_err() {
            continue;
        }
        let found = buf
            .windows(2)
            .enumerate()
            .filter(|(_, w)| *w == [0x0f, 0x05])
            .map(|(i, _)| l.start + i as u64)
            .find(|a| !t.breakpoints.contains_key(a));
        if let Some(a) = found {
            t.syscall_insn = Some(a);
            return Ok(a);
        }
    }
    Err(TargetError::Protocol {
        target: t.describe(),
        why: "no syscall instruction found in the target's code".into(),
    })
}
