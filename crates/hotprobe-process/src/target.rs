//! [`Target`] for [`ProcessTarget`]: memory, registers, resuming, breakpoints,
//! stop-the-world, detach, scratch memory.

use crate::*;

impl Target for ProcessTarget {
    fn describe(&self) -> String {
        format!("pid {}", self.pid)
    }

    fn threads(&self) -> Vec<ThreadId> {
        let mut v: Vec<ThreadId> = self.threads.keys().map(|t| ThreadId(*t as u64)).collect();
        v.sort();
        v
    }

    fn thread_ended(&self, t: ThreadId) -> bool {
        // `/proc/PID/task/TID/stat`: gone, or state Z (zombie) or X (dead),
        // the field after the command name's closing parenthesis.
        match std::fs::read_to_string(format!("/proc/{}/task/{}/stat", self.pid, t.0)) {
            Err(_) => true,
            Ok(s) => s
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| matches!(state, 'Z' | 'X')),
        }
    }

    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        let len = buf.len();
        let err = |me: &Self| TargetError::Memory {
            op: "read",
            addr: addr.0,
            len,
            target: me.describe(),
        };
        if addr.0 > i64::MAX as u64 {
            return Err(err(self));
        }
        match self.mem.read_at(buf, addr.0) {
            Ok(n) if n == buf.len() => {}
            _ => return Err(err(self)),
        }
        if !self.breakpoints.is_empty() {
            let end = addr.0.saturating_add(buf.len() as u64);
            if buf.len() <= 64 {
                for (i, b) in buf.iter_mut().enumerate() {
                    if let Some(orig) = self.breakpoints.get(&(addr.0 + i as u64)) {
                        *b = *orig;
                    }
                }
            } else {
                for (a, orig) in &self.breakpoints {
                    if *a >= addr.0 && *a < end {
                        buf[(*a - addr.0) as usize] = *orig;
                    }
                }
            }
        }
        Ok(())
    }

    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError> {
        let mut data = data.to_vec();
        // Bytes under a breakpoint: remember them as the new original and keep the int3.
        // Whichever is shorter is walked: the bytes or the breakpoints (a
        // span of patched text is written at once, issue 14).
        let end = addr.0.saturating_add(data.len() as u64);
        if self.breakpoints.len() < data.len() {
            for (a, orig) in self.breakpoints.iter_mut() {
                if *a >= addr.0 && *a < end {
                    let b = &mut data[(*a - addr.0) as usize];
                    *orig = *b;
                    *b = INT3;
                }
            }
        } else {
            for (i, b) in data.iter_mut().enumerate() {
                if let Some(orig) = self.breakpoints.get_mut(&(addr.0 + i as u64)) {
                    *orig = *b;
                    *b = INT3;
                }
            }
        }
        match self.mem.write_at(&data, addr.0) {
            Ok(n) if n == data.len() => Ok(()),
            _ => Err(TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: data.len(),
                target: self.describe(),
            }),
        }
    }

    fn registers(&mut self, thread: ThreadId) -> Result<Registers, TargetError> {
        let t = self.stopped_thread(thread)?;
        if let Some(r) = t.regs {
            return Ok(r);
        }
        let r = self.fetch_regs(thread.0 as i32)?;
        self.stopped_thread(thread)?.regs = Some(r);
        Ok(r)
    }

    fn xmm_registers(&mut self, thread: ThreadId) -> Result<[u64; 16], TargetError> {
        self.stopped_thread(thread)?;
        self.sys
            .getxmm(thread.0 as i32)
            .map_err(|e| self.sys_err(e))
    }

    fn set_registers(&mut self, thread: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.stopped_thread(thread)?;
        self.sys
            .setregs(thread.0 as i32, &sys::regs_to_user(regs))
            .map_err(|e| self.sys_err(e))?;
        let t = self.stopped_thread(thread)?;
        t.regs = Some(*regs);
        t.unrewound_breakpoint = None;
        Ok(())
    }

    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let tid = thread.0 as i32;
        let t = self.stopped_thread(thread)?;
        let at_rendezvous = std::mem::take(&mut t.at_rendezvous);
        if let Some(bp) = t.unrewound_breakpoint.take() {
            // The engine did not move the thread: it re-executes the breakpoint
            // address (only meaningful if the breakpoint was removed).
            let mut r = match t.regs {
                Some(r) => r,
                None => self.fetch_regs(tid)?,
            };
            r.rip = bp;
            self.sys
                .setregs(tid, &sys::regs_to_user(&r))
                .map_err(|e| self.sys_err(e))?;
            self.stopped_thread(thread)?.regs = Some(r);
        }
        if at_rendezvous {
            if let Some(ev) = self.leave_rendezvous(thread, mode == ResumeMode::Step)? {
                // Reported instead: the thread stays stopped.
                self.stopped_thread(thread)?.state = RunState::Event;
                self.pending.push_back(ev);
                return Ok(());
            }
        }
        let t = self.stopped_thread(thread)?;
        if mode == ResumeMode::Continue && t.pending_watch != 0 {
            // The step that just ended also made a watched access: that is
            // reported now, with the thread where the engine left it.
            let slots = std::mem::take(&mut t.pending_watch);
            let regs = match t.regs {
                Some(r) => r,
                None => self.fetch_regs(tid)?,
            };
            let t = self.stopped_thread(thread)?;
            t.regs = Some(regs);
            t.state = RunState::Event;
            self.pending.push_back(TargetEvent::Watchpoint {
                thread,
                slots,
                regs,
            });
            return Ok(());
        }
        if mode == ResumeMode::Continue {
            self.restore_sigtrap_state(tid);
        }
        let t = self.stopped_thread(thread)?;
        t.regs = None;
        t.state = RunState::Running;
        let r = match mode {
            ResumeMode::Continue => {
                let sig = t.held_signals.pop_front().unwrap_or(0);
                let rest: Vec<i32> = t.held_signals.drain(..).collect();
                for s in rest {
                    let _ = self.sys.tgkill(self.pid, tid, s);
                }
                self.sys.cont(tid, sig)
            }
            ResumeMode::Step => {
                t.stepping = true;
                self.sys.step(tid, 0)
            }
        };
        r.map_err(|e| self.sys_err(e))
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
        self.wait_traced(timeout)
    }

    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        if let Some(rv) = self.rendezvous.as_mut().filter(|r| r.brk == addr.0) {
            // The internal int3 is there already: share it.
            if rv.engine_owned {
                return Err(TargetError::Breakpoint {
                    addr: addr.0,
                    target: self.describe(),
                    why: "already inserted",
                });
            }
            rv.engine_owned = true;
            return Ok(());
        }
        if self.give_sig_site(addr.0) {
            // A signal-state site's int3 is there already: the engine's now.
            return Ok(());
        }
        self.insert_int3(addr)?;
        if !self.sig_sites_armed() {
            self.arm_sig_sites();
        }
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        if let Some(rv) = self.rendezvous.as_mut().filter(|r| r.brk == addr.0) {
            // The internal int3 stays.
            if !rv.engine_owned {
                return Err(TargetError::Breakpoint {
                    addr: addr.0,
                    target: self.describe(),
                    why: "not inserted",
                });
            }
            rv.engine_owned = false;
            return Ok(());
        }
        self.remove_int3(addr)
    }

    fn stop_all(&mut self) -> Result<(), TargetError> {
        if self.released.is_some() {
            return self.reacquire();
        }
        // Interrupted again even with an interrupt marked pending: a thread
        // that entered another ptrace stop (a breakpoint, a clone event)
        // after PTRACE_INTERRUPT had its pending STOP trap cleared by the
        // kernel ("any trap clears pending STOP trap", ptrace_stop), so no
        // stop may be coming; a second interrupt while one is still
        // pending sets the same bit and makes no second stop. Skipping
        // them hung `watch -p --duration` under thread churn in this wait.
        let running: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state == RunState::Running)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in running {
            match self.sys.interrupt(tid) {
                // ESRCH: it ended, its exit perhaps reaped already into the
                // strays by an earlier drain (`ready.rs`). Waited for all
                // the same: its status there, or ECHILD, takes it out of
                // the threads. Left "running", it failed the next call
                // that wants every thread stopped ("thread N is not a
                // stopped thread" at detach, under thread churn).
                Ok(()) => self.threads.get_mut(&tid).expect("known").interrupt_pending = true,
                Err(e) if e.errno() == libc::ESRCH => {
                    self.threads.get_mut(&tid).expect("known").interrupt_pending = true
                }
                Err(e) => return Err(self.sys_err(e)),
            }
        }
        self.wait_parked()
    }

    fn resume_all(&mut self) -> Result<(), TargetError> {
        let parked: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state == RunState::Parked)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            self.resume(ThreadId(tid as u64), ResumeMode::Continue)?;
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), TargetError> {
        if !self.attached {
            return Ok(());
        }
        if self.released.is_some() && self.exited.is_none() {
            self.reacquire()?;
        }
        self.stop_all()?;
        self.clear_watchpoints_for_detach();
        // What our traps reset in the program's signal state goes back
        // (sites' int3s go with the other breakpoints below).
        self.sigtrap.sites.clear();
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.restore_sigtrap_state(tid);
        }
        // Threads whose breakpoint event the engine never handled re-execute
        // the (restored) original instruction.
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in &tids {
            if let Some(bp) = self.threads.get(tid).and_then(|t| t.unrewound_breakpoint) {
                if let Ok(mut r) = self.fetch_regs(*tid) {
                    r.rip = bp;
                    let _ = self.sys.setregs(*tid, &sys::regs_to_user(&r));
                }
            }
        }
        // Every int3, the rendezvous one included (a thread stopped there
        // runs the original `ret`).
        self.rendezvous = None;
        // Forked children held and never released get their copy of the
        // `int3`s back first (an error below must not leave them in).
        if !self.forked_children.is_empty() {
            let int3s = self.int3_originals();
            for &child in &self.forked_children {
                self.write_into_child(child as u64, &int3s);
            }
        }
        let bps: Vec<u64> = self.breakpoints.keys().copied().collect();
        for a in bps {
            self.remove_int3(RuntimeAddr(a))?;
        }
        // Release scratch memory no thread is executing in.
        let regions = std::mem::take(&mut self.scratch);
        for region in regions {
            let busy = tids.iter().any(|tid| {
                self.fetch_regs(*tid)
                    .map(|r| region.contains(RuntimeAddr(r.rip)))
                    .unwrap_or(false)
            });
            if !busy {
                if let Ok(Some(tid)) = self.thread_for_remote() {
                    let _ = remote::syscall(
                        self,
                        tid,
                        libc::SYS_munmap as u64,
                        &[region.start.0, region.len],
                    );
                }
            }
        }
        // A thread stopped at the loader's rendezvous with its event
        // handed out (and dropped: nothing handles events now) is parked,
        // its `int3` gone: a hook's remote call lends it like the others
        // (`lend.rs`). Left in its event stop it was never lent, and it
        // holds the loader's lock there: the agent's `dlclose` waited for
        // it until its timeout and the agent stayed (plugin_loader under
        // load, its loaders inside `dlopen` and `dlclose` all the time).
        let at_rendezvous: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state == RunState::Event && t.at_rendezvous)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in at_rendezvous {
            self.pending.retain(
                |e| !matches!(e, TargetEvent::ModulesChanged { thread } if thread.0 == tid as u64),
            );
            if let Some(t) = self.threads.get_mut(&tid) {
                t.state = RunState::Parked;
                t.at_rendezvous = false;
            }
        }
        // What our remote calls reset in the program's SIGTRAP state goes
        // back before and after the hooks (see `sigtrap.rs`).
        self.settle_sigtrap_before_detach_hooks();
        for hook in std::mem::take(&mut self.detach_hooks) {
            (hook.0)(self);
        }
        self.settle_sigtrap_after_detach_hooks();
        for child in std::mem::take(&mut self.forked_children) {
            self.child_mask_back(child);
            let _ = self.sys.detach(child, 0);
        }
        // Read again: a hook's remote call may have let the threads run
        // (`lend.rs`), and they may have made threads meanwhile.
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in tids {
            let sig = self
                .threads
                .get_mut(&tid)
                .and_then(|t| t.held_signals.pop_front())
                .unwrap_or(0);
            let _ = self.sys.detach(tid, sig);
        }
        self.threads.clear();
        self.attached = false;
        Ok(())
    }

    fn release_fork_child(
        &mut self,
        child: u64,
        restores: &[(RuntimeAddr, Vec<u8>)],
    ) -> Result<(), TargetError> {
        // Without a ledger: this target's own `int3`s go too.
        let mut all = self.int3_originals();
        all.extend_from_slice(restores);
        self.release_fork_child_with(child, &all)
    }

    fn forget_breakpoint(&mut self, addr: RuntimeAddr) {
        if self.breakpoints.remove(&addr.0).is_some() {
            self.breakpoint_changed(addr.0);
        }
    }

    fn alloc_scratch(&mut self, near: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        let no = |why: String, me: &Self| TargetError::NoScratch {
            near: near.0,
            target: me.describe(),
            why,
        };
        let len = (len + 0xfff) & !0xfff;
        let maps_text = std::fs::read_to_string(format!("/proc/{}/maps", self.live_task()))
            .map_err(|e| no(format!("cannot read maps: {e}"), self))?;
        let lines = parse_maps_lines(&maps_text);
        let Some(addr) = find_free_gap(&lines, near.0, len) else {
            return Err(no("no free gap within ±1 GiB".into(), self));
        };
        let Some(tid) = self.thread_for_remote()? else {
            return Err(no("no stopped thread to make the mmap call".into(), self));
        };
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
        let r = remote::syscall(
            self,
            tid,
            libc::SYS_mmap as u64,
            &[addr, len, prot, flags, u64::MAX, 0],
        )?;
        if r != addr {
            if (r as i64) > 0 {
                let _ = remote::syscall(self, tid, libc::SYS_munmap as u64, &[r, len]);
            }
            return Err(no(
                format!("remote mmap at {addr:#x} returned {:#x}", r),
                self,
            ));
        }
        let region = ScratchRegion {
            start: RuntimeAddr(addr),
            len,
        };
        // Fill with int3 so a stray jump into unused scratch traps.
        self.write_memory(region.start, &vec![INT3; len as usize])?;
        self.scratch.push(region);
        Ok(region)
    }
}
