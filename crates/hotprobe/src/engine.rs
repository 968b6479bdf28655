//! The probe engine for one target: the probe table, out-of-line slots,
//! boosting, emulation, single-step fixups, return-probe instances, and the
//! handling of every [`TargetEvent`]. Written once for any [`Target`].

use crate::handler::{EntryInfo, Handler, HitContext, HitKind, HitRegs, ProbeId, RetProbe};
use crate::held::HeldTarget;
use crate::nonlocal::UnwindHook;
use crate::EngineError;
use hotprobe_resolve::Symbolizer;
use hotprobe_target::{
    ExitStatus, Registers, ResumeMode, ReturnStrategy, RuntimeAddr, ScratchRegion, Target,
    TargetError, TargetEvent, ThreadId,
};
use hotprobe_x86::{Emulation, Execution, ProbePlan, SLOT_SIZE};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

/// Size of each scratch region asked of the target (2048 slots).
const SCRATCH_CHUNK: u64 = 64 * 1024;

/// Dropped return instances kept per thread (see `Engine::graveyard`).
const GRAVEYARD: usize = 256;

/// A hasher for addresses: one multiply (Fibonacci hashing), so a hit finds
/// its site in O(1) without SipHash's cost.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
}

pub(crate) type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// Byte ranges to write back (address, original bytes).
pub(crate) type Restores = Vec<(RuntimeAddr, Vec<u8>)>;

/// What a probe does when its site is hit.
pub(crate) enum ProbeKind {
    /// A plain probe.
    Plain {
        pre: Option<Handler>,
        post: Option<Handler>,
    },
    /// A return probe's entry half.
    Ret {
        entry: Option<Handler>,
        ret: Option<Handler>,
        maxactive: usize,
        live: usize,
    },
}

/// One registered probe.
pub(crate) struct ProbeEntry {
    pub addr: RuntimeAddr,
    pub kind: ProbeKind,
    pub enabled: bool,
    pub hits: u64,
    pub nmissed: u64,
    pub returns: u64,
    pub abandoned: u64,
    /// Dropped at an exec: nothing armed, counts kept.
    pub dropped: bool,
    /// The session's own (a trap-table publisher, a loader breakpoint):
    /// never counted in what a notice tells the user.
    pub internal: bool,
}

/// A probed address: the instruction's plan, its slot, and the probes on it.
struct Site {
    plan: ProbePlan,
    slot: Option<RuntimeAddr>,
    probes: Vec<ProbeId>,
    /// Return-breakpoint references (targets with BreakpointAtReturn).
    return_refs: usize,
    /// The breakpoint is in the target.
    armed: bool,
}

/// A followed call of a return-probed function.
#[derive(Clone, Copy, Debug)]
struct Instance {
    probe: ProbeId,
    /// Where the return address lives on the stack (rsp at entry).
    slot: u64,
    /// The real return address.
    return_addr: u64,
    entry: EntryInfo,
    /// The slot holds the trampoline (Trampoline targets). False while an
    /// unwinder runs over the frame: the real return address is back.
    swapped: bool,
}

/// A thread's single-step in progress.
#[derive(Clone, Copy, Debug)]
struct StepState {
    site: u64,
    /// Stepping in place (no slot): the breakpoint was lifted and must be put back.
    in_place: bool,
    /// Post handlers to run after the step (false on re-entry).
    run_post: bool,
}

/// How a pass over the event loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A handler asked to stop.
    Stopped,
    /// The target is gone.
    Exited(ExitStatus),
    /// Nothing happened within the timeout.
    Idle,
    /// An event was handled.
    Handled,
}

/// Counts kept per probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// Times the probe's site was hit with the probe enabled.
    pub hits: u64,
    /// Hits not handled (re-entry) or calls whose return is not followed
    /// (beyond `maxactive`): real misses only.
    pub nmissed: u64,
    /// Return handler runs (return probes): calls that returned normally.
    pub returns: u64,
    /// Followed calls whose frame was left without a return (return
    /// probes, trap mechanism): unwound by a C++ exception, a Rust panic or
    /// a forced unwind (`pthread_exit`, cancellation), jumped over by
    /// `longjmp`/`siglongjmp`, or still open when their thread ended. No
    /// `ret` handler runs for them and they are not `nmissed`; each frees
    /// its place under `maxactive`. So `hits = returns + nmissed +
    /// abandoned` once no call is live (re-entry misses aside).
    pub abandoned: u64,
}

