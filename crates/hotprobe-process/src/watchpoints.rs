//! Setting and clearing the hardware watchpoints of every thread (the
//! registers themselves: `watch.rs`).

use crate::*;
use hotprobe_target::WATCH_SLOTS_UNKNOWN;

impl ProcessTarget {
    /// The hardware watchpoints set (slot `i` is DR`i`).
    pub fn watchpoints(&self) -> [Option<HwWatch>; WATCH_SLOTS] {
        self.watches
    }

    /// Set the hardware watchpoints (slot `i` in DR`i`, `None` for a free
    /// slot) on every thread, and on every thread created from now on.
    /// Threads running are stopped for it and resumed; threads stopped
    /// stay stopped. Each watchpoint is checked first ([`HwWatch::check`]);
    /// a thread refusing them is an error (no thread is left unwatched
    /// silently). A hit is reported as [`TargetEvent::Watchpoint`].
    pub fn set_watchpoints(
        &mut self,
        slots: [Option<HwWatch>; WATCH_SLOTS],
    ) -> Result<(), TargetError> {
        for w in slots.iter().flatten() {
            w.check().map_err(|why| TargetError::Protocol {
                target: self.describe(),
                why,
            })?;
        }
        if let Some(st) = &self.exited {
            return Err(TargetError::Gone {
                target: self.describe(),
                status: st.clone(),
            });
        }
        // A released process (running untraced) is taken back first: its
        // threads get their debug registers through ptrace, and a hit is
        // then a ptrace stop (release refuses while a watchpoint is set).
        // Threads stopped already stay so; every other one runs on after,
        // threads created while stopping included.
        let held: Vec<i32> = if self.released.is_some() {
            self.reacquire()?;
            Vec::new()
        } else {
            self.threads
                .iter()
                .filter(|(_, t)| t.state != RunState::Running)
                .map(|(tid, _)| *tid)
                .collect()
        };
        if self.threads.values().any(|t| t.state == RunState::Running) {
            self.stop_all()?;
        }
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        let mut result = Ok(());
        for tid in tids {
            match watch::apply(&self.sys, tid, &slots) {
                Ok(()) => {}
                // Gone meanwhile: its exit is still to be reported.
                Err(e) if e.errno() == libc::ESRCH => {}
                Err(e) => {
                    result = Err(self.sys_err(e));
                    break;
                }
            }
        }
        if result.is_ok() {
            self.watches = slots;
        } else {
            // Leave no thread with a partial set.
            for tid in self.threads.keys().copied().collect::<Vec<_>>() {
                let _ = watch::apply(&self.sys, tid, &self.watches);
            }
        }
        let parked: Vec<i32> = self
            .threads
            .iter()
            .filter(|(tid, t)| t.state == RunState::Parked && !held.contains(tid))
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            self.resume(ThreadId(tid as u64), ResumeMode::Continue)?;
        }
        result
    }

    pub(crate) fn watching(&self) -> bool {
        self.watches.iter().any(Option::is_some)
    }

    /// Clear every thread's debug registers (threads stopped), and take
    /// each watchpoint trap already queued to a thread but not yet
    /// reported (it would kill the program once detached): the thread is
    /// let run into its signal-delivery stop, where the trap is dropped.
    pub(crate) fn clear_watchpoints_for_detach(&mut self) {
        if !self.watching() {
            return;
        }
        let none = [None; WATCH_SLOTS];
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in &tids {
            let _ = watch::apply(&self.sys, *tid, &none);
        }
        self.watches = none;
        for tid in tids {
            if !sigtrap_pending(tid) {
                continue;
            }
            if self.sys.cont(tid, 0).is_err() {
                continue;
            }
            // The queued SIGTRAP comes first (synchronous signals are
            // dequeued before others).
            match self.sys.waitpid_restart(tid, libc::__WALL) {
                Ok(Some((_, st)))
                    if libc::WIFSTOPPED(st)
                        && libc::WSTOPSIG(st) == libc::SIGTRAP
                        && st >> 16 == 0 =>
                {
                    // A watchpoint's, DR6 named or not (an empty DR6
                    // comes as `TRAP_BRKPT`, not after an `icebp`).
                    let code = self.sys.getsiginfo(tid).map(|i| i.code).unwrap_or(0);
                    let ours = code == TRAP_HWBKPT
                        || (code == TRAP_BRKPT
                            && !self.after_icebp(self.sys.getregs(tid).map_or(0, |r| r.rip)));
                    if !ours {
                        // The program's own: delivered at detach.
                        if let Some(t) = self.threads.get_mut(&tid) {
                            t.held_signals.push_front(libc::SIGTRAP);
                        }
                    }
                }
                Ok(Some((p, st))) if libc::WIFSTOPPED(st) && st >> 16 == 0 => {
                    // Another signal: delivered at detach.
                    if let Some(t) = self.threads.get_mut(&p) {
                        t.held_signals.push_front(libc::WSTOPSIG(st));
                    }
                }
                _ => {}
            }
        }
    }
}

impl ProcessTarget {
    /// The watchpoint slots a `SIGTRAP` with `si_code` `code` at `rip`
    /// stands for when DR6 named none: a debug exception whose DR6 came
    /// back empty (some virtual CPUs lose it) is reported by the kernel as
    /// an `icebp` (`TRAP_BRKPT`). Unless the instruction before `rip` is
    /// an `icebp` of the program's (0xf1), it is a watchpoint's: an execute
    /// watchpoint at `rip`, else the one data watchpoint, else every data
    /// watchpoint with [`WATCH_SLOTS_UNKNOWN`] set (the session keeps
    /// those the accessing instruction touched). `None`: not ours.
    pub(crate) fn watch_slots_without_dr6(&mut self, code: i32, rip: u64) -> Option<u8> {
        if code != TRAP_BRKPT || !self.watching() {
            return None;
        }
        if self.after_icebp(rip) {
            return None;
        }
        let mask = |exec: bool| {
            self.watches
                .iter()
                .enumerate()
                .filter_map(|(i, w)| w.map(|w| (i, w)))
                .filter(|(_, w)| (w.kind == WatchKind::Execute) == exec)
                .filter(|(_, w)| !exec || w.addr == rip)
                .fold(0u8, |m, (i, _)| m | (1 << i))
        };
        let exec = mask(true);
        if exec != 0 {
            return Some(exec);
        }
        let data = mask(false);
        match data.count_ones() {
            0 => None,
            1 => Some(data),
            _ => Some(data | WATCH_SLOTS_UNKNOWN),
        }
    }

    /// Whether the instruction before `rip` is an `icebp` (0xf1): a
    /// `TRAP_BRKPT` there is the program's own.
    fn after_icebp(&mut self, rip: u64) -> bool {
        let mut before = [0u8; 1];
        hotprobe_target::Target::read_memory(self, RuntimeAddr(rip.wrapping_sub(1)), &mut before)
            .is_ok_and(|()| before[0] == 0xf1)
    }
}
