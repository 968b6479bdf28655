//! Sites: planning the probed instruction, its out-of-line slot, the
//! return trampoline; adding, arming, enabling and removing probes.

use super::{Engine, Instance, ProbeEntry, ProbeKind, Site};
use crate::handler::{ProbeId, RetProbe};
use crate::held::HeldTarget;
use crate::EngineError;
use hotprobe_target::{ReturnStrategy, RuntimeAddr, TargetError};
use hotprobe_x86::{Execution, ProbePlan, SLOT_SIZE};

impl Engine {
    /// For targets that can single-step any instruction in place (a guest
    /// kernel under a GDB stub): probes on instructions that cannot run out
    /// of line or be emulated (privileged ones such as `cli` or `wrmsr`, far
    /// transfers, `swapgs`, `iretq`) are stepped in place instead of
    /// refused. Instructions that trap or wait whatever runs them (`int3`,
    /// `ud2`, `int n`, `hlt`, `mwait`, RTM, hypervisor calls) stay refused.
    pub fn set_step_unsupported_in_place(&mut self, on: bool) {
        self.step_unsupported_in_place = on;
    }

    /// With [`Engine::set_step_unsupported_in_place`]: a plan that steps the
    /// refused instruction in place, if it is one that may be stepped.
    fn in_place_plan(
        &self,
        code: &[u8],
        addr: u64,
        err: &hotprobe_x86::X86Error,
    ) -> Option<ProbePlan> {
        use hotprobe_x86::iced_x86::Mnemonic as M;
        if !self.step_unsupported_in_place
            || !matches!(err, hotprobe_x86::X86Error::Unsupported { .. })
        {
            return None;
        }
        let instruction = hotprobe_x86::decode(code, addr).ok()?;
        let never = matches!(
            instruction.mnemonic(),
            M::Int3
                | M::Int1
                | M::Int
                | M::Into
                | M::Ud0
                | M::Ud1
                | M::Ud2
                | M::Hlt
                | M::Mwait
                | M::Mwaitx
                | M::Monitor
                | M::Monitorx
                | M::Umwait
                | M::Tpause
                | M::Xbegin
                | M::Xabort
                | M::Xend
                | M::Vmcall
                | M::Vmmcall
                | M::Vmgexit
        );
        if never {
            return None;
        }
        Some(ProbePlan {
            len: instruction.len(),
            execution: Execution::Step(hotprobe_x86::StepFixup::None),
            boostable: false,
            slot: None,
            mnemonic: hotprobe_x86::format_instruction(&instruction),
            rip_relative_target: None,
            instruction,
        })
    }

    /// The original code's address for `rip` in an out-of-line slot (the
    /// probed instruction, or the one after it once it ran), `None`
    /// outside scratch memory or at no such place.
    pub(crate) fn original_of(&self, rip: u64) -> Option<u64> {
        if !self.in_scratch(RuntimeAddr(rip)) {
            return None;
        }
        self.sites
            .iter()
            .find_map(|(addr, s)| hotprobe_x86::slot_to_original(&s.plan, *addr, s.slot?.0, rip))
    }

