//! hotprobe: probes on any instruction of a running Linux process (and, with
//! the guest crate, of a VM guest kernel), with handlers in the tracer.
//!
//! ```no_run
//! use hotprobe::{Probe, RetProbe, Session};
//! let mut s = Session::new();
//! let t = s.spawn("./prog".as_ref(), &[]).unwrap();
//! let p = s.probe(t, "compute", Probe::new().pre(|ctx| println!("arg0 = {}", ctx.arg(0).unwrap()))).unwrap();
//! s.retprobe(t, "compute", RetProbe::new(16).ret(|ctx| println!("= {}", ctx.return_value()))).unwrap();
//! s.start().unwrap();
//! s.run().unwrap();
//! println!("{} hits", s.stats(p).unwrap().hits);
//! ```
//!
//! The engine ([`Engine`]) implements Kprobes' semantics once for any
//! [`Target`]: an `int3` at the probe point, the original instruction run
//! out of line in a scratch slot (boosted with a jump back when there is no
//! post handler and the instruction allows it, emulated for branches and
//! simple prologue instructions, single-stepped otherwise), return probes
//! through a trampoline and a per-thread shadow stack bounded by
//! `maxactive`, several probes per address, enable/disable at run time.

mod engine;
mod handler;

pub use engine::{Engine, Outcome, ProbeStats};
pub use handler::{EntryInfo, Handler, HitContext, HitKind, Probe, ProbeId, RetProbe};
pub use hotprobe_process::{ProcessError, ProcessTarget, SpawnOptions};
pub use hotprobe_symbols::{ProbeSpec, ResolvedProbe, SymbolError};
pub use hotprobe_target::{
    ExitStatus, Registers, ResumeMode, ReturnStrategy, RuntimeAddr, Target, TargetError,
    TargetEvent, ThreadId,
};
// Resolution lives below the engine (target crates implement `Resolver`
// without depending on it); re-exported under the names it always had.
pub use hotprobe_resolve::{
    check_probe_point, BlacklistEntry, ProcessResolver, Resolver, Symbolizer, SIGRETURN_SYMBOLS,
};

use std::time::Duration;

/// Errors of the engine and the session.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Starting or attaching to a process failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A probe spec did not resolve.
    #[error(transparent)]
    Symbol(#[from] SymbolError),
    /// The address cannot be probed safely.
    #[error("cannot probe {addr:#x}: {reason}")]
    Refused {
        /// The address.
        addr: u64,
        /// Why.
        reason: String,
    },
    /// A probe spec is not probeable (blacklisted, ambiguous).
    #[error("cannot probe {spec}: {reason}")]
    RefusedSpec {
        /// The spec as given.
        spec: String,
        /// Why.
        reason: String,
    },
    /// No probe with this id.
    #[error("no probe with id {}", .0 .0)]
    NoSuchProbe(ProbeId),
    /// No target with this id.
    #[error("no target with id {0}")]
    NoSuchTarget(usize),
    /// A thread's state no longer matches what the engine followed.
    #[error("thread {thread}: {why}")]
    Lost {
        /// The thread.
        thread: ThreadId,
        /// What went wrong.
        why: String,
    },
}

/// Identifies a target in a [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TargetId(pub usize);

/// Probe ids carry their target in the high bits.
const TARGET_SHIFT: u32 = 24;

struct Slot {
    engine: Engine,
    resolver: Option<Box<dyn Resolver>>,
}

/// How [`Session::run`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// A handler called [`HitContext::stop`].
    Stopped,
    /// Every target is gone.
    AllExited,
    /// The caller's interrupt flag was raised.
    Interrupted,
}

/// A probing session over one or more targets.
#[derive(Default)]
pub struct Session {
    slots: Vec<Slot>,
}

impl Session {
    /// An empty session.
    pub fn new() -> Self {
        Session::default()
    }

    /// Add any target, with an optional resolver for probe specs.
    pub fn add_target(
        &mut self,
        target: Box<dyn Target>,
        resolver: Option<Box<dyn Resolver>>,
    ) -> TargetId {
        let id = self.slots.len();
        let mut engine = Engine::new(target, (id as u32) << TARGET_SHIFT);
        if let Some(r) = &resolver {
            engine.set_symbolizer(r.symbolizer());
        }
        self.slots.push(Slot { engine, resolver });
        TargetId(id)
    }

    /// Start `program` with `args` stopped at its entry point (libraries loaded).
    pub fn spawn(
        &mut self,
        program: &std::path::Path,
        args: &[std::ffi::OsString],
    ) -> Result<TargetId, EngineError> {
        let t = ProcessTarget::spawn(program, args)?;
        let r = ProcessResolver::new(t.pid())?;
        Ok(self.add_target(Box::new(t), Some(Box::new(r))))
    }

