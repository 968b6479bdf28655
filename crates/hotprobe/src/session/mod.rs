//! The facade: a [`Session`] holds targets and, on each, the list of
//! mechanisms that place probes there (see `mech/`: the trap engine, the
//! fast path's patch and jump sites, the agent's in-process trap, a guest's
//! QEMU plugin), the code ledger of every byte they wrote (`ledger.rs`),
//! and the lifecycle (fork, exec, exit, interrupt, detach) for all of them
//! at once.
//!
//! The session's jobs, one file each: opening targets (`open.rs`),
//! resolving specs (`resolve.rs`), adding probes (`add.rs`), planning a
//! site and the rule between mechanisms at one address (`plan.rs`),
//! pending probes (`pending.rs`), shared-memory handlers (`handlers.rs`),
//! running untraced (`untraced.rs`), the run loop and detach (`run.rs`),
//! followed children (`follow.rs`), draining events (`drain.rs`), control
//! and counts (`stats.rs`), other writers of the code (`foreign.rs`),
//! probe ids (`ids.rs`), notices and held children (`inbox.rs`).

use crate::engine::{Engine, EngineView};
use crate::handler::{Probe, ProbeId, RetProbe};
use crate::held::HeldTarget;
use crate::plugin::PluginOptions;
use crate::recorder::{DrainStats, EventSink, RingDrain};
use crate::{EngineError, ProbeStats, Resolver};
use agent::{Agent, AgentState};
use hotprobe_fastpath::{FastPath, FastPathConfig, FunctionInfo, RecordedEvent, TrapTable};
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_symbols::{ProbeSpec, ResolvedProbe};
use hotprobe_target::{ExitStatus, RuntimeAddr, Target, TargetError, TargetEvent};
use ids::ProbeIds;
use inbox::Inbox;
use ledger::CodeLedger;
use mech::{Cx, MechKind, Mechs, ProbeMechanism};
use resolve::from_fast;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod add;
mod agent;
mod agg;
mod detach;
mod drain;
mod exec;
mod follow;
mod foreign;
mod handlers;
pub(crate) mod ids;
pub(crate) mod inbox;
pub(crate) mod ledger;
mod mech;
mod newproc;
mod open;
mod pending;
mod plan;
mod resolve;
mod reverted;
mod run;
pub(crate) mod stacks;
mod stats;
mod tracer_watch;
mod unmapped;
mod untraced;
mod usdt;

// Watchpoints (`Session::watch`): a child module for the session's fields,
// in a file of its own.
#[path = "../watch.rs"]
pub(crate) mod watch;

pub use exec::{ExecCapture, ExecImage, ExecPlacing, AT_EXEC};
pub use ledger::{CodeOwner, CodeSite};
pub use newproc::ProcessMatch;
pub use pending::ArmedPending;
use pending::Pending;
use plan::Plan;

pub use hotprobe_fastpath::{MechanismChoice, PatchKind};

/// Identifies a target in a [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TargetId(pub usize);

/// Probe ids carry their target in the high bits.
pub(crate) const TARGET_SHIFT: u32 = 24;

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

/// Chooses, for each function a `Record` action places on the fast path,
/// an aggregation computed in the target instead of events (see
/// [`Session::set_aggregate`]).
pub type AggChooser = Rc<dyn Fn(&ResolvedProbe) -> Option<hotprobe_fastpath::agg::AggRule>>;

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

/// Chooses, for each function a `Record` action places on the fast path,
/// the typed values its entries copy in the target (issue 23: strings,
/// fields through pointers, stack arguments; see
/// `hotprobe_abi::capture`). Asked after the [`XmmChooser`] and before
/// the [`CaptureChooser`]; a function the fast path takes this way is not
/// given a capture.
pub type FastCaptureChooser =
    Rc<dyn Fn(&ResolvedProbe) -> Option<hotprobe_abi::capture::CapturePrograms>>;

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

