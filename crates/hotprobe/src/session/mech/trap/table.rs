//! The trap mechanism's publication of its `int3`s in the agent's trap
//! table (with their guards), so that an agent whose tracer died undoes
//! them (hotprobe_agent's `orphan` module), and the changes of the
//! engine's breakpoints made with every thread stopped.

use super::*;

impl TrapMech {
    /// An attached process gets the agent before its first trap probe
    /// (quietly: without it, the probes work, only a hotprobe killed with
    /// them in leaves int3s nobody undoes).
    pub(super) fn agent_for_traps(&mut self, cx: &mut Cx<'_>, config: &FastPathConfig) {
        if matches!(
            cx.agent.state,
            crate::session::agent::AgentState::Injectable
        ) {
            let _ = cx.agent.ensure(cx.target, config);
            self.publish(cx);
        }
    }

    /// Publishes the `int3` about to be written at `addr` (its original
    /// byte read now), so that no moment passes with an unpublished one.
    pub(super) fn prepublish(&mut self, cx: &mut Cx<'_>, addr: RuntimeAddr) {
        let Some(table) = cx.agent.trap_table() else {
            return;
        };
        // Into the table only: `publish` then takes it as new (and guards
        // it); a failed placement leaves an entry no int3 uses.
        let mut b = [0u8];
        if cx.target.as_target().read_memory(addr, &mut b).is_ok() {
            table.publish(addr.0, b[0], 0);
        }
    }

    /// Runs `f`, a change of the engine's breakpoints (a probe added takes
    /// its id from the target's ids), with every thread stopped, then
    /// guards and publishes the new set before any thread runs (a guard
    /// left in an instruction whose breakpoint went would corrupt it).
    pub(crate) fn change<R>(
        &mut self,
        cx: &mut Cx<'_>,
        f: impl FnOnce(&mut Engine, &mut HeldTarget, &mut ProbeIds) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let started = cx.engine.started;
        if started {
            cx.target.as_target().stop_all()?;
        }
        let r = f(cx.engine, cx.target, cx.ids);
        self.publish(cx);
        if started {
            cx.target.as_target().resume_all()?;
        }
        r
    }

    /// Takes the process's `int3` changes into the ledger (the guards
    /// marked as such), or a guest's stub breakpoints.
    pub(crate) fn sync(&self, target: &mut HeldTarget, ledger: &mut CodeLedger) {
        let Some(pt) = target.process() else {
            if let Some(list) = target.stub_breakpoints() {
                ledger.sync_stub_breakpoints(list);
            }
            return;
        };
        let changed = pt.take_breakpoint_changes();
        let pt: &ProcessTarget = pt;
        ledger.sync_traps(
            changed,
            || pt.breakpoints(),
            |a| pt.breakpoint_at(a),
            |a| self.guards.contains_key(&a),
        );
    }

    /// Brings the agent's trap table in line with the target's `int3`s
    /// (and out-of-line memory), as the ledger has them: an agent whose
    /// tracer died undoes them (hotprobe_agent's `orphan` module). Called
    /// after every change.
    pub(crate) fn publish(&mut self, cx: &mut Cx<'_>) {
        self.sync(cx.target, cx.ledger);
        let Some(table) = cx.agent.trap_table() else {
            return;
        };
        match cx.ledger.take_trap_changes() {
            Some(changed) => self.publish_changes(cx, &table, changed),
            None => {
                let every = self.every_known(cx);
                self.publish_changes(cx, &table, every)
            }
        }
    }

