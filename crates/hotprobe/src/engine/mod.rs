//! The trap engine for one target: the trap mechanism. Kprobes' semantics
//! written once for any [`Target`]: the probe table, out-of-line slots,
//! boosting, emulation, single-step fixups, return-probe instances, and the
//! handling of every [`hotprobe_target::TargetEvent`].
//!
//! It is the only trap mechanism: a Linux process's trap probes (ptrace) and
//! a guest kernel's (QEMU's GDB stub, `hotprobe-guest`) are this same engine
//! over two targets; the guest stub is not a second implementation. The
//! engine holds no target: the session's slot holds it (a [`HeldTarget`])
//! and lends it to each engine call that reads or writes it (the methods
//! take `target: &mut HeldTarget`). [`StandaloneEngine`] owns an engine
//! and its target together, for an engine driven on its own;
//! [`EngineView`] borrows both from a session (`Session::engine`).
//!
//! The files, by job:
//! - `site`: planning a probed instruction, its slot, the trampoline;
//!   adding, arming, enabling and removing probes;
//! - `event`: the event loop (fork, exec, exit, threads ending);
//! - `hit`: a breakpoint hit, its handlers, and the instruction boosted,
//!   emulated or single-stepped;
//! - `retprobe`: return instances, their returns, frames left by `longjmp`;
//! - `unwind`: the unwinder's hooks (exceptions, see [`crate::nonlocal`]);
//! - `detach`: everything the engine changed in the target, undone;
//! - `report`: what it tells its holder (notices, forked children held);
//! - `standalone`: the engine with its target, owned or borrowed.
//!
//! Probe ids, notices and followed children are the session's: it hands
//! the engine the id of each probe (`Engine::add_probe_as`), drains its
//! reports after each call (`Engine::take_reports`) and says, per event,
//! what the engine holds back (`Engine::handle_holding`). Only an engine
//! driven on its own ([`StandaloneEngine::new`]) numbers its probes itself.

use crate::handler::{EntryInfo, Handler, ProbeId};
use crate::held::HeldTarget;
use crate::nonlocal::UnwindHook;
use crate::session::ids::ProbeIds;
use crate::EngineError;
use hotprobe_resolve::Symbolizer;
use hotprobe_target::{
    ExitStatus, ReturnStrategy, RuntimeAddr, ScratchRegion, TargetError, ThreadId,
};
use hotprobe_x86::ProbePlan;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

mod detach;
mod event;
mod hit;
mod report;
mod retprobe;
mod site;
mod standalone;
mod unwind;

pub(crate) use report::{Holds, Notice, Report};
pub use standalone::{EngineView, StandaloneEngine};

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
    /// (beyond `maxactive`, or, on a target that puts a breakpoint at the
    /// return address, a return address no breakpoint can go to): real
    /// misses only.
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

/// The engine for one target. It holds no target: whoever holds the
/// target (the session's slot, or a [`StandaloneEngine`]) lends it to each
/// call that reads or writes it.
pub struct Engine {
    symbolizer: Option<Box<dyn Symbolizer>>,
    sites: AddrMap<Site>,
    pub(crate) probes: HashMap<ProbeId, ProbeEntry>,
    /// The ids of an engine driven on its own ([`StandaloneEngine::new`]); `None`
    /// for one a session holds: the session hands it every id.
    own_ids: Option<ProbeIds>,
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
    /// Reports for the holder (notices, children held), drained by it
    /// after each call ([`Engine::take_reports`]).
    reports: Vec<Report>,
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
    /// Hits by vfork children (their pid), per probe: not the process's
    /// (see [`Engine::vfork_hits`]).
    vfork_hits: HashMap<ProbeId, Vec<(i32, u64)>>,
    /// `--stacks` on trap probes (issue 24): walks the stack at each hit
    /// of a probe it takes (see `hit.rs`).
    pub(crate) stack_hook: Option<crate::stacks::TrapStacks>,
    /// The stack just walked at this hit (probe, thread, its id), for
    /// the probe's entry handler (`HitContext::stack_id`).
    walked: Option<(ProbeId, ThreadId, u32)>,
    /// Returns by vfork children (their pid), per return probe: not the
    /// process's (see [`Engine::vfork_returns`]).
    vfork_returns: HashMap<ProbeId, Vec<(i32, u64)>>,
}

impl Engine {
    /// The engine of a session's target: the session hands it the id of
    /// every probe ([`Engine::add_probe_as`]). It asks `target` how returns
    /// are caught and has it report breakpoint hits with `rip` alone.
    pub(crate) fn for_session(target: &mut HeldTarget) -> Self {
        Engine::with_ids(target, None)
    }