/// The engine for one target.
pub struct Engine {
    target: HeldTarget,
    symbolizer: Option<Box<dyn Symbolizer>>,
    sites: AddrMap<Site>,
    pub(crate) probes: HashMap<ProbeId, ProbeEntry>,
    next_probe: u32,
    id_base: u32,
    scratch: Vec<(ScratchRegion, u64)>,
    trampoline: Option<RuntimeAddr>,
    shadow: HashMap<ThreadId, Vec<Instance>>,
    /// Instances dropped as dead by stack pointer (longjmp), newest last,
    /// at most [`GRAVEYARD`] per thread: kept in case the frame was alive
    /// after all (a signal handler on an alternate stack, coroutines) and
    /// returns through the trampoline later.
    graveyard: HashMap<ThreadId, VecDeque<Instance>>,
    /// Internal breakpoints in the unwinder (see [`crate::nonlocal`]):
    /// not probes, never counted, removed at detach.
    unwind_hooks: AddrMap<UnwindHook>,
    stepping: HashMap<ThreadId, Vec<StepState>>,
    /// Return breakpoints (BreakpointAtReturn): return address -> instances.
    return_waiters: AddrMap<Vec<Instance>>,
    strategy: ReturnStrategy,
    gone: Option<ExitStatus>,
    stop: bool,
    /// The target was let run by `Session::start` (before that, every
    /// thread is stopped and probes go in without stopping the world).
    pub(crate) started: bool,
    /// Notices for the user (exec, fork, dropped probes).
    pub(crate) notices: Vec<String>,
    /// Size of the scratch regions asked of the target (lowered to a single
    /// slot's size when the target cannot give a whole chunk).
    scratch_chunk: u64,
    /// Instructions the planner refuses only because they cannot run out of
    /// line (privileged, far transfers) are single-stepped in place instead.
    step_unsupported_in_place: bool,
    /// The target reports breakpoint hits with `rip` alone; the rest is
    /// fetched when a handler or the engine needs it.
    partial_regs: bool,
    /// Bytes other mechanisms wrote into the target (address, original),
    /// written back into a forked child before it is released.
    fork_restores: Restores,
    /// Forked children are kept (held stopped) for the session to follow
    /// instead of being released.
    pub(crate) follow_forks: bool,
    /// Children held for the session, with the stack fixes they need.
    pub(crate) forked: Vec<(u64, Restores)>,
}

impl Engine {
    /// An engine driving `target`; probe ids start at `id_base`.
    pub fn new(target: Box<dyn Target>, id_base: u32) -> Self {
        Engine::holding(HeldTarget::Other(target), id_base)
    }

    /// An engine driving `target` (a process, or any other: see
    /// [`HeldTarget`]); probe ids start at `id_base`.
    pub fn holding(mut target: HeldTarget, id_base: u32) -> Self {
        let strategy = target.as_target().return_strategy();
        let partial_regs = target.as_target().set_partial_breakpoint_registers(true);
        Engine {
            target,
            symbolizer: None,
            sites: AddrMap::default(),
            probes: HashMap::new(),
            next_probe: 0,
            id_base,
            scratch: Vec::new(),
            trampoline: None,
            shadow: HashMap::new(),
            graveyard: HashMap::new(),
            unwind_hooks: AddrMap::default(),
            stepping: HashMap::new(),
            return_waiters: AddrMap::default(),
            strategy,
            gone: None,
            stop: false,
            started: false,
            notices: Vec::new(),
            scratch_chunk: SCRATCH_CHUNK,
            step_unsupported_in_place: false,
            partial_regs,
            fork_restores: Vec::new(),
            follow_forks: false,
            forked: Vec::new(),
        }
    }

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

    /// What a handler context outside the engine's probes needs (the
    /// session's watchpoints): the target, the stop flag, the symbolizer.
    pub(crate) fn handler_parts(
        &mut self,
    ) -> (&mut dyn Target, &mut bool, Option<&dyn Symbolizer>) {
        (
            self.target.as_target(),
            &mut self.stop,
            self.symbolizer.as_deref(),
        )
    }

    /// Set the symbolizer handlers use.
    pub fn set_symbolizer(&mut self, s: Box<dyn Symbolizer>) {
        self.symbolizer = Some(s);
    }

    /// The target.
    pub fn target(&mut self) -> &mut dyn Target {
        self.target.as_target()
    }

    /// The process target, when the engine drives a process.
    pub fn process(&mut self) -> Option<&mut hotprobe_process::ProcessTarget> {
        self.target.process()
    }

    /// The target and the handlers' symbolizer together (for handlers the
    /// session runs itself: shared-memory handlers).
    pub(crate) fn target_and_symbolizer(&mut self) -> (&mut dyn Target, Option<&dyn Symbolizer>) {
        (self.target.as_target(), self.symbolizer.as_deref())
    }

    /// How the target ended, if it has.
    pub fn gone(&self) -> Option<&ExitStatus> {
        self.gone.as_ref()
    }

    /// Whether `addr` lies in scratch memory the engine owns.
    pub fn in_scratch(&self, addr: RuntimeAddr) -> bool {
        self.scratch.iter().any(|(r, _)| r.contains(addr))
    }

