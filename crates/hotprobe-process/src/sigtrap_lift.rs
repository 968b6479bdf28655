//! "Lifted" `SIGTRAP` masks and the program's own `SIGTRAP`s queued
//! again (see "Lifted" in `sigtrap.rs`'s module docs): where the program
//! has a handler for `SIGTRAP`, a thread blocking it blocks it in the
//! program's view only; a `SIGTRAP` the program sent and a trap of ours
//! delivered goes back into the queue with its siginfo; children get the
//! mask their program set.

use hotprobe_target::{ResumeMode, RuntimeAddr, Target, TargetError, ThreadId};

use crate::sigtrap::{SIG_IGN, SYS_RT_SIGACTION, TRAP_BIT};
use crate::{ProcessTarget, RunState};

impl ProcessTarget {
    /// Queues the program's own `SIGTRAP` that a trap of ours delivered
    /// (`info`, its siginfo) to `tid` again, as it was sent: by a remote
    /// `rt_tgsigqueueinfo` the thread makes itself (sending to itself, any
    /// siginfo is allowed: `SI_QUEUE`'s value, the sender's pid). Where
    /// that cannot be made, `tgkill` from the tracer (the signal pending
    /// again, its sender then the tracer). Where the thread does not block
    /// it, the signal is delivered as soon as the thread runs, at the
    /// `rip` noted in `requeued` (see [`ProcessTarget::is_requeued_trap`]).
    pub(crate) fn requeue_sent_trap(&mut self, tid: i32, info: &[u64; 16]) {
        let Ok(regs) = self.sys.getregs(tid) else {
            return;
        };
        let queued = info[0] != 0 && {
            let buf = (regs.rsp.wrapping_sub(512 + 128)) & !15;
            let bytes: Vec<u8> = info.iter().flat_map(|w| w.to_le_bytes()).collect();
            self.write_memory(RuntimeAddr(buf), &bytes).is_ok()
                && crate::remote::syscall(
                    self,
                    tid,
                    libc::SYS_rt_tgsigqueueinfo as u64,
                    &[self.pid as u64, tid as u64, libc::SIGTRAP as u64, buf],
                )
                .is_ok_and(|r| r == 0)
        };
        if !queued {
            let _ = self.sys.tgkill(self.pid, tid, libc::SIGTRAP);
        }
        if self.sys.getsigmask(tid).is_ok_and(|m| m & TRAP_BIT == 0) {
            self.sigtrap.requeued.insert(tid, regs.rip);
        }
    }

    /// At `pid`'s `SIGTRAP` signal-delivery stop whose `si_code` is
    /// `code` (`None`: not read): whether it is the program's own `SIGTRAP`
    /// that [`ProcessTarget::requeue_sent_trap`] queued again where the
    /// thread does not block it, delivered before the thread ran an
    /// instruction (at the `rip` it was resumed at). It is passed on as
    /// sent, never taken for a trap of ours: after a one-byte instruction
    /// emulated at a breakpoint, `rip - 1` is that breakpoint.
    pub(crate) fn is_requeued_trap(&mut self, pid: i32, code: Option<i32>) -> bool {
        if code.is_none_or(|c| c > 0) {
            return false;
        }
        let Some(rip) = self.sigtrap.requeued.remove(&pid) else {
            return false;
        };
        self.sys.getregs(pid).is_ok_and(|r| r.rip == rip)
    }

    /// The program's own `SIGTRAP` (`code`, its `si_code`, at most 0: sent
    /// by a process) at a stop taken as one of ours: one that came while
    /// `pid` single-steps over a breakpoint (pending when the step began:
    /// the step is then not made yet, which the engine sees; or arriving
    /// during it: the kernel then drops the step's trap), or that took
    /// the place of an `int3`'s trap (a `SIGTRAP` already pending drops
    /// the next). Kept with its siginfo, and queued again before the
    /// thread next runs freely (before, the step's stop swallowed it, or
    /// a held signal was delivered with the step's siginfo: `si_code`
    /// `TRAP_TRACE`, the value lost).
    pub(crate) fn hold_sent_trap(&mut self, pid: i32, code: Option<i32>) {
        if code.is_none_or(|c| c > 0) {
            return;
        }
        if self
            .threads
            .get(&pid)
            .is_some_and(|t| t.trap_requeue.is_none())
        {
            let info = siginfo_words(pid);
            if let Some(t) = self.threads.get_mut(&pid) {
                t.trap_requeue = info;
            }
        }
    }

    /// A signal `sig` that came to `tid` during a remote call, kept for
    /// its next continue: the program's own `SIGTRAP` with its siginfo
    /// (see [`ProcessTarget::hold_sent_trap`]; held by number, it was
    /// delivered with the siginfo of the stop it was resumed from).
    pub(crate) fn hold_signal(&mut self, tid: i32, sig: i32) {
        if sig == libc::SIGTRAP {
            let code = self.sys.getsiginfo(tid).ok().map(|i| i.code);
            if code.is_some_and(|c| c <= 0) {
                self.hold_sent_trap(tid, code);
                return;
            }
        }
        if let Some(th) = self.threads.get_mut(&tid) {
            th.held_signals.push_back(sig);
        }
    }

