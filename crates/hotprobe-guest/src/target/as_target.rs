//! The `Target` trait over the GDB stub.

use super::*;

impl Target for GuestTarget {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn threads(&self) -> Vec<ThreadId> {
        self.threads
            .iter()
            .map(|t| ThreadId(t.tid as u64))
            .collect()
    }

    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.ram.is_some() && self.read_memory_direct(GuestVirt(addr.0), buf).is_ok() {
            return Ok(());
        }
        let paused = self.pause()?;
        let r = self.read_memory_stub(GuestVirt(addr.0), buf);
        self.unpause(paused)?;
        r
    }

    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        let paused = self.pause()?;
        let r = self.client.write_memory(addr.0, data).map_err(|e| match e {
            GdbError::ErrorReply { .. } => TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: data.len(),
                target: self.name.clone(),
            },
            e => self.fail(e),
        });
        if r.is_ok() {
            for a in &mut self.scratch {
                if addr.0 < a.start + a.len && a.start < addr.0 + data.len() as u64 {
                    a.dirty = true;
                }
            }
        }
        self.unpause(paused)?;
        r
    }

    fn registers(&mut self, thread: ThreadId) -> Result<Registers, TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        self.read_regs(t)
    }

    fn set_registers(&mut self, thread: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        // A rip kept for the resume first, so the diff below is against
        // what the stub holds.
        self.flush_pc()?;
        let old = self.read_regs(t)?;
        let mut new = *regs;
        let mut old_m = old;
        let changed: Vec<(&'static str, u64)> = RegisterMap::fields(&mut new)
            .into_iter()
            .zip(RegisterMap::fields(&mut old_m))
            .filter(|((_, n), (_, o))| **n != **o)
            .map(|((name, n), _)| (name, *n))
            .collect();
        for (name, value) in &changed {
            let Some(info) = self.regmap.get(name).cloned() else {
                continue;
            };
            let bytes = (info.bitsize as usize).div_ceil(8).min(8);
            let v = value.to_le_bytes();
            self.client
                .write_register(t, info.regnum, v.get(..bytes).unwrap_or(&v))
                .map_err(|e| self.fail(e))?;
        }
        if let Some((g, r)) = self.regs.get_mut(&t.tid) {
            self.regmap.store(g, regs);
            *r = self.regmap.registers(g);
        }
        self.pcs.remove(&t.tid);
        if old.rip != regs.rip {
            // Moved off the reported breakpoint (boosted): nothing to step over.
            self.reported.remove(&t.tid);
        }
        Ok(())
    }

    fn set_pc(&mut self, thread: ThreadId, pc: u64) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        let Some(info) = self.regmap.get("rip").cloned() else {
            let mut regs = self.read_regs(t)?;
            regs.rip = pc;
            return self.set_registers(thread, &regs);
        };
        if info.bitsize == 0 {
            return Err(proto(&self.name, "rip has no size"));
        }
        let old = self.pc(t, &[])?;
        if self.pending_pc.is_some_and(|(pt, _)| pt != t) {
            self.flush_pc()?;
        }
        // Sent with the resume (`c ADDR`), or as a `P` if anything needs
        // the registers first.
        self.pending_pc = Some((t, pc));
        self.stats.pc_writes += 1;
        if let Some((g, r)) = self.regs.get_mut(&t.tid) {
            r.rip = pc;
            self.regmap.store(g, r);
        }
        self.pcs.insert(t.tid, pc);
        if old != pc {
            // Moved off the reported breakpoint (boosted): nothing to step over.
            self.reported.remove(&t.tid);
        }
        Ok(())
    }

    fn set_partial_breakpoint_registers(&mut self, on: bool) -> bool {
        self.partial_regs = on && self.config.partial_registers;
        self.partial_regs
    }

    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let r = self.resume_inner(thread, mode);
        self.publish_stats();
        r
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
        let r = self.wait_inner(timeout);
        self.publish_stats();
        r
    }

    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.breakpoints.contains(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.name.clone(),
                why: "already inserted",
            });
        }
        let paused = self.pause()?;
        let r = self
            .client
            .insert_breakpoint(0, addr.0)
            .map_err(|e| self.fail(e));
        if r.is_ok() {
            self.breakpoints.insert(addr.0);
        }
        self.unpause(paused)?;
        r
    }

    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        self.check_alive()?;
        if !self.breakpoints.remove(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.name.clone(),
                why: "none inserted",
            });
        }
        let paused = self.pause()?;
        let r = self
            .client
            .remove_breakpoint(0, addr.0)
            .map_err(|e| self.fail(e));
        self.reported.retain(|_, a| *a != addr.0);
        self.unpause(paused)?;
        r
    }

    fn stub_breakpoints(&self) -> Option<Vec<u64>> {
        Some(self.breakpoints.iter().copied().collect())
    }

    fn stop_all(&mut self) -> Result<(), TargetError> {
        self.check_alive()?;
        self.stopped_by_stop_all = self.pause()?;
        Ok(())
    }

    fn resume_all(&mut self) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.stopped_by_stop_all && !self.running && self.pending.is_empty() {
            self.stopped_by_stop_all = false;
            self.continue_vm()?;
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), TargetError> {
        if self.gone.is_some() {
            return Ok(());
        }
        self.pause()?;
        self.flush_pc()?;
        self.pending.clear();
        // No vCPU may be left inside a scratch area about to be restored.
        for t in self.threads.clone() {
            for _ in 0..64 {
                let rip = self.read_regs(t)?.rip;
                if !self
                    .scratch
                    .iter()
                    .any(|a| rip >= a.start && rip < a.start + a.len)
                {
                    break;
                }
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.client
                    .wait_stop(Some(self.config.timeout))
                    .map_err(|e| self.fail(e))?;
                self.invalidate();
            }
        }
        for a in std::mem::take(&mut self.breakpoints) {
            self.client
                .remove_breakpoint(0, a)
                .map_err(|e| self.fail(e))?;
        }
        self.restore_scratch()?;
        let r = self.client.detach().map_err(|e| self.fail(e));
        self.gone = Some("detached".into());
        self.running = false;
        r
    }

    fn alloc_scratch(&mut self, near: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        self.check_alive()?;
        // Bump-allocate in areas found earlier.
        for a in &mut self.scratch {
            let start = (a.start + a.used + 15) & !15;
            if start + len <= a.start + a.len && start.abs_diff(near.0) < (1u64 << 31) - 4096 {
                a.used = start + len - a.start;
                return Ok(ScratchRegion {
                    start: RuntimeAddr(start),
                    len,
                });
            }
        }
        match self.find_scratch(near.0, len) {
            Ok(mut area) => {
                area.used = len;
                let region = ScratchRegion {
                    start: RuntimeAddr(area.start),
                    len,
                };
                self.scratch.push(area);
                Ok(region)
            }
            Err(why) => Err(TargetError::NoScratch {
                near: near.0,
                target: self.name.clone(),
                why,
            }),
        }
    }

    fn return_strategy(&self) -> ReturnStrategy {
        ReturnStrategy::BreakpointAtReturn
    }
}
