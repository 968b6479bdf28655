//! The program's `SIGTRAP` state, kept across the tracer's traps (issue 22).
//!
//! An `int3` (a breakpoint, the loader's rendezvous), a single-step and a
//! hardware watchpoint raise `SIGTRAP` with the kernel's
//! `force_sig_info_to_task`: in a thread that blocks `SIGTRAP`, or in a
//! process that ignores it, the kernel first takes `SIGTRAP` out of the
//! thread's mask and resets its disposition to `SIG_DFL` (for a blocked
//! one, even a handler the program installed). The tracer swallows the
//! signal, but the program's state has changed: its `pthread_sigmask` and
//! `sigaction(SIGTRAP)` read back differently, and a `SIGTRAP` it raises
//! later, expecting it ignored or held pending, kills it.
//!
//! So the target keeps what the program set, and puts it back:
//!
//! - **What was set.** Per thread, whether it blocks `SIGTRAP`; per
//!   process, `SIGTRAP`'s handler (`SIG_DFL`, `SIG_IGN` or an address).
//!   Read at attach, at spawn and after an exec from
//!   `/proc/PID/task/TID/status` (`SigBlk`, `SigIgn`, `SigCgt`; a caught
//!   one's address by a remote `rt_sigaction` read); a new thread starts
//!   with its creator's. The changes the program makes later are seen at
//!   its system calls: each `syscall` instruction of libc (of a static
//!   program's own code) preceded by `mov eax, 13` (`rt_sigaction`) or `mov eax, 14`
//!   (`rt_sigprocmask`) — glibc's `sigaction`, `signal`,
//!   `pthread_sigmask`, `sigprocmask`, and its internal ones around
//!   `pthread_create`, `posix_spawn`, `raise`, `abort`, a static program's
//!   own — gets an `int3` of the target's ([`SigSite`], armed with the
//!   first breakpoint of the engine's). At such a stop the target puts
//!   back what its own `int3` reset, makes the program's system call
//!   itself (a remote system call with the thread's arguments, through
//!   `PTRACE_SYSCALL` stops, which raise no signal), gives the thread the
//!   result as the `syscall` instruction would (`rax`, `rcx`, `r11`), and
//!   notes the new state.
//! - **Put back.** A trap of the tracer's in a thread known to block
//!   `SIGTRAP`, or in a process known to ignore it (or to block it with a
//!   handler), marks the thread (and the process's disposition) as reset;
//!   before the thread next runs freely (`resume` with `Continue`, detach,
//!   release), `SIGTRAP` goes back into its mask (`PTRACE_SETSIGMASK`) and
//!   the handler back into the disposition (a remote `rt_sigaction`,
//!   through `PTRACE_SYSCALL` stops: keeping the flags, mask and restorer
//!   the kernel left). A single-step's own trap in between is reset and
//!   put back with it.
//!
//! - **An injected agent.** Its `SIGTRAP` handler (for a tracer that
//!   dies) holds the kernel's disposition; it keeps the program's action
//!   in a block of its own memory, which the program's
//!   `rt_sigaction(SIGTRAP)` at a site reads and writes instead
//!   (`sigtrap_agent.rs`). Traps of the injection itself (the loader's
//!   rendezvous in `dlopen`, before the sites are armed) are undone from
//!   the state read at attach; at detach, those of the detach's and the
//!   unload's remote calls, before and after the agent's release.
//!
//! - **Lifted.** Putting a reset handler back comes too late for another
//!   thread's own `SIGTRAP` (`raise`, `tgkill`) delivered meanwhile: it
//!   met `SIG_DFL` and the process died (a `pthread_create` blocks every
//!   signal around its clone, so the creator and the new thread both trap
//!   at sites with `SIGTRAP` blocked, while another thread raises it). So
//!   where the program has a handler for `SIGTRAP`, a thread's
//!   `rt_sigprocmask` at a site that leaves `SIGTRAP` blocked leaves it
//!   blocked in the program's view only: the kernel's mask goes without it
//!   (a new thread inherits that), so our traps there reset nothing. Its
//!   next `rt_sigprocmask` sees its own mask back first (the result and
//!   the old mask it reads are the kernel's for what it set). A `SIGTRAP`
//!   the program sends to such a thread, which it expects held pending,
//!   is stopped before delivery: the mask goes back and the signal is
//!   passed on, which the kernel then queues again as sent (its siginfo
//!   kept; a process-directed one goes to a thread that does not block
//!   it, or stays pending). A forked or vforked child gets its mask back
//!   at its start; before release, detach and exec every thread does.
//!   A thread that blocked `SIGTRAP` before the program's handler came
//!   is lifted when it comes: at that `rt_sigaction` site every running
//!   thread that blocks it is stopped first, and all are lifted once the
//!   handler is in; threads found blocking when the sites are armed are
//!   lifted then (`sigtrap_lift.rs`).
//! - **The program's own `SIGTRAP` at a stop of ours.** A `SIGTRAP` sent
//!   by a process (`si_code` ≤ 0) that comes in place of a trap of ours
//!   (pending when a single-step began, or merged with the step's or an
//!   `int3`'s trap by the kernel, which keeps one pending `SIGTRAP` per
//!   queue) is kept with its siginfo and queued again before the thread
//!   next runs freely; at its delivery it is passed on as sent. Left: a
//!   thread-directed one that comes in the instant a trap's own `SIGTRAP`
//!   is pending on that thread is dropped by the kernel, and nothing of
//!   it is left to see. A lifted thread's mask read in `/proc` (`SigBlk`)
//!   lacks `SIGTRAP` (see docs/DESIGN.md, "What code patching changes by
//!   its nature").
//!
//! Not seen: a `syscall` instruction whose number is not loaded just
//! before it (libc's `syscall()` function, inline assembly, the Go
//! runtime), and `sigreturn`'s or signal delivery's masks (a probed call
//! inside a handler whose `sa_mask` holds `SIGTRAP`): there the state is
//! the last one seen.