    /// [`TrapMech::publish`] for the `int3`s at `changed` (written or
    /// taken out since the last call): a probe added costs the same with
    /// 10 or 100,000 in (the whole set is walked only after an exec).
    ///
    /// Each new breakpoint whose instruction is 2 bytes or more (and the
    /// return trampoline's NOPs) gets a guard `int3` one byte in; the
    /// guards of breakpoints that went are taken out. Should we die while
    /// a thread is stopped at a breakpoint, the kernel resumes it one byte
    /// past the `int3`, without the signal: on the guard, which sends it to
    /// the agent (see [`hotprobe_fastpath::TRAP_GUARD`]). No thread runs a
    /// guard while we live (it is inside an instruction that never runs in
    /// place: it runs out of line, or is emulated).
    fn publish_changes(&mut self, cx: &mut Cx<'_>, table: &TrapTable, mut changed: Vec<u64>) {
        let Some(pt) = cx.target.process() else {
            return;
        };
        let regions = pt.scratch_regions();
        // Guards whose breakpoint went, and guards gone themselves.
        for &a in &changed {
            if pt.breakpoint_at(a).is_some() {
                continue;
            }
            let g = a.wrapping_add(1);
            if self.guards.get(&g) == Some(&a) {
                self.guards.remove(&g);
                if pt.breakpoint_at(g).is_some() && pt.remove_breakpoint(RuntimeAddr(g)).is_err() {
                    // Its memory is gone (an unloaded library).
                    pt.forget_breakpoint(RuntimeAddr(g));
                }
            }
            self.guards.remove(&a);
        }
        // Guards for the new breakpoints.
        let mut wanted = Vec::new();
        for &a in &changed {
            if pt.breakpoint_at(a).is_none()
                || self.published.contains_key(&a)
                || self.overflow.contains(&a)
            {
                continue;
            }
            let g = a.wrapping_add(1);
            if self.guards.contains_key(&a)
                || self.guards.get(&g) == Some(&a)
                || pt.breakpoint_at(g).is_some()
            {
                continue;
            }
            if guard_fits(pt, &regions, a) {
                wanted.push(a);
            }
        }
        self.insert_guards(cx.engine, cx.target, wanted);
        self.sync(cx.target, cx.ledger);
        match cx.ledger.take_trap_changes() {
            Some(more) => changed.extend(more),
            None => changed.extend(self.every_known(cx)),
        }
        let Some(pt) = cx.target.process() else {
            return;
        };
        changed.sort_unstable();
        changed.dedup();
        let now: Vec<(u64, Option<u8>)> =
            changed.iter().map(|a| (*a, pt.breakpoint_at(*a))).collect();
        for (a, at) in now {
            match at {
                Some(b) => {
                    let flags = trap_flags(&self.guards, &regions, a);
                    self.publish_one(cx, table, a, b, flags);
                }
                None => {
                    self.overflow.remove(&a);
                    if self.published.remove(&a).is_some() {
                        table.unpublish(a);
                    }
                }
            }
        }
        table.set_regions(&regions);
    }

    /// Publishes the `int3` at `a` (original byte `b`), or counts it past
    /// the table.
    fn publish_one(&mut self, cx: &mut Cx<'_>, table: &TrapTable, a: u64, b: u8, flags: u32) {
        if self.published.get(&a) == Some(&b) || self.overflow.contains(&a) {
            return;
        }
        if table.publish(a, b, flags) {
            self.published.insert(a, b);
        } else {
            if self.overflow.is_empty() {
                cx.notice(format!(
                    "the agent's trap table is full ({} slots, guards included): \
                     int3s placed past it work, but a hotprobe killed with SIGKILL \
                     leaves them in",
                    hotprobe_fastpath::TRAP_SLOTS
                ));
            }
            self.overflow.insert(a);
        }
    }

    /// Every address [`TrapMech::publish_changes`] may have to look at:
    /// the ledger's `int3`s, the published ones, the ones past the table,
    /// the guards and their sites.
    fn every_known(&self, cx: &Cx<'_>) -> Vec<u64> {
        let mut v: Vec<u64> = cx.ledger.traps().collect();
        v.extend(self.published.keys());
        v.extend(&self.overflow);
        v.extend(self.guards.iter().flat_map(|(g, site)| [*g, *site]));
        v
    }

    /// Puts the guard `int3` one byte into each breakpoint of `sites`,
    /// except an instruction stepped in place (it runs where it is).
    fn insert_guards(&mut self, engine: &Engine, target: &mut HeldTarget, mut sites: Vec<u64>) {
        sites.retain(|a| engine.execution_of(RuntimeAddr(*a)) != Some("stepped in place"));
        let Some(pt) = target.process() else {
            return;
        };
        for a in sites {
            let g = a.wrapping_add(1);
            if pt.insert_breakpoint(RuntimeAddr(g)).is_ok() {
                self.guards.insert(g, a);
            }
        }
    }

    /// Empties the trap table (every `int3` taken out, every return
    /// address put back: detach).
    pub(super) fn unpublish(&mut self, agent: &Agent) {
        if let Some(table) = agent.trap_table() {
            for a in self.published.keys() {
                table.unpublish(*a);
            }
            table.clear_returns();
            table.set_regions(&[]);
        }
        self.published.clear();
        self.overflow.clear();
        self.guards.clear();
    }
}

/// Whether the instruction under the breakpoint at `a` has room for a
/// guard one byte in (2 bytes or more; the return trampoline's `int3` is
/// followed by NOPs nothing runs).
fn guard_fits(pt: &mut ProcessTarget, regions: &[(u64, u64)], a: u64) -> bool {
    if regions.iter().any(|(s, e)| a >= *s && a < *e) {
        return true;
    }
    let mut code = [0u8; 15];
    match pt.read_memory(RuntimeAddr(a), &mut code) {
        Ok(()) => hotprobe_x86::decode(&code, a).is_ok_and(|i| i.len() >= 2),
        Err(_) => false,
    }
}

/// The trap table's flags for the `int3` at `a`: a guard, the return
/// trampoline (the only `int3` in scratch memory), or a probe's.
fn trap_flags(guards: &HashMap<u64, u64>, regions: &[(u64, u64)], a: u64) -> u32 {
    if guards.contains_key(&a) {
        hotprobe_fastpath::TRAP_GUARD
    } else if regions.iter().any(|(s, e)| a >= *s && a < *e) {
        hotprobe_fastpath::TRAP_RETURN
    } else {
        0
    }
}
