//! System calls made inside the target on one of its stopped threads: the
//! thread's registers are saved, pointed at a `syscall` instruction found in
//! the target's own code (no text is written), run to the call's entry and
//! exit stops (`PTRACE_SYSCALL`), and restored. Used to map and unmap
//! scratch pages near the probed code, and to load and unload the agent.
//!
//! A tracer killed meanwhile leaves the thread as it was:
//! - no stop of these is a signal stop: a thread left in a single-step's
//!   SIGTRAP stop when its tracer dies is sent that SIGTRAP, and dies of
//!   it (a system-call stop sends nothing);
//! - where the code allows, the thread's state waits on its stack as a
//!   signal frame, which the call returns into (`remote_frame.rs`).

use crate::remote_frame::FrameFor;
use crate::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target, TargetError};
use std::os::unix::fs::FileExt;

/// Runs system call `nr` with `args` on stopped thread `tid` from a
/// `syscall` instruction of the target's, through its entry and exit
/// stops: the registers the thread had, the raw result, and the signals
/// that came meanwhile (to be delivered on its next continue).
fn run_remote(
    t: &mut ProcessTarget,
    tid: i32,
    nr: u64,
    args: &[u64],
) -> Result<(libc::user_regs_struct, u64, Vec<i32>), TargetError> {
    let insn = find_syscall_insn(t)?;
    let saved = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
    let mut regs = saved;
    if let Some(frame) = resumable_frame(t, tid, &saved) {
        regs.rsp = frame;
    }
    regs.rip = insn;
    regs.rax = nr;
    // Not inside a system call any more: no restart logic for ours.
    regs.orig_rax = u64::MAX;
    set_args(&mut regs, args, ArgConvention::Syscall);
    t.sys.setregs(tid, &regs).map_err(|e| t.sys_err(e))?;
    let mut held = Vec::new();
    // The entry stop, then the exit stop, both with rip past the
    // instruction (a signal stop before it runs has rip at it).
    let mut past = 0;
    let result = loop {
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
        if status >> 16 == libc::PTRACE_EVENT_STOP {
            // A pending interrupt was consumed; go on.
            if let Some(th) = t.threads.get_mut(&tid) {
                th.interrupt_pending = false;
            }
            continue;
        }
        if status >> 16 != 0 {
            continue;
        }
        let sig = libc::WSTOPSIG(status);
        // System-call stops are `SIGTRAP | 0x80` (`TRACESYSGOOD`; plain
        // SIGTRAP in the scripted tests' older statuses).
        if sig & 0x7f == libc::SIGTRAP {
            let after = t.sys.getregs(tid).map_err(|e| t.sys_err(e))?;
            if after.rip == insn + 2 {
                past += 1;
                if past == 2 {
                    break after.rax;
                }
                continue;
            }
            if sig != libc::SIGTRAP {
                continue;
            }
            // Not the call's: the program's own is kept with its
            // siginfo.
            let code = t.sys.getsiginfo(tid).ok().map(|i| i.code);
            if code.is_some_and(|c| c <= 0) {
                t.hold_sent_trap(tid, code);
                continue;
            }
        }
        held.push(sig);
    };
    Ok((saved, result, held))
}