use std::collections::{HashMap, HashSet};

use hotprobe_target::{RuntimeAddr, Target, TargetError};

use crate::ProcessTarget;

/// `SIGTRAP`'s bit in the kernel's 8-byte signal set.
pub(crate) const TRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// `rt_sigaction`'s system call number.
pub(crate) const SYS_RT_SIGACTION: u64 = libc::SYS_rt_sigaction as u64;
/// `rt_sigprocmask`'s system call number.
const SYS_RT_SIGPROCMASK: u64 = libc::SYS_rt_sigprocmask as u64;

/// `SIG_IGN` as a handler value.
pub(crate) const SIG_IGN: u64 = 1;

/// The largest executable mapping scanned for system-call sites.
const MAX_SCAN: u64 = 64 << 20;

/// One `syscall` instruction making a signal-state system call, with the
/// target's `int3` on it: the system call's number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SigSite {
    nr: u64,
}

/// The process-wide part of the kept state.
#[derive(Debug, Default)]
pub(crate) struct SigTrapState {
    /// `SIGTRAP`'s handler as the program set it (0 `SIG_DFL`, 1
    /// `SIG_IGN`, else its address); `None` when unknown.
    handler: Option<u64>,
    /// The kernel reset the disposition at a trap of ours: put back
    /// before a thread next runs.
    handler_reset: bool,
    /// The system-call sites with the target's `int3`.
    pub(crate) sites: HashMap<u64, SigSite>,
    /// Executable mappings (start addresses) already scanned for sites.
    scanned: HashSet<u64>,
    /// Sites are armed (the engine has breakpoints: traps will come).
    armed: bool,
    /// The agent is mapped: it keeps the state itself (see
    /// [`ProcessTarget::arm_sig_sites`]); nothing is tracked or put back
    /// until an exec.
    agent: bool,
    /// The program's whole `SIGTRAP` action (handler, flags, restorer,
    /// mask) when it was read at attach (a caught one).
    action: Option<[u64; 4]>,
    /// What was read at attach is what the program has: no thread ran
    /// freely since (the injection of an agent runs calls only). A trap
    /// of ours before the sites are armed (the loader's rendezvous in the
    /// agent's `dlopen`) is then undone from it (see
    /// [`ProcessTarget::arm_sig_sites`]).
    fresh: bool,
    /// The address of an injected agent's copy of the program's action
    /// (see `sigtrap_agent.rs`), once found.
    pub(crate) block: Option<u64>,
    /// At detach, the program's action the agent's release puts back
    /// (see [`ProcessTarget::settle_sigtrap_before_detach_hooks`]).
    detach_action: Option<[u64; 4]>,
    /// At detach, the threads that blocked `SIGTRAP` before the hooks.
    detach_blocked: Vec<i32>,
    /// Threads are being held for a handler's installation
    /// (`sigtrap_lift.rs`): a nested site does not hold them again.
    pub(crate) holding: bool,
    /// Threads whose own `SIGTRAP` was queued again where they do not
    /// block it, with the `rip` they were resumed at: the signal-delivery
    /// stop there is that signal's, delivered as sent
    /// (`sigtrap_lift.rs`).
    pub(crate) requeued: HashMap<i32, u64>,
}

