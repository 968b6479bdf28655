//! Running and stopping the VM: stop replies to events, continue, pause, resume, wait.

use super::*;

impl GuestTarget {
    /// Classifies a stop reply into an event (None: not for the engine, the
    /// VM was resumed again or stays stopped for stop_all).
    pub(super) fn on_stop(
        &mut self,
        s: StopReply,
        interrupted: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        self.running = false;
        self.stopped_at.get_or_insert_with(Instant::now);
        self.stats.stops += 1;
        self.invalidate();
        match s {
            StopReply::Exited { code } => {
                let why = format!("guest exited (W{code:02x})");
                self.gone = Some(why.clone());
                Ok(Some(TargetEvent::Exited(ExitStatus::Disconnected(why))))
            }
            StopReply::Terminated { signal } => {
                let why = format!("guest terminated (X{signal:02x})");
                self.gone = Some(why.clone());
                Ok(Some(TargetEvent::Exited(ExitStatus::Disconnected(why))))
            }
            StopReply::Output(_) => Ok(None),
            StopReply::Signal {
                signal,
                thread,
                pairs,
            } => {
                let t = thread.unwrap_or(self.last_thread);
                if !self.threads.contains(&t) {
                    // A vCPU we did not know (hot-plugged): learn the list again.
                    if let Ok(ts) = self.client.threads() {
                        self.threads = ts;
                    }
                }
                self.last_thread = t;
                let thread = ThreadId(t.tid as u64);
                if let Some((st, from, repeats)) = self.stepping.filter(|s| s.0 == t) {
                    let regs = self.read_regs(t)?;
                    if regs.rip == from && repeats < MAX_STEP_REPEATS {
                        // The stop came before the instruction ran (the TCG
                        // quirk `continue_vm` steps over too) or it is a rep
                        // iteration: step again, or the engine would run the
                        // instruction a second time after its post handler.
                        self.stats.step_repeats += 1;
                        self.stepping = Some((st, from, repeats + 1));
                        self.invalidate();
                        self.client.step(t).map_err(|e| self.fail(e))?;
                        self.running = true;
                        self.mark_resumed();
                        return Ok(None);
                    }
                    self.stepping = None;
                    return Ok(Some(TargetEvent::Stepped { thread, regs }));
                }
                let rip = self.stop_pc(t, &pairs)?;
                if signal == 5 && self.breakpoints.contains(&rip) {
                    self.reported.insert(t.tid, rip);
                    self.stats.breakpoint_hits += 1;
                    let regs = self.event_regs(t, rip)?;
                    return Ok(Some(TargetEvent::Breakpoint {
                        thread,
                        addr: RuntimeAddr(rip),
                        regs,
                    }));
                }
                if interrupted {
                    return Ok(None);
                }
                // A stop that is not ours (a breakpoint removed while its hit
                // was in flight, a stray interrupt): keep the VM running.
                self.continue_vm()?;
                Ok(None)
            }
        }
    }

    /// Continues the VM, stepping a vCPU first off a breakpoint it was just
    /// reported at. Returns an event if the step-over itself produced one.
    pub(super) fn continue_vm(&mut self) -> Result<(), TargetError> {
        let t = self.last_thread;
        if let Some(addr) = self.reported.get(&t.tid).copied() {
            let rip = self.pc(t, &[])?;
            self.reported.remove(&t.tid);
            if rip == addr && self.breakpoints.contains(&addr) {
                self.flush_pc()?;
                self.stats.step_overs += 1;
                let mut repeats = 0;
                loop {
                    self.client.step(t).map_err(|e| self.fail(e))?;
                    self.running = true;
                    self.mark_resumed();
                    let s = self
                        .client
                        .wait_stop(Some(self.config.timeout))
                        .map_err(|e| self.fail(e))?;
                    let Some(s) = s else {
                        return Err(proto(&self.name, "no stop reply to a single-step"));
                    };
                    self.running = false;
                    self.stopped_at = Some(Instant::now());
                    self.stats.stops += 1;
                    self.invalidate();
                    let StopReply::Signal { pairs, .. } = s else {
                        if let Some(ev) = self.on_stop(s, false)? {
                            self.pending.push_back(ev);
                            return Ok(());
                        }
                        break;
                    };
                    let rip = self.stop_pc(t, &pairs)?;
                    if rip == addr && repeats < MAX_STEP_REPEATS {
                        // Still before the probed instruction: QEMU (TCG)
                        // sometimes answers a single-step with a trap stop
                        // taken before the instruction ran (seen: 1 step in
                        // a few hundred, the same T05 and registers), or the
                        // instruction is a rep iteration. Either way this is
                        // the execution already reported: step again, or
                        // it would be reported a second time.
                        repeats += 1;
                        self.stats.step_repeats += 1;
                        continue;
                    }
                    if self.breakpoints.contains(&rip) {
                        // The next instruction is probed too: report it, VM stopped.
                        self.reported.insert(t.tid, rip);
                        self.stats.breakpoint_hits += 1;
                        let regs = self.event_regs(t, rip)?;
                        self.pending.push_back(TargetEvent::Breakpoint {
                            thread: ThreadId(t.tid as u64),
                            addr: RuntimeAddr(rip),
                            regs,
                        });
                        return Ok(());
                    }
                    break;
                }
            }
        }
        self.reported.clear();
        self.invalidate();
        // A rip set for the vCPU of the last stop (QEMU's current vCPU for
        // `c`) goes with the resume: one packet, no reply to wait for.
        let r = match self.pending_pc {
            Some((pt, pc)) if pt == t => {
                self.pending_pc = None;
                self.client.cont_at(pc)
            }
            _ => {
                self.flush_pc()?;
                self.client.cont()
            }
        };
        r.map_err(|e| self.fail(e))?;
        self.running = true;
        self.mark_resumed();
        Ok(())
    }