/// Runs system call `nr` with up to six arguments on stopped thread `tid`;
/// returns the raw result (a negative errno on failure). No trap signal
/// is raised, so a thread that blocks or ignores `SIGTRAP` keeps its
/// state (see `sigtrap.rs`); the thread is left at the call's exit stop,
/// which a tracer's death ends harmlessly.
pub(crate) fn syscall(
    t: &mut ProcessTarget,
    tid: i32,
    nr: u64,
    args: &[u64],
) -> Result<u64, TargetError> {
    let (saved, result, held) = run_remote(t, tid, nr, args)?;
    restore_at_syscall_stop(t, tid, &saved)?;
    if let Some(th) = t.threads.get_mut(&tid) {
        th.held_signals.extend(held);
        th.regs = None;
    }
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

/// The stack pointer of a remote system call on thread `tid` (stopped
/// with `saved`) whose thread gets its state back alone should the tracer
/// die: the frame `remote_frame::signal_frame` builds, written. None
/// where the target's code has no `syscall; ret` and sigreturn sequence,
/// or the thread's state or stack cannot be had: the call then borrows the
/// registers as before.
fn resumable_frame(t: &mut ProcessTarget, tid: i32, saved: &libc::user_regs_struct) -> Option<u64> {
    let sigreturn = t.sigreturn_insn?;
    write_frame(t, tid, saved, sigreturn, FrameFor::Syscall)
}

/// Writes below the stack of thread `tid` (stopped with `saved`) the
/// signal frame that gives it its state back by a sigreturn at
/// `sigreturn`; where it starts. None where the thread's extended state
/// or mask cannot be had, or the stack cannot be written.
pub(crate) fn write_frame(
    t: &mut ProcessTarget,
    tid: i32,
    saved: &libc::user_regs_struct,
    sigreturn: u64,
    used_by: FrameFor,
) -> Option<u64> {
    let xstate = t.sys.getxstate(tid).ok()?;
    let blocked = t.sys.getsigmask(tid).ok()?;
    let frame = crate::remote_frame::signal_frame(saved, &xstate, blocked, sigreturn, used_by)?;
    t.write_memory(RuntimeAddr(frame.at), &frame.bytes).ok()?;
    Some(frame.at)
}

/// Sets back at a system-call stop the registers `saved` thread `tid`
/// had: the kernel runs no restart logic on the way out of such a stop,
/// so a system call the thread was interrupted in (`-ERESTARTSYS` and
/// the like) is set up to restart here, as the kernel would have.
pub(crate) fn restore_at_syscall_stop(
    t: &mut ProcessTarget,
    tid: i32,
    saved: &libc::user_regs_struct,
) -> Result<(), TargetError> {
    let back = crate::remote_resumable::resume_context(&crate::sys::regs_from_user(saved));
    let mut back = crate::sys::regs_to_user(&back);
    if back.rip != saved.rip {
        back.orig_rax = u64::MAX;
    }
    t.sys.setregs(tid, &back).map_err(|e| t.sys_err(e))
}

/// Whether the target's memory at `addr` holds `pattern` now, with no
/// breakpoint of ours over any of its bytes (`read_memory` shows the
/// bytes under them).
fn holds(t: &mut ProcessTarget, addr: u64, pattern: &[u8]) -> bool {
    let mut now = vec![0u8; pattern.len()];
    (0..pattern.len() as u64).all(|i| !t.breakpoints.contains_key(&(addr + i)))
        && t.mem.read_at(&mut now, addr).ok() == Some(pattern.len())
        && now == pattern
}

/// The address of a `syscall` instruction (0f 05) in the target's code.
/// Preferred: one followed by `ret`, with a sigreturn sequence found too
/// ([`ProcessTarget::sigreturn_insn`], see `remote_frame.rs`; glibc and
/// its loader have both); else any, in the vDSO first. Checked against
/// the memory at each use: a probe written there since makes it look
/// again.
fn find_syscall_insn(t: &mut ProcessTarget) -> Result<u64, TargetError> {
    use crate::remote_frame::{find, SIGRETURNS, SYSCALL_RET};
    if let Some(a) = t.syscall_insn {
        let insn_len = if t.sigreturn_insn.is_some() { 3 } else { 2 };
        let sigreturn_kept = match t.sigreturn_insn {
            Some(s) => SIGRETURNS.iter().any(|p| holds(t, s, p)),
            None => true,
        };
        if sigreturn_kept && holds(t, a, &SYSCALL_RET[..insn_len]) {
            return Ok(a);
        }
        t.syscall_insn = None;
        t.sigreturn_insn = None;
    }
    let text = std::fs::read_to_string(format!("/proc/{}/maps", t.live_task())).unwrap_or_default();
    let lines = crate::parse_maps_lines(&text);
    let mut candidates: Vec<&crate::MapLine> = lines.iter().filter(|l| l.exec).collect();
    let rank = |l: &crate::MapLine| match l.name.as_str() {
        "[vdso]" => 0,
        n if n.contains("/libc.so") || n.contains("/ld-linux") => 1,
        _ => 2,
    };
    candidates.sort_by_key(|l| rank(l));
    let (mut plain, mut with_ret, mut sigreturn) = (None, None, None);
    for l in candidates {
        let len = (l.end - l.start).min(4 << 20) as usize;
        let mut buf = vec![0u8; len];
        if t.mem.read_at(&mut buf, l.start).ok() != Some(len) {
            continue;
        }
        let free = |at: usize, n: usize| {
            (0..n as u64).all(|i| !t.breakpoints.contains_key(&(l.start + at as u64 + i)))
        };
        if plain.is_none() {
            plain = find(&buf, &SYSCALL_RET[..2], |i| free(i, 2)).map(|i| l.start + i as u64);
        }
        if with_ret.is_none() {
            with_ret = find(&buf, &SYSCALL_RET, |i| free(i, 3)).map(|i| l.start + i as u64);
        }
        if sigreturn.is_none() {
            sigreturn = SIGRETURNS
                .iter()
                .find_map(|p| find(&buf, p, |i| free(i, p.len())))
                .map(|i| l.start + i as u64);
        }
        if with_ret.is_some() && sigreturn.is_some() {
            break;
        }
    }
    let (insn, sigreturn) = match (with_ret, sigreturn) {
        (Some(w), Some(s)) => (Some(w), Some(s)),
        _ => (plain, None),
    };
    let Some(insn) = insn else {
        return Err(TargetError::Protocol {
            target: t.describe(),
            why: "no syscall instruction found in the target's code".into(),
        });
    };
    t.syscall_insn = Some(insn);
    t.sigreturn_insn = sigreturn;
    Ok(insn)
}