impl SigTrapState {
    /// Whether a thread's `SIGTRAP` may be lifted (see the module docs):
    /// the program has a handler for it, the sites are armed, and no
    /// agent keeps the state itself.
    pub(crate) fn may_lift(&self) -> bool {
        self.handler.is_some_and(|h| h > SIG_IGN) && self.armed && !self.agent
    }
}

/// `SigBlk`, `SigIgn` and `SigCgt` of `/proc/PID/task/TID/status`.
fn status_masks(pid: i32, tid: i32) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some((field("SigBlk:")?, field("SigIgn:")?, field("SigCgt:")?))
}

/// Offsets of the `syscall` instructions in `code` that are signal-state
/// sites (`hotprobe_abi::sigsite`: `mov eax, 13|14` just before, at most
/// two simple instructions between), with the number.
pub(crate) fn find_sites(code: &[u8]) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    for i in 0..code.len() {
        if code[i] != 0xb8 {
            continue;
        }
        let w = &code[i..code.len().min(i + hotprobe_abi::sigsite::SIG_SITE_MAX)];
        if let Some((at, nr)) = hotprobe_abi::sigsite::sig_site_shape(w) {
            if w[at..at + 2] == [0x0f, 0x05] {
                out.push((i + at, u64::from(nr)));
            }
        }
    }
    out
}

/// Whether the agent was preloaded into process `pid` (an entry of its
/// environment's `LD_PRELOAD` names it, or is a `/proc/PID/fd/N` link to
/// it: hotprobe preloads its memfd so): then its interposers are bound.
fn agent_preloaded(pid: i32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let names = |p: &[u8]| p.windows(14).any(|w| w == b"hotprobe_agent");
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    env.split(|b| *b == 0)
        .filter_map(|var| var.strip_prefix(b"LD_PRELOAD="))
        .flat_map(|v| v.split(|b| *b == b':' || *b == b' '))
        .any(|entry| {
            names(entry)
                || std::fs::read_link(std::ffi::OsStr::from_bytes(entry))
                    .is_ok_and(|l| names(l.as_os_str().as_bytes()))
        })
}

impl ProcessTarget {
    /// Reads what the program set (see the module docs) from `/proc`, for
    /// every thread: at attach, spawn and exec, all threads stopped.
    pub(crate) fn learn_sigtrap_state(&mut self) {
        if self.sigtrap.agent {
            return;
        }
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        self.sigtrap.fresh = true;
        self.sigtrap.action = None;
        let mut caught = false;
        let mut ignored = false;
        for tid in tids {
            let Some((blk, ign, cgt)) = status_masks(self.pid, tid) else {
                continue;
            };
            ignored |= ign & TRAP_BIT != 0;
            caught |= cgt & TRAP_BIT != 0;
            if let Some(t) = self.threads.get_mut(&tid) {
                // A lifted thread (an adopted fork child's) blocks it in
                // the program's view.
                t.trap_blocked = blk & TRAP_BIT != 0 || t.trap_lifted;
            }
        }
        self.sigtrap.handler = if ignored {
            Some(SIG_IGN)
        } else if caught {
            let action = self
                .any_stopped_thread()
                .and_then(|tid| self.read_trap_action(tid).ok());
            self.sigtrap.action = action;
            action.map(|a| a[0])
        } else {
            Some(0)
        };
    }

