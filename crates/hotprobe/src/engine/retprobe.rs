//! Return probes: instances followed per thread, their returns through the
//! trampoline or a return breakpoint, and frames left without a return.

use super::{Engine, Instance, ProbeEntry, ProbeKind, GRAVEYARD};
use crate::handler::{EntryInfo, HitKind, ProbeId};
use crate::held::HeldTarget;
use crate::EngineError;
use hotprobe_target::{Registers, ResumeMode, ReturnStrategy, RuntimeAddr, TargetError, ThreadId};
use std::time::Instant;

impl Engine {
    /// Kprobes' pre_handler_kretprobe: follow this call if a slot is free.
    pub(super) fn ret_entry(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        thread: ThreadId,
        regs: &mut Registers,
    ) -> Result<(), EngineError> {
        let full = matches!(
            self.probes.get(&id),
            Some(ProbeEntry { kind: ProbeKind::Ret { maxactive, live, .. }, .. }) if live >= maxactive
        );
        if full {
            // Threads that ended (pthread_exit, a forced unwind) still hold
            // their instances until their end is handled: drop them first,
            // so that a miss means as many calls live at once.
            let ended: Vec<ThreadId> = self
                .shadow
                .keys()
                .copied()
                .filter(|&t| t != thread && target.thread_ended(t))
                .collect();
            for t in ended {
                self.drop_thread(t);
            }
        }
        let Some(ProbeEntry {
            kind: ProbeKind::Ret {
                maxactive, live, ..
            },
            nmissed,
            ..
        }) = self.probes.get_mut(&id)
        else {
            return Ok(());
        };
        if *live >= *maxactive {
            *nmissed += 1;
            return Ok(());
        }
        let mut b = [0u8; 8];
        target.read_memory(RuntimeAddr(regs.rsp), &mut b)?;
        let return_addr = u64::from_le_bytes(b);
        let depth = self.shadow.get(&thread).map_or(0, |s| s.len());
        let inst = Instance {
            probe: id,
            slot: regs.rsp,
            return_addr,
            entry: EntryInfo {
                regs: *regs,
                time: Instant::now(),
                depth,
                return_addr,
            },
            swapped: self.strategy == ReturnStrategy::Trampoline,
        };
        match self.strategy {
            ReturnStrategy::Trampoline => {
                let t = self
                    .trampoline
                    .expect("trampoline made with the return probe");
                target.write_memory(RuntimeAddr(regs.rsp), &t.0.to_le_bytes())?;
                self.shadow.entry(thread).or_default().push(inst);
            }
            ReturnStrategy::BreakpointAtReturn => {
                let ra = RuntimeAddr(return_addr);
                if !self.sites.contains_key(&ra.0) {
                    // A breakpoint only for returns: plan it like any site.
                    // Where none can go (the call is followed by an
                    // instruction no breakpoint may replace, such as the
                    // `hlt` or `ud2` after a call that does not return, or
                    // `[rsp]` is no code address), this call's return
                    // cannot be seen: a miss, as beyond `maxactive`, and
                    // the thread runs on.
                    match self.ensure_site(target, ra) {
                        Ok(()) => {}
                        Err(
                            EngineError::Refused { .. }
                            | EngineError::Target(TargetError::Memory { .. }),
                        ) => {
                            if let Some(p) = self.probes.get_mut(&id) {
                                p.nmissed += 1;
                            }
                            return Ok(());
                        }
                        Err(e) => return Err(e),
                    }
                }
                self.sites.get_mut(&ra.0).expect("site").return_refs += 1;
                self.return_waiters.entry(ra.0).or_default().push(inst);
                self.shadow.entry(thread).or_default().push(inst);
            }
        }
        if let Some(ProbeEntry {
            kind: ProbeKind::Ret { live, .. },
            ..
        }) = self.probes.get_mut(&id)
        {
            *live += 1;
        }
        self.run_handler_on(target, id, HitKind::Entry, thread, regs, Some(inst.entry))
    }

    fn finish_instance(
        &mut self,
        target: &mut HeldTarget,
        inst: Instance,
        thread: ThreadId,
        regs: &mut Registers,
    ) -> Result<(), EngineError> {
        // A vfork child's return is its own (its pid's row).
        let vforked = self.count_vfork_return(target, inst.probe, thread);
        if let Some(ProbeEntry {
            kind: ProbeKind::Ret { live, .. },
            returns,
            ..
        }) = self.probes.get_mut(&inst.probe)
        {
            *live = live.saturating_sub(1);
            if !vforked {
                *returns += 1;
            }
        } else {
            return Ok(());
        }
        self.run_handler_on(
            target,
            inst.probe,
            HitKind::Return,
            thread,
            regs,
            Some(inst.entry),
        )
    }

    /// A followed call whose frame was left without a return (see
    /// [`ProbeStats::abandoned`]): it frees its place under `maxactive`.
    /// With `keep`, an instance whose slot still holds the trampoline is
    /// kept in the thread's graveyard, in case the frame was alive after
    /// all (found dead by stack pointer while the thread ran on another
    /// stack: a signal handler on an alternate stack, a coroutine).
    pub(super) fn abandon(&mut self, thread: ThreadId, inst: Instance, keep: bool) {
        if let Some(ProbeEntry {
            kind: ProbeKind::Ret { live, .. },
            abandoned,
            ..
        }) = self.probes.get_mut(&inst.probe)
        {
            *live = live.saturating_sub(1);
            *abandoned += 1;
        }
        if keep && inst.swapped {
            let g = self.graveyard.entry(thread).or_default();
            if g.len() >= GRAVEYARD {
                g.pop_front();
            }
            g.push_back(inst);
        }
    }