    /// As [`Session::spawn`], with the child's standard streams redirected.
    pub fn spawn_with(
        &mut self,
        program: &std::path::Path,
        args: &[std::ffi::OsString],
        opts: &SpawnOptions,
    ) -> Result<TargetId, EngineError> {
        let t = ProcessTarget::spawn_with(program, args, opts)?;
        let r = ProcessResolver::new(t.pid())?;
        Ok(self.add_target(Box::new(t), Some(Box::new(r))))
    }

    /// Attach to process `pid` (all threads), stopped until [`Session::start`].
    pub fn attach(&mut self, pid: i32) -> Result<TargetId, EngineError> {
        let t = ProcessTarget::attach(pid)?;
        let r = ProcessResolver::new(pid)?;
        Ok(self.add_target(Box::new(t), Some(Box::new(r))))
    }

    fn slot(&mut self, t: TargetId) -> Result<&mut Slot, EngineError> {
        self.slots
            .get_mut(t.0)
            .ok_or(EngineError::NoSuchTarget(t.0))
    }

    fn slot_of(&mut self, id: ProbeId) -> Result<&mut Slot, EngineError> {
        self.slots
            .get_mut((id.0 >> TARGET_SHIFT) as usize)
            .ok_or(EngineError::NoSuchProbe(id))
    }

    /// The engine of a target (for lower-level control).
    pub fn engine(&mut self, t: TargetId) -> Result<&mut Engine, EngineError> {
        Ok(&mut self.slot(t)?.engine)
    }

