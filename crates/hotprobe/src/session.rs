//! The facade: a [`Session`] holds targets and owns every mechanism active
//! on each — the trap engine, the fast path (agent, shared memory, patch
//! and jump sites) — and the lifecycle (fork, exec, exit, interrupt,
//! detach) for all of them at once.

use crate::engine::Engine;
use crate::handler::{Probe, ProbeId, RetProbe};
use crate::plugin::{GuestPlugin, PluginOptions};
use crate::recorder::{DrainStats, EventSink, RingDrain};
use crate::{EngineError, ProbeStats, Resolver};
use hotprobe_fastpath::{FastPath, FastPathConfig, FunctionInfo, RecordedEvent, TrapTable};
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_symbols::{ProbeSpec, ResolvedProbe};
use hotprobe_target::{ExitStatus, RuntimeAddr, Target, TargetError, TargetEvent};
use ledger::ProbeOwner;

#[path = "session_foreign.rs"]
mod foreign;
#[path = "session_inproc.rs"]
mod inproc;
#[path = "session_ledger.rs"]
mod ledger;
use foreign::uprobes_on_rewritten_sites;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

// Watchpoints (`Session::watch`): a child module for the session's fields,
// in a file of its own.
#[path = "watch.rs"]
pub(crate) mod watch;

pub use hotprobe_fastpath::{MechanismChoice, PatchKind};

/// Identifies a target in a [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TargetId(pub usize);

/// Probe ids carry their target in the high bits.
const TARGET_SHIFT: u32 = 24;

/// What a probe does where it is placed.
pub enum Action {
    /// Handlers in hotprobe, before/after the instruction (full power:
    /// registers and memory, read and write).
    Handler(Probe),
    /// Handlers at a function's entry and return.
    Return(RetProbe),
    /// Count hits (with a `%return` spec: returns).
    Count,
    /// Record a time-stamped entry event with the first
    /// [`FastPathConfig::record_args`] argument registers and an exit event
    /// with the return value, into the session's [`EventSink`].
    Record,
}

/// What a trap `Record` probe reads at its hits beyond the argument
/// registers (typed arguments: floats in xmm registers, strings and fields
/// through pointers): called at the entry (`false`) and at the return
/// (`true`) while the thread is stopped, it appends bytes that the sink
/// gets with the event ([`EventSink::event_data`]).
pub type Capture = Rc<dyn Fn(&mut crate::HitContext<'_>, bool, &mut Vec<u8>)>;

/// Chooses the [`Capture`] of each function a `Record` action places
/// (`None`: the function records registers only, on any mechanism).
pub type CaptureChooser = Rc<dyn Fn(&ResolvedProbe) -> Option<Capture>>;

/// Chooses, for each function a `Record` action places, whether its
/// events record float and double values from xmm registers on the fast
/// path (`Some(k)`: the first `k` integer argument registers, then xmm0,
/// xmm1, … at entries; rax, rdx, xmm0 at exits; see
/// `hotprobe_abi::ACTION_XMM_SHIFT`). Asked before the [`CaptureChooser`];
/// a function the fast path takes this way is not given a capture.
pub type XmmChooser = Rc<dyn Fn(&ResolvedProbe) -> Option<u8>>;

/// How a probe's hits are executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// A compiler's placeholder NOP rewritten into a call to the agent
    /// (iProbe HotPatch): no trap.
    Patch(PatchKind),
    /// The entry's first instructions moved to a trampoline that calls the
    /// agent: no trap.
    Jump,
    /// A breakpoint handled by hotprobe through ptrace.
    Trap,
    /// A breakpoint in a guest, through QEMU's GDB stub.
    Stub,
    /// hotprobe's QEMU TCG plugin: the site instrumented at translation,
    /// gated by a flag; no stop of the VM.
    Plugin,
    /// Not placed yet: its module is not loaded (see [`Session::add`]).
    Pending,
    /// An `int3` taken by the agent's own `SIGTRAP` handler inside the
    /// process: no ptrace stop (`Count` where neither patch nor jump fits).
    InProcessTrap,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mechanism::Patch(k) => {
                write!(f, "{}", hotprobe_fastpath::Mechanism::Patch(*k))
            }
            Mechanism::Jump => f.write_str("jump"),
            Mechanism::Trap => f.write_str("trap"),
            Mechanism::Stub => f.write_str("stub"),
            Mechanism::Plugin => f.write_str("plugin"),
            Mechanism::Pending => f.write_str("pending"),
            Mechanism::InProcessTrap => f.write_str("in-process trap"),
        }
    }
}

/// A probe placed at one address.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Its id.
    pub id: ProbeId,
    /// What the user sees: the spec, or for a spec naming several
    /// addresses, the function (or `spec @ function+offset`).
    pub label: String,
    /// The run-time address.
    pub addr: RuntimeAddr,
    /// The function, when known.
    pub function: Option<String>,
    /// The module's file name (empty for a guest).
    pub module: String,
    /// A `%return` probe (hits are returns).
    pub is_return: bool,
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Why this mechanism (what the fast path found, or why it could not
    /// be used).
    pub reason: String,
    /// How hits execute, for a table: `patch (patchable entry)`, `jump`,
    /// `trap (boosted)`, `stub (emulated)` …
    pub execution: String,
    /// A recording probe that takes the function's entries only, and why:
    /// the function does not return to the address at `[rsp]`
    /// ([`ResolvedProbe::no_return`]), so no return is hooked.
    pub entry_only: Option<String>,
}

/// A match of a spec that was not placed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The function or address.
    pub label: String,
    /// Why.
    pub reason: String,
}

/// What [`Session::add`] did.
#[derive(Clone, Debug, Default)]
pub struct Added {
    /// Probes placed.
    pub placements: Vec<Placement>,
    /// Matches of a pattern that could not be probed.
    pub skipped: Vec<Skipped>,
    /// Matches the caller's filter left out (not probed).
    pub left_out: usize,
}

/// How [`Session::run`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// A handler called [`crate::HitContext::stop`].
    Stopped,
    /// Every target is gone.
    AllExited,
    /// The caller's interrupt flag was raised.
    Interrupted,
}

/// Settings of a session, read when targets are opened.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    /// How mechanisms are chosen for `Count` and `Record` actions.
    pub mechanism: MechanismChoice,
    /// Shared-memory sizes for the fast path (ring events, argument
    /// registers recorded, thread slots, probe ids).
    pub fast_path: FastPathConfig,
    /// Live return instances followed at once by trap `%return` counts.
    pub maxactive: usize,
    /// `Record` probes may fall back to the trap mechanism (a ptrace stop
    /// per hit) where the fast path cannot take a site; when false such
    /// sites are refused with the reason.
    pub record_traps: bool,
    /// No trap of either kind (ptrace or in-process) for `Count` and
    /// `Record` probes: a site that neither a patch nor a jump takes is
    /// refused with the reason (skipped, for a pattern).
    pub no_traps: bool,
    /// Follow forked children as targets of their own (their counts per
    /// process, see [`Session::stats_by_process`]; their recorded events
    /// under their own thread ids) instead of letting them run without
    /// probes (`strace -f`, `uftrace` habits). Probes with handlers of the
    /// caller's are not followed; `Count` and `Record` probes are.
    pub follow_forks: bool,
    /// Accept probe addresses not shown to start an instruction (no known
    /// boundary before them, e.g. in a stripped binary without
    /// `.eh_frame`, or decoding from one does not land on them):
    /// `--force`. Skips that check only, never the blacklist.
    pub force: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            mechanism: MechanismChoice::Auto,
            fast_path: FastPathConfig::default(),
            maxactive: 64,
            record_traps: true,
            no_traps: false,
            follow_forks: false,
            force: false,
        }
    }
}

/// The fast path of a target.
enum Fast {
    /// Not used, and why.
    Off(String),
    /// An attached process: the agent goes in at the first fast probe.
    Injectable,
    /// The agent is in and attached to our shared memory.
    On(Box<FastPath>),
}

/// A probe the fast path runs.
#[derive(Clone, Debug)]
struct FastProbe {
    /// Its counters: entries, and the exit placeholders' hits (returns)
    /// if any; one pair per place it was armed (a library loaded again
    /// at another address is probed again under the same probe).
    counters: Vec<(u32, Option<u32>)>,
}

/// A probe whose module was not loaded when it was added (or was
/// unloaded since): armed at the dynamic loader's rendezvous when the
/// module is mapped, before its constructors run; disarmed (nothing
/// written: the memory is gone) when it is unmapped.
struct Pending {
    /// The spec, resolved again at each change of the loaded modules.
    spec: String,
    /// The probe (an unarmed engine probe with the trap form of its action).
    id: ProbeId,
    /// `Count` or `Record`: the fast path may take it.
    fast_ok: bool,
    record: bool,
    is_return: bool,
    /// Where it is armed now.
    armed: Option<Armed>,
}

/// Where a pending probe is armed.
struct Armed {
    /// The module's path and the span of its mappings.
    path: PathBuf,
    start: u64,
    end: u64,
    addr: u64,
}

/// One target and everything active on it.
struct Slot {
    engine: Engine,
    resolver: Option<Box<dyn Resolver>>,
    /// A process's pid (None for guests).
    pid: Option<i32>,
    spawned: bool,
    fast: Fast,
    /// Session probe id of each fast-path probe id.
    fast_ids: Vec<Option<ProbeId>>,
    fast_probes: HashMap<ProbeId, FastProbe>,
    drain: RingDrain,
    /// Record probes on the trap mechanism push their events here.
    trap_events: Rc<RefCell<Vec<RecordedEvent>>>,
    /// Bytes captured with trap events: an event whose `reserved2` is
    /// `n > 0` carries entry `n - 1` (see [`Capture`]).
    trap_data: Rc<RefCell<Vec<Vec<u8>>>>,
    /// Probes that record (fast or trap): the loop drains for them.
    recording: bool,
    /// Probes on modules not loaded (yet, or any more).
    pending: Vec<Pending>,
    /// A followed fork child: the slot of the process the session started
    /// or attached to, whose probes (and fast path) it shares.
    root: Option<usize>,
    /// A followed child: the code the fast path rewrote, inherited from its
    /// parent (address, original bytes), restored if it is detached.
    inherited: Vec<(RuntimeAddr, Vec<u8>)>,
    /// Trap `Count`/`Record` probes a followed child gets too: (probe,
    /// address, `%return`, record, returns hooked).
    followable: Vec<(ProbeId, RuntimeAddr, bool, bool, bool)>,
    /// A followed child's probe ids → its root's.
    origin: HashMap<ProbeId, ProbeId>,
    /// A guest started with hotprobe's QEMU plugin.
    plugin: Option<Box<GuestPlugin>>,
    /// The `int3`s published in the fast path's trap table (address →
    /// original byte), for the agent to undo if we die (see
    /// [`Slot::publish_traps`]).
    published: HashMap<u64, u8>,
    /// `int3`s the trap table had no room for (past its
    /// [`hotprobe_fastpath::TRAP_SLOTS`]): they work (ptrace), but an agent
    /// whose tracer died cannot undo them. Not retried.
    overflow: std::collections::HashSet<u64>,
    /// Guard `int3`s (address → the breakpoint they guard, one byte before).
    guards: HashMap<u64, u64>,
    /// The process's modules and the `/proc/PID/maps` they were read from:
    /// read again only when the maps change (issue 14).
    symbols: Option<(String, std::sync::Arc<hotprobe_symbols::ProcessSymbols>)>,
    /// The fast path's writes already given to the engine as fork restores,
    /// and its `removals()` then (see `update_fork_restores`).
    fork_synced: (usize, u64),
    /// Trap return probes → the plain probe, at the same address and just
    /// before them, that publishes each call in the trap table before
    /// the return address is swapped ([`publisher`]).
    publishers: HashMap<ProbeId, ProbeId>,
    /// In-process traps placed (see `session_inproc`): probe → (address,
    /// has a shared-memory handler).
    inproc: HashMap<ProbeId, (u64, bool)>,
    /// Probes whose pre handler runs through shared memory, by fast-path
    /// counter (see `session_inproc`).
    shm_handlers: HashMap<u32, (ProbeId, Probe)>,
    /// Handler calls the session took, by fast-path counter, for every
    /// counter that ever had a shared-memory handler: its hits are the
    /// calls taken plus those the agent withdrew (see `stats_by_process`).
    shm_taken: HashMap<u32, u64>,
    /// Fast-path probes removed while the target ran (`remove_probe`):
    /// their counts stay readable, nothing else applies to them.
    removed_fast: std::collections::HashSet<ProbeId>,
    /// In-process and fast-path probes handed over to the engine (a trap
    /// probe came to the same address, or into a jump's bytes: see
    /// `session_ledger.rs`): probe → the engine probe that counts on for it.
    handed: HashMap<ProbeId, ProbeId>,
    /// The bytes the fast path wrote, by the address they start at: the
    /// ledger's index (a probe is fitted to the sites already there
    /// without walking them all), with the session probes on each site.
    fast_ranges: std::collections::BTreeMap<u64, ledger::FastSpan>,
}