    /// Resynchronises `thread`'s shadow stack with its stack pointer: the
    /// followed frames whose return-address slot is at or below `floor`
    /// were left without a return (`longjmp`, `siglongjmp` out of a signal
    /// handler) and are abandoned. Only the newest instances are looked at
    /// (the stack grows down: they are the deepest frames), so the cost is
    /// that of the frames dropped.
    pub(super) fn drop_dead(&mut self, thread: ThreadId, floor: u64) {
        let Some(stack) = self.shadow.get_mut(&thread) else {
            return;
        };
        let mut dead = Vec::new();
        while stack.last().is_some_and(|i| i.slot <= floor) {
            dead.extend(stack.pop());
        }
        for inst in dead {
            self.abandon(thread, inst, true);
        }
    }

    /// A return through the trampoline matching none of the thread's live
    /// instances: an instance abandoned too early (this thread's
    /// graveyard), or one followed on another thread (a coroutine resumed
    /// elsewhere). The flag says it had been abandoned.
    pub(super) fn find_elsewhere(
        &mut self,
        thread: ThreadId,
        popped: u64,
    ) -> Option<(Instance, bool)> {
        if let Some(g) = self.graveyard.get_mut(&thread) {
            if let Some(p) = g.iter().rposition(|i| i.slot == popped) {
                return g.remove(p).map(|i| (i, true));
            }
        }
        for stack in self.shadow.values_mut() {
            if let Some(p) = stack.iter().rposition(|i| i.slot == popped) {
                return Some((stack.remove(p), false));
            }
        }
        for g in self.graveyard.values_mut() {
            if let Some(p) = g.iter().rposition(|i| i.slot == popped) {
                return g.remove(p).map(|i| (i, true));
            }
        }
        None
    }

    /// A return through the trampoline: pop this thread's instance whose
    /// return-address slot was just popped (rsp - 8); instances followed
    /// after it are frames left by longjmp (an unwinder's are dropped at
    /// its hooks) and are abandoned.
    pub(super) fn on_trampoline(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        mut regs: Registers,
    ) -> Result<(), EngineError> {
        let popped_slot = regs.rsp.wrapping_sub(8);
        let stack = self.shadow.entry(thread).or_default();
        let inst = match stack.iter().rposition(|i| i.slot == popped_slot) {
            Some(pos) => {
                let deeper: Vec<Instance> = stack.drain(pos + 1..).collect();
                let inst = stack.pop().expect("found above");
                for d in deeper {
                    self.abandon(thread, d, true);
                }
                inst
            }
            None => match self.find_elsewhere(thread, popped_slot) {
                Some((inst, was_abandoned)) => {
                    if was_abandoned {
                        // It returned after all: a return, not abandoned.
                        if let Some(ProbeEntry {
                            kind: ProbeKind::Ret { live, .. },
                            abandoned,
                            ..
                        }) = self.probes.get_mut(&inst.probe)
                        {
                            *abandoned = abandoned.saturating_sub(1);
                            *live += 1;
                        }
                    }
                    inst
                }
                None => {
                    let why = format!(
                        "returned through the trampoline with rsp {:#x} matching no followed call",
                        regs.rsp
                    );
                    return Err(EngineError::Lost { thread, why });
                }
            },
        };
        regs.rip = inst.return_addr;
        self.finish_instance(target, inst, thread, &mut regs)?;
        target.set_registers(thread, &regs)?;
        target.resume(thread, ResumeMode::Continue)?;
        Ok(())
    }

    /// BreakpointAtReturn: a hit at a return address may close followed calls
    /// whose stack slot was just popped.
    pub(super) fn match_return_breakpoint(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        addr: RuntimeAddr,
        regs: &mut Registers,
    ) -> Result<(), EngineError> {
        let Some(waiters) = self.return_waiters.get_mut(&addr.0) else {
            return Ok(());
        };
        let popped_slot = regs.rsp.wrapping_sub(8);
        let Some(pos) = waiters.iter().position(|i| i.slot == popped_slot) else {
            return Ok(());
        };
        let inst = waiters.remove(pos);
        if waiters.is_empty() {
            self.return_waiters.remove(&addr.0);
        }
        // Drop it (and abandoned frames beneath it) from whichever thread's shadow stack holds it.
        for stack in self.shadow.values_mut() {
            if let Some(p) = stack
                .iter()
                .position(|i| i.slot == inst.slot && i.probe == inst.probe)
            {
                stack.truncate(p);
                break;
            }
        }
        self.finish_instance(target, inst, thread, regs)?;
        let release = {
            let site = self.sites.get_mut(&addr.0).expect("return site");
            site.return_refs -= 1;
            site.return_refs == 0
                && site.probes.is_empty()
                && !self.unwind_hooks.contains_key(&addr.0)
        };
        if release {
            let site = self.sites.remove(&addr.0).expect("site");
            if site.armed {
                target.remove_breakpoint(addr)?;
            }
            // Nothing else to run at this address: resume in place.
            target.set_registers(thread, regs)?;
        }
        Ok(())
    }
}
