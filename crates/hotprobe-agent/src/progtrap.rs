//! The program's own `SIGTRAP` action while the agent's handler holds the
//! kernel's disposition (issue 22: never change what the program sees).
//!
//! The agent's handler (`orphan`) takes the kernel's `SIGTRAP`
//! disposition; the program's action — handler, flags, restorer and mask,
//! exactly as the kernel held them — is kept here, in the kernel's own
//! layout, and:
//!
//! * chained to exactly (`orphan::chain`): the program's handler runs
//!   with its `sa_mask` added to the thread's mask, `SIGTRAP` shown
//!   blocked unless `SA_NODEFER`, `SA_RESETHAND` honoured, `SA_SIGINFO`'s
//!   arguments passed;
//! * shown and changed by the program's `sigaction`/`signal` (interposed
//!   where the agent is preloaded, `orphan::sigaction`; bound into the
//!   program's GOT where it was injected, `gotbind`), and by its
//!   `rt_sigaction` system calls at libc's call sites where the agent was
//!   injected and the ptrace trap is in use: the tracer stops the thread
//!   there (`hotprobe-process`'s `sigtrap.rs`, "signal-state sites") and
//!   reads or writes this block ([`hotprobe_agent_program_sigtrap`], found
//!   by its magic words) instead of the kernel's disposition;
//! * put back byte for byte (a raw `rt_sigaction`) when the agent's handler
//!   goes (at release). After a tracer died, the handler stays (threads
//!   may still trap on what it leaves, see `orphan`): an injected agent's
//!   program then reads the agent's handler through `sigaction`.
//!
//! What stays visible: `SigCgt` of `/proc/PID/status` shows `SIGTRAP`
//! caught while the agent's handler is installed (a program that left it
//! at `SIG_DFL` or `SIG_IGN` can tell), and an `SA_ONSTACK` handler runs
//! on the stack the signal interrupted (the agent's own handler does not
//! switch stacks).

use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{Relaxed, Release};

/// The kernel's `struct sigaction` (x86-64), 8-byte signal set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelAction {
    /// `SIG_DFL` (0), `SIG_IGN` (1) or the handler's address.
    pub handler: u64,
    /// `SA_*` flags.
    pub flags: u64,
    /// The `SA_RESTORER` trampoline.
    pub restorer: u64,
    /// Signals blocked while the handler runs.
    pub mask: u64,
}

/// The first two words of [`hotprobe_agent_program_sigtrap`]: how the
/// tracer finds the block in the agent's writable data.
pub const PROGRAM_SIGTRAP_MAGIC: [u64; 2] = [
    u64::from_le_bytes(*b"hotprobe"),
    u64::from_le_bytes(*b"sigtrap1"),
];