    /// A new thread `new` made by `creator`: it starts with its creator's
    /// mask (a lifted one too).
    pub(crate) fn inherit_sigtrap_state(&mut self, creator: i32, new: i32) {
        let (blocked, lifted) = self
            .threads
            .get(&creator)
            .map_or((false, false), |t| (t.trap_blocked, t.trap_lifted));
        if let Some(t) = self.threads.get_mut(&new) {
            t.trap_blocked = blocked;
            t.trap_lifted = lifted;
        }
    }

    /// A trap of the tracer's in `tid` (a breakpoint, a step, the
    /// rendezvous, a watchpoint, a remote call's): what the kernel reset
    /// is marked to be put back.
    pub(crate) fn note_forced_trap(&mut self, tid: i32) {
        let handler = self.sigtrap.handler;
        // Without the sites (no engine breakpoint yet: `watch` alone), the
        // program's mask changes since attach are not seen: a blocked bit
        // learnt then (or inherited from a creator inside glibc's
        // all-blocked thread start) may be stale, and putting it back
        // would block SIGTRAP where the program has it unblocked (watch -p
        // under thread churn: the program died of SIGTRAP).
        if self.sigtrap.agent || !self.sigtrap.armed {
            return;
        }
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        let blocked = t.trap_blocked && !t.trap_lifted;
        if blocked {
            t.trap_mask_reset = true;
            // A SIGTRAP of the program's own pending while blocked is not
            // queued twice: the trap delivered that one (sent by a
            // process, not the kernel), and it must be pending again.
            if self.sys.getsiginfo(tid).is_ok_and(|i| i.code <= 0) {
                let info = crate::sigtrap_lift::siginfo_words(tid);
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.trap_requeue = Some(info.unwrap_or([0; 16]));
                }
            }
        }
        let reset = blocked || handler == Some(SIG_IGN);
        if reset && handler.is_some_and(|h| h != 0) {
            self.sigtrap.handler_reset = true;
        }
    }

    /// Puts back what a trap of ours reset in `tid`'s state (see the
    /// module docs), before it runs freely. Errors are the thread's end
    /// (ESRCH): nothing to put back then.
    pub(crate) fn restore_sigtrap_state(&mut self, tid: i32) {
        self.restore_sigtrap_state_then(tid, true);
    }

    /// [`ProcessTarget::restore_sigtrap_state`]; the program's own
    /// `SIGTRAP` kept is queued again only when `requeue` (the thread's
    /// registers and mask are final: it is delivered at once where it is
    /// not blocked, and noted so).
    fn restore_sigtrap_state_then(&mut self, tid: i32, requeue: bool) {
        if !self.sigtrap.armed && std::mem::take(&mut self.sigtrap.fresh) {
            // The first thread to run freely since the state was read
            // with every thread stopped, the sites not armed (no ptrace
            // breakpoint: the fast path's probes only): what our traps
            // (an agent's injection) reset goes back now; what the
            // program sets from now on is not seen until they are.
            self.undo_unarmed_traps();
        }
        if self.sigtrap.sites.is_empty() {
            // Detach: nothing of ours traps any more.
            self.unlift(tid);
        }
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        if std::mem::take(&mut t.trap_mask_reset) {
            if let Ok(mask) = self.sys.getsigmask(tid) {
                if mask & TRAP_BIT == 0 {
                    let _ = self.sys.setsigmask(tid, mask | TRAP_BIT);
                }
            }
        }
        // The program's own SIGTRAP a trap of ours delivered (or took the
        // place of: a single-step's stop, `sigtrap_lift.rs`).
        if let Some(info) = self
            .threads
            .get_mut(&tid)
            .filter(|_| requeue)
            .and_then(|t| t.trap_requeue.take())
        {
            self.requeue_sent_trap(tid, &info);
        }
        if self.sigtrap.handler_reset {
            if let Some(handler) = self.sigtrap.handler {
                if self.write_trap_handler(tid, handler).is_ok() {
                    self.sigtrap.handler_reset = false;
                }
            }
        }
    }

    /// `SIGTRAP`'s kernel action (handler, flags, restorer, mask), read by
    /// a remote `rt_sigaction` on stopped thread `tid`.
    fn read_trap_action(&mut self, tid: i32) -> Result<[u64; 4], TargetError> {
        let regs = self.sys.getregs(tid).map_err(|e| self.sys_err(e))?;
        let buf = (regs.rsp.wrapping_sub(512)) & !15;
        let r = crate::remote::syscall(
            self,
            tid,
            SYS_RT_SIGACTION,
            &[libc::SIGTRAP as u64, 0, buf, 8],
        )?;
        if r != 0 {
            return Err(self.protocol(format!("rt_sigaction read failed ({})", r as i64)));
        }
        let mut raw = [0u8; 32];
        self.read_memory(RuntimeAddr(buf), &mut raw)?;
        let word = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
        Ok([word(0), word(1), word(2), word(3)])
    }

    /// Sets `SIGTRAP`'s handler to `handler`, keeping the flags, restorer
    /// and mask the kernel has (a remote `rt_sigaction` pair on `tid`).
    fn write_trap_handler(&mut self, tid: i32, handler: u64) -> Result<(), TargetError> {
        let mut action = self.read_trap_action(tid)?;
        if action[0] == handler {
            return Ok(());
        }
        action[0] = handler;
        self.write_trap_action(tid, action)
    }

    /// Sets `SIGTRAP`'s whole kernel action (a remote `rt_sigaction` on
    /// `tid`).
    fn write_trap_action(&mut self, tid: i32, action: [u64; 4]) -> Result<(), TargetError> {
        let regs = self.sys.getregs(tid).map_err(|e| self.sys_err(e))?;
        let buf = (regs.rsp.wrapping_sub(512)) & !15;
        let bytes: Vec<u8> = action.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.write_memory(RuntimeAddr(buf), &bytes)?;
        let r = crate::remote::syscall(
            self,
            tid,
            SYS_RT_SIGACTION,
            &[libc::SIGTRAP as u64, buf, 0, 8],
        )?;
        if r != 0 {
            return Err(self.protocol(format!("rt_sigaction write failed ({})", r as i64)));
        }
        Ok(())
    }

    fn protocol(&self, why: String) -> TargetError {
        TargetError::Protocol {
            target: self.describe(),
            why,
        }
    }

    /// Arms the signal-state sites of every executable file mapping not
    /// scanned yet (at the engine's first breakpoint, and when modules
    /// change while armed).
    pub(crate) fn arm_sig_sites(&mut self) {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap_or_default();
        if text.contains("hotprobe_agent") && agent_preloaded(self.pid) {
            // The preloaded agent keeps SIGTRAP out of the program's
            // masks and its handler in: a site's trap in glibc's own
            // all-blocked windows (a new thread's start) would reset that
            // handler for a moment, and another thread's in-process trap
            // could die of it. (An injected agent binds none of its
            // interposers and serves no in-process trap: the state is
            // kept as without it, its handler holding the disposition
            // for a tracer that dies, and the program's action served
            // from the agent's copy: `sigtrap_agent.rs`.)
            self.sigtrap.armed = true;
            let sites: Vec<u64> = self.sigtrap.sites.drain().map(|(a, _)| a).collect();
            for a in sites {
                let _ = self.remove_int3(RuntimeAddr(a));
            }
            self.sigtrap.agent = true;
            self.sigtrap.handler = None;
            self.sigtrap.handler_reset = false;
            for t in self.threads.values_mut() {
                t.trap_blocked = false;
                t.trap_mask_reset = false;
            }
            return;
        }
        if !self.sigtrap.armed {
            if self.sigtrap.fresh {
                // No thread ran since it was read: what differs now is
                // our traps' doing (an agent's injection), and goes back.
                self.undo_unarmed_traps();
            } else {
                // What changed since it was last read (masks set, handlers
                // installed) was not seen: read it again.
                self.learn_sigtrap_state();
            }
        }
        self.sigtrap.armed = true;
        let lines = crate::parse_maps_lines(&text);
        // Where the calls are: libc, or a static program's own code (no
        // loader mapped). Not every module: reading text through
        // /proc/PID/mem faults its pages into the program's resident set.
        let file = |l: &crate::MapLine| {
            std::path::Path::new(&l.name)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let dynamic = lines.iter().any(|l| file(l).starts_with("ld-linux"));
        let exe = std::fs::read_link(format!("/proc/{}/exe", self.pid)).ok();
        let wanted = |l: &crate::MapLine| {
            let f = file(l);
            f.starts_with("libc.so")
                || f.starts_with("libc-")
                || (!dynamic && exe.as_deref() == Some(std::path::Path::new(&l.name)))
        };
        for l in lines
            .iter()
            .filter(|l| l.exec && l.name.starts_with('/') && wanted(l))
        {
            if !self.sigtrap.scanned.insert(l.start) || l.end - l.start > MAX_SCAN {
                continue;
            }
            let mut code = vec![0u8; (l.end - l.start) as usize];
            if self.read_memory(RuntimeAddr(l.start), &mut code).is_err() {
                continue;
            }
            for (off, nr) in find_sites(&code) {
                let at = l.start + off as u64;
                if self.breakpoints.contains_key(&at) || self.syscall_insn == Some(at) {
                    continue;
                }
                if self.insert_int3(RuntimeAddr(at)).is_ok() {
                    self.sigtrap.sites.insert(at, SigSite { nr });
                }
            }
        }
        // Threads that block SIGTRAP where the program has a handler:
        // lifted now, not at their next signal-state call.
        self.lift_blocked_threads();
    }

    /// Puts back what traps of ours reset before the sites were armed,
    /// from the state read at attach (no thread ran freely since): each
    /// thread's `SIGTRAP` block, and the handler — the kernel's, or, where
    /// an injected agent's handler took the disposition meanwhile (after
    /// the reset: it kept `SIG_DFL` as the program's), the program's
    /// action the agent keeps (see `sigtrap_agent.rs`).
    fn undo_unarmed_traps(&mut self) {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in &tids {
            if !self.threads.get(tid).is_some_and(|t| t.trap_blocked) {
                continue;
            }
            if let Ok(mask) = self.sys.getsigmask(*tid) {
                if mask & TRAP_BIT == 0 {
                    let _ = self.sys.setsigmask(*tid, mask | TRAP_BIT);
                }
            }
        }
        let Some(want) = self.sigtrap.handler else {
            return;
        };
        // A trap resets the handler only in a thread blocking SIGTRAP or
        // where it is ignored, and only to SIG_DFL: seen in /proc without
        // a remote call (which a thread at its exec stop cannot make).
        let blocking = self.threads.values().any(|t| t.trap_blocked);
        if want == 0 || !(blocking || want == SIG_IGN) {
            return;
        }
        let Some(tid) = self.any_stopped_thread() else {
            return;
        };
        let Some((_, ign, cgt)) = status_masks(self.pid, tid) else {
            return;
        };
        let kernel_reset = ign & TRAP_BIT == 0 && cgt & TRAP_BIT == 0;
        if let Some(block) = self.held_agent_block() {
            if let Some(mut kept) = self.kept_action(block) {
                if kept[0] != want {
                    // The reset changed the handler only (the kernel
                    // keeps flags and mask).
                    kept = self.sigtrap.action.filter(|a| a[0] == want).unwrap_or(kept);
                    kept[0] = want;
                    self.keep_action(block, kept);
                }
            }
            // The kernel's disposition is the agent's handler: the one a
            // reset of ours puts back from now on.
            self.sigtrap.handler = self.agent_handler(block);
            if kernel_reset {
                if let Some(h) = self.sigtrap.handler {
                    let _ = self.write_trap_handler(tid, h);
                }
            }
        } else if kernel_reset {
            let _ = self.write_trap_handler(tid, want);
        }
    }

    /// At detach, before the detach hooks run (an injected agent's
    /// release): what the traps of the detach's own remote calls reset
    /// goes back, so that the agent finds its handler and puts the
    /// program's action back exactly; that action is noted, as the one a
    /// reset during or after the unload must get back
    /// ([`ProcessTarget::settle_sigtrap_after_detach_hooks`]).
    pub(crate) fn settle_sigtrap_before_detach_hooks(&mut self) {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for &tid in &tids {
            self.restore_sigtrap_state(tid);
        }
        // The masks as they are now, every thread stopped: what the
        // hooks' traps reset in them goes back after (tracked or not:
        // without the sites, what the program set is not).
        self.sigtrap.detach_blocked = tids
            .into_iter()
            .filter(|&t| self.sys.getsigmask(t).is_ok_and(|m| m & TRAP_BIT != 0))
            .collect();
        self.sigtrap.detach_action = self
            .held_agent_block()
            .and_then(|block| self.kept_action(block));
    }

    /// At detach, after the hooks, just before the threads are let go:
    /// what the unload's remote calls reset goes back — the program's own
    /// action where the agent gave it back (its copy is gone, or says it
    /// no longer holds the disposition).
    pub(crate) fn settle_sigtrap_after_detach_hooks(&mut self) {
        if let Some(action) = self.sigtrap.detach_action.take() {
            let still_held = self
                .sigtrap
                .block
                .is_some_and(|b| self.read_u64(RuntimeAddr(b + 16)).is_ok_and(|w| w == 1));
            if !still_held {
                // The agent's release puts the action back only over its
                // own handler: a reset before it ran (the unload's remote
                // calls) left SIG_DFL with the agent's flags.
                self.sigtrap.handler = Some(action[0]);
                self.sigtrap.block = None;
                if let Some(tid) = self.any_stopped_thread() {
                    if self.read_trap_action(tid).is_ok_and(|now| now != action)
                        && self.write_trap_action(tid, action).is_ok()
                    {
                        self.sigtrap.handler_reset = false;
                    }
                }
            }
        }
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.restore_sigtrap_state(tid);
        }
        for tid in std::mem::take(&mut self.sigtrap.detach_blocked) {
            if let Ok(mask) = self.sys.getsigmask(tid) {
                if mask & TRAP_BIT == 0 {
                    let _ = self.sys.setsigmask(tid, mask | TRAP_BIT);
                }
            }
        }
    }

    /// Whether the sites are armed.
    pub(crate) fn sig_sites_armed(&self) -> bool {
        self.sigtrap.armed
    }

    /// Takes every site's `int3` out (release, exec).
    pub(crate) fn disarm_sig_sites(&mut self) {
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.unlift(tid);
        }
        self.sigtrap.armed = false;
        self.sigtrap.agent = false;
        self.sigtrap.block = None;
        self.sigtrap.scanned.clear();
        let sites: Vec<u64> = self.sigtrap.sites.drain().map(|(a, _)| a).collect();
        for a in sites {
            let _ = self.remove_int3(RuntimeAddr(a));
        }
    }

    /// The engine takes over the site at `addr` (a probe placed there):
    /// the `int3` is its own from now on. Whether there was one.
    pub(crate) fn give_sig_site(&mut self, addr: u64) -> bool {
        self.sigtrap.sites.remove(&addr).is_some()
    }

    /// Whether `addr` is a site's `int3`.
    pub(crate) fn is_sig_site(&self, addr: u64) -> bool {
        self.sigtrap.sites.contains_key(&addr)
    }

    /// Thread `tid` stopped at the site at `addr` (its `rip` one past):
    /// puts back what this trap reset, makes the program's system call,
    /// notes the new state and lets the thread go on past the `syscall`
    /// instruction (parked instead when `stopping`).
    pub(crate) fn on_sig_site(
        &mut self,
        tid: i32,
        addr: u64,
        stopping: bool,
    ) -> Result<(), TargetError> {
        self.emulate_sig_site_in(tid, addr, stopping)?;
        self.park_or_continue(tid, stopping)
    }

    /// [`ProcessTarget::on_sig_site`] but for letting the thread go: it
    /// stays stopped (a remote call's thread, which runs on).
    pub(crate) fn emulate_sig_site(&mut self, tid: i32, addr: u64) -> Result<(), TargetError> {
        self.emulate_sig_site_in(tid, addr, false)
    }

    /// [`ProcessTarget::emulate_sig_site`]; `stopping`: every thread is
    /// being stopped (those held for a handler's installation stay so).
    fn emulate_sig_site_in(
        &mut self,
        tid: i32,
        addr: u64,
        stopping: bool,
    ) -> Result<(), TargetError> {
        let site = self.sigtrap.sites[&addr];
        self.note_forced_trap(tid);
        // The program's own SIGTRAP kept is queued again once the call
        // is made, when the thread goes on (its mask and rip final).
        self.restore_sigtrap_state_then(tid, false);
        let regs = self.sys.getregs(tid).map_err(|e| self.sys_err(e))?;
        let mut after = regs;
        if regs.rax != site.nr {
            // Reached by a jump past the number's load: not the call we
            // know. The site is given up, the instruction runs as is.
            self.sigtrap.sites.remove(&addr);
            let _ = self.remove_int3(RuntimeAddr(addr));
            after.rip = addr;
        } else {
            let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
            if site.nr == SYS_RT_SIGPROCMASK {
                // The call reads and changes the program's own mask.
                self.unlift(tid);
            }
            let agent = (site.nr == SYS_RT_SIGACTION
                && args[0] == libc::SIGTRAP as u64
                && args[3] == 8
                && !self.vfork_children.contains(&tid))
            .then(|| self.held_agent_block())
            .flatten();
            // A handler coming for SIGTRAP: the threads that block it are
            // held first, and lifted once it is in (`sigtrap_lift.rs`).
            let held = match agent {
                Some(_) => Vec::new(),
                None => self.hold_for_trap_handler(tid, site.nr, &args)?,
            };
            let r = match agent {
                // An injected agent's handler holds the disposition: the
                // program's action is the agent's copy.
                Some(block) => self.emulate_trap_action(block, args[1], args[2]),
                None => crate::remote::syscall(self, tid, site.nr, &args)?,
            };
            after.rax = r;
            after.rip = addr + 2;
            after.rcx = addr + 2;
            after.r11 = regs.eflags;
            if r == 0 && agent.is_none() {
                self.note_sig_call(tid, site.nr, &args);
            }
            if !held.is_empty() {
                self.lift_blocked_threads();
                self.let_held_go(&held, stopping);
            }
        }
        self.sys.setregs(tid, &after).map_err(|e| self.sys_err(e))?;
        if let Some(t) = self.threads.get_mut(&tid) {
            t.regs = None;
        }
        Ok(())
    }

    /// Notes the state a successful signal-state call `nr` with `args`
    /// made in `tid`.
    fn note_sig_call(&mut self, tid: i32, nr: u64, args: &[u64; 6]) {
        if nr == SYS_RT_SIGPROCMASK {
            if let Ok(mask) = self.sys.getsigmask(tid) {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.trap_blocked = mask & TRAP_BIT != 0;
                }
                self.lift(tid, mask);
            }
        } else if nr == SYS_RT_SIGACTION
            && args[0] == libc::SIGTRAP as u64
            && args[1] != 0
            // A vfork child's dispositions are its own copy (posix_spawn
            // resets them there): the process's stay.
            && !self.vfork_children.contains(&tid)
        {
            if let Ok(h) = self.read_u64(RuntimeAddr(args[1])) {
                self.sigtrap.handler = Some(h);
            }
            if self.threads.get(&tid).is_some_and(|t| t.trap_blocked) {
                if let Ok(mask) = self.sys.getsigmask(tid) {
                    self.lift(tid, mask);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_may_have_simple_instructions_between() {
        // mov eax, 14; lea rsi, [rip+d]; syscall (glibc's pthread_create)
        let code = [
            0x90, 0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x35, 1, 2, 3, 0, 0x0f, 0x05,
        ];
        assert_eq!(find_sites(&code), vec![(13, 14)]);
    }

    #[test]
    fn sites_are_syscalls_right_after_their_number() {
        // mov eax, 14; syscall | mov eax, 13; syscall | mov eax, 39; syscall
        let code = [
            0x90, 0xb8, 14, 0, 0, 0, 0x0f, 0x05, 0xb8, 13, 0, 0, 0, 0x0f, 0x05, 0xb8, 39, 0, 0, 0,
            0x0f, 0x05,
        ];
        assert_eq!(find_sites(&code), vec![(6, 14), (13, 13)]);
    }
}
