//! The unwinder's internal breakpoints (see [`crate::nonlocal`]): the real
//! return addresses back before an unwinder walks the stack, the trampoline
//! again for the frames that survive it.

use super::{Engine, Instance, Notice};
use crate::held::HeldTarget;
use crate::nonlocal::UnwindHook;
use crate::EngineError;
use hotprobe_target::{Registers, RuntimeAddr, ThreadId};

impl Engine {
    /// Whether return probes made a trampoline in this target (their
    /// frames then need the unwinder's hooks, see [`crate::nonlocal`]).
    pub(crate) fn has_trampoline(&self) -> bool {
        self.trampoline.is_some()
    }

    /// Whether the internal unwinder breakpoints differ from `hooks`.
    pub(crate) fn unwind_hooks_differ(&self, hooks: &[(RuntimeAddr, UnwindHook)]) -> bool {
        hooks.len() != self.unwind_hooks.len()
            || hooks
                .iter()
                .any(|(a, h)| self.unwind_hooks.get(&a.0) != Some(h))
    }

    /// Makes the internal unwinder breakpoints those of `hooks`: new ones
    /// are placed (a site of their own, or shared with probes at the same
    /// address), vanished ones (their library was unmapped) forgotten.
    /// They are no probes: no ids, no counts; they go at detach and exec.
    /// A hook that cannot be placed is left out with a notice.
    pub(crate) fn set_unwind_hooks(
        &mut self,
        target: &mut HeldTarget,
        hooks: &[(RuntimeAddr, UnwindHook)],
    ) -> Result<(), EngineError> {
        self.check_alive(target)?;
        let gone: Vec<u64> = self
            .unwind_hooks
            .keys()
            .copied()
            .filter(|a| !hooks.iter().any(|(h, _)| h.0 == *a))
            .collect();
        for a in gone {
            self.unwind_hooks.remove(&a);
            let unused = self
                .sites
                .get(&a)
                .is_some_and(|s| s.probes.is_empty() && s.return_refs == 0);
            let busy = self.stepping.values().flatten().any(|s| s.site == a);
            if unused && !busy {
                let site = self.sites.remove(&a).expect("checked");
                if site.armed && target.remove_breakpoint(RuntimeAddr(a)).is_err() {
                    target.forget_breakpoint(RuntimeAddr(a));
                }
            }
        }
        for (a, h) in hooks {
            if let Err(e) = self.ensure_site(target, *a) {
                self.notice(Notice::NoUnwindHook {
                    target: target.describe(),
                    addr: *a,
                    error: e.to_string(),
                });
                continue;
            }
            self.unwind_hooks.insert(a.0, *h);
        }
        Ok(())
    }

    /// An internal breakpoint in the unwinder was hit by `thread`.
    ///
    /// - [`UnwindHook::Enter`] (`_Unwind_RaiseException` and the other
    ///   entry points): the unwinder is about to walk this thread's stack
    ///   from here up, reading return addresses: every followed frame above
    ///   gets its real return address back before it runs (the trampoline
    ///   has no unwind info). The instances stay, marked not swapped.
    /// - [`UnwindHook::Landing`] (`_Unwind_SetIP`, called by the
    ///   personality routine just before the unwinder installs a landing
    ///   pad — a `catch`, a cleanup, `catch_unwind` — in the frame the
    ///   context describes; the context's CFA is that frame's stack
    ///   pointer, the CFA of the callee unwound last): the frames below
    ///   that one are unwound (abandoned: no `ret` handler runs, not counted as
    ///   missed); the frames from it up survive and get the trampoline
    ///   again, so their returns are still counted. A cleanup ends in
    ///   `_Unwind_Resume`: its `Enter` puts them back again.
    pub(super) fn on_unwind_hook(
        &mut self,
        target: &mut HeldTarget,
        thread: ThreadId,
        hook: UnwindHook,
        regs: &Registers,
    ) -> Result<(), EngineError> {
        let Some(t) = self.trampoline else {
            return Ok(());
        };
        match hook {
            UnwindHook::Enter => {
                // A slot that no longer holds the trampoline was reused by
                // another call: its frame is gone.
                let mut dead = Vec::new();
                if let Some(stack) = self.shadow.get_mut(&thread) {
                    let mut b = [0u8; 8];
                    for (k, inst) in stack.iter_mut().enumerate().rev() {
                        if !inst.swapped || inst.slot <= regs.rsp {
                            continue;
                        }
                        let slot = RuntimeAddr(inst.slot);
                        let ours = target.read_memory(slot, &mut b).is_ok()
                            && u64::from_le_bytes(b) == t.0;
                        if ours {
                            target.write_memory(slot, &inst.return_addr.to_le_bytes())?;
                            inst.swapped = false;
                        } else {
                            dead.push(k);
                        }
                    }
                    // Indices in decreasing order: removal keeps the others.
                    let dead: Vec<Instance> = dead.into_iter().map(|k| stack.remove(k)).collect();
                    for inst in dead {
                        self.abandon(thread, inst, false);
                    }
                }
                if let Some(g) = self.graveyard.get_mut(&thread) {
                    for inst in g.iter().rev().filter(|i| i.slot > regs.rsp) {
                        let mut b = [0u8; 8];
                        let slot = RuntimeAddr(inst.slot);
                        if target.read_memory(slot, &mut b).is_ok() && u64::from_le_bytes(b) == t.0
                        {
                            target.write_memory(slot, &inst.return_addr.to_le_bytes())?;
                        }
                    }
                    g.retain(|i| i.slot <= regs.rsp);
                }
            }
            UnwindHook::Landing { cfa_offset } => {
                let Some(stack) = self.shadow.get_mut(&thread) else {
                    return Ok(());
                };
                if stack.iter().all(|i| i.swapped) {
                    return Ok(());
                }
                let mut b = [0u8; 8];
                target.read_memory(
                    RuntimeAddr(regs.rdi.wrapping_add(cfa_offset as u64)),
                    &mut b,
                )?;
                // The context's CFA is the stack pointer of the landing
                // frame (its callee's CFA): the return-address slots of the
                // frames below it lie under it.
                let keep_from = u64::from_le_bytes(b);
                let mut dead = Vec::new();
                let mut kept = Vec::with_capacity(stack.len());
                for mut inst in stack.drain(..) {
                    if inst.swapped {
                        kept.push(inst);
                        continue;
                    }
                    let slot = RuntimeAddr(inst.slot);
                    let intact = inst.slot >= keep_from
                        && target.read_memory(slot, &mut b).is_ok()
                        && u64::from_le_bytes(b) == inst.return_addr;
                    if intact && target.write_memory(slot, &t.0.to_le_bytes()).is_ok() {
                        inst.swapped = true;
                        kept.push(inst);
                    } else {
                        dead.push(inst);
                    }
                }
                *stack = kept;
                for inst in dead {
                    self.abandon(thread, inst, false);
                }
            }
        }
        Ok(())
    }
}
