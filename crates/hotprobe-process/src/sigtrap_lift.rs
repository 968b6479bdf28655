//! "Lifted" `SIGTRAP` masks and the program's own `SIGTRAP`s queued
//! again (see "Lifted" in `sigtrap.rs`'s module docs): where the program
//! has a handler for `SIGTRAP`, a thread blocking it blocks it in the
//! program's view only; a `SIGTRAP` the program sent and a trap of ours
//! delivered goes back into the queue with its siginfo; children get the
//! mask their program set.

use hotprobe_target::{RuntimeAddr, Target};

use crate::sigtrap::TRAP_BIT;
use crate::ProcessTarget;

impl ProcessTarget {
    /// Queues the program's own `SIGTRAP` that a trap of ours delivered
    /// (`info`, its siginfo) to `tid` again, as it was sent: by a remote
    /// `rt_tgsigqueueinfo` the thread makes itself (sending to itself, any
    /// siginfo is allowed: `SI_QUEUE`'s value, the sender's pid). Where
    /// that cannot be made, `tgkill` from the tracer (the signal pending
    /// again, its sender then the tracer).
    pub(crate) fn requeue_sent_trap(&mut self, tid: i32, info: &[u64; 16]) {
        let queued = info[0] != 0
            && self.sys.getregs(tid).is_ok_and(|regs| {
                let buf = (regs.rsp.wrapping_sub(512 + 128)) & !15;
                let bytes: Vec<u8> = info.iter().flat_map(|w| w.to_le_bytes()).collect();
                self.write_memory(RuntimeAddr(buf), &bytes).is_ok()
                    && crate::remote::syscall_quiet(
                        self,
                        tid,
                        libc::SYS_rt_tgsigqueueinfo as u64,
                        &[self.pid as u64, tid as u64, libc::SIGTRAP as u64, buf],
                    )
                    .is_ok_and(|r| r == 0)
            });
        if !queued {
            let _ = self.sys.tgkill(self.pid, tid, libc::SIGTRAP);
        }
    }

    /// Takes `SIGTRAP` out of stopped thread `tid`'s kernel mask `mask`
    /// where the program blocks it, has a handler for it, and has none
    /// of its own pending there (see "Lifted" in the module docs).
    pub(crate) fn lift(&mut self, tid: i32, mask: u64) {
        if mask & TRAP_BIT == 0 || !self.sigtrap.may_lift() || trap_pending(self.pid, tid) {
            return;
        }
        if self.sys.setsigmask(tid, mask & !TRAP_BIT).is_ok() {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.trap_lifted = true;
            }
        }
    }

    /// Puts `SIGTRAP` back into stopped thread `tid`'s kernel mask if it
    /// was lifted.
    pub(crate) fn unlift(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        if !std::mem::take(&mut t.trap_lifted) {
            return;
        }
        if let Ok(mask) = self.sys.getsigmask(tid) {
            let _ = self.sys.setsigmask(tid, mask | TRAP_BIT);
        }
    }

    /// At `tid`'s signal-delivery stop for `SIGTRAP`: if the program sent
    /// it to a lifted thread, where it blocks it, `SIGTRAP` goes back into
    /// the thread's mask, so that passed on it is queued again by the
    /// kernel as it was sent (`ptrace_signal` requeues a signal the thread
    /// blocks: its siginfo kept, a process-directed one free to go to a
    /// thread that does not block it), held pending as the program
    /// expects.
    pub(crate) fn unlift_at_sent_trap(&mut self, tid: i32) {
        if self.threads.get(&tid).is_some_and(|t| t.trap_lifted)
            && self.sys.getsiginfo(tid).is_ok_and(|i| i.code <= 0)
        {
            self.unlift(tid);
        }
    }

    /// A vfork child `new` of `creator`, stopped at its start: it has a
    /// copy of the creator's kernel mask, which a lifted creator's lacks
    /// `SIGTRAP` in; it gets it back (the child, and any program it
    /// executes, sees the mask the program set).
    pub(crate) fn vfork_mask_back(&mut self, creator: i32, new: i32) {
        if !self.threads.get(&creator).is_some_and(|t| t.trap_lifted) {
            return;
        }
        if let Ok(mask) = self.sys.getsigmask(new) {
            let _ = self.sys.setsigmask(new, mask | TRAP_BIT);
        }
        if let Some(t) = self.threads.get_mut(&new) {
            t.trap_lifted = false;
        }
    }

    /// A held fork child let go: one forked by a lifted thread gets
    /// `SIGTRAP` back into its mask first (see
    /// [`ProcessTarget::vfork_mask_back`]).
    pub(crate) fn child_mask_back(&mut self, child: i32) {
        let Some(i) = self.lifted_children.iter().position(|c| *c == child) else {
            return;
        };
        self.lifted_children.swap_remove(i);
        if let Ok(mask) = self.sys.getsigmask(child) {
            let _ = self.sys.setsigmask(child, mask | TRAP_BIT);
        }
    }
}

/// The siginfo of stopped thread `tid`'s signal, as 16 words.
pub(crate) fn siginfo_words(tid: i32) -> Option<[u64; 16]> {
    let info = hotprobe_os::sys::getsiginfo(tid).ok()?;
    // SAFETY: siginfo_t is 128 bytes of plain data; read as words.
    Some(unsafe { std::mem::transmute::<libc::siginfo_t, [u64; 16]>(info) })
}

/// Whether `SIGTRAP` is pending for thread `tid` or its process
/// (`SigPnd`, `ShdPnd`).
fn trap_pending(pid: i32, tid: i32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
        return true;
    };
    ["SigPnd:", "ShdPnd:"].iter().any(|k| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|m| m & TRAP_BIT != 0)
    })
}