    fn alloc_slot(
        &mut self,
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
            match self.target.alloc_scratch(near, self.scratch_chunk.max(len)) {
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

    /// Bytes other mechanisms wrote (address, original) that a forked
    /// child must get back before it runs on its own.
    pub fn set_fork_restores(&mut self, restores: Vec<(RuntimeAddr, Vec<u8>)>) {
        self.fork_restores = restores;
    }

    /// Adds to [`Engine::set_fork_restores`]'s list.
    pub fn extend_fork_restores(&mut self, more: Vec<(RuntimeAddr, Vec<u8>)>) {
        self.fork_restores.extend(more);
    }

    /// A fresh probe id (for probes another mechanism runs).
    pub(crate) fn new_id(&mut self) -> ProbeId {
        let id = ProbeId(self.id_base + self.next_probe);
        self.next_probe += 1;
        id
    }

    /// Plan (and arm) the site at `addr` if it is new.
    fn ensure_site(&mut self, addr: RuntimeAddr) -> Result<(), EngineError> {
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
        while n > 0 && self.target.read_memory(addr, &mut code[..n]).is_err() {
            n -= 1;
        }
        if n == 0 {
            return Err(EngineError::Target(TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: 1,
                target: self.target.describe(),
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
            match self.alloc_slot(addr, SLOT_SIZE as u64)? {
                Some(slot) => {
                    let plan =
                        hotprobe_x86::plan_probe(&code[..n], addr.0, slot.0).map_err(|e| {
                            EngineError::Refused {
                                addr: addr.0,
                                reason: e.to_string(),
                            }
                        })?;
                    let image = plan.slot.as_ref().expect("slot plan");
                    self.target.write_memory(slot, &image.bytes)?;
                    (plan, Some(slot))
                }
                None => (probe_plan, None),
            }
        } else {
            (probe_plan, None)
        };
        self.target.insert_breakpoint(addr)?;
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

    /// Add a probe at `addr`.
    pub fn add_probe(
        &mut self,
        addr: RuntimeAddr,
        probe: crate::Probe,
    ) -> Result<ProbeId, EngineError> {
        self.check_alive()?;
        self.ensure_site(addr)?;
        let id = self.new_id();
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

    /// Add a return probe on the function entered at `addr`.
    pub fn add_retprobe(
        &mut self,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        self.check_alive()?;
        if rp.maxactive == 0 {
            return Err(EngineError::Refused {
                addr: addr.0,
                reason: "maxactive must be at least 1".into(),
            });
        }
        self.ensure_trampoline(addr)?;
        self.ensure_site(addr)?;
        let id = self.new_id();
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
    fn ensure_trampoline(&mut self, addr: RuntimeAddr) -> Result<(), EngineError> {
        if self.strategy == ReturnStrategy::Trampoline && self.trampoline.is_none() {
            let Some(t) = self.alloc_slot(addr, 16)? else {
                return Err(EngineError::Refused {
                    addr: addr.0,
                    reason: "return probes need scratch memory for their trampoline, and this target has none".into(),
                });
            };
            self.target.write_memory(t, &[0x90; 16])?;
            self.target.insert_breakpoint(t)?;
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
        hooks: &[(RuntimeAddr, UnwindHook)],
    ) -> Result<(), EngineError> {
        self.check_alive()?;
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
                if site.armed && self.target.remove_breakpoint(RuntimeAddr(a)).is_err() {
                    self.target.forget_breakpoint(RuntimeAddr(a));
                }
            }
        }
        for (a, h) in hooks {
            if let Err(e) = self.ensure_site(*a) {
                self.notices.push(format!(
                    "{}: no unwinder hook at {a}: {e} (an exception through a return-probed frame may crash the program)",
                    self.target.describe()
                ));
                continue;
            }
            self.unwind_hooks.insert(a.0, *h);
        }
        Ok(())
    }

    /// A probe (or, with `rp`, a return probe) that is not armed anywhere
    /// yet: its module is not loaded. [`Engine::arm_at`] places it.
    pub(crate) fn add_unarmed(
        &mut self,
        probe: Option<crate::Probe>,
        rp: Option<RetProbe>,
    ) -> ProbeId {
        let id = self.new_id();
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

    /// Marks probe `id` as the session's own (see [`ProbeEntry::internal`]).
    pub(crate) fn mark_internal(&mut self, id: ProbeId) {
        if let Some(p) = self.probes.get_mut(&id) {
            p.internal = true;
        }
    }

    /// How many of the user's probes (not the session's own) `keep` takes.
    fn user_probes(&self, keep: impl Fn(&ProbeEntry) -> bool) -> usize {
        self.probes
            .values()
            .filter(|p| !p.internal && keep(p))
            .count()
    }

    /// Arms probe `id` (unarmed: pending, or its library was unmapped) at
    /// `addr`; its counts go on from where they were.
    pub(crate) fn arm_at(&mut self, id: ProbeId, addr: RuntimeAddr) -> Result<(), EngineError> {
        self.check_alive()?;
        let is_ret = matches!(
            self.probes
                .get(&id)
                .ok_or(EngineError::NoSuchProbe(id))?
                .kind,
            ProbeKind::Ret { .. }
        );
        if is_ret {
            self.ensure_trampoline(addr)?;
        }
        self.ensure_site(addr)?;
        self.sites.get_mut(&addr.0).expect("site").probes.push(id);
        let p = self.probes.get_mut(&id).expect("checked above");
        p.addr = addr;
        p.dropped = false;
        p.enabled = true;
        Ok(())
    }

    /// Forgets every site in `[start, end)` without writing anything (the
    /// memory was unmapped: a library closed). Their probes stay, unarmed,
    /// with their counts, and can be armed again with [`Engine::arm_at`].
    pub(crate) fn forget_range(&mut self, start: u64, end: u64) {
        let gone: Vec<u64> = self
            .sites
            .keys()
            .copied()
            .filter(|a| (start..end).contains(a))
            .collect();
        for a in gone {
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
                }
            }
            if site.armed {
                self.target.forget_breakpoint(RuntimeAddr(a));
            }
        }
        self.unwind_hooks.retain(|a, _| !(start..end).contains(a));
        let gone = |i: &Instance| {
            let a = self.probes.get(&i.probe).map_or(0, |p| p.addr.0);
            (start..end).contains(&a)
        };
        for stack in self.shadow.values_mut() {
            stack.retain(|i| !gone(i));
        }
        for g in self.graveyard.values_mut() {
            g.retain(|i| !gone(i));
        }
    }

    fn check_alive(&self) -> Result<(), EngineError> {
        match &self.gone {
            Some(st) => Err(EngineError::Target(TargetError::Gone {
                target: self.target.describe(),
                status: st.clone(),
            })),
            None => Ok(()),
        }
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
    pub fn remove_probe(&mut self, id: ProbeId) -> Result<(), EngineError> {
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
                        self.target.remove_breakpoint(p.addr)?;
                    }
                    self.sites.remove(&p.addr.0);
                }
            }
        }
        Ok(())
    }

    /// Counts of a probe.
    pub fn stats(&self, id: ProbeId) -> Option<ProbeStats> {
        self.probes.get(&id).map(|p| ProbeStats {
            hits: p.hits,
            nmissed: p.nmissed,
            returns: p.returns,
            abandoned: p.abandoned,
        })
    }

    /// Whether a handler asked to stop (cleared by reading).
    pub fn take_stop(&mut self) -> bool {
        std::mem::take(&mut self.stop)
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

    /// Wait for one event (at most `timeout`) and handle it.
    pub fn poll(&mut self, timeout: Option<std::time::Duration>) -> Result<Outcome, EngineError> {
        if let Some(st) = &self.gone {
            return Ok(Outcome::Exited(st.clone()));
        }
        let ev = self.target.wait(timeout)?;
        self.handle(ev)?;
        if let Some(st) = &self.gone {
            return Ok(Outcome::Exited(st.clone()));
        }
        if self.stop {
            return Ok(Outcome::Stopped);
        }
        Ok(Outcome::Handled)
    }

    /// Handle one event from the target.
    pub fn handle(&mut self, ev: TargetEvent) -> Result<(), EngineError> {
        match ev {
            TargetEvent::Breakpoint { thread, addr, regs } => {
                self.on_breakpoint(thread, addr, regs)
            }
            TargetEvent::Stepped { thread, regs } => self.on_stepped(thread, regs),
            TargetEvent::ThreadCreated(_) => Ok(()),
            // Watchpoints are the session's ([`crate::Session::watch`]);
            // an engine on its own lets the thread run on.
            TargetEvent::Watchpoint { thread, .. } => {
                self.target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::ThreadExited(t) => {
                self.drop_thread(t);
                Ok(())
            }
            TargetEvent::Forked { thread, child } => {
                // Code the fast path rewrote, then the return addresses
                // swapped in the forking thread's stack: the child runs the
                // program as it was, without probes. A followed child keeps
                // the fast path's code (its agent counts into slots of its
                // own) and is handed to the session with its stack fixes.
                let mut fixes = if self.follow_forks {
                    Vec::new()
                } else {
                    self.fork_restores.clone()
                };
                if self.strategy == ReturnStrategy::Trampoline {
                    // Dropped frames that may be alive after all first, so
                    // that a live instance at the same slot wins.
                    let t = self.trampoline.map_or(0, |t| t.0);
                    for inst in self.graveyard.get(&thread).into_iter().flatten() {
                        let mut b = [0u8; 8];
                        if self
                            .target
                            .read_memory(RuntimeAddr(inst.slot), &mut b)
                            .is_ok()
                            && u64::from_le_bytes(b) == t
                        {
                            fixes.push((
                                RuntimeAddr(inst.slot),
                                inst.return_addr.to_le_bytes().to_vec(),
                            ));
                        }
                    }
                    if let Some(v) = self.shadow.get(&thread) {
                        fixes.extend(
                            v.iter().map(|i| {
                                (RuntimeAddr(i.slot), i.return_addr.to_le_bytes().to_vec())
                            }),
                        );
                    }
                }
                if self.follow_forks {
                    self.forked.push((child, fixes));
                    self.target.resume(thread, ResumeMode::Continue)?;
                    return Ok(());
                }
                self.target.release_fork_child(child, &fixes)?;
                self.notices.push(format!(
                    "{}: forked child {child} (released without probes)",
                    self.target.describe()
                ));
                self.target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::Exec => {
                // Nothing is written into the new image: its addresses mean
                // something else. The probes stay, disabled and unarmed, so
                // that what they counted before the exec is still reported.
                let n = self.user_probes(|_| true);
                self.sites.clear();
                self.shadow.clear();
                self.graveyard.clear();
                self.unwind_hooks.clear();
                self.stepping.clear();
                self.return_waiters.clear();
                self.scratch.clear();
                self.trampoline = None;
                self.fork_restores.clear();
                for p in self.probes.values_mut() {
                    p.enabled = false;
                    p.dropped = true;
                    if let ProbeKind::Ret { live, .. } = &mut p.kind {
                        *live = 0;
                    }
                }
                if n > 0 {
                    self.notices.push(format!(
                        "{}: exec: {n} trap probes dropped (their counts before the exec are kept)",
                        self.target.describe()
                    ));
                }
                for t in self.target.threads() {
                    let _ = self.target.resume(t, ResumeMode::Continue);
                }
                Ok(())
            }
            TargetEvent::Exited(st) => {
                // An exit is the normal end: nothing is "dropped" then. A
                // death by signal, or a guest whose stub went away, says
                // how many of the user's probes were armed in it.
                let n = match st {
                    ExitStatus::Code(_) => 0,
                    _ => self.user_probes(|p| !p.dropped),
                };
                self.notices.push(if n > 0 {
                    format!(
                        "{} {st}: its {n} probes are dropped",
                        self.target.describe()
                    )
                } else {
                    format!("{} {st}", self.target.describe())
                });
                self.gone = Some(st);
                self.sites.clear();
                self.shadow.clear();
                self.graveyard.clear();
                self.unwind_hooks.clear();
                self.stepping.clear();
                Ok(())
            }
            TargetEvent::ModulesChanged { thread } => {
                self.target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::Timeout => Ok(()),
        }
    }

    fn drop_thread(&mut self, t: ThreadId) {
        // Calls still open when their thread ended never returned.
        if let Some(stack) = self.shadow.remove(&t) {
            for inst in stack {
                self.abandon(t, inst, false);
            }
        }
        self.graveyard.remove(&t);
        self.stepping.remove(&t);
    }

    /// Runs one handler of probe `id`; an error if the registers it asked
    /// for could not be fetched.
    fn run_handler(
        &mut self,
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
        let fetch_error = {
            let mut ctx = HitContext {
                target: RefCell::new(self.target.as_target()),
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
    fn run_handler_on(
        &mut self,
        id: ProbeId,
        which: HitKind,
        thread: ThreadId,
        regs: &mut Registers,
        entry: Option<EntryInfo>,
    ) -> Result<(), EngineError> {
        let mut hr = HitRegs::complete(*regs);
        let r = self.run_handler(id, which, thread, &mut hr, entry);
        if let Some(full) = hr.fetched() {
            *regs = *full;
        }
        r
    }

    fn on_breakpoint(
        &mut self,
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
            let regs = *hr.fetch(self.target.as_target(), thread)?;
            return self.on_trampoline(thread, regs);
        }
        if self.strategy == ReturnStrategy::BreakpointAtReturn
            && self.return_waiters.contains_key(&addr.0)
        {
            let mut regs = *hr.fetch(self.target.as_target(), thread)?;
            self.match_return_breakpoint(thread, addr, &mut regs)?;
            hr = HitRegs::complete(regs);
        }
        if let Some(hook) = self.unwind_hooks.get(&addr.0).copied() {
            let regs = *hr.fetch(self.target.as_target(), thread)?;
            self.on_unwind_hook(thread, hook, &regs)?;
        }
        let Some(site) = self.sites.get(&addr.0) else {
            // Not ours any more (removed meanwhile): run on.
            if let Some(regs) = hr.fetched() {
                self.target.set_registers(thread, regs)?;
            }
            self.target.resume(thread, ResumeMode::Continue)?;
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
            let rsp = hr.fetch(self.target.as_target(), thread)?.rsp;
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
            p.hits += 1;
            match &p.kind {
                ProbeKind::Plain { post, .. } => {
                    needs_post |= post.is_some();
                    self.run_handler(*id, HitKind::Pre, thread, &mut hr, None)?;
                }
                ProbeKind::Ret { .. } => {
                    let mut regs = *hr.fetch(self.target.as_target(), thread)?;
                    self.ret_entry(*id, thread, &mut regs)?;
                    hr = HitRegs::complete(regs);
                }
            }
        }
        if hr.rip() != addr.0 {
            // A handler redirected the thread: skip the instruction (Kprobes' pre returning 1).
            if let Some(regs) = hr.fetched() {
                self.target.set_registers(thread, regs)?;
            }
            self.target.resume(thread, ResumeMode::Continue)?;
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
                self.target.set_pc(thread, next)?;
                self.target.resume(thread, ResumeMode::Continue)?;
            }
            (Execution::Emulate(e), _) => {
                let len = site.plan.len;
                let target = &mut self.target;
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
                    self.target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
                }
                if needs_post {
                    self.run_posts(&probes, thread, &mut hr)?;
                }
                let regs = hr.fetch(self.target.as_target(), thread)?;
                let regs = *regs;
                self.target.set_registers(thread, &regs)?;
                self.target.resume(thread, ResumeMode::Continue)?;
            }
            (Execution::Boost, Some(slot)) if !needs_post => {
                self.move_to(thread, &mut hr, slot.0)?;
                self.target.resume(thread, ResumeMode::Continue)?;
            }
            (_, Some(slot)) => {
                self.move_to(thread, &mut hr, slot.0)?;
                self.stepping.entry(thread).or_default().push(StepState {
                    site: addr.0,
                    in_place: false,
                    run_post: !reentry,
                });
                self.target.resume(thread, ResumeMode::Step)?;
            }
            (_, None) => {
                // No scratch memory: lift the breakpoint and step in place.
                self.target.remove_breakpoint(addr)?;
                self.sites.get_mut(&addr.0).expect("site").armed = false;
                if let Some(regs) = hr.fetched() {
                    self.target.set_registers(thread, regs)?;
                }
                self.stepping.entry(thread).or_default().push(StepState {
                    site: addr.0,
                    in_place: true,
                    run_post: !reentry,
                });
                self.target.resume(thread, ResumeMode::Step)?;
            }
        }
        Ok(())
    }

    /// Points the thread at `pc`: the whole register set if a handler saw
    /// (and may have changed) it, else `rip` alone.
    fn move_to(&mut self, thread: ThreadId, hr: &mut HitRegs, pc: u64) -> Result<(), EngineError> {
        match hr.fetched() {
            Some(regs) => {
                let mut regs = *regs;
                regs.rip = pc;
                self.target.set_registers(thread, &regs)?;
            }
            None => self.target.set_pc(thread, pc)?,
        }
        Ok(())
    }

    fn run_posts(
        &mut self,
        probes: &[ProbeId],
        thread: ThreadId,
        regs: &mut HitRegs,
    ) -> Result<(), EngineError> {
        for id in probes {
            if self.probes.get(id).is_some_and(|p| p.enabled) {
                self.run_handler(*id, HitKind::Post, thread, regs, None)?;
            }
        }
        Ok(())
    }

    fn on_stepped(&mut self, thread: ThreadId, stepped: Registers) -> Result<(), EngineError> {
        let mut regs = stepped;
        let Some(st) = self.stepping.get_mut(&thread).and_then(|s| s.pop()) else {
            // A step we did not ask for: run on.
            self.target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        };
        let Some(site) = self.sites.get_mut(&st.site) else {
            self.target.resume(thread, ResumeMode::Continue)?;
            return Ok(());
        };
        if st.in_place {
            if regs.rip == st.site {
                // Not executed yet (a stop taken before the instruction ran,
                // as QEMU TCG sometimes reports a step, or a rep
                // iteration): step again, or re-arming the breakpoint would
                // report this execution a second time.
                self.stepping.entry(thread).or_default().push(st);
                self.target.resume(thread, ResumeMode::Step)?;
                return Ok(());
            }
            if !site.armed {
                site.armed = true;
                self.target.insert_breakpoint(RuntimeAddr(st.site))?;
            }
        } else if let Some(slot) = site.slot {
            if regs.rip == slot.0 {
                // The instruction did not complete (a rep iteration): step again.
                self.stepping.entry(thread).or_default().push(st);
                self.target.resume(thread, ResumeMode::Step)?;
                return Ok(());
            }
            if let Some(w) = hotprobe_x86::fixup_after_step(&site.plan, st.site, slot.0, &mut regs)
            {
                self.target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
            }
        }
        if st.run_post {
            let probes = site.probes.clone();
            let mut hr = HitRegs::complete(regs);
            self.run_posts(&probes, thread, &mut hr)?;
            regs = *hr.fetch(self.target.as_target(), thread)?;
        }
        let only_rip_moved = Registers {
            rip: stepped.rip,
            ..regs
        } == stepped;
        if self.partial_regs && only_rip_moved {
            // Only rip moved (back from the slot): the target may send it
            // with the resume.
            self.target.set_pc(thread, regs.rip)?;
        } else {
            self.target.set_registers(thread, &regs)?;
        }
        self.target.resume(thread, ResumeMode::Continue)?;
        Ok(())
    }

    /// Kprobes' pre_handler_kretprobe: follow this call if a slot is free.
    fn ret_entry(
        &mut self,
        id: ProbeId,
        thread: ThreadId,
        regs: &mut Registers,
    ) -> Result<(), EngineError> {
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
        self.target.read_memory(RuntimeAddr(regs.rsp), &mut b)?;
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
                self.target
                    .write_memory(RuntimeAddr(regs.rsp), &t.0.to_le_bytes())?;
                self.shadow.entry(thread).or_default().push(inst);
            }
            ReturnStrategy::BreakpointAtReturn => {
                let ra = RuntimeAddr(return_addr);
                if !self.sites.contains_key(&ra.0) {
                    // A breakpoint only for returns: plan it like any site.
                    self.ensure_site(ra)?;
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
        self.run_handler_on(id, HitKind::Entry, thread, regs, Some(inst.entry))
    }

    fn finish_instance(
        &mut self,
        inst: Instance,
        thread: ThreadId,
        regs: &mut Registers,
    ) -> Result<(), EngineError> {
        if let Some(ProbeEntry {
            kind: ProbeKind::Ret { live, .. },
            returns,
            ..
        }) = self.probes.get_mut(&inst.probe)
        {
            *live = live.saturating_sub(1);
            *returns += 1;
        } else {
            return Ok(());
        }
        self.run_handler_on(inst.probe, HitKind::Return, thread, regs, Some(inst.entry))
    }

    /// A followed call whose frame was left without a return (see
    /// [`ProbeStats::abandoned`]): it frees its place under `maxactive`.
    /// With `keep`, an instance whose slot still holds the trampoline is
    /// kept in the thread's graveyard, in case the frame was alive after
    /// all (found dead by stack pointer while the thread ran on another
    /// stack: a signal handler on an alternate stack, a coroutine).
    fn abandon(&mut self, thread: ThreadId, inst: Instance, keep: bool) {
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
    fn drop_dead(&mut self, thread: ThreadId, floor: u64) {
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
    fn find_elsewhere(&mut self, thread: ThreadId, popped: u64) -> Option<(Instance, bool)> {
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
    fn on_trampoline(&mut self, thread: ThreadId, mut regs: Registers) -> Result<(), EngineError> {
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
        self.finish_instance(inst, thread, &mut regs)?;
        self.target.set_registers(thread, &regs)?;
        self.target.resume(thread, ResumeMode::Continue)?;
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
    fn on_unwind_hook(
        &mut self,
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
                        let ours = self.target.read_memory(slot, &mut b).is_ok()
                            && u64::from_le_bytes(b) == t.0;
                        if ours {
                            self.target
                                .write_memory(slot, &inst.return_addr.to_le_bytes())?;
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
                        if self.target.read_memory(slot, &mut b).is_ok()
                            && u64::from_le_bytes(b) == t.0
                        {
                            self.target
                                .write_memory(slot, &inst.return_addr.to_le_bytes())?;
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
                self.target.read_memory(
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
                        && self.target.read_memory(slot, &mut b).is_ok()
                        && u64::from_le_bytes(b) == inst.return_addr;
                    if intact && self.target.write_memory(slot, &t.0.to_le_bytes()).is_ok() {
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

    /// BreakpointAtReturn: a hit at a return address may close followed calls
    /// whose stack slot was just popped.
    fn match_return_breakpoint(
        &mut self,
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
        self.finish_instance(inst, thread, regs)?;
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
                self.target.remove_breakpoint(addr)?;
            }
            // Nothing else to run at this address: resume in place.
            self.target.set_registers(thread, regs)?;
        }
        Ok(())
    }

    /// Detach: no handler runs any more; threads are moved out of slots,
    /// live return addresses put back, breakpoints and scratch removed.
    pub fn detach(&mut self) -> Result<(), EngineError> {
        if self.gone.is_some() {
            return Ok(());
        }
        for p in self.probes.values_mut() {
            p.enabled = false;
        }
        self.target.stop_all()?;
        // Finish what the target reported meanwhile, without handlers.
        loop {
            match self.target.wait(Some(std::time::Duration::ZERO))? {
                TargetEvent::Timeout => break,
                TargetEvent::Stepped { thread, mut regs } => {
                    if let Some(st) = self.stepping.get_mut(&thread).and_then(|s| s.pop()) {
                        if let Some(site) = self.sites.get(&st.site) {
                            if let Some(slot) = site.slot {
                                if let Some(w) = hotprobe_x86::fixup_after_step(
                                    &site.plan, st.site, slot.0, &mut regs,
                                ) {
                                    self.target.write_memory(RuntimeAddr(w.addr), &w.bytes)?;
                                }
                            }
                        }
                        self.target.set_registers(thread, &regs)?;
                    }
                }
                TargetEvent::Breakpoint {
                    thread,
                    addr,
                    mut regs,
                } if Some(addr) == self.trampoline => {
                    if self.partial_regs {
                        regs = self.target.registers(thread)?;
                    }
                    let popped = regs.rsp.wrapping_sub(8);
                    let live = self.shadow.get_mut(&thread).and_then(|stack| {
                        let pos = stack.iter().rposition(|i| i.slot == popped)?;
                        let ra = stack[pos].return_addr;
                        stack.truncate(pos);
                        Some(ra)
                    });
                    let ra = live.or_else(|| {
                        self.find_elsewhere(thread, popped)
                            .map(|(i, _)| i.return_addr)
                    });
                    if let Some(ra) = ra {
                        regs.rip = ra;
                        self.target.set_registers(thread, &regs)?;
                    }
                }
                TargetEvent::Exited(st) => {
                    self.gone = Some(st);
                    return Ok(());
                }
                // A breakpoint hit: the target rewinds it at detach.
                _ => {}
            }
        }
        // Threads inside a slot go back to the original code.
        for thread in self.target.threads() {
            let Ok(mut regs) = self.target.registers(thread) else {
                continue;
            };
            if !self.in_scratch(RuntimeAddr(regs.rip)) {
                continue;
            }
            let mapped = self.sites.iter().find_map(|(addr, s)| {
                let slot = s.slot?;
                hotprobe_x86::slot_to_original(&s.plan, *addr, slot.0, regs.rip)
            });
            match mapped {
                Some(orig) => {
                    regs.rip = orig;
                    self.target.set_registers(thread, &regs)?;
                }
                None => self.notices.push(format!(
                    "thread {thread} left at {:#x} in scratch memory",
                    regs.rip
                )),
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
                if self
                    .target
                    .read_memory(RuntimeAddr(inst.slot), &mut b)
                    .is_ok()
                    && u64::from_le_bytes(b) == t.0
                {
                    self.target
                        .write_memory(RuntimeAddr(inst.slot), &inst.return_addr.to_le_bytes())?;
                }
            }
        }
        self.shadow.clear();
        self.graveyard.clear();
        self.unwind_hooks.clear();
        self.sites.clear();
        self.target.detach()?;
        self.gone = Some(ExitStatus::Disconnected("detached".into()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Probe;
    use std::rc::Rc;

    /// What the engine asked of the mock target.
    #[derive(Default)]
    struct Log {
        register_reads: u32,
        register_writes: u32,
        pc_writes: Vec<u64>,
        resumes: u32,
        steps: u32,
        inserts: u32,
    }

    /// A target with code at `BASE`, scratch at `SCRATCH`, one thread, that
    /// reports breakpoint hits with `rip` alone.
    struct Mock {
        regs: Registers,
        log: Rc<RefCell<Log>>,
        /// No scratch memory (sites step in place).
        no_scratch: bool,
    }

    const BASE: u64 = 0x40_0000;
    const SCRATCH: u64 = 0x50_0000;
    /// `mov eax, 1` (boosted), `nop` (emulated), `ret`.
    const CODE: &[u8] = &[0xb8, 0x01, 0, 0, 0, 0x90, 0xc3];

    impl Target for Mock {
        fn describe(&self) -> String {
            "mock".into()
        }
        fn threads(&self) -> Vec<ThreadId> {
            vec![ThreadId(1)]
        }
        fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
            let off = addr.0.wrapping_sub(BASE) as usize;
            match CODE.get(off..off + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    Ok(())
                }
                None => Err(TargetError::Memory {
                    op: "read",
                    addr: addr.0,
                    len: buf.len(),
                    target: self.describe(),
                }),
            }
        }
        fn write_memory(&mut self, _: RuntimeAddr, _: &[u8]) -> Result<(), TargetError> {
            Ok(())
        }
        fn registers(&mut self, _: ThreadId) -> Result<Registers, TargetError> {
            self.log.borrow_mut().register_reads += 1;
            Ok(self.regs)
        }
        fn set_registers(&mut self, _: ThreadId, regs: &Registers) -> Result<(), TargetError> {
            self.log.borrow_mut().register_writes += 1;
            self.regs = *regs;
            Ok(())
        }
        fn set_pc(&mut self, _: ThreadId, pc: u64) -> Result<(), TargetError> {
            self.log.borrow_mut().pc_writes.push(pc);
            self.regs.rip = pc;
            Ok(())
        }
        fn set_partial_breakpoint_registers(&mut self, on: bool) -> bool {
            on
        }
        fn resume(&mut self, _: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
            let mut log = self.log.borrow_mut();
            log.resumes += 1;
            if mode == ResumeMode::Step {
                log.steps += 1;
            }
            Ok(())
        }
        fn wait(&mut self, _: Option<std::time::Duration>) -> Result<TargetEvent, TargetError> {
            Ok(TargetEvent::Timeout)
        }
        fn insert_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
            self.log.borrow_mut().inserts += 1;
            Ok(())
        }
        fn remove_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
            Ok(())
        }
        fn stop_all(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
        fn resume_all(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
        fn detach(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
        fn alloc_scratch(
            &mut self,
            _: RuntimeAddr,
            len: u64,
        ) -> Result<ScratchRegion, TargetError> {
            if self.no_scratch {
                return Err(TargetError::NoScratch {
                    near: BASE,
                    target: self.describe(),
                    why: "none in the mock".into(),
                });
            }
            Ok(ScratchRegion {
                start: RuntimeAddr(SCRATCH),
                len,
            })
        }
    }

    /// A hit at `addr` as the mock reports it: `rip` alone.
    fn hit(e: &mut Engine, addr: u64) {
        e.handle(TargetEvent::Breakpoint {
            thread: ThreadId(1),
            addr: RuntimeAddr(addr),
            regs: Registers {
                rip: addr,
                ..Registers::default()
            },
        })
        .unwrap();
    }

    #[test]
    fn registers_are_fetched_only_when_a_handler_asks() {
        let log = Rc::new(RefCell::new(Log::default()));
        let mock = Mock {
            regs: Registers {
                rip: BASE,
                rdi: 7,
                ..Registers::default()
            },
            log: log.clone(),
            no_scratch: false,
        };
        let mut e = Engine::new(Box::new(mock), 0);
        let boosted = e
            .add_probe(RuntimeAddr(BASE), Probe::new().pre(|_| {}))
            .unwrap();
        assert_eq!(e.execution_of(RuntimeAddr(BASE)), Some("boosted"));

        // A null handler on a boosted site: rip alone is written, to the slot.
        hit(&mut e, BASE);
        assert_eq!(e.stats(boosted).unwrap().hits, 1);
        assert_eq!(log.borrow().register_reads, 0);
        assert_eq!(log.borrow().register_writes, 0);
        assert_eq!(log.borrow().pc_writes, vec![SCRATCH]);
        assert_eq!(log.borrow().resumes, 1);

        // A null handler on an emulated NOP: rip moves past it, nothing read.
        let nop = BASE + 5;
        let p = e
            .add_probe(RuntimeAddr(nop), Probe::new().pre(|_| {}))
            .unwrap();
        assert_eq!(e.execution_of(RuntimeAddr(nop)), Some("emulated"));
        hit(&mut e, nop);
        assert_eq!(log.borrow().register_reads, 0);
        assert_eq!(log.borrow().pc_writes, vec![SCRATCH, nop + 1]);

        // A handler that reads an argument: one fetch, then the whole set
        // is written back (with rip past the NOP).
        e.remove_probe(p).unwrap();
        let seen = Rc::new(RefCell::new(None));
        let s2 = seen.clone();
        e.add_probe(
            RuntimeAddr(nop),
            Probe::new().pre(move |ctx| *s2.borrow_mut() = ctx.arg(0)),
        )
        .unwrap();
        hit(&mut e, nop);
        assert_eq!(*seen.borrow(), Some(7));
        assert_eq!(log.borrow().register_reads, 1);
        assert_eq!(log.borrow().register_writes, 1);
        assert_eq!(log.borrow().pc_writes.len(), 2);
        assert_eq!(log.borrow().resumes, 3);

        // A post handler: the thread steps the slot; after the step only
        // rip moves (back to the original code), so rip alone is written.
        e.remove_probe(boosted).unwrap();
        e.add_probe(RuntimeAddr(BASE), Probe::new().post(|_| {}))
            .unwrap();
        hit(&mut e, BASE);
        let slot = *log.borrow().pc_writes.last().unwrap();
        assert!((SCRATCH..SCRATCH + SCRATCH_CHUNK).contains(&slot));
        let after_step = Registers {
            rip: slot + 5,
            rdi: 7,
            ..Registers::default()
        };
        e.handle(TargetEvent::Stepped {
            thread: ThreadId(1),
            regs: after_step,
        })
        .unwrap();
        assert_eq!(log.borrow().pc_writes.last(), Some(&(BASE + 5)));
        assert_eq!(log.borrow().register_writes, 1);
        assert_eq!(log.borrow().resumes, 5);
    }

    #[test]
    fn an_in_place_step_that_did_not_execute_is_stepped_again() {
        let log = Rc::new(RefCell::new(Log::default()));
        let mock = Mock {
            regs: Registers {
                rip: BASE,
                ..Registers::default()
            },
            log: log.clone(),
            no_scratch: true,
        };
        let mut e = Engine::new(Box::new(mock), 0);
        let posts = Rc::new(RefCell::new(0));
        let p2 = posts.clone();
        let id = e
            .add_probe(
                RuntimeAddr(BASE),
                Probe::new().post(move |_| *p2.borrow_mut() += 1),
            )
            .unwrap();
        let inserts = log.borrow().inserts;
        hit(&mut e, BASE);
        assert_eq!(log.borrow().steps, 1);
        let stepped = |rip| TargetEvent::Stepped {
            thread: ThreadId(1),
            regs: Registers {
                rip,
                ..Registers::default()
            },
        };
        // A step stop taken before the instruction ran: the same
        // execution, stepped again with the breakpoint still lifted.
        e.handle(stepped(BASE)).unwrap();
        assert_eq!(log.borrow().steps, 2);
        assert_eq!(log.borrow().inserts, inserts);
        assert_eq!(*posts.borrow(), 0);
        e.handle(stepped(BASE + 5)).unwrap();
        assert_eq!(log.borrow().steps, 2);
        assert_eq!(log.borrow().inserts, inserts + 1, "re-armed once");
        assert_eq!(*posts.borrow(), 1);
        assert_eq!(e.stats(id).unwrap().hits, 1);
    }
}