    /// Before the program's `rt_sigaction` at `tid`'s site (`nr`, `args`)
    /// installs a `SIGTRAP` handler: every other thread that blocks
    /// `SIGTRAP` and is not lifted, and runs, is stopped
    /// (`PTRACE_INTERRUPT`), so that it is lifted once the handler is in
    /// ([`ProcessTarget::lift_blocked_threads`]) before its next trap:
    /// that trap would reset the new handler to `SIG_DFL`, and another
    /// thread's own `SIGTRAP` meanwhile killed the process (a thread that
    /// blocked `SIGTRAP` before the program installed its handler was
    /// lifted only at its next signal-state call). A trap such a thread
    /// takes before it stops still meets the old disposition. The
    /// threads stopped so.
    pub(crate) fn hold_for_trap_handler(
        &mut self,
        tid: i32,
        nr: u64,
        args: &[u64; 6],
    ) -> Result<Vec<i32>, TargetError> {
        if nr != SYS_RT_SIGACTION
            || args[0] != libc::SIGTRAP as u64
            || args[1] == 0
            || self.sigtrap.holding
            || self.vfork_children.contains(&tid)
        {
            return Ok(Vec::new());
        }
        if !self
            .read_u64(RuntimeAddr(args[1]))
            .is_ok_and(|handler| handler > SIG_IGN)
        {
            return Ok(Vec::new());
        }
        let running: Vec<i32> = self
            .threads
            .iter()
            .filter(|(t, th)| {
                **t != tid
                    && th.state == RunState::Running
                    && th.trap_blocked
                    && !th.trap_lifted
                    && !self.vfork_children.contains(t)
                    // A vfork parent waits for its child, which may be
                    // stopped: no interrupt stops it before the child
                    // execs (it restores its mask right after, at a site).
                    && th.last_event != libc::PTRACE_EVENT_VFORK
            })
            .map(|(t, _)| *t)
            .collect();
        let mut held = Vec::new();
        for t in running {
            match self.sys.interrupt(t) {
                Ok(()) => {
                    if let Some(th) = self.threads.get_mut(&t) {
                        th.interrupt_pending = true;
                    }
                    held.push(t);
                }
                Err(e) if e.errno() == libc::ESRCH => {}
                Err(e) => return Err(self.sys_err(e)),
            }
        }
        if !held.is_empty() {
            self.sigtrap.holding = true;
            let r = self.wait_parked();
            self.sigtrap.holding = false;
            r?;
        }
        Ok(held)
    }

    /// Lifts every stopped thread that blocks `SIGTRAP` and is not lifted
    /// yet, where lifting applies (see "Lifted" in `sigtrap.rs`): when the
    /// program's handler comes, and when the sites are armed.
    pub(crate) fn lift_blocked_threads(&mut self) {
        if !self.sigtrap.may_lift() {
            return;
        }
        let tids: Vec<i32> = self
            .threads
            .iter()
            .filter(|(t, th)| {
                th.state != RunState::Running
                    && th.trap_blocked
                    && !th.trap_lifted
                    && !th.stepping
                    && !self.vfork_children.contains(t)
            })
            .map(|(t, _)| *t)
            .collect();
        for tid in tids {
            let Some((reset, requeue)) = self
                .threads
                .get(&tid)
                .map(|t| (t.trap_mask_reset, t.trap_requeue.is_some()))
            else {
                continue;
            };
            if reset {
                // A trap of ours took SIGTRAP out of the kernel's mask
                // already: it stays out, unless the program's own is to
                // be queued again (then held pending as the program
                // expects).
                if !requeue && !trap_pending(self.pid, tid) {
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.trap_mask_reset = false;
                        t.trap_lifted = true;
                    }
                }
                continue;
            }
            if let Ok(mask) = self.sys.getsigmask(tid) {
                self.lift(tid, mask);
            }
        }
    }

    /// Lets the threads [`ProcessTarget::hold_for_trap_handler`] stopped
    /// go again, those it parked (one that reported an event instead is
    /// the engine's); all stay parked while every thread is being
    /// stopped (`stopping`).
    pub(crate) fn let_held_go(&mut self, held: &[i32], stopping: bool) {
        if stopping {
            return;
        }
        for &t in held {
            if self
                .threads
                .get(&t)
                .is_some_and(|th| th.state == RunState::Parked)
            {
                // Its end (ESRCH) is reported by the next wait.
                let _ = self.resume(ThreadId(t as u64), ResumeMode::Continue);
            }
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