    /// Resolve a probe spec (`[module:]function[+off]`, `[module:]0xADDR`,
    /// `file.c:LINE`, optionally `%return`) to checked, probeable addresses.
    pub fn resolve(&mut self, t: TargetId, spec: &str) -> Result<Vec<ResolvedProbe>, EngineError> {
        let parsed: ProbeSpec = spec.parse()?;
        let slot = self.slot(t)?;
        let resolver = slot
            .resolver
            .as_mut()
            .ok_or_else(|| EngineError::RefusedSpec {
                spec: spec.into(),
                reason: "this target has no symbols".into(),
            })?;
        let found = resolver.resolve(&parsed, slot.engine.target())?;
        slot.engine.set_symbolizer(resolver.symbolizer());
        for r in &found {
            resolver
                .check(r, slot.engine.target())
                .map_err(|reason| EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                })?;
            if slot.engine.in_scratch(r.addr) {
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason: "the address is in hotprobe's scratch memory".into(),
                });
            }
        }
        Ok(found)
    }

    fn resolve_one(&mut self, t: TargetId, spec: &str) -> Result<ResolvedProbe, EngineError> {
        let mut v = self.resolve(t, spec)?;
        if v.len() > 1 {
            let list: Vec<String> = v.iter().map(|r| r.to_string()).collect();
            return Err(EngineError::RefusedSpec {
                spec: spec.into(),
                reason: format!(
                    "it matches {} addresses ({}): name one",
                    v.len(),
                    list.join(", ")
                ),
            });
        }
        Ok(v.remove(0))
    }

    /// Put a probe on the instruction named by `spec`.
    pub fn probe(&mut self, t: TargetId, spec: &str, probe: Probe) -> Result<ProbeId, EngineError> {
        let r = self.resolve_one(t, spec)?;
        self.probe_addr(t, r.addr, probe)
    }

    /// Put a probe on a run-time address (no symbol checks).
    pub fn probe_addr(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
        probe: Probe,
    ) -> Result<ProbeId, EngineError> {
        let engine = &mut self.slot(t)?.engine;
        with_world_stopped(engine, |e| e.add_probe(addr, probe))
    }

    /// Put a return probe on the function named by `spec` (its entry).
    pub fn retprobe(
        &mut self,
        t: TargetId,
        spec: &str,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        let r = self.resolve_one(t, spec)?;
        if r.offset != 0 {
            return Err(EngineError::RefusedSpec {
                spec: spec.into(),
                reason: "a return probe goes on a function's first instruction".into(),
            });
        }
        self.retprobe_addr(t, r.addr, rp)
    }

    /// Put a return probe on the function entered at `addr`.
    pub fn retprobe_addr(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        let engine = &mut self.slot(t)?.engine;
        with_world_stopped(engine, |e| e.add_retprobe(addr, rp))
    }

    /// Enable or disable a probe at run time.
    pub fn set_enabled(&mut self, id: ProbeId, enabled: bool) -> Result<(), EngineError> {
        self.slot_of(id)?.engine.set_enabled(id, enabled)
    }

    /// Remove a probe.
    pub fn remove_probe(&mut self, id: ProbeId) -> Result<(), EngineError> {
        let engine = &mut self.slot_of(id)?.engine;
        with_world_stopped(engine, |e| e.remove_probe(id))
    }

    /// A probe's counts.
    pub fn stats(&self, id: ProbeId) -> Option<ProbeStats> {
        self.slots
            .get((id.0 >> TARGET_SHIFT) as usize)?
            .engine
            .stats(id)
    }

    /// How hits at this probe's address are executed.
    pub fn execution_of(&self, id: ProbeId) -> Option<&'static str> {
        let e = &self.slots.get((id.0 >> TARGET_SHIFT) as usize)?.engine;
        e.execution_of(e.probes.get(&id)?.addr)
    }

    /// Notices gathered since the last call (exec, fork, a target that died).
    pub fn take_notices(&mut self) -> Vec<String> {
        self.slots
            .iter_mut()
            .flat_map(|s| std::mem::take(&mut s.engine.notices))
            .collect()
    }

    /// Let every target run (after attaching/spawning and adding probes).
    pub fn start(&mut self) -> Result<(), EngineError> {
        for s in &mut self.slots {
            if s.engine.gone().is_none() && !s.engine.started {
                s.engine.target().resume_all()?;
                s.engine.started = true;
            }
        }
        Ok(())
    }

    /// Handle events until a handler stops, or every target is gone.
    pub fn run(&mut self) -> Result<RunEnd, EngineError> {
        self.run_until(&std::sync::atomic::AtomicBool::new(false))
    }

    /// As [`Session::run`], also returning when `interrupt` becomes true.
    /// With one target the loop blocks until the target's next event: set
    /// `interrupt` from a signal handler installed without `SA_RESTART`
    /// (the signal interrupts the wait), as the CLI does for Ctrl-C.
    pub fn run_until(
        &mut self,
        interrupt: &std::sync::atomic::AtomicBool,
    ) -> Result<RunEnd, EngineError> {
        use std::sync::atomic::Ordering;
        loop {
            if interrupt.load(Ordering::Relaxed) {
                return Ok(RunEnd::Interrupted);
            }
            let live: Vec<usize> = (0..self.slots.len())
                .filter(|i| self.slots[*i].engine.gone().is_none())
                .collect();
            if live.is_empty() {
                return Ok(RunEnd::AllExited);
            }
            // One target: block until its next event (a signal handler
            // installed without SA_RESTART interrupts the wait, so raise
            // `interrupt` from one). Several: poll each in turn.
            let timeout = if live.len() == 1 {
                None
            } else {
                Some(Duration::from_millis(1))
            };
            for i in live {
                let outcome = match self.slots[i].engine.poll(timeout) {
                    Ok(o) => o,
                    Err(EngineError::Target(TargetError::Gone { .. })) => continue,
                    Err(e) => return Err(e),
                };
                if outcome == Outcome::Stopped {
                    self.slots[i].engine.take_stop();
                    return Ok(RunEnd::Stopped);
                }
            }
        }
    }

    /// Detach from every target: handlers stop, threads leave scratch slots,
    /// return addresses are put back, original bytes restored, targets run on.
    pub fn detach(&mut self) -> Result<(), EngineError> {
        let mut first_err = None;
        for s in &mut self.slots {
            if let Err(e) = s.engine.detach() {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The unsafe probe points of a target: PLT stubs, signal trampolines,
    /// scratch memory.
    pub fn blacklist(&mut self, t: TargetId) -> Result<Vec<BlacklistEntry>, EngineError> {
        let slot = self.slot(t)?;
        let mut v = slot
            .resolver
            .as_ref()
            .map(|r| r.blacklist())
            .unwrap_or_default();
        let _ = &slot.engine;
        v.sort_by_key(|b| b.start);
        Ok(v)
    }
}

/// Run `f` with every thread of the engine's target stopped (the patching
/// invariant), resuming only the threads this call stopped.
fn with_world_stopped<R>(
    engine: &mut Engine,
    f: impl FnOnce(&mut Engine) -> Result<R, EngineError>,
) -> Result<R, EngineError> {
    if !engine.started {
        // Still stopped since spawn/attach.
        return f(engine);
    }
    engine.target().stop_all()?;
    let r = f(engine);
    engine.target().resume_all()?;
    r
}
