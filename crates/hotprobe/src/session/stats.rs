//! Control and counts of placed probes, whatever their mechanism, and
//! what the session says about its targets.

use super::*;

impl Session {
    /// How many of target `t`'s `int3`s the agent's trap table had no room
    /// for (it holds [`hotprobe_fastpath::TRAP_SLOTS`], guards included):
    /// they work, but a hotprobe killed with SIGKILL leaves them in (their
    /// placements say so). 0 for a target without the agent.
    pub fn traps_past_table(&self, t: TargetId) -> usize {
        self.slots
            .get(t.0)
            .map_or(0, |s| s.mechs.trap.overflow.len())
    }

    /// Enable or disable a probe at run time.
    pub fn set_enabled(&mut self, id: ProbeId, enabled: bool) -> Result<(), EngineError> {
        self.control(id, |m, cx| m.set_enabled(cx, id, enabled))
    }

    /// Remove a probe.
    pub fn remove_probe(&mut self, id: ProbeId) -> Result<(), EngineError> {
        self.control(id, |m, cx| m.remove(cx, id))?;
        // A pending one is not armed when its module loads.
        self.slot_of(id)?.drop_pending(id);
        Ok(())
    }

    /// Runs `f` on the mechanism that serves probe `id`. The fast path
    /// takes a process running untraced back for its rewrite: it is let
    /// go again after.
    pub(super) fn control(
        &mut self,
        id: ProbeId,
        f: impl FnOnce(&mut dyn mech::ProbeMechanism, &mut Cx<'_>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        self.unchain(id)?;
        let slot = self.slot_of(id)?;
        let kind = slot.owner(id);
        let (mut cx, mechs) = slot.parts();
        let m = mechs.get(kind).ok_or(EngineError::NoSuchProbe(id))?;
        f(m, &mut cx)?;
        if kind == MechKind::Fast {
            self.maybe_release((id.0 >> TARGET_SHIFT) as usize);
        }
        Ok(())
    }

    /// Before probe `id` alone is changed: a fast-path site serving it
    /// and other probes (jumps chained at one entry, `plan.rs`) goes to
    /// the trap with all of them, so that removing or disabling one leaves
    /// the others counting (the later jump's trampoline would run the
    /// earlier one's, removed or not). A recording site stays (its
    /// events cannot change hands within a call).
    fn unchain(&mut self, id: ProbeId) -> Result<(), EngineError> {
        let slot = self.slot_of(id)?;
        if slot.owner(id) != MechKind::Fast {
            return Ok(());
        }
        slot.sync_ledger();
        let shared = slot.ledger.sites().iter().find(|s| {
            s.owner == ledger::CodeOwner::Fast
                && s.probes().any(|(p, _)| p == id)
                && s.probes().count() > 1
                && s.probes().all(|(_, record)| !record)
        });
        let Some(start) = shared.map(|s| s.start) else {
            return Ok(());
        };
        let t = TargetId((id.0 >> TARGET_SHIFT) as usize);
        // A released process taken back first (the trap needs ptrace).
        self.before_trap_at(t, RuntimeAddr(start))
    }

    /// A probe's counts, whatever its mechanism, over every process it
    /// is in (followed fork children included). Fast-path counts are exact
    /// once the target's threads are quiescent (stopped or gone).
    pub fn stats(&self, id: ProbeId) -> Option<ProbeStats> {
        let by = self.stats_by_process(id)?;
        Some(by.iter().fold(ProbeStats::default(), |mut a, (_, s)| {
            a.hits += s.hits;
            a.nmissed += s.nmissed;
            a.returns += s.returns;
            a.abandoned += s.abandoned;
            a
        }))
    }

    /// A probe's counts per process: the process it was placed in, then
    /// each followed fork child that hit it (vfork children included).
    /// Without `follow_forks`, a vfork child's hits (it runs in its
    /// parent's memory, probes included) are in no row: see
    /// [`Session::vfork_uncounted`].
    pub fn stats_by_process(&self, id: ProbeId) -> Option<Vec<(i32, ProbeStats)>> {
        let (me, mut by) = self.stats_of_every_process(id)?;
        if !self.config.follow_forks {
            by.retain(|(pid, _)| *pid == me);
        }
        Some(by)
    }

    /// Hits of probe `id` by vfork children of a process not followed
    /// (no `follow_forks`), per child pid: counted apart from their
    /// parent's, and in no row of [`Session::stats_by_process`].
    pub fn vfork_uncounted(&self, id: ProbeId) -> Vec<(i32, u64)> {
        if self.config.follow_forks {
            return Vec::new();
        }
        let Some((me, by)) = self.stats_of_every_process(id) else {
            return Vec::new();
        };
        by.into_iter()
            .filter(|(pid, st)| *pid != me && st.hits > 0)
            .map(|(pid, st)| (pid, st.hits))
            .collect()
    }

    /// The process probe `id` was placed in, and its counts in every
    /// process that hit it.
    fn stats_of_every_process(&self, id: ProbeId) -> Option<(i32, Vec<(i32, ProbeStats)>)> {
        if let Some(w) = self.watch_probe_stats(id) {
            let me = w.first().map_or(0, |x| x.0);
            return Some((me, w));
        }
        let ri = (id.0 >> TARGET_SHIFT) as usize;
        let root = self.slots.get(ri)?;
        let me = root.pid.unwrap_or(0);
        let mut by = agent::ByProcess(vec![(me, ProbeStats::default())]);
        let mut found = false;
        for m in root.mechs.all_ref() {
            found |= m.stats(&root.engine, id, me, &mut by);
        }
        // The agent counts for both of its mechanisms (and for a probe
        // handed from them to the trap, until then).
        let counted = root.agent.counters.contains_key(&id);
        if !found && !counted {
            return None;
        }
        for s in self.slots.iter().filter(|s| s.root == Some(ri)) {
            for (cid, _) in s.origin.iter().filter(|(_, r)| **r == id) {
                if let Some(c) = s.engine.stats(*cid) {
                    by.add_stats(s.pid.unwrap_or(0), &c);
                }
            }
        }
        root.agent.add_counts(id, me, &mut by);
        Some((me, by.0))
    }

    /// How hits at this probe's address are executed (trap probes: "boosted",
    /// "emulated", "stepped"…; a probe another mechanism handed to the
    /// trap too).
    pub fn execution_of(&self, id: ProbeId) -> Option<&'static str> {
        let slot = self.slots.get((id.0 >> TARGET_SHIFT) as usize)?;
        let id = slot.mechs.trap.handed.get(&id).copied().unwrap_or(id);
        let e = &slot.engine;
        e.execution_of(e.probes.get(&id)?.addr)
    }