    /// Stops the VM if it runs; returns whether it did (so the caller
    /// resumes it after). A breakpoint that raced the interrupt is queued.
    pub(super) fn pause(&mut self) -> Result<bool, TargetError> {
        if !self.running {
            return Ok(false);
        }
        self.client.interrupt().map_err(|e| self.fail(e))?;
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = self
                .client
                .wait_stop(Some(left))
                .map_err(|e| self.fail(e))?;
            let Some(s) = s else {
                return Err(proto(&self.name, "the VM did not stop after an interrupt"));
            };
            if let Some(ev) = self.on_stop(s, true)? {
                self.pending.push_back(ev);
                return Ok(false);
            }
            if !self.running {
                return Ok(true);
            }
        }
    }

    pub(super) fn unpause(&mut self, paused: bool) -> Result<(), TargetError> {
        if paused && self.pending.is_empty() {
            self.continue_vm()?;
        }
        Ok(())
    }

    /// [`Target::resume`] without publishing the counters.
    pub(super) fn resume_inner(
        &mut self,
        thread: ThreadId,
        mode: ResumeMode,
    ) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Ok(()); // all-stop: the VM already runs
        }
        if !self.pending.is_empty() {
            // An event is queued for the engine: the VM stays stopped until
            // it is taken and answered.
            return Ok(());
        }
        self.stopped_by_stop_all = false;
        match mode {
            ResumeMode::Step => {
                let from = self.pc(t, &[])?;
                self.flush_pc()?;
                self.reported.remove(&t.tid);
                self.invalidate();
                self.stepping = Some((t, from, 0));
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.running = true;
                self.mark_resumed();
                Ok(())
            }
            ResumeMode::Continue => {
                self.last_thread = t;
                self.continue_vm()
            }
        }
    }

    /// [`Target::wait`] without publishing the counters.
    pub(super) fn wait_inner(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<TargetEvent, TargetError> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(ev);
        }
        if let Some(why) = &self.gone {
            return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why.clone())));
        }
        if !self.running {
            return Ok(TargetEvent::Timeout);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // A signal (Ctrl-C) ends the wait: the session checks its flag.
            match self.client.wait_stop_interruptible(left) {
                Ok(None) => return Ok(TargetEvent::Timeout),
                Ok(Some(s)) => {
                    let ev = match self.on_stop(s, false) {
                        Ok(ev) => ev,
                        // The stub died while the stop was being examined.
                        Err(_) if self.gone.is_some() => {
                            let why = self.gone.clone().unwrap_or_default();
                            return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why)));
                        }
                        Err(e) => return Err(e),
                    };
                    if let Some(ev) = ev {
                        return Ok(ev);
                    }
                    if let Some(ev) = self.pending.pop_front() {
                        return Ok(ev);
                    }
                    if !self.running {
                        return Ok(TargetEvent::Timeout);
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    self.gone = Some(why.clone());
                    self.running = false;
                    return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why)));
                }
            }
        }
    }
}
