//! A breakpoint hit: handlers, then the probed instruction boosted,
//! emulated or single-stepped (and the step's fixups).

use super::{Engine, ProbeKind, StepState};
use crate::handler::{EntryInfo, HitContext, HitKind, HitRegs, ProbeId};
use crate::held::HeldTarget;
use crate::EngineError;
use hotprobe_target::{Registers, ResumeMode, ReturnStrategy, RuntimeAddr, ThreadId};
use hotprobe_x86::{Emulation, Execution};
use std::cell::RefCell;

impl Engine {
    /// Runs one handler of probe `id`; an error if the registers it asked
    /// for could not be fetched.
    fn run_handler(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        which: HitKind,
        thread: ThreadId,
        regs: &mut HitRegs,
        entry: Option<EntryInfo>,
    ) -> Result<(), EngineError> {
        let Some(p) = self.probes.get_mut(&id) else {
            return Ok(());
        };
        let addr = p.addr;
        let slot = match (&mut p.kind, which) {
            (ProbeKind::Plain { pre, .. }, HitKind::Pre) => pre.take(),
            (ProbeKind::Plain { post, .. }, HitKind::Post) => post.take(),
            (ProbeKind::Ret { entry, .. }, HitKind::Entry) => entry.take(),
            (ProbeKind::Ret { ret, .. }, HitKind::Return) => ret.take(),
            _ => None,
        };
        let Some(mut f) = slot else { return Ok(()) };
        // The stack walked at this entry, for this probe's handler alone.
        let stack = match (self.walked, which) {
            (Some((p, t, s)), HitKind::Pre | HitKind::Entry) if p == id && t == thread => {
                self.walked = None;
                Some(s)
            }
            _ => None,
        };
        let fetch_error = {
            let mut ctx = HitContext {
                target: RefCell::new(target.as_target()),
                thread,
                regs,
                probe: id,
                addr,
                kind: which,
                stop: &mut self.stop,
                symbolizer: self.symbolizer.as_deref(),
                entry,
                fetch_error: RefCell::new(None),
                watch: None,
                stack,
            };
            f(&mut ctx);
            ctx.fetch_error.into_inner()
        };
        if let Some(p) = self.probes.get_mut(&id) {
            match (&mut p.kind, which) {
                (ProbeKind::Plain { pre, .. }, HitKind::Pre) => *pre = Some(f),
                (ProbeKind::Plain { post, .. }, HitKind::Post) => *post = Some(f),
                (ProbeKind::Ret { entry, .. }, HitKind::Entry) => *entry = Some(f),
                (ProbeKind::Ret { ret, .. }, HitKind::Return) => *ret = Some(f),
                _ => {}
            }
        }
        match fetch_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Runs one handler on a complete register set.
    pub(super) fn run_handler_on(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        which: HitKind,
        thread: ThreadId,
        regs: &mut Registers,
        entry: Option<EntryInfo>,
    ) -> Result<(), EngineError> {
        let mut hr = HitRegs::complete(*regs);
        let r = self.run_handler(target, id, which, thread, &mut hr, entry);
        if let Some(full) = hr.fetched() {
            *regs = *full;
        }
        r
    }

    pub(super) fn on_breakpoint(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        addr: RuntimeAddr,
        regs: Registers,
    ) -> Result<(), EngineError> {
        // A target reporting `rip` alone: fetch the rest only if needed.
        let mut hr = if self.partial_regs {
            HitRegs::rip_only(regs.rip)
        } else {
            HitRegs::complete(regs)
        };
        if Some(addr) == self.trampoline {
            let regs = *hr.fetch(target.as_target(), thread)?;
            return self.on_trampoline(target, thread, regs);
        }
        if self.strategy == ReturnStrategy::BreakpointAtReturn
            && self.return_waiters.contains_key(&addr.0)
        {
            let mut regs = *hr.fetch(target.as_target(), thread)?;
            self.match_return_breakpoint(target, thread, addr, &mut regs)?;
            hr = HitRegs::complete(regs);
        }
        if let Some(hook) = self.unwind_hooks.get(&addr.0).copied() {
            let regs = *hr.fetch(target.as_target(), thread)?;
            self.on_unwind_hook(target, thread, hook, &regs)?;
        }
        let Some(site) = self.sites.get(&addr.0) else {
            // Not ours any more (removed meanwhile): run on.
            if let Some(regs) = hr.fetched() {
                target.set_registers(thread, regs)?;
            }
            target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        };
        let probes = site.probes.clone();
        let reentry = self.stepping.get(&thread).is_some_and(|s| !s.is_empty());
        let mut needs_post = false;
        let followed = self.shadow.get(&thread).is_some_and(|s| !s.is_empty());
        if followed
            && !reentry
            && self.strategy == ReturnStrategy::Trampoline
            && probes.iter().any(|id| {
                self.probes
                    .get(id)
                    .is_some_and(|p| p.enabled && matches!(p.kind, ProbeKind::Ret { .. }))
            })
        {
            // A call is about to put its return address at rsp: followed
            // frames whose slot is at or below it are gone (longjmp).
            let rsp = hr.fetch(target.as_target(), thread)?.rsp;
            self.drop_dead(thread, rsp);
        }
        for id in &probes {
            let Some(p) = self.probes.get_mut(id) else {
                continue;
            };
            if !p.enabled {
                continue;
            }
            if reentry {
                // Kprobes' re-entry: count it, run no handler, execute the instruction.
                p.nmissed += 1;
                continue;
            }
            self.count_hit(target, *id, thread);
            self.walked = None;
            if self.stack_hook.as_ref().is_some_and(|h| h.has_probe(*id)) {
                self.walk_stack(target, *id, thread, &mut hr)?;
            }
            let Some(p) = self.probes.get(id) else {
                continue;
            };
            match &p.kind {
                ProbeKind::Plain { post, .. } => {
                    needs_post |= post.is_some();
                    self.run_handler(target, *id, HitKind::Pre, thread, &mut hr, None)?;
                }
                ProbeKind::Ret { .. } => {
                    let mut regs = *hr.fetch(target.as_target(), thread)?;
                    self.ret_entry(target, *id, thread, &mut regs)?;
                    hr = HitRegs::complete(regs);
                }
            }
        }
        if hr.rip() != addr.0 {
            // A handler redirected the thread: skip the instruction (Kprobes' pre returning 1).
            if let Some(regs) = hr.fetched() {
                target.set_registers(thread, regs)?;
            }
            target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        }
        let site = self.sites.get(&addr.0).expect("site still there");
        match (site.plan.execution, site.slot) {
            (Execution::Emulate(e @ (Emulation::Nop | Emulation::JmpRel { .. })), _)
                if !needs_post && hr.fetched().is_none() =>
            {
                // Only rip moves: no need for the other registers.
                let next = match e {
                    Emulation::JmpRel { target } => target,
                    _ => addr.0.wrapping_add(site.plan.len as u64),
                };
                target.set_pc(thread, next)?;
                target.resume(thread, ResumeMode::Continue)?;
            }
            (Execution::Emulate(e), _) => {
                let len = site.plan.len;
                let regs = hr.fetch(target.as_target(), thread)?;
                let mut read_stack = |a: u64| -> Result<u64, hotprobe_x86::X86Error> {
                    let mut b = [0u8; 8];
                    target.read_memory(RuntimeAddr(a), &mut b).map_err(|e| {
                        hotprobe_x86::X86Error::StackRead {
                            addr: a,
                            reason: e.to_string(),
                        }
                    })?;
                    Ok(u64::from_le_bytes(b))
                };
                let write =
                    hotprobe_x86::emulate(&e, addr.0, len, regs, &mut read_stack).map_err(|e| {
                        EngineError::Refused {
                            addr: addr.0,
                            reason: e.to_string(),
                        }
                    })?;
                if let Some(w) = write {
                    target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
                }
                if needs_post {
                    self.run_posts(target, &probes, thread, &mut hr)?;
                }
                let regs = hr.fetch(target.as_target(), thread)?;
                let regs = *regs;
                target.set_registers(thread, &regs)?;
                target.resume(thread, ResumeMode::Continue)?;
            }
            (Execution::Boost, Some(slot)) if !needs_post => {
                self.move_to(target, thread, &mut hr, slot.0)?;
                target.resume(thread, ResumeMode::Continue)?;
            }
            (_, Some(slot)) => {
                self.move_to(target, thread, &mut hr, slot.0)?;
                self.stepping.entry(thread).or_default().push(StepState {
                    site: addr.0,
                    in_place: false,
                    run_post: !reentry,
                });
                target.resume(thread, ResumeMode::Step)?;
            }
            (_, None) => {
                // No scratch memory: lift the breakpoint and step in place.
                target.remove_breakpoint(addr)?;
                self.sites.get_mut(&addr.0).expect("site").armed = false;
                if let Some(regs) = hr.fetched() {
                    target.set_registers(thread, regs)?;
                }
                self.stepping.entry(thread).or_default().push(StepState {
                    site: addr.0,
                    in_place: true,
                    run_post: !reentry,
                });
                target.resume(thread, ResumeMode::Step)?;
            }
        }
        Ok(())
    }

    /// `--stacks` on a trap probe (issue 24): the stack at this entry hit,
    /// walked in the tracer ([`crate::stacks::TrapStacks::on_hit`]); a
    /// return slot holding the trap return trampoline gives the real
    /// address its followed call saved. Its id is kept for the probe's
    /// handler, which runs next (a recorded entry carries it).
    fn walk_stack(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        thread: ThreadId,
        hr: &mut HitRegs,
    ) -> Result<(), EngineError> {
        let regs = *hr.fetch(target.as_target(), thread)?;
        let Some(hook) = &self.stack_hook else {
            return Ok(());
        };
        let trampoline = self.trampoline.map(|t| t.0);
        let shadow = self.shadow.get(&thread);
        let fix = |slot: u64, word: u64| -> u64 {
            if Some(word) != trampoline {
                return word;
            }
            shadow
                .and_then(|s| s.iter().rev().find(|i| i.slot == slot && i.swapped))
                .map_or(word, |i| i.return_addr)
        };
        self.walked = hook
            .on_hit(target.as_target(), id, &regs, &fix)
            .map(|s| (id, thread, s));
        Ok(())
    }

    /// Points the thread at `pc`: the whole register set if a handler saw
    /// (and may have changed) it, else `rip` alone.
    fn move_to(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        hr: &mut HitRegs,
        pc: u64,
    ) -> Result<(), EngineError> {
        match hr.fetched() {
            Some(regs) => {
                let mut regs = *regs;
                regs.rip = pc;
                target.set_registers(thread, &regs)?;
            }
            None => target.set_pc(thread, pc)?,
        }
        Ok(())
    }

    fn run_posts(
        &mut self,
        target: &mut HeldTarget,
        probes: &[ProbeId],
        thread: ThreadId,
        regs: &mut HitRegs,
    ) -> Result<(), EngineError> {
        for id in probes {
            if self.probes.get(id).is_some_and(|p| p.enabled) {
                self.run_handler(target, *id, HitKind::Post, thread, regs, None)?;
            }
        }
        Ok(())
    }

    pub(super) fn on_stepped(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        stepped: Registers,
    ) -> Result<(), EngineError> {
        let mut regs = stepped;
        let Some(st) = self.stepping.get_mut(&thread).and_then(|s| s.pop()) else {
            // A step we did not ask for: run on.
            target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        };
        let Some(site) = self.sites.get_mut(&st.site) else {
            target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        };
        if st.in_place {
            if regs.rip == st.site {
                // Not executed yet (a stop taken before the instruction ran,
                // as QEMU TCG sometimes reports a step, or a rep
                // iteration): step again, or re-arming the breakpoint would
                // report this execution a second time.
                self.stepping.entry(thread).or_default().push(st);
                target.resume(thread, ResumeMode::Step)?;
                return Ok(());
            }
            if !site.armed {
                site.armed = true;
                target.insert_breakpoint(RuntimeAddr(st.site))?;
            }
        } else if let Some(slot) = site.slot {
            if regs.rip == slot.0 {
                // The instruction did not complete (a rep iteration): step again.
                self.stepping.entry(thread).or_default().push(st);
                target.resume(thread, ResumeMode::Step)?;
                return Ok(());
            }
            if let Some(w) = hotprobe_x86::fixup_after_step(&site.plan, st.site, slot.0, &mut regs)
            {
                target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
            }
        }
        if st.run_post {
            let probes = site.probes.clone();
            let mut hr = HitRegs::complete(regs);
            self.run_posts(target, &probes, thread, &mut hr)?;
            regs = *hr.fetch(target.as_target(), thread)?;
        }
        let only_rip_moved = Registers {
            rip: stepped.rip,
            ..regs
        } == stepped;
        if self.partial_regs && only_rip_moved {
            // Only rip moved (back from the slot): the target may send it
            // with the resume.
            target.set_pc(thread, regs.rip)?;
        } else {
            target.set_registers(thread, &regs)?;
        }
        target.resume(thread, ResumeMode::Continue)?;
        Ok(())
    }
}