    /// Notices gathered since the last call (exec, fork, a target that died).
    pub fn take_notices(&mut self) -> Vec<String> {
        let mut n: Vec<String> = self
            .slots
            .iter_mut()
            .flat_map(|s| s.inbox.take_notices(&mut s.engine))
            .collect();
        n.append(&mut self.gate_notices);
        n
    }

    /// How a target ended, once it is gone (`Disconnected("detached")`
    /// after a detach).
    pub fn exit_status(&self, t: TargetId) -> Option<ExitStatus> {
        self.slots.get(t.0)?.engine.gone().cloned()
    }

    /// What the drain of a target's events found so far.
    pub fn drain_stats(&self, t: TargetId) -> DrainStats {
        self.slots
            .get(t.0)
            .map(|s| s.drain.stats)
            .unwrap_or_default()
    }

    /// The unsafe probe points of a target: PLT stubs, signal trampolines,
    /// scratch memory.
    pub fn blacklist(&mut self, t: TargetId) -> Result<Vec<crate::BlacklistEntry>, EngineError> {
        let slot = self.slot(t)?;
        let mut v = slot
            .resolver
            .as_ref()
            .map(|r| r.blacklist())
            .unwrap_or_default();
        if let Some(fp) = slot.agent.fast_path() {
            v.extend(fp.pages().into_iter().map(|(a, b)| crate::BlacklistEntry {
                start: RuntimeAddr(a),
                end: RuntimeAddr(b),
                what: "hotprobe's fast-path stubs and trampolines".into(),
            }));
        }
        v.sort_by_key(|b| b.start);
        Ok(v)
    }
}
