//! Detach: threads out of slots, return addresses back, breakpoints gone.

use super::{Engine, Notice};
use crate::held::HeldTarget;
use crate::EngineError;
use hotprobe_target::{ExitStatus, RuntimeAddr, TargetEvent, ThreadId};

impl Engine {
    /// Detach: no handler runs any more; threads are moved out of slots,
    /// live return addresses put back, breakpoints and scratch removed.
    /// [`Engine::prepare_detach`], then [`Engine::finish_detach`].
    pub fn detach(&mut self, target: &mut HeldTarget) -> Result<(), EngineError> {
        if self.prepare_detach(target)? {
            self.finish_detach(target)?;
        }
        Ok(())
    }

    /// Detach, first step: no handler runs any more, every thread stopped
    /// (and left stopped) out of the scratch slots, the live return
    /// addresses put back. The breakpoints stay (tracked by the target):
    /// a session takes every code byte out in one walk of its ledger
    /// before [`Engine::finish_detach`]. False when the target is gone
    /// (before or meanwhile): nothing to take out.
    pub fn prepare_detach(&mut self, target: &mut HeldTarget) -> Result<bool, EngineError> {
        if self.gone.is_some() {
            return Ok(false);
        }
        for p in self.probes.values_mut() {
            p.enabled = false;
        }
        target.stop_all()?;
        // Finish what the target reported meanwhile, without handlers.
        loop {
            match target.wait(Some(std::time::Duration::ZERO))? {
                TargetEvent::Timeout => break,
                TargetEvent::Stepped { thread, mut regs } => {
                    if let Some(st) = self.stepping.get_mut(&thread).and_then(|s| s.pop()) {
                        if let Some(site) = self.sites.get(&st.site) {
                            if let Some(slot) = site.slot {
                                if let Some(w) = hotprobe_x86::fixup_after_step(
                                    &site.plan, st.site, slot.0, &mut regs,
                                ) {
                                    target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
                                }
                            }
                        }
                        target.set_registers(thread, &regs)?;
                    }
                }
                TargetEvent::Breakpoint {
                    thread,
                    addr,
                    mut regs,
                } if Some(addr) == self.trampoline => {
                    if self.partial_regs {
                        regs = target.registers(thread)?;
                    }
                    if let Some(ra) = self.popped_return(thread, regs.rsp) {
                        regs.rip = ra;
                        target.set_registers(thread, &regs)?;
                    }
                }
                TargetEvent::Exited(st) => {
                    self.gone = Some(st);
                    return Ok(false);
                }
                // A breakpoint hit: the target rewinds it at detach.
                _ => {}
            }
        }
        // Threads inside a slot go back to the original code.
        for thread in target.threads() {
            let Ok(mut regs) = target.registers(thread) else {
                continue;
            };
            if !self.in_scratch(RuntimeAddr(regs.rip)) {
                continue;
            }
            // Stopped on the return trampoline's int3 before running it
            // (it had just returned there): it goes to the real return
            // address, as at the trampoline's stop above. Left there, it
            // took the int3 after the detach and died of SIGTRAP
            // (trap_call_stacks' attached case, 1 run in 5).
            let returned = (Some(RuntimeAddr(regs.rip)) == self.trampoline)
                .then(|| self.popped_return(thread, regs.rsp))
                .flatten();
            let mapped = returned.or_else(|| {
                self.sites.iter().find_map(|(addr, s)| {
                    let slot = s.slot?;
                    hotprobe_x86::slot_to_original(&s.plan, *addr, slot.0, regs.rip)
                })
            });
            match mapped {
                Some(orig) => {
                    regs.rip = orig;
                    target.set_registers(thread, &regs)?;
                }
                None => self.notice(Notice::LeftInScratch {
                    thread,
                    rip: regs.rip,
                }),
            }
        }
        // Put back every return address still swapped for the trampoline.
        if let Some(t) = self.trampoline {
            // Frames dropped as dead that may be alive after all (their
            // slot still holds the trampoline), unless a live one is there.
            let live: std::collections::HashSet<u64> =
                self.shadow.values().flatten().map(|i| i.slot).collect();
            let graves = self.graveyard.values().flatten();
            let graves = graves.filter(|i| !live.contains(&i.slot));
            for inst in graves.chain(self.shadow.values().flatten()) {
                let mut b = [0u8; 8];
                if target.read_memory(RuntimeAddr(inst.slot), &mut b).is_ok()
                    && u64::from_le_bytes(b) == t.0
                {
                    target.write_memory(RuntimeAddr(inst.slot), &inst.return_addr.to_le_bytes())?;
                }
            }
        }
        self.shadow.clear();
        self.graveyard.clear();
        self.unwind_hooks.clear();
        Ok(true)
    }

    /// The real return address of the hooked return `thread` just took
    /// into the trampoline (its stack pointer `rsp`, past the popped
    /// slot), taken off its shadow stack.
    fn popped_return(&mut self, thread: ThreadId, rsp: u64) -> Option<u64> {
        let popped = rsp.wrapping_sub(8);
        let live = self.shadow.get_mut(&thread).and_then(|stack| {
            let pos = stack.iter().rposition(|i| i.slot == popped)?;
            let ra = stack[pos].return_addr;
            stack.truncate(pos);
            Some(ra)
        });
        live.or_else(|| {
            self.find_elsewhere(thread, popped)
                .map(|(i, _)| i.return_addr)
        })
    }

    /// Detach, last step, after [`Engine::prepare_detach`]: the target
    /// takes out the breakpoints still in (every one, unless a session
    /// took them out already), frees its scratch memory and lets the
    /// threads go.
    pub fn finish_detach(&mut self, target: &mut HeldTarget) -> Result<(), EngineError> {
        if self.gone.is_some() {
            return Ok(());
        }
        self.sites.clear();
        target.detach()?;
        self.gone = Some(ExitStatus::Disconnected("detached".into()));
        Ok(())
    }
}