    fn with_ids(target: &mut HeldTarget, own_ids: Option<ProbeIds>) -> Self {
        let strategy = target.as_target().return_strategy();
        let partial_regs = target.as_target().set_partial_breakpoint_registers(true);
        Engine {
            symbolizer: None,
            sites: AddrMap::default(),
            probes: HashMap::new(),
            own_ids,
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
            reports: Vec::new(),
            scratch_chunk: SCRATCH_CHUNK,
            step_unsupported_in_place: false,
            partial_regs,
            fork_restores: Vec::new(),
            vfork_hits: HashMap::new(),
            stack_hook: None,
            walked: None,
            vfork_returns: HashMap::new(),
        }
    }

    /// What a handler context outside the engine's probes needs (the
    /// session's watchpoints): the stop flag, the symbolizer.
    pub(crate) fn handler_parts(&mut self) -> (&mut bool, Option<&dyn Symbolizer>) {
        (&mut self.stop, self.symbolizer.as_deref())
    }

    /// Set the symbolizer handlers use.
    pub fn set_symbolizer(&mut self, s: Box<dyn Symbolizer>) {
        self.symbolizer = Some(s);
    }

    /// The handlers' symbolizer (also for handlers the session runs
    /// itself: shared-memory handlers).
    pub(crate) fn symbolizer(&self) -> Option<&dyn Symbolizer> {
        self.symbolizer.as_deref()
    }

    /// How the target ended, if it has.
    pub fn gone(&self) -> Option<&ExitStatus> {
        self.gone.as_ref()
    }

    /// Whether `addr` lies in scratch memory the engine owns.
    pub fn in_scratch(&self, addr: RuntimeAddr) -> bool {
        self.scratch.iter().any(|(r, _)| r.contains(addr))
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

    /// Runs `place` with the next id of an engine driven on its own; an
    /// engine a session holds refuses (its ids are the session's).
    fn with_own_id(
        &mut self,
        addr: RuntimeAddr,
        place: impl FnOnce(&mut Self, ProbeId) -> Result<ProbeId, EngineError>,
    ) -> Result<ProbeId, EngineError> {
        let Some(mut ids) = self.own_ids.take() else {
            return Err(EngineError::Refused {
                addr: addr.0,
                reason: "this engine's probe ids are its session's: add the probe through the \
                         session"
                    .into(),
            });
        };
        let r = ids.place(|id| place(self, id));
        self.own_ids = Some(ids);
        r
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

    fn check_alive(&self, target: &HeldTarget) -> Result<(), EngineError> {
        match &self.gone {
            Some(st) => Err(EngineError::Target(TargetError::Gone {
                target: target.describe(),
                status: st.clone(),
            })),
            None => Ok(()),
        }
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

    /// Hits of probe `id` by vfork children of the process, per child
    /// pid: such a child runs in the process's memory, so its hits reach
    /// this engine, but they are not the process's (not in
    /// [`Engine::stats`]).
    pub fn vfork_hits(&self, id: ProbeId) -> &[(i32, u64)] {
        self.vfork_hits.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Returns of return probe `id` by vfork children of the process, per
    /// child pid (as [`Engine::vfork_hits`]: not in [`Engine::stats`]).
    pub fn vfork_returns(&self, id: ProbeId) -> &[(i32, u64)] {
        self.vfork_returns.get(&id).map_or(&[], Vec::as_slice)
    }

    /// The vfork children that hit a probe so far (their pids).
    pub fn vfork_children_hit(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.vfork_hits.values().flatten().map(|x| x.0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Counts one hit of probe `id` by thread `thread`: the process's, or
    /// a vfork child's (see [`Engine::vfork_hits`]).
    pub(crate) fn count_hit(&mut self, target: &HeldTarget, id: ProbeId, thread: ThreadId) {
        let tid = thread.0 as i32;
        if target.process_ref().is_some_and(|p| p.is_vfork_child(tid)) {
            let by = self.vfork_hits.entry(id).or_default();
            match by.iter_mut().find(|(p, _)| *p == tid) {
                Some((_, n)) => *n += 1,
                None => by.push((tid, 1)),
            }
        } else if let Some(p) = self.probes.get_mut(&id) {
            p.hits += 1;
        }
    }

    /// Counts a return of probe `id` seen in thread `thread` when it is a
    /// vfork child's (see [`Engine::vfork_returns`]); false when the
    /// return is the process's, for the caller to count.
    pub(crate) fn count_vfork_return(
        &mut self,
        target: &HeldTarget,
        id: ProbeId,
        thread: ThreadId,
    ) -> bool {
        let tid = thread.0 as i32;
        if !target.process_ref().is_some_and(|p| p.is_vfork_child(tid)) {
            return false;
        }
        let by = self.vfork_returns.entry(id).or_default();
        match by.iter_mut().find(|(p, _)| *p == tid) {
            Some((_, n)) => *n += 1,
            None => by.push((tid, 1)),
        }
        true
    }

    /// Whether a handler asked to stop (cleared by reading).
    pub fn take_stop(&mut self) -> bool {
        std::mem::take(&mut self.stop)
    }
}

#[cfg(test)]
mod tests;