impl Slot {
    /// Turns the fast path's sites another writer changed (see
    /// [`hotprobe_fastpath::ForeignWrite`]) into notices naming them.
    pub(crate) fn note_foreign_writes(&mut self) {
        let Fast::On(fp) = &mut self.fast else {
            return;
        };
        let found = fp.take_foreign_writes();
        if found.is_empty() {
            return;
        }
        let symbolizer = self.resolver.as_ref().map(|r| r.symbolizer());
        let hex = |b: &[u8]| {
            b.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for f in found {
            let name = symbolizer
                .as_ref()
                .and_then(|s| s.symbolize(RuntimeAddr(f.addr)))
                .map_or(String::new(), |n| format!("{n} "));
            let (left, found) = (hex(&f.expected), hex(&f.found));
            let site = format!("the probe site {name}at {:#x}", f.addr);
            use hotprobe_fastpath::ForeignOutcome as O;
            self.engine.notices.push(match f.outcome {
                O::Int3Kept => format!(
                    "{site} was changed by another writer while hotprobe's code was in it \
                     (hotprobe left {left}, found {found}): a kernel uprobe (bpftrace, perf probe) \
                     or a breakpoint on the same instruction (a hit on both crashes a jump or call \
                     site, and an int3 site's hits go to it); its int3 was kept, over the original \
                     instructions"
                ),
                O::Restored => format!(
                    "{site} was changed by another writer while hotprobe's code was in it \
                     (hotprobe left {left}, found {found}): a kernel uprobe placed and removed \
                     since (a hit on both crashes a jump or call site, and an int3 site's hits go \
                     to it); the original bytes were put back"
                ),
                O::LeftAsFound => format!(
                    "{site} holds code hotprobe did not write (hotprobe left {left}, found \
                     {found}): another tool's (a kernel uprobe's, a debugger's); it was left as \
                     found"
                ),
                O::LeftDisabled => format!(
                    "{site} stays disabled: its original bytes were changed since the disable \
                     (expected {left}, found {found}), by a kernel uprobe or a breakpoint; \
                     enabling it would break that probe"
                ),
            });
        }
    }

    /// Binds fast-path counters `entry` (and `exit`, an exit placeholder's)
    /// to session probe `id`: its counts are theirs (see
    /// [`Session::stats_by_process`]).
    fn bind_fast(&mut self, id: ProbeId, entry: u32, exit: Option<u32>) {
        self.fast_probes
            .entry(id)
            .or_insert_with(|| FastProbe {
                counters: Vec::new(),
            })
            .counters
            .push((entry, exit));
        for c in std::iter::once(entry).chain(exit) {
            let c = c as usize;
            if self.fast_ids.len() <= c {
                self.fast_ids.resize(c + 1, None);
            }
            self.fast_ids[c] = Some(id);
        }
    }

    fn is_process(&self) -> bool {
        self.pid.is_some()
    }

    fn fast_path(&self) -> Option<&FastPath> {
        match &self.fast {
            Fast::On(fp) => Some(fp),
            _ => None,
        }
    }

    /// The process target behind the engine.
    fn process(engine: &mut Engine) -> Option<&mut ProcessTarget> {
        engine.process()
    }

    /// The fast path's writes become the bytes a forked child gets back.
    /// Only what was written since the last call is added, unless writes
    /// were taken back since (then all again): probing N names one call
    /// each stays linear.
    fn update_fork_restores(&mut self) {
        let (count, removals) = match &self.fast {
            Fast::On(fp) => (fp.written_count(), fp.removals()),
            _ => (0, 0),
        };
        let (synced, seen) = self.fork_synced;
        let from = if removals == seen && count >= synced {
            synced
        } else {
            0
        };
        let more: Vec<(RuntimeAddr, Vec<u8>)> = match &self.fast {
            Fast::On(fp) => fp
                .written_since(from)
                .into_iter()
                .map(|(a, b)| (RuntimeAddr(a), b))
                .collect(),
            _ => Vec::new(),
        };
        if from == 0 {
            self.engine.set_fork_restores(more);
        } else {
            self.engine.extend_fork_restores(more);
        }
        self.fork_synced = (count, removals);
    }

    /// The fast path's trap table, when the agent is in.
    fn trap_table(&self) -> Option<TrapTable> {
        self.fast_path().map(FastPath::trap_table)
    }

    /// An attached process gets the agent before its first trap probe
    /// (quietly: without it, the probes work, only a hotprobe killed with
    /// them in leaves int3s nobody undoes).
    fn agent_for_traps(&mut self, config: &FastPathConfig) {
        if matches!(self.fast, Fast::Injectable) {
            let _ = self.ensure_fast(config);
            self.publish_traps();
        }
    }

    /// Publishes the `int3` about to be written at `addr` (its original
    /// byte read now), so that no moment passes with an unpublished one.
    fn prepublish_trap(&mut self, addr: RuntimeAddr) {
        let Some(table) = self.trap_table() else {
            return;
        };
        // Into the table only: `publish_traps` then takes it as new (and
        // guards it); a failed placement leaves an entry no int3 uses.
        let mut b = [0u8];
        if self.engine.target().read_memory(addr, &mut b).is_ok() {
            table.publish(addr.0, b[0], 0);
        }
    }

    /// Runs `f` on each fast-path counter of fast probe `id` (enable,
    /// disable, remove: see `hotprobe_fastpath`'s `control` module) with
    /// every thread stopped, then resumes them if the target was running.
    fn change_fast(
        &mut self,
        id: ProbeId,
        mut f: impl FnMut(
            &mut FastPath,
            &mut ProcessTarget,
            u32,
        ) -> Result<(), hotprobe_fastpath::FastPathError>,
    ) -> Result<(), EngineError> {
        let refused = |reason: &str| EngineError::RefusedSpec {
            spec: format!("probe {}", id.0),
            reason: reason.into(),
        };
        let counters: Vec<u32> = self
            .fast_probes
            .get(&id)
            .map(|p| p.counters.iter().map(|c| c.0).collect())
            .unwrap_or_default();
        let started = self.engine.started;
        let Slot { engine, fast, .. } = self;
        let Fast::On(fp) = fast else {
            return Err(refused("the fast path is not attached"));
        };
        if fp.is_detached() {
            return Err(refused("the fast path is detached"));
        }
        let pt = Slot::process(engine).ok_or_else(|| refused("not a process"))?;
        // A process running untraced is taken back for the rewrite (the
        // caller lets it go again: `Session::maybe_release`).
        if pt.is_released() {
            pt.reacquire()?;
        }
        let mut r = Ok(());
        for c in counters {
            r = f(fp, pt, c);
            if r.is_err() {
                break;
            }
        }
        let resumed = match started {
            true => pt.resume_all(),
            false => Ok(()),
        };
        self.note_foreign_writes();
        resumed?;
        Ok(r?)
    }

    /// Runs `f`, a change of the engine's breakpoints, with every thread
    /// stopped, then guards and publishes the new set before any thread
    /// runs (a guard left in an instruction whose breakpoint went would
    /// corrupt it).
    fn change_traps<R>(
        &mut self,
        f: impl FnOnce(&mut Engine) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let started = self.engine.started;
        if started {
            self.engine.target().stop_all()?;
        }
        let r = f(&mut self.engine);
        self.publish_traps();
        if started {
            self.engine.target().resume_all()?;
        }
        r
    }

    /// Brings the fast path's trap table in line with the process target's
    /// `int3`s (and out-of-line memory): an agent whose tracer died undoes
    /// them (hotprobe_agent's `orphan` module). Called after every change.
    fn publish_traps(&mut self) {
        let Some(table) = self.trap_table() else {
            return;
        };
        let Some(pt) = Slot::process(&mut self.engine) else {
            return;
        };
        match pt.take_breakpoint_changes() {
            Some(changed) => self.publish_changes(&table, changed),
            None => self.publish_all(&table),
        }
    }

    /// [`Slot::publish_traps`] for the `int3`s at `changed` (written or
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
    fn publish_changes(&mut self, table: &TrapTable, mut changed: Vec<u64>) {
        let Some(pt) = Slot::process(&mut self.engine) else {
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
        self.insert_guards(wanted);
        let Some(pt) = Slot::process(&mut self.engine) else {
            return;
        };
        let more = pt.take_breakpoint_changes();
        match more {
            Some(more) => changed.extend(more),
            None => changed.extend(self.every_known()),
        }
        let Some(pt) = Slot::process(&mut self.engine) else {
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
                    self.publish_one(table, a, b, flags);
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
    fn publish_one(&mut self, table: &TrapTable, a: u64, b: u8, flags: u32) {
        if self.published.get(&a) == Some(&b) || self.overflow.contains(&a) {
            return;
        }
        if table.publish(a, b, flags) {
            self.published.insert(a, b);
        } else {
            if self.overflow.is_empty() {
                self.engine.notices.push(format!(
                    "the agent's trap table is full ({} slots, guards included): \
                     int3s placed past it work, but a hotprobe killed with SIGKILL \
                     leaves them in",
                    hotprobe_fastpath::TRAP_SLOTS
                ));
            }
            self.overflow.insert(a);
        }
    }

    /// [`Slot::publish_traps`] over every `int3` of the target, and every
    /// address published, past the table or guarded: what a change of any
    /// of them needs, when the changes themselves are not known.
    fn publish_all(&mut self, table: &TrapTable) {
        let Some(pt) = Slot::process(&mut self.engine) else {
            return;
        };
        let _ = pt.take_breakpoint_changes();
        let every = self.every_known();
        self.publish_changes(table, every);
    }

    /// Every address [`Slot::publish_changes`] may have to look at: the
    /// target's `int3`s, the published ones, the ones past the table, the
    /// guards and their sites.
    fn every_known(&mut self) -> Vec<u64> {
        let mut v: Vec<u64> = Slot::process(&mut self.engine)
            .map(|pt| pt.breakpoints().into_iter().map(|(a, _)| a).collect())
            .unwrap_or_default();
        v.extend(self.published.keys());
        v.extend(&self.overflow);
        v.extend(self.guards.iter().flat_map(|(g, site)| [*g, *site]));
        v
    }

    /// Puts the guard `int3` one byte into each breakpoint of `sites`,
    /// except an instruction stepped in place (it runs where it is).
    fn insert_guards(&mut self, mut sites: Vec<u64>) {
        sites.retain(|a| self.engine.execution_of(RuntimeAddr(*a)) != Some("stepped in place"));
        let Some(pt) = Slot::process(&mut self.engine) else {
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
    fn unpublish_traps(&mut self) {
        if let Some(table) = self.trap_table() {
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

    /// The agent loaded and attached, loading it into an attached process
    /// on first use; `Err(reason)` when the fast path cannot be had.
    fn ensure_fast(&mut self, config: &FastPathConfig) -> Result<&mut FastPath, String> {
        if let Fast::Injectable = self.fast {
            let r = match hotprobe_fastpath::find_agent() {
                Err(e) => Err(e.to_string()),
                Ok(agent) => match Slot::process(&mut self.engine) {
                    None => Err("not a process".to_string()),
                    Some(pt) => FastPath::inject(pt, &agent, *config).map_err(|e| e.to_string()),
                },
            };
            self.fast = match r {
                Ok(fp) => Fast::On(Box::new(fp)),
                Err(why) => Fast::Off(format!("the agent could not be loaded: {why}")),
            };
        }
        match &mut self.fast {
            Fast::On(fp) => Ok(fp),
            Fast::Off(why) => Err(why.clone()),
            Fast::Injectable => Err("the agent is not loaded".into()),
        }
    }
}

/// A probing session over one or more targets.
#[derive(Default)]
pub struct Session {
    slots: Vec<Slot>,
    config: SessionConfig,
    /// Chooses what `Record` probes read at their hits beyond the argument
    /// registers (see [`Session::set_capture`]).
    capture: Option<CaptureChooser>,
    /// Which `Record` probes record xmm registers on the fast path (see
    /// [`Session::set_xmm_layout`]).
    xmm_layout: Option<XmmChooser>,
    /// Options of plugin probes being added (see [`Session::add_plugin`]).
    plugin_options: Option<PluginOptions>,
    /// How long each side of a shared-memory handler call spins before
    /// it sleeps (see [`Session::set_handler_spin`]); `None`: the default.
    handler_spin: Option<Duration>,
    /// How long a shared-memory handler request may wait to be taken
    /// before its thread withdraws it (see
    /// [`Session::set_handler_timeout`]); `None`: the default.
    handler_timeout: Option<Duration>,
    /// Hardware watchpoints ([`Session::watch`]).
    watches: watch::Watches,
    /// Inside [`Session::add_filtered`]: fast-path sites are written in one
    /// batch at its end, the target stopped once (issue 14).
    batching: bool,
    /// Wait statuses one process target reaped for another (shared by all).
    strays: hotprobe_process::Strays,
}

/// Where a resolved site goes.
enum Plan {
    Fast {
        path: PathBuf,
        bias: u64,
        function: FunctionInfo,
        reason: String,
        /// The run-time address and length of the bytes it rewrites.
        site: u64,
        len: usize,
    },
    Trap(String),
    /// The ptrace trap, joining a site already at the address (see
    /// `session_ledger.rs`): never an in-process trap.
    Join(String),
    /// The guest's QEMU plugin.
    Plugin(String),
}

impl Session {
    /// An empty session with the default settings.
    pub fn new() -> Self {
        Session::default()
    }

    /// An empty session with these settings.
    pub fn with_config(config: SessionConfig) -> Self {
        Session {
            slots: Vec::new(),
            config,
            plugin_options: None,
            handler_spin: None,
            handler_timeout: None,
            watches: watch::Watches::default(),
            capture: None,
            batching: false,
            xmm_layout: None,
            strays: Default::default(),
        }
    }

    /// The session's settings.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Add any target, with an optional resolver for probe specs. Only the
    /// trap (or stub) mechanism is used on it.
    pub fn add_target(
        &mut self,
        target: Box<dyn Target>,
        resolver: Option<Box<dyn Resolver>>,
    ) -> TargetId {
        self.push_slot(
            crate::HeldTarget::Other(target),
            resolver,
            None,
            false,
            Fast::Off("not a process".into()),
        )
    }

    /// Add a guest started with hotprobe's QEMU plugin (`target` is its
    /// GDB stub, `plugin` the plugin's shared memory; see
    /// `hotprobe_guest::launch`): `Count` and `Record` probes added before
    /// [`Session::start`] go to the plugin, handlers to the stub.
    pub fn add_plugin_guest(
        &mut self,
        target: Box<dyn Target>,
        resolver: Option<Box<dyn Resolver>>,
        plugin: hotprobe_qemu::PluginHost,
    ) -> TargetId {
        let t = self.add_target(target, resolver);
        self.slots[t.0].plugin = Some(Box::new(GuestPlugin::new(plugin)));
        t
    }

    /// As [`Session::add`] with `Count` or `Record`, for a guest with
    /// hotprobe's QEMU plugin, with what the plugin's events carry and how
    /// they travel. Elsewhere (and for sites added once the guest runs:
    /// they were not candidates) `opts` is ignored.
    pub fn add_plugin(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        opts: &PluginOptions,
    ) -> Result<Added, EngineError> {
        self.plugin_options = Some(opts.clone());
        let r = self.add_filtered(t, spec, action, &|_| true);
        self.plugin_options = None;
        r
    }

    /// The QEMU plugin's counters of a guest started with it.
    pub fn plugin_stats(&self, t: TargetId) -> Option<hotprobe_qemu::PluginStats> {
        Some(self.slots.get(t.0)?.plugin.as_ref()?.host.stats())
    }

    fn push_slot(
        &mut self,
        target: crate::HeldTarget,
        resolver: Option<Box<dyn Resolver>>,
        pid: Option<i32>,
        spawned: bool,
        fast: Fast,
    ) -> TargetId {
        let id = self.slots.len();
        let mut engine = Engine::holding(target, (id as u32) << TARGET_SHIFT);
        if let Some(r) = &resolver {
            engine.set_symbolizer(r.symbolizer());
        }
        self.slots.push(Slot {
            engine,
            resolver,
            pid,
            spawned,
            fast,
            fast_ids: Vec::new(),
            fast_probes: HashMap::new(),
            drain: RingDrain::default(),
            trap_events: Rc::new(RefCell::new(Vec::new())),
            trap_data: Rc::new(RefCell::new(Vec::new())),
            recording: false,
            pending: Vec::new(),
            root: None,
            inherited: Vec::new(),
            followable: Vec::new(),
            origin: HashMap::new(),
            plugin: None,
            published: HashMap::new(),
            overflow: Default::default(),
            guards: HashMap::new(),
            symbols: None,
            fork_synced: (0, 0),
            publishers: HashMap::new(),
            inproc: HashMap::new(),
            shm_handlers: HashMap::new(),
            shm_taken: HashMap::new(),
            removed_fast: Default::default(),
            handed: HashMap::new(),
            fast_ranges: Default::default(),
        });
        let follow = self.config.follow_forks && pid.is_some();
        let slot = &mut self.slots[id];
        slot.engine.follow_forks = follow;
        if let Fast::On(fp) = &slot.fast {
            fp.set_follow_forks(follow);
        }
        TargetId(id)
    }

    /// Start `program` with `args`, stopped before it runs its own code
    /// (libraries loaded). With the fast path on (any mechanism choice but
    /// `Trap`), the agent is preloaded.
    pub fn spawn(
        &mut self,
        program: &Path,
        args: &[std::ffi::OsString],
    ) -> Result<TargetId, EngineError> {
        self.spawn_with(program, args, &SpawnOptions::default())
    }

    /// As [`Session::spawn`], with the child's standard streams and
    /// environment as `opts` says.
    pub fn spawn_with(
        &mut self,
        program: &Path,
        args: &[std::ffi::OsString],
        opts: &SpawnOptions,
    ) -> Result<TargetId, EngineError> {
        let dup = |f: &Option<std::fs::File>| -> Result<Option<std::fs::File>, EngineError> {
            f.as_ref()
                .map(|f| f.try_clone())
                .transpose()
                .map_err(|e| EngineError::Io {
                    what: "duplicate a standard stream for the target".into(),
                    source: e,
                })
        };
        let mut opts = SpawnOptions {
            stdin: dup(&opts.stdin)?,
            stdout: dup(&opts.stdout)?,
            stderr: dup(&opts.stderr)?,
            env: opts.env.clone(),
            stop_at_entry: opts.stop_at_entry,
        };
        let mut pending = None;
        let mut fast_off = None;
        if self.config.mechanism == MechanismChoice::Trap {
            fast_off = Some("--mechanism trap".to_string());
        } else {
            match hotprobe_fastpath::find_agent() {
                Ok(agent) => {
                    pending = Some(FastPath::for_spawn(
                        &mut opts,
                        &agent,
                        self.config.fast_path,
                    )?)
                }
                // A bad explicit override is the user's error, not a reason
                // to fall back to traps quietly.
                Err(e @ hotprobe_fastpath::FastPathError::AgentOverride { .. }) => {
                    return Err(e.into())
                }
                Err(e) => fast_off = Some(e.to_string()),
            }
        }
        let mut t = ProcessTarget::spawn_with(program, args, &opts)?;
        t.share_strays(&self.strays);
        let fast = match (pending, fast_off) {
            (Some(p), _) => match p.attach(&mut t) {
                Ok(fp) => Fast::On(Box::new(fp)),
                Err(e) => Fast::Off(format!("no agent in the target ({e})")),
            },
            (None, Some(why)) => Fast::Off(why),
            (None, None) => Fast::Off("no agent".into()),
        };
        let pid = t.pid();
        let r = crate::ProcessResolver::new(pid)?;
        Ok(self.push_slot(t.into(), Some(Box::new(r)), Some(pid), true, fast))
    }

    /// Attach to process `pid` (all threads), stopped until
    /// [`Session::start`]. The agent is loaded at once when it can be
    /// (whatever the mechanisms: should hotprobe be killed, the agent undoes
    /// the trap mechanism's `int3`s, see [`hotprobe_fastpath::TrapTable`]);
    /// when it cannot, probes use traps.
    pub fn attach(&mut self, pid: i32) -> Result<TargetId, EngineError> {
        let fast = match hotprobe_fastpath::find_agent() {
            Err(e @ hotprobe_fastpath::FastPathError::AgentOverride { .. }) => return Err(e.into()),
            _ => Fast::Injectable,
        };
        let mut t = ProcessTarget::attach(pid)?;
        t.share_strays(&self.strays);
        let r = crate::ProcessResolver::new(pid)?;
        // The agent goes in with the first probe placed (fast or trap: with
        // it the program survives hotprobe's death, see `publish_traps`), so
        // that a refused probe leaves the process untouched.
        Ok(self.push_slot(t.into(), Some(Box::new(r)), Some(pid), false, fast))
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

    /// The process id of a process target.
    pub fn pid(&self, t: TargetId) -> Option<i32> {
        self.slots.get(t.0)?.pid
    }

    /// Whether the session started the target (rather than attached to it).
    pub fn is_spawned(&self, t: TargetId) -> bool {
        self.slots.get(t.0).is_some_and(|s| s.spawned)
    }

    /// Resolve a probe spec (`[module:]function[+off]`, `[module:]0xADDR`,
    /// `file.c:LINE`, optionally `%return`) to checked, probeable addresses.
    pub fn resolve(&mut self, t: TargetId, spec: &str) -> Result<Vec<ResolvedProbe>, EngineError> {
        let found = self.resolve_unchecked(t, spec)?;
        for r in &found {
            self.check(t, spec, r)?;
        }
        Ok(found)
    }

    fn resolve_unchecked(
        &mut self,
        t: TargetId,
        spec: &str,
    ) -> Result<Vec<ResolvedProbe>, EngineError> {
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
        Ok(found)
    }

    /// The blacklist, instruction-boundary and scratch-memory checks.
    fn check(&mut self, t: TargetId, spec: &str, r: &ResolvedProbe) -> Result<(), EngineError> {
        let options = crate::CheckOptions {
            force: self.config.force,
        };
        let slot = self.slot(t)?;
        let from = r.boundary.as_ref().map_or(r.addr.0, |b| b.start.0);
        let originals = slot.originals_in(from, r.addr.0 + hotprobe_x86::MAX_INSN_LEN as u64);
        if let Some(resolver) = slot.resolver.as_ref() {
            resolver
                .check_over(r, slot.engine.target(), options, &originals)
                .map_err(|reason| EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                })?;
        }
        let in_fast_pages = slot
            .fast_path()
            .is_some_and(|fp| fp.pages().iter().any(|(a, b)| (*a..*b).contains(&r.addr.0)));
        if slot.engine.in_scratch(r.addr) || in_fast_pages {
            return Err(EngineError::RefusedSpec {
                spec: spec.into(),
                reason: "the address is in hotprobe's scratch memory".into(),
            });
        }
        Ok(())
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

    /// Put a probe with handlers on the instruction named by `spec`, on
    /// the ptrace trap (a stop of the target per hit, the handlers run
    /// with it stopped). [`Session::add`] with [`Action::Handler`] picks
    /// the cheapest mechanism instead: a handler through shared memory at
    /// a patch or jump site or an in-process trap, no ptrace stop.
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
        self.note_plugin_overlap(t, addr, true);
        self.before_trap_at(t, addr)?;
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        slot.agent_for_traps(&config);
        slot.prepublish_trap(addr);
        slot.change_traps(|e| e.add_probe(addr, probe))
    }

    /// Put a return probe on the function named by `spec` (its entry).
    pub fn retprobe(
        &mut self,
        t: TargetId,
        spec: &str,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        let r = self.resolve_one(t, spec)?;
        if !r.is_entry() {
            return Err(not_an_entry(spec, &r));
        }
        self.retprobe_addr(t, r.addr, rp)
    }

    /// Put a return probe on the function entered at `addr`. Refused on
    /// functions that return twice (`setjmp`, `vfork`, …) and on Go
    /// functions (see [`crate::nonlocal`]).
    pub fn retprobe_addr(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        self.note_plugin_overlap(t, addr, true);
        if let Some(pid) = self.slot(t)?.pid {
            crate::nonlocal::check_return_probe(pid, addr)?;
        }
        self.before_trap_at(t, addr)?;
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        slot.agent_for_traps(&config);
        let table = slot.trap_table();
        slot.prepublish_trap(addr);
        let (id, publishing) = slot.change_traps(|e| {
            let publishing = match table {
                Some(table) => Some(e.add_probe(addr, publisher(table))?),
                None => None,
            };
            match e.add_retprobe(addr, rp) {
                Ok(id) => Ok((id, publishing)),
                Err(err) => {
                    if let Some(p) = publishing {
                        let _ = e.remove_probe(p);
                    }
                    Err(err)
                }
            }
        })?;
        if let Some(p) = publishing {
            slot.engine.mark_internal(p);
            slot.publishers.insert(id, p);
        }
        if let Some(pid) = slot.pid {
            crate::nonlocal::sync_unwind_hooks(&mut slot.engine, pid);
        }
        Ok(id)
    }

    /// A stub probe where the guest's QEMU plugin instruments too (`stub`:
    /// a stub probe is being added; else a plugin probe): the stub emulates
    /// the instruction or runs it out of line, so the plugin's probes there
    /// do not see those executions. Said in a notice.
    fn note_plugin_overlap(&mut self, t: TargetId, addr: RuntimeAddr, stub: bool) {
        let Ok(slot) = self.slot(t) else { return };
        let plugin_there = !stub || slot.plugin.as_ref().is_some_and(|p| p.is_site(addr.0));
        let stub_there = stub || slot.engine.execution_of(addr).is_some();
        if slot.plugin.is_some() && plugin_there && stub_there {
            slot.engine.notices.push(format!(
                "{addr}: a GDB-stub probe shares this address with QEMU-plugin probes: the \
                 executions the stub handles (it emulates the instruction or runs it out of \
                 line) are not seen by the plugin's probes"
            ));
        }
    }

    /// What `Record` probes added from now on read at their hits beyond the
    /// argument registers: a function the chooser gives a [`Capture`] is
    /// put on the trap mechanism (the capture reads the stopped thread's
    /// vector registers and memory at the hit, so a string is copied while
    /// its pointer is alive), its events reach the sink with the captured
    /// bytes. Children followed after a fork record registers only.
    pub fn set_capture(&mut self, chooser: Option<CaptureChooser>) {
        self.capture = chooser;
    }

    /// Which `Record` probes added from now on record float and double
    /// values from xmm registers on the fast path (patch or jump, with
    /// 64-byte event slots): a function the chooser gives `Some(k)` and
    /// the fast path takes records the first `k` integer argument
    /// registers then xmm0, xmm1, … (its events carry
    /// `hotprobe_abi::EVENT_XMM`), and is not given a [`Capture`]. Others
    /// (no fast path, compact slots) go to the capture chooser as before.
    pub fn set_xmm_layout(&mut self, chooser: Option<XmmChooser>) {
        self.xmm_layout = chooser;
    }

    /// Put probes doing `action` on every address `spec` names (a pattern
    /// in a function name names every matching function), each on the
    /// cheapest mechanism that fits — patch, then jump, then trap for
    /// processes; the stub for guests — or on the session's forced one.
    /// Handler actions take one address. For a pattern, matches that
    /// cannot be probed are returned as skipped; otherwise they are errors.
    pub fn add(&mut self, t: TargetId, spec: &str, action: Action) -> Result<Added, EngineError> {
        self.add_filtered(t, spec, action, &|_| true)
    }

    /// As [`Session::add`], with `mechanism` for this spec alone instead of
    /// the session's ([`SessionConfig::mechanism`]): `Trap` is the ptrace
    /// trap, `Patch` and `Jump` the fast path's, `Auto` the usual choice
    /// (an in-process trap where no patch or jump fits). A probe at an
    /// address another mechanism serves joins that site whatever is asked
    /// (its placement says which serves it; see the code ledger in
    /// docs/DESIGN.md).
    pub fn add_using(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        mechanism: MechanismChoice,
    ) -> Result<Added, EngineError> {
        let session = std::mem::replace(&mut self.config.mechanism, mechanism);
        let added = self.add(t, spec, action);
        self.config.mechanism = session;
        added
    }

    /// As [`Session::add`], leaving out the matches whose function name
    /// `keep` refuses (counted in [`Added::left_out`], not probed). The
    /// fast-path sites of all the matches are written in one batch, the
    /// target's threads stopped once (see
    /// [`hotprobe_fastpath::FastPath::begin_batch`]).
    pub fn add_filtered(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Added, EngineError> {
        self.batching = true;
        let added = self.add_filtered_unbatched(t, spec, action, keep);
        self.batching = false;
        let flushed = self.end_batch(t);
        let added = added?;
        flushed?;
        Ok(added)
    }

    /// Process `pid`'s modules (target `t`), read again only when its
    /// `/proc/PID/maps` changed since the last read.
    fn process_symbols(
        &mut self,
        t: TargetId,
        pid: i32,
    ) -> Result<std::sync::Arc<hotprobe_symbols::ProcessSymbols>, EngineError> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let slot = self.slot(t)?;
        if let Some((seen, syms)) = &slot.symbols {
            if !maps.is_empty() && *seen == maps {
                return Ok(syms.clone());
            }
        }
        let syms = std::sync::Arc::new(hotprobe_symbols::ProcessSymbols::for_pid(pid as u32)?);
        slot.symbols = Some((maps, syms.clone()));
        Ok(syms)
    }

    /// Writes what target `t`'s fast path held back in a batch (see
    /// [`Session::add_filtered`]) and lets a started target run again.
    fn end_batch(&mut self, t: TargetId) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        let Slot { engine, fast, .. } = slot;
        let Fast::On(fp) = fast else {
            return Ok(());
        };
        if !fp.in_batch() {
            return Ok(());
        }
        let Some(pt) = Slot::process(engine) else {
            return Ok(());
        };
        let r = fp.end_batch(pt);
        if started {
            pt.resume_all()?;
        }
        Ok(r?)
    }

    fn add_filtered_unbatched(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Added, EngineError> {
        let parsed: ProbeSpec = spec.parse()?;
        let is_return = parsed.is_return();
        // A module glob (`'*:malloc'`) names functions of several modules:
        // a pattern too, each row named `module:function`.
        let module_glob =
            matches!(&parsed, ProbeSpec::Function { module: Some(m), .. } if is_pattern(m));
        let pattern =
            module_glob || matches!(&parsed, ProbeSpec::Function { name, .. } if is_pattern(name));
        match action {
            Action::Handler(p) => {
                let r = match self.resolve_one(t, spec) {
                    Err(e) if not_loaded(&e) => {
                        return self.add_pending(t, spec, Some(p), None, false, is_return, e)
                    }
                    r => r?,
                };
                let p = match self.place_shm_handler(t, &r, p, spec.to_string())? {
                    Ok(placed) => {
                        self.maybe_release(t.0);
                        return Ok(Added {
                            placements: vec![placed],
                            ..Added::default()
                        });
                    }
                    Err(p) => p,
                };
                let id = self.probe_addr(t, r.addr, p)?;
                return Ok(Added {
                    placements: vec![self.placement(t, id, spec.to_string(), &r, None)],
                    ..Added::default()
                });
            }
            Action::Return(rp) => {
                let r = match self.resolve_one(t, spec) {
                    Err(e) if not_loaded(&e) => {
                        return self.add_pending(t, spec, None, Some(rp), false, true, e)
                    }
                    r => r?,
                };
                if !r.is_entry() {
                    return Err(not_an_entry(spec, &r));
                }
                if let Some(why) = &r.no_return {
                    return Err(EngineError::RefusedSpec {
                        spec: spec.into(),
                        reason: why.clone(),
                    });
                }
                let id = self.retprobe_addr(t, r.addr, rp)?;
                return Ok(Added {
                    placements: vec![self.placement(t, id, spec.to_string(), &r, None)],
                    ..Added::default()
                });
            }
            Action::Count | Action::Record => {}
        }
        let record = matches!(action, Action::Record);
        let found = match self.resolve_unchecked(t, spec) {
            Err(e) if not_loaded(&e) && !pattern => {
                let (p, rp) = self.trap_form(t, is_return, record, None, true)?;
                return self.add_pending(t, spec, p, rp, true, is_return, e);
            }
            found => found?,
        };
        let many = found.len() > 1;
        let mut added = Added::default();
        let symbols = match self.slot(t)?.pid {
            Some(pid) => Some(self.process_symbols(t, pid)?),
            None => None,
        };
        for r in found {
            if matches!(r.function.as_deref(), Some(f) if !keep(f)) {
                added.left_out += 1;
                continue;
            }
            let label = match (&r.function, pattern || many) {
                (Some(f), true) if r.offset == 0 && pattern => {
                    let m = if module_glob {
                        format!("{}:", r.module)
                    } else {
                        String::new()
                    };
                    format!("{m}{f}{}", if is_return { "%return" } else { "" })
                }
                (_, true) => format!("{spec} @ {}", short(&r)),
                (_, false) => spec.to_string(),
            };
            // A pattern names functions: a `.cold` partition or a label
            // it matches is none (whatever the action).
            if let (true, Some(why)) = (pattern, r.kind.as_ref().and_then(|k| k.summary())) {
                added.skipped.push(Skipped {
                    label,
                    reason: format!("not a function entry: {why}"),
                });
                continue;
            }
            if (record || is_return) && r.offset == 0 && !r.is_entry() {
                return Err(not_an_entry(spec, &r));
            }
            // No return to hook: `%return` is refused, recording takes
            // the entries only (see `entry_only`).
            if let (true, Some(why)) = (is_return, &r.no_return) {
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: why.clone(),
                    });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason: why.clone(),
                });
            }
            // Inside a function, an in-process trap records hit events
            // (no return to hook); nothing else records there.
            let mid_record = record && r.offset != 0;
            if mid_record
                && (pattern || is_return || self.config.mechanism != MechanismChoice::Auto)
            {
                let e = not_whole_function(spec, &r);
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: e.to_string(),
                    });
                    continue;
                }
                return Err(e);
            }
            if let Err(e) = self.check(t, spec, &r) {
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: match e {
                            EngineError::RefusedSpec { reason, .. } => reason,
                            e => e.to_string(),
                        },
                    });
                    continue;
                }
                return Err(e);
            }
            let mut plan = match self.plan_resolved(t, &r, is_return, record, symbols.as_deref()) {
                // A forced mechanism with a pattern: what cannot take it
                // is listed, the rest placed (issue 23).
                Err(e) if pattern && self.config.mechanism != MechanismChoice::Auto => {
                    let reason = match e {
                        EngineError::RefusedSpec { reason, .. } => reason,
                        e => e.to_string(),
                    };
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                plan => plan?,
            };
            let full_slots = self.config.fast_path.record_args > 2;
            let xmm = match (&self.xmm_layout, record && !is_return, &plan) {
                (Some(choose), true, Plan::Fast { .. }) if full_slots => choose(&r),
                _ => None,
            };
            let capture = match (&self.capture, record && !is_return, xmm) {
                (Some(choose), true, None) => choose(&r),
                _ => None,
            };
            if capture.is_some() && !matches!(plan, Plan::Trap(_)) {
                plan = Plan::Trap("typed values read at the hit (DWARF)".into());
            }
            let fast_ok = capture.is_none() && (record || !is_return);
            plan = self.fit_to_ledger(t, &r, plan, fast_ok)?;
            if let (true, Plan::Trap(why) | Plan::Join(why)) = (self.config.no_traps, &plan) {
                let reason = format!("needs a trap ({why})");
                if pattern {
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                });
            }
            // An in-process trap may still take it (refused below if not);
            // typed values (captured at the hit) need the ptrace trap.
            let inproc_first =
                !is_return && capture.is_none() && self.config.mechanism == MechanismChoice::Auto;
            if let (Plan::Trap(why) | Plan::Join(why), true, false) = (
                &plan,
                record && !self.config.record_traps && capture.is_none(),
                inproc_first && !matches!(plan, Plan::Join(_)),
            ) {
                let reason = format!("needs the trap mechanism ({why})");
                if pattern {
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                });
            }
            let placed = match std::mem::replace(&mut plan, Plan::Trap(String::new())) {
                Plan::Fast {
                    path,
                    bias,
                    function,
                    reason,
                    ..
                } => {
                    let reason = match xmm {
                        Some(_) => format!("{reason}; float/double values from xmm registers"),
                        None => reason,
                    };
                    let placed = self.place_fast(
                        t,
                        &r,
                        &path,
                        bias,
                        &function,
                        record,
                        xmm,
                        reason,
                        label.clone(),
                        None,
                    );
                    match (placed, &self.capture) {
                        // The fast path refused the xmm layout (compact
                        // slots, coldpatch exits): the values are read at
                        // the hit instead, as without it.
                        (Err(EngineError::FastPath(why)), Some(choose)) if xmm.is_some() => {
                            let capture = choose(&r);
                            let reason =
                                format!("typed values read at the hit (DWARF); fast path: {why}");
                            self.place_trap(t, &r, is_return, record, reason, label, capture)
                        }
                        (placed, _) => placed,
                    }
                }
                Plan::Trap(reason) if inproc_first => {
                    match self.place_inproc(t, &r, &reason, label.clone(), record)? {
                        Ok(p) => Ok(p),
                        Err(why) if mid_record => Err(match not_whole_function(spec, &r) {
                            EngineError::RefusedSpec { spec, reason } => EngineError::RefusedSpec {
                                spec,
                                reason: format!("{reason}; in-process trap: {why}"),
                            },
                            e => e,
                        }),
                        Err(why) => {
                            let reason = format!("{reason}; in-process trap: {why}");
                            if record && !self.config.record_traps && capture.is_none() {
                                Err(EngineError::RefusedSpec {
                                    spec: spec.into(),
                                    reason: format!("needs the trap mechanism ({reason})"),
                                })
                            } else {
                                self.place_trap(t, &r, is_return, record, reason, label, capture)
                            }
                        }
                    }
                }
                Plan::Trap(reason) | Plan::Join(reason) => {
                    self.place_trap(t, &r, is_return, record, reason, label, capture)
                }
                Plan::Plugin(reason) => self.place_plugin(t, &r, is_return, record, reason, label),
            };
            match placed {
                Ok(p) => added.placements.push(p),
                Err(e) if pattern => added.skipped.push(Skipped {
                    label: r.function.clone().unwrap_or_else(|| r.addr.to_string()),
                    reason: e.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        let slot = self.slot(t)?;
        slot.update_fork_restores();
        if record && !added.placements.is_empty() {
            slot.recording = true;
        }
        self.maybe_release(t.0);
        Ok(added)
    }

    fn plan_resolved(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        symbols: Option<&hotprobe_symbols::ProcessSymbols>,
    ) -> Result<Plan, EngineError> {
        let choice = self.config.mechanism;
        let config = self.config.fast_path;
        let forced = matches!(choice, MechanismChoice::Patch | MechanismChoice::Jump);
        let slot = self.slot(t)?;
        if let Some(p) = &slot.plugin {
            return Ok(if p.host.is_frozen() {
                Plan::Trap(
                    "added once the guest ran: not a candidate of the QEMU plugin, \
                     so the GDB stub takes it"
                        .into(),
                )
            } else {
                Plan::Plugin("instrumented by QEMU at translation, gated by a flag".into())
            });
        }
        let Some(symbols) = symbols.filter(|_| slot.is_process()) else {
            return Ok(Plan::Trap("guest probes use the GDB stub".into()));
        };
        let trap_only = if choice == MechanismChoice::Trap {
            Some("--mechanism trap".to_string())
        } else if is_return && !record {
            Some("return counts use a return probe".to_string())
        } else if r.offset != 0 || !r.is_entry() {
            Some("not a function entry (the fast path probes entries)".to_string())
        } else {
            None
        };
        if let Some(why) = trap_only {
            if forced {
                return Err(EngineError::RefusedSpec {
                    spec: r.to_string(),
                    reason: format!("--mechanism patch|jump applies to function entries: {why}"),
                });
            }
            return Ok(Plan::Trap(why));
        }
        let Some(module) = symbols.modules().iter().find(|m| m.contains(r.addr)) else {
            return Ok(Plan::Trap("no module maps this address".into()));
        };
        // The file the symbols were read from: a program or library
        // replaced on disk since it was mapped is read through the
        // mapping (`/proc/PID/map_files`), never through its old path,
        // which now names another file (issue 22).
        let (path, bias) = (module.module.path().to_path_buf(), module.bias.0);
        let fp = match slot.ensure_fast(&config) {
            Ok(fp) => fp,
            Err(why) if !forced => return Ok(Plan::Trap(why)),
            Err(why) => {
                return Err(EngineError::RefusedSpec {
                    spec: r.to_string(),
                    reason: why,
                })
            }
        };
        let function = match fp.function_at(&path, r.link_addr.0, r.function.as_deref()) {
            Ok(f) => f,
            Err(e) if !forced => return Ok(Plan::Trap(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let plan = fp.plan(&path, &function, choice)?;
        Ok(match plan.mechanism {
            hotprobe_fastpath::Mechanism::Trap => Plan::Trap(plan.reason),
            _ => Plan::Fast {
                path,
                bias,
                function,
                reason: plan.reason,
                site: plan.site.wrapping_add(bias),
                len: plan.len,
            },
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn place_fast(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        path: &Path,
        bias: u64,
        function: &FunctionInfo,
        record: bool,
        xmm: Option<u8>,
        reason: String,
        label: String,
        existing: Option<ProbeId>,
    ) -> Result<Placement, EngineError> {
        let choice = self.config.mechanism;
        let batching = self.batching;
        let slot = self.slot(t)?;
        let id = match existing {
            Some(id) => id,
            None => slot.engine.new_id(),
        };
        let started = slot.engine.started;
        let Slot { engine, fast, .. } = slot;
        let Fast::On(fp) = fast else {
            unreachable!("planned on the fast path")
        };
        let pt = Slot::process(engine).ok_or_else(|| EngineError::RefusedSpec {
            spec: label.clone(),
            reason: "not a process".into(),
        })?;
        let entry_only = r.no_return.clone().filter(|_| record);
        let action = if record {
            let a = hotprobe_fastpath::Action::record();
            let a = match entry_only {
                Some(_) => a,
                None => a.with_exit(),
            };
            match xmm {
                Some(k) => a.with_xmm(k),
                None => a,
            }
        } else {
            hotprobe_fastpath::Action::count()
        };
        if batching {
            fp.begin_batch();
        }
        let written_before = fp.written_count();
        let info = fp.add_function(pt, path, bias, function, action, choice);
        if started && !fp.in_batch() {
            pt.resume_all()?;
        }
        let info = info?;
        slot.bind_fast(id, info.probe_id, info.exit_probe_id);
        if let Fast::On(fp) = &slot.fast {
            ledger::FastSpan::add(
                &mut slot.fast_ranges,
                fp.written_spans_since(written_before),
            );
        }
        ledger::FastSpan::add_probe(&mut slot.fast_ranges, info.addr, (id, record));
        let mechanism = from_fast(info.mechanism);
        Ok(Placement {
            id,
            label,
            addr: RuntimeAddr(info.addr),
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism,
            reason,
            execution: mechanism.to_string(),
            entry_only,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn place_trap(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        reason: String,
        label: String,
        capture: Option<Capture>,
    ) -> Result<Placement, EngineError> {
        let entry_only = r.no_return.clone().filter(|_| record);
        let form = self.trap_form(t, is_return, record, capture, entry_only.is_none())?;
        let id = match form {
            (_, Some(rp)) => self.retprobe_addr(t, r.addr, rp)?,
            (p, None) => self.probe_addr(t, r.addr, p.unwrap_or_default())?,
        };
        self.slot(t)?
            .followable
            .push((id, r.addr, is_return, record, entry_only.is_none()));
        let mut placed = self.placement(t, id, label, r, Some(reason));
        placed.entry_only = entry_only;
        Ok(placed)
    }

    /// A `Count` or `Record` probe on a guest's QEMU plugin.
    fn place_plugin(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        reason: String,
        label: String,
    ) -> Result<Placement, EngineError> {
        let opts = self.plugin_options.clone().unwrap_or_default();
        let nargs = self.config.fast_path.record_args.min(6) as usize;
        let maxactive = self.config.maxactive;
        let thunk = match self.slot(t)?.plugin.as_ref().is_some_and(|p| !p.thunk_set) {
            true => self
                .resolve_unchecked(t, "__x86_return_thunk")
                .ok()
                .and_then(|v| v.first().map(|r| r.addr.0)),
            false => None,
        };
        let slot = self.slot(t)?;
        let id = slot.engine.new_id();
        let Some(p) = slot.plugin.as_mut() else {
            unreachable!("planned on the plugin")
        };
        if !p.thunk_set {
            p.thunk_set = true;
            if let Some(a) = thunk {
                let _ = p.host.set_return_thunk(a);
            }
        }
        let range = r.function_range.as_ref().map(|x| (x.start.0, x.end.0));
        let stub_there = slot.engine.execution_of(r.addr).is_some();
        let refused = |reason: String| EngineError::RefusedSpec {
            spec: label.clone(),
            reason,
        };
        if (is_return || record) && (r.offset != 0 || range.is_none()) {
            return Err(refused(
                "a return on the QEMU plugin needs a function entry with a known size".into(),
            ));
        }
        p.add(
            id, r.addr.0, range, is_return, record, nargs, maxactive, &opts,
        )
        .map_err(refused)?;
        if stub_there {
            self.note_plugin_overlap(t, r.addr, false);
        }
        let execution = match (record, opts.delivery) {
            (false, _) => "plugin (count)",
            (true, hotprobe_qemu::Delivery::Sync) => "plugin (record, synchronous)",
            (true, _) => "plugin (record)",
        };
        Ok(Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return,
            mechanism: Mechanism::Plugin,
            reason,
            execution: execution.into(),
            entry_only: None,
        })
    }

    /// The trap form of a `Count` (`%return`: a return probe) or `Record`
    /// action: a return probe whose handlers queue time-stamped entry and
    /// exit events for the drain.
    fn trap_form(
        &mut self,
        t: TargetId,
        is_return: bool,
        record: bool,
        capture: Option<Capture>,
        exits: bool,
    ) -> Result<(Option<Probe>, Option<RetProbe>), EngineError> {
        let maxactive = self.config.maxactive;
        let nargs = self.config.fast_path.record_args.min(6) as usize;
        Ok(if record && !exits {
            // Entries only (the function does not return to `[rsp]`).
            let events = self.slot(t)?.trap_events.clone();
            let data = self.slot(t)?.trap_data.clone();
            let probe = Probe::new().pre(move |ctx| {
                let mut ev = trap_event(ctx, hotprobe_fastpath::KIND_ENTRY);
                ev.nargs = nargs as u8;
                for (i, a) in ev.args.iter_mut().take(nargs).enumerate() {
                    *a = ctx.arg(i).unwrap_or(0);
                }
                if let Some(c) = &capture {
                    ev.reserved2 = captured(ctx, c, false, &data);
                }
                events.borrow_mut().push(ev);
            });
            (Some(probe), None)
        } else if record {
            let events = self.slot(t)?.trap_events.clone();
            let exits = events.clone();
            let data = self.slot(t)?.trap_data.clone();
            let exit_data = data.clone();
            let exit_capture = capture.clone();
            let rp = RetProbe::new(maxactive)
                .entry(move |ctx| {
                    let mut ev = trap_event(ctx, hotprobe_fastpath::KIND_ENTRY);
                    ev.nargs = nargs as u8;
                    for (i, a) in ev.args.iter_mut().take(nargs).enumerate() {
                        *a = ctx.arg(i).unwrap_or(0);
                    }
                    if let Some(c) = &capture {
                        ev.reserved2 = captured(ctx, c, false, &data);
                    }
                    events.borrow_mut().push(ev);
                })
                .ret(move |ctx| {
                    let mut ev = trap_event(ctx, hotprobe_fastpath::KIND_EXIT);
                    if nargs > 0 {
                        ev.nargs = 2;
                        ev.args[0] = ctx.regs().rax;
                        ev.args[1] = ctx.regs().rdx;
                    }
                    if let Some(c) = &exit_capture {
                        ev.reserved2 = captured(ctx, c, true, &exit_data);
                    }
                    exits.borrow_mut().push(ev);
                });
            (None, Some(rp))
        } else if is_return {
            (None, Some(RetProbe::new(maxactive)))
        } else {
            (Some(Probe::new()), None)
        })
    }

    /// A probe on a module that is not loaded: pending, armed when the
    /// program maps the module (see [`Pending`]). `why` is the resolver's
    /// refusal, for targets that cannot follow their loader.
    #[allow(clippy::too_many_arguments)]
    fn add_pending(
        &mut self,
        t: TargetId,
        spec: &str,
        probe: Option<Probe>,
        rp: Option<RetProbe>,
        fast_ok: bool,
        is_return: bool,
        why: EngineError,
    ) -> Result<Added, EngineError> {
        let record = fast_ok && rp.as_ref().is_some_and(|r| r.entry.is_some());
        let slot = self.slot(t)?;
        if !slot.is_process() {
            return Err(why);
        }
        // Pending only for a library that exists: a misspelt name is an
        // error now, not a probe that waits forever.
        let module = match &why {
            EngineError::Symbol(hotprobe_symbols::SymbolError::ModuleNotFound { name, .. }) => {
                name.clone()
            }
            _ => return Err(why),
        };
        let program_dir = Slot::process(&mut slot.engine)
            .and_then(|pt| pt.program().parent().map(Path::to_path_buf));
        if hotprobe_symbols::find_library(&module, program_dir.as_deref()).is_none() {
            return Err(why);
        }
        let publishing = match (&rp, slot.trap_table()) {
            (Some(_), Some(table)) => Some(slot.engine.add_unarmed(Some(publisher(table)), None)),
            _ => None,
        };
        let id = slot.engine.add_unarmed(probe, rp);
        if let Some(p) = publishing {
            slot.engine.mark_internal(p);
            slot.publishers.insert(id, p);
        }
        slot.pending.push(Pending {
            spec: spec.to_string(),
            id,
            fast_ok,
            record,
            is_return,
            armed: None,
        });
        if record {
            slot.recording = true;
        }
        Ok(Added {
            placements: vec![Placement {
                id,
                label: spec.to_string(),
                addr: RuntimeAddr(0),
                function: None,
                reason: format!("{module} is not loaded: armed when the program loads it"),
                module,
                is_return,
                mechanism: Mechanism::Pending,
                execution: "pending".into(),
                entry_only: None,
            }],
            ..Added::default()
        })
    }

    /// After the loaded modules changed (the loader's rendezvous, the
    /// thread stopped there, before any new constructor runs): disarms
    /// pending probes whose module is gone, arms those whose module is now
    /// mapped. What fails is said in a notice; the run goes on.
    fn refresh_pending(&mut self, i: usize) {
        let t = TargetId(i);
        let Some(pid) = self.slots[i].pid else { return };
        if self.slots[i].pending.is_empty() {
            return;
        }
        let syms = match hotprobe_symbols::ProcessSymbols::for_pid(pid as u32) {
            Ok(s) => s,
            Err(e) => {
                self.slots[i]
                    .engine
                    .notices
                    .push(format!("pid {pid}: cannot read its modules: {e}"));
                return;
            }
        };
        for k in 0..self.slots[i].pending.len() {
            let slot = &mut self.slots[i];
            let p = &mut slot.pending[k];
            if let Some(a) = &p.armed {
                let mapped = syms.modules().iter().any(|m| {
                    m.path == a.path && m.ranges.iter().any(|r| r.contains(&RuntimeAddr(a.addr)))
                });
                if !mapped {
                    let (start, end) = (a.start, a.end);
                    p.armed = None;
                    let spec = p.spec.clone();
                    slot.engine.forget_range(start, end);
                    if let Fast::On(fp) = &mut slot.fast {
                        fp.forget_range(start, end);
                    }
                    let gone: Vec<u64> = slot
                        .fast_ranges
                        .range(start..end)
                        .map(|(s, _)| *s)
                        .collect();
                    for s in gone {
                        slot.fast_ranges.remove(&s);
                    }
                    slot.update_fork_restores();
                    slot.engine.notices.push(format!(
                        "pid {pid}: {spec}: its module was unloaded; armed again if it is loaded again"
                    ));
                }
            }
            if self.slots[i].pending[k].armed.is_some() {
                continue;
            }
            let spec = self.slots[i].pending[k].spec.clone();
            match self.arm_pending(t, k, &syms) {
                Ok(()) => {}
                Err(e) if not_loaded(&e) => {}
                Err(e) => self.slots[i]
                    .engine
                    .notices
                    .push(format!("pid {pid}: cannot arm {spec}: {e}")),
            }
        }
        self.slots[i].publish_traps();
    }

    fn arm_pending(
        &mut self,
        t: TargetId,
        k: usize,
        syms: &hotprobe_symbols::ProcessSymbols,
    ) -> Result<(), EngineError> {
        let (spec, id, fast_ok, record, is_return) = {
            let p = &self.slot(t)?.pending[k];
            (p.spec.clone(), p.id, p.fast_ok, p.record, p.is_return)
        };
        let r = self.resolve_one(t, &spec)?;
        if (is_return || record) && !r.is_entry() {
            return Err(not_an_entry(&spec, &r));
        }
        let Some(m) = syms.modules().iter().find(|m| m.contains(r.addr)) else {
            return Err(EngineError::RefusedSpec {
                spec,
                reason: "no module maps its address".into(),
            });
        };
        let start = m.ranges.iter().map(|r| r.start.0).min().unwrap_or(0);
        let end = m.ranges.iter().map(|r| r.end.0).max().unwrap_or(0);
        let path = m.path.clone();
        let plan = if fast_ok {
            self.plan_resolved(t, &r, is_return, record, Some(syms))?
        } else {
            Plan::Trap(String::new())
        };
        let no_trap = (record && !self.config.record_traps) || self.config.no_traps;
        if let (Plan::Trap(why), true) = (&plan, no_trap) {
            return Err(EngineError::RefusedSpec {
                spec,
                reason: format!("needs the trap mechanism ({why})"),
            });
        }
        match plan {
            Plan::Fast {
                path: fpath,
                bias,
                function,
                reason,
                ..
            } => {
                self.place_fast(
                    t,
                    &r,
                    &fpath,
                    bias,
                    &function,
                    record,
                    None,
                    reason,
                    spec.clone(),
                    Some(id),
                )?;
                self.slot(t)?.update_fork_restores();
            }
            Plan::Trap(_) | Plan::Join(_) | Plan::Plugin(_) => {
                let config = self.config.fast_path;
                let slot = self.slot(t)?;
                if let Some(pid) = slot.pid.filter(|_| slot.engine.is_return_probe(id)) {
                    crate::nonlocal::check_return_probe(pid, r.addr)?;
                }
                let publishing = slot.publishers.get(&id).copied();
                slot.agent_for_traps(&config);
                slot.prepublish_trap(r.addr);
                slot.change_traps(|e| {
                    if let Some(p) = publishing {
                        e.arm_at(p, r.addr)?;
                    }
                    e.arm_at(id, r.addr)
                })?;
            }
        }
        self.slot(t)?.pending[k].armed = Some(Armed {
            path,
            start,
            end,
            addr: r.addr.0,
        });
        Ok(())
    }

    fn placement(
        &mut self,
        t: TargetId,
        id: ProbeId,
        label: String,
        r: &ResolvedProbe,
        reason: Option<String>,
    ) -> Placement {
        let slot = &self.slots[t.0];
        let mechanism = if slot.is_process() {
            Mechanism::Trap
        } else {
            Mechanism::Stub
        };
        let execution = match slot.engine.execution_of(r.addr) {
            Some(e) => format!("{mechanism} ({e})"),
            None => mechanism.to_string(),
        };
        let mut reason = reason.unwrap_or_else(|| "handlers run in hotprobe".into());
        if slot.overflow.contains(&r.addr.0) {
            reason.push_str(&format!(
                "; not in the agent's trap table (full: {} slots), so a hotprobe killed \
                 with SIGKILL leaves this int3 in",
                hotprobe_fastpath::TRAP_SLOTS
            ));
        }
        Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism,
            reason,
            execution,
            entry_only: None,
        }
    }

    /// How many of target `t`'s `int3`s the agent's trap table had no room
    /// for (it holds [`hotprobe_fastpath::TRAP_SLOTS`], guards included):
    /// they work, but a hotprobe killed with SIGKILL leaves them in (their
    /// placements say so). 0 for a target without the agent.
    pub fn traps_past_table(&self, t: TargetId) -> usize {
        self.slots.get(t.0).map_or(0, |s| s.overflow.len())
    }

    /// Enable or disable a probe at run time.
    pub fn set_enabled(&mut self, id: ProbeId, enabled: bool) -> Result<(), EngineError> {
        let slot = self.slot_of(id)?;
        match slot.owner(id) {
            // A flag the plugin applies to its scoreboard: nothing is
            // retranslated, no stop of the VM.
            ProbeOwner::Plugin => slot
                .plugin
                .as_ref()
                .expect("owned by the plugin")
                .set_enabled(id, enabled)
                .map_err(|reason| EngineError::RefusedSpec {
                    spec: format!("probe {}", id.0),
                    reason,
                }),
            ProbeOwner::InProcess { addr, handler } => {
                if let Fast::On(fp) = &slot.fast {
                    fp.set_inproc_enabled(addr, handler, enabled);
                }
                Ok(())
            }
            ProbeOwner::Handed(x) => slot.engine.set_enabled(x, enabled),
            ProbeOwner::Removed => Err(EngineError::NoSuchProbe(id)),
            ProbeOwner::Fast => {
                slot.change_fast(id, |fp, pt, c| {
                    fp.set_probe_enabled(pt, c, enabled).map(|_| ())
                })?;
                let i = (id.0 >> TARGET_SHIFT) as usize;
                self.maybe_release(i);
                Ok(())
            }
            ProbeOwner::Trap => slot.engine.set_enabled(id, enabled),
        }
    }

    /// Remove a probe.
    pub fn remove_probe(&mut self, id: ProbeId) -> Result<(), EngineError> {
        let slot = self.slot_of(id)?;
        match slot.owner(id) {
            ProbeOwner::Plugin => Err(EngineError::RefusedSpec {
                spec: format!("probe {}", id.0),
                reason: "QEMU plugin probes stay candidates: disable it instead".into(),
            }),
            ProbeOwner::Handed(x) => {
                slot.handed.remove(&id);
                slot.change_traps(|e| e.remove_probe(x))
            }
            ProbeOwner::InProcess { addr, handler } => {
                // Disabled for good (its handler dropped); the int3 goes at detach.
                if let Fast::On(fp) = &slot.fast {
                    fp.set_inproc_enabled(addr, handler, false);
                }
                slot.shm_handlers.retain(|_, (p, _)| *p != id);
                Ok(())
            }
            ProbeOwner::Removed => Err(EngineError::NoSuchProbe(id)),
            ProbeOwner::Fast => {
                slot.change_fast(id, |fp, pt, c| fp.remove_probe(pt, c).map(|_| ()))?;
                slot.removed_fast.insert(id);
                // Its site's span stays in the index while another probe
                // holds it (the fast path took the bytes out otherwise).
                slot.fast_ranges.retain(|_, span| span.drop_probe(id));
                // Its counters stay readable (stats); no handler call is
                // served any more (a thread waiting in one resumes unmodified).
                slot.shm_handlers.retain(|_, (p, _)| *p != id);
                let i = (id.0 >> TARGET_SHIFT) as usize;
                self.maybe_release(i);
                Ok(())
            }
            ProbeOwner::Trap => {
                let publishing = slot.publishers.remove(&id);
                slot.change_traps(|e| {
                    e.remove_probe(id)?;
                    match publishing {
                        Some(p) => e.remove_probe(p),
                        None => Ok(()),
                    }
                })
            }
        }
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
    /// each followed fork child that hit it.
    pub fn stats_by_process(&self, id: ProbeId) -> Option<Vec<(i32, ProbeStats)>> {
        if let Some(w) = self.watch_probe_stats(id) {
            return Some(w);
        }
        let ri = (id.0 >> TARGET_SHIFT) as usize;
        let root = self.slots.get(ri)?;
        let trap = root
            .engine
            .stats(id)
            .or_else(|| root.plugin.as_ref().and_then(|p| p.stats(id)));
        let fast = root.fast_probes.get(&id);
        if trap.is_none() && fast.is_none() {
            return None;
        }
        let me = root.pid.unwrap_or(0);
        let mut trap = trap.unwrap_or_default();
        if let Some(h) = root.handed.get(&id).and_then(|x| root.engine.stats(*x)) {
            // Handed over to the engine: its hits since then.
            trap.hits += h.hits;
            trap.nmissed += h.nmissed;
        }
        let mut by: Vec<(i32, ProbeStats)> = vec![(me, trap)];
        let mut add =
            |pid: i32, f: &dyn Fn(&mut ProbeStats)| match by.iter_mut().find(|(p, _)| *p == pid) {
                Some((_, st)) => f(st),
                None => {
                    let mut st = ProbeStats::default();
                    f(&mut st);
                    by.push((pid, st));
                }
            };
        for s in self.slots.iter().filter(|s| s.root == Some(ri)) {
            for (cid, _) in s.origin.iter().filter(|(_, r)| **r == id) {
                if let Some(c) = s.engine.stats(*cid) {
                    add(s.pid.unwrap_or(0), &|st| {
                        st.hits += c.hits;
                        st.nmissed += c.nmissed;
                        st.returns += c.returns;
                        st.abandoned += c.abandoned;
                    });
                }
            }
        }
        if let (Some(f), Some(fp)) = (fast, root.fast_path()) {
            for (c, exit) in &f.counters {
                // Events the agent could not write (hits always count).
                let missed = fp.missed(*c);
                // A shared-memory handler's hit counts once its call is
                // taken or withdrawn (as a trap hit counts once handled):
                // the agent counts it before the call, so a thread waiting
                // for the next run would count without a handler run.
                let taken = root.shm_taken.get(c).copied();
                for (pid, n) in fp.counts_by_process(*c) {
                    let n = match taken {
                        Some(t) if pid as i32 == me => t + missed,
                        _ => n,
                    };
                    add(pid as i32, &|st| st.hits += n);
                }
                if missed > 0 {
                    add(me, &|st| st.nmissed += missed);
                }
                for (pid, n) in exit.map(|e| fp.counts_by_process(e)).unwrap_or_default() {
                    add(pid as i32, &|st| st.returns += n);
                }
            }
        }
        Some(by)
    }

    /// How hits at this probe's address are executed (trap probes: "boosted",
    /// "emulated", "stepped"…).
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

    /// Let every target run (after attaching/spawning and adding probes).
    pub fn start(&mut self) -> Result<(), EngineError> {
        for s in &mut self.slots {
            if let Some(p) = &mut s.plugin {
                // The candidate sites are final before the VM's first
                // translation, the enable flags applied.
                p.host.freeze().map_err(|e| EngineError::RefusedSpec {
                    spec: "the QEMU plugin's probes".into(),
                    reason: e.to_string(),
                })?;
            }
            if s.engine.gone().is_none() && !s.engine.started {
                // Without the agent nothing in the program can take the
                // int3s out if hotprobe dies: said once, at the start.
                if let (Fast::Off(why), Some(pid), true) =
                    (&s.fast, s.pid, s.engine.has_armed_sites())
                {
                    s.engine.notices.push(format!(
                        "pid {pid}: {why}: a hotprobe killed with SIGKILL would leave its \
                         int3s in the program (Ctrl-C, --duration and the program's exit take \
                         them out)"
                    ));
                }
                s.engine.target().resume_all()?;
                s.engine.started = true;
            }
        }
        for i in 0..self.slots.len() {
            self.maybe_release(i);
        }
        Ok(())
    }

    /// Handle events until a handler stops, or every target is gone.
    pub fn run(&mut self) -> Result<RunEnd, EngineError> {
        self.run_until(&AtomicBool::new(false))
    }

    /// As [`Session::run`], also returning when `interrupt` becomes true.
    /// With one target the loop blocks until the target's next event: set
    /// `interrupt` from a signal handler installed without `SA_RESTART`
    /// (the signal interrupts the wait), as the CLI does for Ctrl-C.
    pub fn run_until(&mut self, interrupt: &AtomicBool) -> Result<RunEnd, EngineError> {
        self.run_with(interrupt, None)
    }

    /// As [`Session::run_until`], handing every recorded event (fast path
    /// rings and trap record probes) to `sink` while the targets run. The
    /// last events are drained before it returns.
    pub fn run_with<'s>(
        &mut self,
        interrupt: &AtomicBool,
        mut sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<RunEnd, EngineError> {
        loop {
            if interrupt.load(Ordering::Relaxed) {
                self.drain(sink.as_deref_mut(), 1)?;
                return Ok(RunEnd::Interrupted);
            }
            match self.step(sink.as_deref_mut())? {
                Some(end) => {
                    self.drain(sink.as_deref_mut(), 1)?;
                    return Ok(end);
                }
                None => continue,
            }
        }
    }

    /// One pass: drain the rings, then wait for (and handle) one event of
    /// each live target. `Some(end)` when the loop is over.
    fn step<'s>(
        &mut self,
        sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<Option<RunEnd>, EngineError> {
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.slots[*i].engine.gone().is_none())
            .collect();
        if live.is_empty() {
            return Ok(Some(RunEnd::AllExited));
        }
        let recording = live.iter().any(|i| self.slots[*i].recording);
        if recording && sink.is_none() {
            self.drain(None, 0)?;
        }
        let timeout = if recording && sink.is_some() {
            Some(self.drain(sink, 0)?)
        } else if live.len() == 1 {
            None
        } else {
            Some(Duration::from_millis(1))
        };
        for i in live {
            if self.poll_slot(i, timeout)? {
                return Ok(Some(RunEnd::Stopped));
            }
        }
        Ok(None)
    }

    /// Takes the fork child `child` of slot `i` as a target of its own:
    /// the fast path's code stays in it (its agent counts into slots of
    /// its own), the trap `Count`/`Record` probes are placed in it again,
    /// return addresses swapped in its stack are put back (`fixes`).
    /// Where that fails the child is released without probes, with a notice.
    fn follow_child(&mut self, i: usize, child: u64, fixes: Vec<(RuntimeAddr, Vec<u8>)>) {
        let root = self.slots[i].root.unwrap_or(i);
        let inherited: Vec<(RuntimeAddr, Vec<u8>)> = match &self.slots[root].fast {
            Fast::On(fp) => fp
                .written_bytes()
                .into_iter()
                .map(|(a, b)| (RuntimeAddr(a), b))
                .collect(),
            _ => Vec::new(),
        };
        let adopted = Slot::process(&mut self.slots[i].engine)
            .ok_or_else(|| "not a process".to_string())
            .and_then(|pt| pt.adopt_fork_child(child).map_err(|e| e.to_string()));
        let mut pt = match adopted {
            Ok(pt) => pt,
            Err(why) => {
                let slot = &mut self.slots[i];
                let mut all = inherited;
                all.extend(fixes);
                let _ = slot.engine.target().release_fork_child(child, &all);
                slot.engine.notices.push(format!(
                    "cannot follow forked child {child}: {why}; released without probes"
                ));
                return;
            }
        };
        for (a, b) in &fixes {
            let _ = pt.write_memory(*a, b);
        }
        let resolver = crate::ProcessResolver::new(child as i32).ok();
        let t = self.push_slot(
            pt.into(),
            resolver.map(|r| Box::new(r) as Box<dyn Resolver>),
            Some(child as i32),
            true,
            Fast::Off("a followed child counts through its parent's fast path".into()),
        );
        let recording = self.slots[root].recording;
        let followable = self.slots[root].followable.clone();
        let slot = &mut self.slots[t.0];
        slot.root = Some(root);
        slot.inherited = inherited;
        slot.recording = recording;
        let mut failed = Vec::new();
        for (rid, addr, is_return, record, exits) in followable {
            let placed = self
                .trap_form(t, is_return, record, None, exits)
                .and_then(|form| match form {
                    (_, Some(rp)) => self.retprobe_addr(t, addr, rp),
                    (p, None) => self.probe_addr(t, addr, p.unwrap_or_default()),
                });
            match placed {
                Ok(cid) => {
                    self.slots[t.0].origin.insert(cid, rid);
                }
                Err(e) => failed.push(format!("{addr}: {e}")),
            }
        }
        let parent = self.slots[i].pid.unwrap_or(0);
        let slot = &mut self.slots[t.0];
        let msg = if failed.is_empty() {
            format!("pid {parent} forked {child}: followed")
        } else {
            format!(
                "pid {parent} forked {child}: followed, but without {} of its probes ({})",
                failed.len(),
                failed.join("; ")
            )
        };
        slot.engine.notices.push(msg);
        match slot.engine.target().resume_all() {
            Ok(()) => slot.engine.started = true,
            Err(e) => slot
                .engine
                .notices
                .push(format!("forked child {child} could not be resumed: {e}")),
        }
    }

    /// Drains every recording target into `sink`. With `low` 0, the usual
    /// thresholds apply and the nap before the next drain is returned;
    /// otherwise every ring is emptied.
    fn drain<'s>(
        &mut self,
        sink: Option<&mut (dyn EventSink + 's)>,
        low: u64,
    ) -> Result<Duration, EngineError> {
        let Some(sink) = sink else {
            // Nobody to hand trap record events to: drop them rather than
            // let the queues grow (the counts stay in stats()).
            for s in &self.slots {
                s.trap_events.borrow_mut().clear();
                s.trap_data.borrow_mut().clear();
            }
            return Ok(Duration::ZERO);
        };
        let mut nap = Duration::from_millis(1);
        for s in &mut self.slots {
            if !s.recording {
                continue;
            }
            let mut traps: Vec<RecordedEvent> = s.trap_events.borrow_mut().drain(..).collect();
            let data: Vec<Vec<u8>> = s.trap_data.borrow_mut().drain(..).collect();
            for ev in &mut traps {
                if let Some(r) = s.origin.get(&ProbeId(ev.probe_id)) {
                    ev.probe_id = r.0;
                }
            }
            s.drain.stats.events += traps.len() as u64;
            if let Some(p) = &mut s.plugin {
                let before = p.drops;
                let n = p.drain(sink).map_err(EngineError::Sink)?;
                s.drain.stats.events += n;
                s.drain.stats.ring_drops += p.drops - before;
            }
            let Fast::On(fp) = &s.fast else {
                for ev in &traps {
                    emit(sink, ev, &data).map_err(EngineError::Sink)?;
                }
                continue;
            };
            if !traps.is_empty() {
                // Trap events were taken at ptrace stops, after every event
                // their thread had written into its ring: one pass over
                // the rings, merged with them by time stamp, keeps each
                // thread's events in order.
                let mut merged = Merge {
                    events: traps,
                    sink: &mut *sink,
                };
                s.drain
                    .pass(fp, &s.fast_ids, 1, &mut merged)
                    .map_err(EngineError::Sink)?;
                merged.events.sort_by_key(|e| e.tsc);
                for ev in &merged.events {
                    emit(sink, ev, &data).map_err(EngineError::Sink)?;
                }
                continue;
            }
            // A ring is drained again while a drain of it returned at least
            // `low` events; the loop naps only when no ring held that many
            // (a drain right behind the producer pulls the cache lines it
            // is writing away from it). 1/64 of a ring.
            let ring_low = (u64::from(fp.ring_capacity()) / 64).max(64);
            let pass = s
                .drain
                .pass(fp, &s.fast_ids, if low == 0 { ring_low } else { low }, sink)
                .map_err(EngineError::Sink)?;
            let this = if pass.events == 0 {
                Duration::from_millis(1)
            } else if pass.max_fill < ring_low {
                Duration::from_micros(100)
            } else {
                Duration::ZERO
            };
            nap = nap.min(this);
        }
        Ok(nap)
    }

    /// Waits up to `timeout` for one event of slot `i` and handles it, for
    /// every mechanism of the target. True when a handler asked to stop.
    fn poll_slot(&mut self, i: usize, timeout: Option<Duration>) -> Result<bool, EngineError> {
        let mut timeout = timeout;
        if !self.slots[i].shm_handlers.is_empty() && self.slots[i].engine.gone().is_none() {
            if self.serve_handlers(i, timeout) {
                return Ok(true);
            }
            timeout = Some(Duration::ZERO);
        }
        let slot = &mut self.slots[i];
        let ev = match slot.engine.target().wait(timeout) {
            Ok(ev) => ev,
            Err(TargetError::Gone { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        match &ev {
            TargetEvent::Exec => {
                // The image the fast path wrote into is gone: nothing is
                // restored into the new one. Counts and rings stay ours.
                if let Fast::On(fp) = &mut slot.fast {
                    let n = slot.fast_probes.len();
                    if !fp.is_detached() && n > 0 {
                        let who = slot.engine.target().describe();
                        slot.engine.notices.push(format!(
                            "{who}: exec: {n} fast-path probes dropped (their counts and events \
                             before the exec are kept)"
                        ));
                    }
                    fp.forget();
                }
                slot.fast_ranges.clear();
            }
            TargetEvent::Exited(status) => {
                // SIGILL, SIGTRAP, SIGBUS, SIGSEGV (x86-64 Linux).
                let crashed = matches!(status, ExitStatus::Signal(4 | 5 | 7 | 11));
                let written: Vec<(u64, usize)> = match &slot.fast {
                    Fast::On(fp) if crashed => fp
                        .written_bytes()
                        .into_iter()
                        .map(|(a, b)| (a, b.len()))
                        .collect(),
                    _ => Vec::new(),
                };
                if !written.is_empty() {
                    if let Some(n) = uprobes_on_rewritten_sites(slot, &written, status) {
                        slot.engine.notices.push(n);
                    }
                }
                if let Fast::On(fp) = &mut slot.fast {
                    fp.forget();
                }
            }
            _ => {}
        }
        if let TargetEvent::Watchpoint {
            thread,
            slots,
            regs,
        } = ev
        {
            return self.on_watchpoint(i, thread, slots, regs);
        }
        let exec = matches!(ev, TargetEvent::Exec);
        if exec {
            self.watches_exec(i);
        }
        if matches!(ev, TargetEvent::ModulesChanged { .. }) {
            self.refresh_pending(i);
            if let Some(pid) = self.slots[i].pid {
                crate::nonlocal::sync_unwind_hooks(&mut self.slots[i].engine, pid);
            }
        }
        let slot = &mut self.slots[i];
        slot.engine.handle(ev)?;
        if exec {
            slot.update_fork_restores();
            slot.inherited.clear();
            slot.publish_traps();
        }
        let stop = slot.engine.take_stop();
        for (child, fixes) in std::mem::take(&mut slot.engine.forked) {
            self.follow_child(i, child, fixes);
        }
        Ok(stop)
    }

    /// Ends the run: spawned targets still alive get `grace` to exit on
    /// their own (a terminal's Ctrl-C reaches them as well as hotprobe)
    /// while their events are handled and drained; every target still
    /// alive then is detached (code restored, running on). The last events
    /// are drained into `sink`. A target that dies meanwhile is no error.
    pub fn finish<'s>(
        &mut self,
        grace: Duration,
        mut sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<(), EngineError> {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && self
                .slots
                .iter()
                .any(|s| s.spawned && s.engine.gone().is_none())
        {
            let live: Vec<usize> = (0..self.slots.len())
                .filter(|i| self.slots[*i].engine.gone().is_none())
                .collect();
            self.drain(sink.as_deref_mut(), 0)?;
            for i in live {
                self.poll_slot(i, Some(Duration::from_millis(5)))?;
            }
        }
        self.drain(sink.as_deref_mut(), 1)?;
        let r = self.detach();
        self.drain(sink, 1)?;
        r
    }

    /// Detach from every target: handlers stop, threads leave scratch
    /// slots, return addresses are put back, original bytes restored
    /// (the fast path's and the traps'), targets run on. Targets already
    /// gone are skipped.
    pub fn detach(&mut self) -> Result<(), EngineError> {
        let mut first_err = None;
        for s in &mut self.slots {
            if let (Some(p), None) = (&s.plugin, s.engine.gone()) {
                // The guest runs on without the callbacks' work.
                let _ = p.host.disable_all();
            }
            if s.engine.gone().is_some() {
                if let Fast::On(fp) = &mut s.fast {
                    fp.forget();
                }
                continue;
            }
            if let (Fast::On(fp), Some(pt)) = (&mut s.fast, s.engine.process()) {
                if let Err(e) = fp.detach(pt) {
                    first_err.get_or_insert(EngineError::from(e));
                }
                s.note_foreign_writes();
            }
            if !s.inherited.is_empty() {
                // A followed child still running: its parent's fast-path
                // code goes (threads are never inside those bytes but at
                // their first one: each is one instruction).
                let t = s.engine.target();
                if t.stop_all().is_ok() {
                    for (a, b) in std::mem::take(&mut s.inherited) {
                        let _ = t.write_memory(a, &b);
                    }
                }
            }
            match s.engine.detach() {
                Ok(()) => s.unpublish_traps(),
                // Gone meanwhile: nothing left to restore.
                Err(EngineError::Target(TargetError::Gone { .. })) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
        if let Some(fp) = slot.fast_path() {
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

/// Collects a ring pass's events (to merge them with trap events);
/// losses go straight on.
struct Merge<'a, 's> {
    events: Vec<RecordedEvent>,
    sink: &'a mut (dyn EventSink + 's),
}

impl EventSink for Merge<'_, '_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), crate::SinkError> {
        self.events.push(*ev);
        Ok(())
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), crate::SinkError> {
        self.sink.lost(tid, ts, count)
    }
}

/// The plain probe placed just before a trap return probe, at the same
/// address (so that its handler runs first at each hit): it publishes the
/// call (thread, stack slot, real return address) in `table` before the
/// return probe swaps the return address for the engine's trampoline; an
/// agent whose tracer died anywhere between that swap and the thread's
/// return completes the return (see [`TrapTable`]). Entries stay: the next
/// call with the same slot replaces them.
fn publisher(table: TrapTable) -> Probe {
    Probe::new().pre(move |ctx| {
        let rsp = ctx.regs().rsp;
        let tid = ctx.thread().0 as u32;
        if let Ok(real) = ctx.read_u64(rsp) {
            // Swapped already by another return probe on this function.
            if !table.is_return_trampoline(real) {
                table.publish_return(tid, rsp, real);
            }
        }
    })
}

/// Runs `capture` at a trap record probe's hit; the `reserved2` value
/// that ties the event to its bytes in `store`.
fn captured(
    ctx: &mut crate::HitContext<'_>,
    capture: &Capture,
    exit: bool,
    store: &RefCell<Vec<Vec<u8>>>,
) -> u32 {
    let mut bytes = Vec::new();
    capture(ctx, exit, &mut bytes);
    let mut store = store.borrow_mut();
    store.push(bytes);
    store.len() as u32
}

/// Hands `ev` to `sink`, with its captured bytes when it has some.
fn emit(
    sink: &mut (dyn EventSink + '_),
    ev: &RecordedEvent,
    data: &[Vec<u8>],
) -> Result<(), crate::SinkError> {
    match ev
        .reserved2
        .checked_sub(1)
        .and_then(|i| data.get(i as usize))
    {
        Some(bytes) => {
            let mut plain = *ev;
            plain.reserved2 = 0;
            sink.event_data(&plain, bytes)
        }
        None => sink.event(ev),
    }
}

/// An event for a trap record probe, stamped now.
fn trap_event(ctx: &crate::HitContext<'_>, kind: u8) -> RecordedEvent {
    // SAFETY: rdtsc has no preconditions on x86-64.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    RecordedEvent {
        tsc,
        probe_id: ctx.probe().0,
        tid: ctx.thread().0 as u32,
        kind,
        nargs: 0,
        reserved: 0,
        reserved2: 0,
        args: [0; 6],
    }
}

fn from_fast(m: hotprobe_fastpath::Mechanism) -> Mechanism {
    match m {
        hotprobe_fastpath::Mechanism::Patch(k) => Mechanism::Patch(k),
        hotprobe_fastpath::Mechanism::Jump => Mechanism::Jump,
        hotprobe_fastpath::Mechanism::Trap => Mechanism::Trap,
    }
}

/// The resolver's "no module of that name is loaded".
fn not_loaded(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::Symbol(hotprobe_symbols::SymbolError::ModuleNotFound { .. })
    )
}

/// Whether a function name in a spec is a pattern.
fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

fn not_whole_function(spec: &str, r: &ResolvedProbe) -> EngineError {
    EngineError::RefusedSpec {
        spec: spec.into(),
        reason: format!(
            "recording follows whole functions, and {:#x} is {} bytes into {} \
             (inside a function only an in-process trap records, as hit events: \
             not with a forced mechanism, a pattern or %return; count probes any \
             instruction)",
            r.addr.0,
            r.offset,
            r.function.as_deref().unwrap_or("a function")
        ),
    }
}

fn not_an_entry(spec: &str, r: &ResolvedProbe) -> EngineError {
    let reason = match &r.not_entry {
        Some(why) if r.offset == 0 => why.clone(),
        _ => format!(
            "a return probe goes on a function's first instruction, and {:#x} is {} \
             bytes into {}",
            r.addr.0,
            r.offset,
            r.function.as_deref().unwrap_or("its function")
        ),
    };
    EngineError::RefusedSpec {
        spec: spec.into(),
        reason,
    }
}

/// `compute+0x4`.
fn short(r: &ResolvedProbe) -> String {
    match &r.function {
        Some(f) if r.offset == 0 => f.clone(),
        Some(f) => format!("{f}+{:#x}", r.offset),
        None => format!("{:#x}", r.addr.0),
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