impl Mechanism {
    /// Whether hits stop at a breakpoint: [`Mechanism::Trap`] (a ptrace
    /// stop) or [`Mechanism::InProcessTrap`] (the agent's `SIGTRAP`
    /// handler), the mechanisms left where neither patch nor jump fits.
    pub fn is_trap(self) -> bool {
        matches!(self, Mechanism::Trap | Mechanism::InProcessTrap)
    }
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
    /// With [`SessionConfig::follow_forks`]: when a process the session
    /// holds executes another program, its `Count` and `Record` specs are
    /// placed again in the new image (see [`Session::exec_images`]) instead
    /// of its probes ending there.
    pub follow_exec: bool,
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
            follow_exec: false,
            force: false,
        }
    }
}

/// One target and everything active on it.
struct Slot {
    /// The target. The session holds it; every mechanism, the trap
    /// engine among them, borrows it for each call (`Cx::target`).
    target: HeldTarget,
    /// The trap engine (the trap mechanism's state): it borrows
    /// [`Slot::target`] for each call that reads or writes it.
    engine: Engine,
    resolver: Option<Box<dyn Resolver>>,
    /// A process's pid (None for guests).
    pid: Option<i32>,
    spawned: bool,
    /// The agent in the process (shared by the fast path, the in-process
    /// trap and the trap table).
    agent: Agent,
    /// The mechanisms registered on the target.
    mechs: Mechs,
    /// Which mechanism serves each probe placed by another than the trap
    /// engine (a probe not listed is the engine's).
    owner: HashMap<ProbeId, MechKind>,
    /// The target's probe ids: every mechanism is handed its probes' ids
    /// from here.
    ids: ProbeIds,
    /// The notices about the target and the fork children held for the
    /// session, as the engine and the mechanisms reported them.
    inbox: Inbox,
    /// Forked children are held (stopped) and followed as targets of
    /// their own instead of being released without probes.
    follow_forks: bool,
    /// At an exec the threads stay stopped: the session resumes them once
    /// it placed its probes in the new image (`Session::follow_exec`).
    hold_at_exec: bool,
    /// Every byte the mechanisms wrote into the target's code.
    ledger: CodeLedger,
    drain: RingDrain,
    /// Probes that record (fast or trap): the loop drains for them.
    recording: bool,
    /// Probes on modules not loaded (yet, or any more).
    pending: Vec<Pending>,
    /// Probes placed while their module was loaded, as they were asked:
    /// made pending again if the module is unloaded (`unmapped.rs`).
    placed_specs: HashMap<ProbeId, pending::PlacedSpec>,
    /// Which of its modules the program loaded at run time.
    unloads: unmapped::Unloads,
    /// A followed fork child: the slot of the process the session started
    /// or attached to, whose probes (and fast path) it shares.
    root: Option<usize>,
    /// A followed child's probe ids → its root's.
    origin: HashMap<ProbeId, ProbeId>,
    /// The process's modules and the `/proc/PID/maps` they were read from:
    /// read again only when the maps change (issue 14).
    symbols: Option<(String, std::sync::Arc<hotprobe_symbols::ProcessSymbols>)>,
    /// The walk for sites whose code is the original again.
    reverted: reverted::RevertedSites,
    /// USDT semaphores raised, one entry per probe placed on a marker
    /// that has one (see `usdt.rs`).
    semaphores: Vec<RuntimeAddr>,
    /// The process executed another program that the session followed
    /// (see `exec.rs`): its fork children take its probes, not its root's.
    execd: bool,
    /// The process's command name when the session took it.
    first_comm: String,
    /// When to try again to let the process run untraced, after a try
    /// found something of it needing ptrace, and the delay that gave it
    /// (doubled at each refusal: `untraced.rs`).
    release_retry: Option<(std::time::Instant, Duration)>,
    /// Since when the tries to let the process run untraced have been
    /// refused, and whether a notice said why (`untraced.rs`).
    release_refused: Option<(std::time::Instant, bool)>,
    /// The last answer said by `HOTPROBE_DEBUG_RELEASE` (`untraced.rs`).
    release_logged: Option<String>,
}

impl Slot {
    fn is_process(&self) -> bool {
        self.pid.is_some()
    }

    /// The process, when the target is one.
    fn process(target: &mut HeldTarget) -> Option<&mut ProcessTarget> {
        target.process()
    }