    fn alloc_slot(
        &mut self,
        target: &mut HeldTarget,
        near: RuntimeAddr,
        len: u64,
    ) -> Result<Option<RuntimeAddr>, TargetError> {
        for (region, used) in &mut self.scratch {
            let dist = region.start.0.abs_diff(near.0);
            if *used + len <= region.len && dist < (1 << 30) {
                let a = RuntimeAddr(region.start.0 + *used);
                *used += len;
                return Ok(Some(a));
            }
        }
        loop {
            match target.alloc_scratch(near, self.scratch_chunk.max(len)) {
                Ok(region) => {
                    self.scratch.push((region, len));
                    return Ok(Some(region.start));
                }
                // A target with only small holes (a guest kernel's text
                // padding): ask for single slots from now on.
                Err(TargetError::NoScratch { .. }) if self.scratch_chunk > len => {
                    self.scratch_chunk = len;
                }
                Err(TargetError::NoScratch { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Plan (and arm) the site at `addr` if it is new.
    pub(super) fn ensure_site(
        &mut self,
        target: &mut HeldTarget,
        addr: RuntimeAddr,
    ) -> Result<(), EngineError> {
        if self.sites.contains_key(&addr.0) {
            return Ok(());
        }
        if self.in_scratch(addr) {
            return Err(EngineError::Refused {
                addr: addr.0,
                reason: "the address is in hotprobe's scratch memory".into(),
            });
        }
        let mut code = [0u8; hotprobe_x86::MAX_INSN_LEN];
        // Read what is there; near the end of a mapping fewer bytes may do.
        let mut n = code.len();
        while n > 0 && target.read_memory(addr, &mut code[..n]).is_err() {
            n -= 1;
        }
        if n == 0 {
            return Err(EngineError::Target(TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: 1,
                target: target.describe(),
            }));
        }
        // Plan against a provisional slot address to learn whether a slot is needed.
        let probe_plan = match hotprobe_x86::plan_probe(&code[..n], addr.0, addr.0) {
            Ok(p) => p,
            Err(e) => {
                self.in_place_plan(&code[..n], addr.0, &e)
                    .ok_or_else(|| EngineError::Refused {
                        addr: addr.0,
                        reason: e.to_string(),
                    })?
            }
        };
        let (plan, slot) = if probe_plan.slot.is_some() {
            match self.alloc_slot(target, addr, SLOT_SIZE as u64)? {
                Some(slot) => {
                    let plan =
                        hotprobe_x86::plan_probe(&code[..n], addr.0, slot.0).map_err(|e| {
                            EngineError::Refused {
                                addr: addr.0,
                                reason: e.to_string(),
                            }
                        })?;
                    let image = plan.slot.as_ref().expect("slot plan");
                    target.write_memory(slot, &image.bytes)?;
                    (plan, Some(slot))
                }
                None => (probe_plan, None),
            }
        } else {
            (probe_plan, None)
        };
        target.insert_breakpoint(addr)?;
        self.sites.insert(
            addr.0,
            Site {
                plan,
                slot,
                probes: Vec::new(),
                return_refs: 0,
                armed: true,
            },
        );
        Ok(())
    }

    /// Add a probe at `addr` (an engine driven on its own: in a session,
    /// add probes through the session, which numbers them).
    pub fn add_probe(
        &mut self,
        target: &mut HeldTarget,
        addr: RuntimeAddr,
        probe: crate::Probe,
    ) -> Result<ProbeId, EngineError> {
        self.with_own_id(addr, |e, id| e.add_probe_as(target, id, addr, probe))
    }

    /// Add a probe at `addr` under id `id` (the session's).
    pub(crate) fn add_probe_as(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        addr: RuntimeAddr,
        probe: crate::Probe,
    ) -> Result<ProbeId, EngineError> {
        self.check_alive(target)?;
        self.ensure_site(target, addr)?;
        self.sites.get_mut(&addr.0).expect("site").probes.push(id);
        self.probes.insert(
            id,
            ProbeEntry {
                addr,
                kind: ProbeKind::Plain {
                    pre: probe.pre,
                    post: probe.post,
                },
                enabled: true,
                hits: 0,
                nmissed: 0,
                returns: 0,
                abandoned: 0,
                dropped: false,
                internal: false,
            },
        );
        Ok(id)
    }

    /// Add a return probe on the function entered at `addr` (an engine
    /// driven on its own, as [`Engine::add_probe`]).
    pub fn add_retprobe(
        &mut self,
        target: &mut HeldTarget,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        self.with_own_id(addr, |e, id| e.add_retprobe_as(target, id, addr, rp))
    }

    /// Add a return probe on the function entered at `addr` under id `id`
    /// (the session's).
    pub(crate) fn add_retprobe_as(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        self.check_alive(target)?;
        if rp.maxactive == 0 {
            return Err(EngineError::Refused {
                addr: addr.0,
                reason: "maxactive must be at least 1".into(),
            });
        }
        self.ensure_trampoline(target, addr)?;
        self.ensure_site(target, addr)?;
        self.sites.get_mut(&addr.0).expect("site").probes.push(id);
        self.probes.insert(
            id,
            ProbeEntry {
                addr,
                kind: ProbeKind::Ret {
                    entry: rp.entry,
                    ret: rp.ret,
                    maxactive: rp.maxactive,
                    live: 0,
                },
                enabled: true,
                hits: 0,
                nmissed: 0,
                returns: 0,
                abandoned: 0,
                dropped: false,
                internal: false,
            },
        );
        Ok(id)
    }

    /// The return trampoline (targets with [`ReturnStrategy::Trampoline`]),
    /// allocated near `addr` on first use.
    fn ensure_trampoline(
        &mut self,
        target: &mut HeldTarget,
        addr: RuntimeAddr,
    ) -> Result<(), EngineError> {
        if self.strategy == ReturnStrategy::Trampoline && self.trampoline.is_none() {
            let Some(t) = self.alloc_slot(target, addr, 16)? else {
                return Err(EngineError::Refused {
                    addr: addr.0,
                    reason: "return probes need scratch memory for their trampoline, and this target has none".into(),
                });
            };
            target.write_memory(t, &[0x90; 16])?;
            target.insert_breakpoint(t)?;
            self.trampoline = Some(t);
        }
        Ok(())
    }

    /// Whether probe `id` is a return probe.
    pub(crate) fn is_return_probe(&self, id: ProbeId) -> bool {
        self.probes
            .get(&id)
            .is_some_and(|p| matches!(p.kind, ProbeKind::Ret { .. }))
    }

    /// A probe (or, with `rp`, a return probe) that is not armed anywhere
    /// yet: its module is not loaded. [`Engine::arm_at`] places it. Its
    /// id `id` is the session's.
    pub(crate) fn add_unarmed(
        &mut self,
        id: ProbeId,
        probe: Option<crate::Probe>,
        rp: Option<RetProbe>,
    ) -> ProbeId {
        let kind = match (probe, rp) {
            (_, Some(rp)) => ProbeKind::Ret {
                entry: rp.entry,
                ret: rp.ret,
                maxactive: rp.maxactive.max(1),
                live: 0,
            },
            (p, None) => {
                let p = p.unwrap_or_default();
                ProbeKind::Plain {
                    pre: p.pre,
                    post: p.post,
                }
            }
        };
        self.probes.insert(
            id,
            ProbeEntry {
                addr: RuntimeAddr(0),
                kind,
                enabled: false,
                hits: 0,
                nmissed: 0,
                returns: 0,
                abandoned: 0,
                dropped: true,
                internal: false,
            },
        );
        id
    }

    /// Whether any breakpoint of this engine is in the target.
    pub(crate) fn has_armed_sites(&self) -> bool {
        self.sites.values().any(|s| s.armed)
    }

    /// Arms probe `id` (unarmed: pending, or its library was unmapped) at
    /// `addr`; its counts go on from where they were.
    pub(crate) fn arm_at(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
        addr: RuntimeAddr,
    ) -> Result<(), EngineError> {
        self.check_alive(target)?;
        let is_ret = matches!(
            self.probes
                .get(&id)
                .ok_or(EngineError::NoSuchProbe(id))?
                .kind,
            ProbeKind::Ret { .. }
        );
        if is_ret {
            self.ensure_trampoline(target, addr)?;
        }
        self.ensure_site(target, addr)?;
        self.sites.get_mut(&addr.0).expect("site").probes.push(id);
        let p = self.probes.get_mut(&id).expect("checked above");
        p.addr = addr;
        p.dropped = false;
        p.enabled = true;
        Ok(())
    }

    /// Forgets the sites at `addrs` without writing anything (the memory
    /// was unmapped: a library closed; the session's walk of its code
    /// ledger found them). Their probes stay, unarmed, with their counts,
    /// and can be armed again with [`Engine::arm_at`]; they are returned,
    /// the session's own left out.
    pub(crate) fn forget_sites(&mut self, target: &mut HeldTarget, addrs: &[u64]) -> Vec<ProbeId> {
        let mut dropped = Vec::new();
        for &a in addrs {
            self.unwind_hooks.remove(&a);
            let Some(site) = self.sites.remove(&a) else {
                continue;
            };
            for id in site.probes {
                if let Some(p) = self.probes.get_mut(&id) {
                    p.dropped = true;
                    p.enabled = false;
                    if let ProbeKind::Ret { live, .. } = &mut p.kind {
                        *live = 0;
                    }
                    if !p.internal {
                        dropped.push(id);
                    }
                }
            }
            if site.armed {
                target.forget_breakpoint(RuntimeAddr(a));
            }
        }
        let gone = |i: &Instance| {
            let a = self.probes.get(&i.probe).map_or(0, |p| p.addr.0);
            addrs.binary_search(&a).is_ok()
        };
        for stack in self.shadow.values_mut() {
            stack.retain(|i| !gone(i));
        }
        for g in self.graveyard.values_mut() {
            g.retain(|i| !gone(i));
        }
        dropped
    }

    /// Enable or disable a probe; a site with no enabled probe keeps its
    /// breakpoint (hits are passed straight through).
    pub fn set_enabled(&mut self, id: ProbeId, enabled: bool) -> Result<(), EngineError> {
        let p = self
            .probes
            .get_mut(&id)
            .ok_or(EngineError::NoSuchProbe(id))?;
        p.enabled = enabled && !p.dropped;
        Ok(())
    }

    /// Remove a probe; the site's breakpoint goes when its last probe does.
    pub fn remove_probe(
        &mut self,
        target: &mut HeldTarget,
        id: ProbeId,
    ) -> Result<(), EngineError> {
        let p = self
            .probes
            .remove(&id)
            .ok_or(EngineError::NoSuchProbe(id))?;
        if let Some(site) = self.sites.get_mut(&p.addr.0) {
            site.probes.retain(|x| *x != id);
            if site.probes.is_empty()
                && site.return_refs == 0
                && !self.unwind_hooks.contains_key(&p.addr.0)
                && self.gone.is_none()
            {
                let busy = self.stepping.values().flatten().any(|s| s.site == p.addr.0);
                if !busy {
                    if site.armed {
                        target.remove_breakpoint(p.addr)?;
                    }
                    self.sites.remove(&p.addr.0);
                }
            }
        }
        Ok(())
    }

    /// How a hit at `addr` would be executed: "boosted", "emulated", "stepped" or "stepped in place".
    pub fn execution_of(&self, addr: RuntimeAddr) -> Option<&'static str> {
        let site = self.sites.get(&addr.0)?;
        Some(match (&site.plan.execution, site.slot) {
            (Execution::Emulate(_), _) => "emulated",
            (_, None) => "stepped in place",
            (Execution::Boost, Some(_)) => "boosted",
            (Execution::Step(_), Some(_)) => "stepped",
        })
    }
}