/// The program's `SIGTRAP` action, for the tracer to find (by the magic
/// words 0–1 in the agent's writable data): word 2 is 1
/// while the agent's handler holds the kernel's disposition (words 3–6
/// are then the program's action: handler, flags, restorer, mask, as the
/// kernel's `struct sigaction` lays them out), 0 otherwise (the kernel's
/// disposition is the program's own). Word 7 is the agent's own handler
/// (what the tracer puts back where a trap of its reset it). The tracer
/// writes words 3–6 only while word 2 is 1, with the thread that asked
/// stopped.
#[no_mangle]
pub static hotprobe_agent_program_sigtrap: [AtomicU64; 8] = [
    AtomicU64::new(PROGRAM_SIGTRAP_MAGIC[0]),
    AtomicU64::new(PROGRAM_SIGTRAP_MAGIC[1]),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

const BLOCK: &[AtomicU64; 8] = &hotprobe_agent_program_sigtrap;

/// Notes the agent's own handler (word 7).
pub(crate) fn set_agent_handler(h: u64) {
    BLOCK[7].store(h, Relaxed);
}

/// The program's action as kept.
pub(crate) fn get() -> KernelAction {
    KernelAction {
        handler: BLOCK[3].load(Relaxed),
        flags: BLOCK[4].load(Relaxed),
        restorer: BLOCK[5].load(Relaxed),
        mask: BLOCK[6].load(Relaxed),
    }
}

/// Keeps `a` as the program's action.
pub(crate) fn set(a: KernelAction) {
    BLOCK[3].store(a.handler, Relaxed);
    BLOCK[4].store(a.flags, Relaxed);
    BLOCK[5].store(a.restorer, Relaxed);
    BLOCK[6].store(a.mask, Relaxed);
}

/// Marks whether the agent's handler holds the kernel's disposition.
pub(crate) fn set_held(on: bool) {
    BLOCK[2].store(u64::from(on), Release);
}

/// `rt_sigaction(SIGTRAP, act, old, 8)`, raw: the kernel's action as is
/// (flags and restorer included). 0 or a negated errno.
pub(crate) fn kernel(act: Option<&KernelAction>, old: Option<&mut KernelAction>) -> i64 {
    crate::orphan::syscall(
        libc::SYS_rt_sigaction,
        [
            libc::SIGTRAP as u64,
            act.map_or(0, |a| a as *const KernelAction as u64),
            old.map_or(0, |o| o as *mut KernelAction as u64),
            8,
        ],
    ) as i64
}

/// `a` as glibc's `sigaction` reports it (glibc copies the kernel's
/// fields: its 1024-bit set's first word is the kernel's, the rest 0).
pub(crate) fn to_libc(a: &KernelAction) -> libc::sigaction {
    // SAFETY: an all-zero sigaction is a valid value.
    let mut s: libc::sigaction = unsafe { core::mem::zeroed() };
    s.sa_sigaction = a.handler as usize;
    s.sa_flags = a.flags as libc::c_int;
    s.sa_restorer = if a.restorer == 0 {
        None
    } else {
        // SAFETY: a restorer address the kernel held for this signal
        // (glibc's `__restore_rt`): only stored, never called here.
        Some(unsafe { core::mem::transmute::<usize, extern "C" fn()>(a.restorer as usize) })
    };
    // SAFETY: `sigset_t` starts with the kernel's 64 signals (bit n-1).
    unsafe { (&mut s.sa_mask as *mut libc::sigset_t as *mut u64).write(a.mask) };
    s
}

/// The kernel action glibc's `sigaction` makes of `s`: its flags with
/// `SA_RESTORER` and glibc's restorer `restorer`, the set's first word
/// less the signals the kernel never blocks.
pub(crate) fn from_libc(s: &libc::sigaction, restorer: u64) -> KernelAction {
    // SAFETY: `sigset_t` starts with the kernel's 64 signals.
    let mask = unsafe { (&s.sa_mask as *const libc::sigset_t as *const u64).read() };
    let never = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
    KernelAction {
        handler: s.sa_sigaction as u64,
        flags: s.sa_flags as u32 as u64 | SA_RESTORER,
        restorer,
        mask: mask & !never,
    }
}

/// `SA_RESTORER` (x86-64).
pub(crate) const SA_RESTORER: u64 = 0x0400_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_reads_back_as_glibc_reports_it() {
        let a = KernelAction {
            handler: 0x1234,
            flags: (libc::SA_SIGINFO | libc::SA_RESTART) as u64 | SA_RESTORER,
            restorer: 0x5678,
            mask: 1 << (libc::SIGUSR1 - 1),
        };
        let s = to_libc(&a);
        assert_eq!(s.sa_sigaction, 0x1234);
        // SAFETY: a valid set.
        assert_eq!(unsafe { libc::sigismember(&s.sa_mask, libc::SIGUSR1) }, 1);
        // SAFETY: a valid set.
        assert_eq!(unsafe { libc::sigismember(&s.sa_mask, libc::SIGUSR2) }, 0);
        assert_eq!(from_libc(&s, 0x5678), a);
    }
}