    /// What the mechanisms borrow, and the mechanisms.
    fn parts(&mut self) -> (Cx<'_>, &mut Mechs) {
        (
            Cx {
                engine: &mut self.engine,
                target: &mut self.target,
                agent: &mut self.agent,
                ledger: &mut self.ledger,
                ids: &mut self.ids,
                inbox: &mut self.inbox,
            },
            &mut self.mechs,
        )
    }

    /// Tells every mechanism of the target of `change`.
    fn tell_mechanisms_of(&mut self, change: &mech::TargetChange) {
        let (mut cx, mechs) = self.parts();
        for m in mechs.all() {
            m.on_change(&mut cx, change);
        }
    }

    /// A notice about this target, after what its engine reported before.
    fn notice(&mut self, text: String) {
        self.inbox.notice(&mut self.engine, text);
    }

    /// What the engine holds back at this target's events.
    fn holds(&self) -> crate::engine::Holds {
        crate::engine::Holds {
            // Every fork: what the child gets back, followed or not, is
            // one walk of the ledger (`follow.rs`).
            forks: true,
            exec: self.hold_at_exec,
        }
    }

    /// Which mechanism serves probe `id`.
    fn owner(&self, id: ProbeId) -> MechKind {
        self.owner.get(&id).copied().unwrap_or(MechKind::Trap)
    }

    /// Brings the ledger up to date with the writes of every mechanism.
    fn sync_ledger(&mut self) {
        self.mechs.trap.sync(&mut self.target, &mut self.ledger);
        agent::sync_agent_writes(&self.agent, &mut self.ledger);
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
    /// Which `Record` probes copy typed values in the target (see
    /// [`Session::set_fast_capture`]).
    fast_capture: Option<FastCaptureChooser>,
    /// Which `Record` probes aggregate in the target on the fast path
    /// (see [`Session::set_aggregate`]).
    aggregate: Option<AggChooser>,
    /// No wait of the run loop goes past this instant
    /// ([`Session::set_wait_deadline`]).
    wait_deadline: Option<std::time::Instant>,
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
    /// When watched values were last read for writes no debug register
    /// sees (see `watch.rs`'s `check_unseen_writes`).
    watch_check: Option<Instant>,
    /// Sources that follow the processes from outside (`Session::observe`).
    observers: Vec<Rc<std::cell::RefCell<dyn crate::observer::TargetObserver>>>,
    /// Inside [`Session::add_filtered`]: fast-path sites are written in one
    /// batch at its end, the target stopped once (issue 14).
    batching: bool,
    /// Wait statuses one process target reaped for another (shared by all).
    strays: hotprobe_process::Strays,
    /// Events of vfork children not recorded (no `follow_forks`), per
    /// child (see `drain.rs`).
    vfork_unrecorded: std::collections::BTreeMap<u32, u64>,
    /// `Count`/`Record` specs placed again at each followed exec.
    exec_specs: Vec<exec::ExecSpec>,
    /// The images followed execs brought, with their probes.
    exec_images: Vec<ExecImage>,
    /// Inside [`Session::follow_exec`]: specs are not remembered again.
    placing_exec: bool,
    /// The capture of the specs added next in exec'd images
    /// ([`Session::set_exec_capture`]).
    exec_capture: Option<exec::ExecCapture>,
    /// The stack tables of images processes left at an exec (`stacks.rs`).
    retired_stacks: Vec<stacks::RetiredStacks>,
    /// How many of `exec_images` the sink was told of.
    exec_announced: usize,
    /// Pending probes armed as their modules were loaded (`pending.rs`).
    armed_pending: Vec<ArmedPending>,
    /// How many of `armed_pending` the sink was told of.
    armed_announced: usize,
    /// Processes that start later (`newproc.rs`).
    new_processes: Option<newproc::NewProcesses>,
    /// A `Record` spec is given for them.
    recording_new: bool,
    /// What the exec gate had to say.
    gate_notices: Vec<String>,
    /// The process of each thread seen created (`Session::process_of_thread`).
    thread_pids: HashMap<u32, i32>,
    /// New tracers of processes running with in-process traps (`tracer_watch.rs`).
    tracer_watch: tracer_watch::TracerWatch,
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
            watch_check: None,
            observers: Vec::new(),
            capture: None,
            batching: false,
            xmm_layout: None,
            fast_capture: None,
            aggregate: None,
            wait_deadline: None,
            strays: Default::default(),
            vfork_unrecorded: Default::default(),
            exec_specs: Vec::new(),
            exec_images: Vec::new(),
            placing_exec: false,
            retired_stacks: Vec::new(),
            exec_capture: None,
            exec_announced: 0,
            armed_pending: Vec::new(),
            armed_announced: 0,
            new_processes: None,
            recording_new: false,
            gate_notices: Vec::new(),
            thread_pids: HashMap::new(),
            tracer_watch: Default::default(),
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
            AgentState::Off("not a process".into()),
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
        self.slots[t.0].mechs.plugin = Some(mech::plugin::PluginMech::new(plugin));
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
        Some(
            self.slots
                .get(t.0)?
                .mechs
                .plugin
                .as_ref()?
                .plugin
                .host
                .stats(),
        )
    }

    fn push_slot(
        &mut self,
        mut target: HeldTarget,
        resolver: Option<Box<dyn Resolver>>,
        pid: Option<i32>,
        spawned: bool,
        agent: AgentState,
    ) -> TargetId {
        let id = self.slots.len();
        let mut engine = Engine::for_session(&mut target);
        if let Some(r) = &resolver {
            engine.set_symbolizer(r.symbolizer());
        }
        self.slots.push(Slot {
            target,
            engine,
            resolver,
            pid,
            spawned,
            agent: Agent::new(agent),
            mechs: match pid {
                Some(_) => Mechs::process(),
                None => Mechs::other(),
            },
            owner: HashMap::new(),
            ids: ProbeIds::new((id as u32) << TARGET_SHIFT),
            inbox: Inbox::default(),
            follow_forks: false,
            hold_at_exec: false,
            ledger: CodeLedger::default(),
            drain: RingDrain::default(),
            recording: false,
            pending: Vec::new(),
            placed_specs: HashMap::new(),
            unloads: Default::default(),
            root: None,
            origin: HashMap::new(),
            symbols: None,
            reverted: Default::default(),
            semaphores: Vec::new(),
            execd: false,
            first_comm: pid.map(exec::comm_of).unwrap_or_default(),
            release_retry: None,
            release_refused: None,
            release_logged: None,
        });
        let follow = self.config.follow_forks && pid.is_some();
        let slot = &mut self.slots[id];
        slot.follow_forks = follow;
        slot.hold_at_exec = follow && self.config.follow_exec;
        let hold = slot.hold_at_exec;
        if let Some(pt) = Slot::process(&mut slot.target) {
            pt.set_keep_execd_vfork_children(hold);
        }
        if let Some(fp) = slot.agent.fast_path() {
            fp.set_follow_forks(follow);
        }
        TargetId(id)
    }

    /// The code ledger of target `t`: every byte range a mechanism wrote
    /// into its code, with the owner and the original bytes, by address
    /// (for mirroring it where the agent can undo it, and for tests).
    pub fn code_ledger(&mut self, t: TargetId) -> Option<&[CodeSite]> {
        let slot = self.slots.get_mut(t.0)?;
        slot.sync_ledger();
        Some(slot.ledger.sites())
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

    /// The engine of a target (for lower-level control). Probes go in
    /// through the session, which numbers them: the engine's own
    /// [`Engine::add_probe`] refuses.
    pub fn engine(&mut self, t: TargetId) -> Result<EngineView<'_>, EngineError> {
        let slot = self.slot(t)?;
        Ok(EngineView {
            engine: &mut slot.engine,
            target: &mut slot.target,
        })
    }

    /// The process id of a process target.
    pub fn pid(&self, t: TargetId) -> Option<i32> {
        self.slots.get(t.0)?.pid
    }

    /// Whether the session started the target (rather than attached to it).
    pub fn is_spawned(&self, t: TargetId) -> bool {
        self.slots.get(t.0).is_some_and(|s| s.spawned)
    }
}
