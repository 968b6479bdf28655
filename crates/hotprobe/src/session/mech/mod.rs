//! The mechanisms a session places probes with, behind one interface
//! ([`ProbeMechanism`]), and the list of them a target has ([`Mechs`]).
//!
//! - [`trap::TrapMech`]: the trap engine ([`crate::Engine`]): an `int3`
//!   handled through ptrace, or, on a guest, a breakpoint through QEMU's
//!   GDB stub: the guest stub is this same mechanism over the guest's
//!   target (`Mechanism::Stub` only names it in placements).
//! - [`fast::FastMech`]: the fast path's patch and jump sites (a call to
//!   the agent, no trap).
//! - [`inproc::InProcMech`]: the agent's in-process trap (an `int3` its
//!   `SIGTRAP` handler takes, no ptrace stop).
//! - [`plugin::PluginMech`]: hotprobe's QEMU TCG plugin of a guest.
//!
//! A mechanism borrows what the target shares ([`Cx`]): the target itself
//! (held by the session's slot, not by any mechanism), the trap engine
//! (which borrows the target for each call that reads or writes it), the
//! agent (the fast path, the in-process traps and the trap table all live
//! in it), the code ledger, and the session's probe ids and inbox of the
//! target.
//!
//! The session keeps, per target, the list of mechanisms and which one
//! serves each probe (`Slot::owner`), allocates probe ids (`ids.rs`: each
//! mechanism is handed the id of each probe it places, the trap engine's
//! own ids included), plans a site by an ordered choice over the
//! mechanisms (`plan.rs`), and holds notices, pending probes and followed
//! children (`inbox.rs`: the engine reports notices and held children,
//! typed; mechanisms give their notices through [`Cx::notice`]).

pub(super) mod fast;
pub(super) mod inproc;
pub(super) mod plugin;
pub(super) mod trap;
mod trap_event;

use super::agent::{Agent, ByProcess};
use super::ids::ProbeIds;
use super::inbox::Inbox;
use super::ledger::{CodeLedger, CodeOwner, GoneSite};
use super::{Capture, Placement, Plan};
use crate::handler::ProbeId;
use crate::recorder::{EventSink, SinkError};
use crate::{Engine, EngineError, HeldTarget};
use hotprobe_fastpath::{MechanismChoice, RecordedEvent};
use hotprobe_symbols::ResolvedProbe;

/// Which mechanism serves a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MechKind {
    /// The trap engine (ptrace trap, guest stub).
    Trap,
    /// A patch or jump site of the fast path.
    Fast,
    /// The agent's in-process trap.
    InProcess,
    /// The guest's QEMU plugin.
    Plugin,
}

impl MechKind {
    /// Whether this mechanism is told of a site `owner` wrote when it
    /// goes: the trap of its `int3`s and their guards, the fast path of
    /// every write of the agent (its one list holds the in-process traps
    /// too), the in-process trap of its own. Nobody is told of inherited
    /// bytes (only the ledger holds them) nor, on a guest, the plugin
    /// (it writes no code byte).
    pub(crate) fn serves(self, owner: CodeOwner) -> bool {
        match self {
            MechKind::Trap => matches!(owner, CodeOwner::Trap | CodeOwner::Guard),
            MechKind::Fast => matches!(owner, CodeOwner::Fast | CodeOwner::InProcess),
            MechKind::InProcess => owner == CodeOwner::InProcess,
            MechKind::Plugin => false,
        }
    }
}

/// What the mechanisms of a target borrow from it.
pub(crate) struct Cx<'a> {
    /// The trap engine (the trap mechanism's state).
    pub engine: &'a mut Engine,
    /// The target, held by the session: every mechanism borrows it here.
    pub target: &'a mut HeldTarget,
    /// The agent (a process target's).
    pub agent: &'a mut Agent,
    /// Every byte written into the target's code.
    pub ledger: &'a mut CodeLedger,
    /// The target's probe ids: a mechanism takes the id of each probe it
    /// places from here.
    pub ids: &'a mut ProbeIds,
    /// The target's notices and held children.
    pub inbox: &'a mut Inbox,
}

impl Cx<'_> {
    /// A notice about the target, after what the engine reported before.
    pub(crate) fn notice(&mut self, text: String) {
        self.inbox.notice(self.engine, text);
    }
}

/// A probe with handlers ([`crate::Action::Handler`]) to place: the
/// mechanism that takes it takes the probe out of `probe`; one that cannot
/// leaves it there for the next one asked (the session asks the fast
/// path's handler call, then the in-process trap, then the trap).
pub(crate) struct HandlerAsk {
    /// The probe, until a mechanism takes it.
    pub probe: std::cell::RefCell<Option<crate::handler::Probe>>,
    /// How long each side of a shared-memory handler call spins.
    pub spin: std::time::Duration,
    /// How long a request may wait to be taken.
    pub timeout: std::time::Duration,
}

impl HandlerAsk {
    /// Takes the probe out (`None`: a mechanism took it already).
    pub(crate) fn take(&self) -> Option<crate::handler::Probe> {
        self.probe.borrow_mut().take()
    }

    /// Leaves the probe for the next mechanism asked.
    pub(crate) fn give_back(&self, probe: crate::handler::Probe) {
        *self.probe.borrow_mut() = Some(probe);
    }
}

/// A probe to place at one resolved address: a `Count` or `Record`, or,
/// with [`SiteAsk::handler`], a probe with handlers.
pub(crate) struct SiteAsk<'r> {
    /// Where.
    pub r: &'r ResolvedProbe,
    /// What the user sees.
    pub label: String,
    /// A `%return` spec.
    pub is_return: bool,
    /// `Record` (else `Count`).
    pub record: bool,
    /// What a trap `Record` reads at its hits (typed values).
    pub capture: Option<Capture>,
    /// Float/double values from xmm registers on the fast path.
    pub xmm: Option<u8>,
    /// Typed values copied in the target on the fast path.
    pub program: Option<hotprobe_abi::capture::CapturePrograms>,
    /// An aggregation in the target instead of events (fast path).
    pub agg: Option<hotprobe_fastpath::agg::AggRule>,
    /// The probe id already given (a pending probe being armed).
    pub existing: Option<ProbeId>,
    /// The session's (or this spec's) choice of mechanism.
    pub choice: MechanismChoice,
    /// Live return instances a trap return probe follows.
    pub maxactive: usize,
    /// Argument registers a record event carries.
    pub nargs: usize,
    /// The fast path's shared-memory sizes.
    pub fast_path: hotprobe_fastpath::FastPathConfig,
    /// Inside `Session::add_filtered`: fast-path writes held for a batch.
    pub batching: bool,
    /// Why the in-process trap may not be used in this target, if so.
    pub inproc_refusal: Option<String>,
    /// The plugin's options for this probe.
    pub plugin: Option<crate::PluginOptions>,
    /// The guest's `__x86_return_thunk`, for the plugin.
    pub return_thunk: Option<u64>,
    /// A process's modules (`None` for a guest).
    pub symbols: Option<&'r hotprobe_symbols::ProcessSymbols>,
    /// A probe with handlers to place instead of a `Count` or `Record`
    /// (`is_return` and `record` are then false).
    pub handler: Option<&'r HandlerAsk>,
}

/// A mechanism's answer to a site.
pub(crate) enum Verdict {
    /// It takes the site, as planned.
    Take(Plan),
    /// It cannot, and why (the next mechanism in the order is asked).
    Pass(String),
}

/// A change of the target every mechanism is told of
/// ([`ProbeMechanism::on_change`]). A module unmapped is not one of them:
/// the session's walk of the code ledger tells each mechanism exactly
/// which of its sites went ([`ProbeMechanism::forget_sites`]).
pub(crate) enum TargetChange {
    /// The process ran `execve`: its image is gone (before the engine
    /// handles the exec).
    Exec,
    /// The process forked (after the engine handled the fork, before the
    /// session's walk of the ledger decides what the child keeps and
    /// whether it is followed: `session/follow.rs`).
    Forked {
        /// The child's pid.
        #[expect(
            dead_code,
            reason = "every mechanism leaves a fork to the engine and the session's ledger walk \
                      today (see each `on_change`); the child is named for one that does not"
        )]
        child: u64,
    },
    /// The dynamic loader's rendezvous: its list of modules changed (a
    /// `dlopen` mapped a module, or a `dlclose` unmapped one). Told after
    /// the sites of unmapped modules were forgotten and the pending probes
    /// of mapped ones armed (`Session::refresh_pending`).
    ModuleMapped,
    /// The target exited (or died).
    Exited,
}

/// How a mechanism stands after the first step of a detach from a live
/// process ([`ProbeMechanism::prepare_detach`]; see `session/detach.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DetachReady {
    /// Its sites may be restored: every thread stopped, none inside them.
    Ready,
    /// None of its bytes are in the target.
    Nothing,
    /// The target is gone: nothing is restored.
    Gone,
}

/// What the session's walk of the ledger did with a mechanism's sites,
/// for its last step ([`ProbeMechanism::finish_detach`]).
pub(crate) enum Walked {
    /// Its sites have their original bytes back; `foreign`: those another
    /// writer had changed, left as [`hotprobe_fastpath::ForeignOutcome`]
    /// says.
    Restored {
        foreign: Vec<hotprobe_fastpath::ForeignWrite>,
    },
    /// The walk could not write every site back (the error is the
    /// detach's).
    Failed,
    /// The target is gone.
    Gone,
    /// Its sites were not walked (it was not ready, or had none).
    Skipped,
}

/// One way of executing probes (see the module docs).
pub(crate) trait ProbeMechanism {
    /// Which mechanism this is.
    fn kind(&self) -> MechKind;

    /// Whether this mechanism can serve `ask`, and if not why; `Err` when
    /// the caller's forced choice of it cannot be met.
    fn plan(
        &mut self,
        cx: &mut Cx<'_>,
        ask: &SiteAsk<'_>,
        before: Option<String>,
    ) -> Result<Verdict, EngineError>;

    /// Places `ask` as `plan` said; `Ok(Err(why))` when the site turns out
    /// not to take it after all (the caller falls back).
    fn place(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError>;

    /// Enables or disables probe `id` at run time.
    fn set_enabled(&mut self, cx: &mut Cx<'_>, id: ProbeId, on: bool) -> Result<(), EngineError>;

    /// Removes probe `id`.
    fn remove(&mut self, cx: &mut Cx<'_>, id: ProbeId) -> Result<(), EngineError>;

    /// Adds probe `id`'s counts of this mechanism to `by` (`me`: the
    /// target's pid); false when it has none for it.
    fn stats(&self, engine: &Engine, id: ProbeId, me: i32, by: &mut ByProcess) -> bool;

    /// Hands this mechanism's recorded events to `sink`, or, when they
    /// must be merged with the agent's rings by time stamp, queues them
    /// (with the bytes captured at the hit, if any). Returns how many were
    /// handed to `sink`, and how many were lost in full rings.
    fn drain(
        &mut self,
        sink: &mut dyn EventSink,
        queued: &mut Vec<(RecordedEvent, Option<Vec<u8>>)>,
    ) -> Result<(u64, u64), SinkError>;

    /// Reacts to a change of the target (see [`TargetChange`] for when
    /// each is told).
    fn on_change(&mut self, cx: &mut Cx<'_>, change: &TargetChange);

    /// The program unmapped memory under some of this mechanism's sites
    /// (it unloaded a library): `gone` lists exactly those sites, as the
    /// session's one walk of the code ledger found and took them out (see
    /// `session/unmapped.rs`), in address order, only sites this
    /// mechanism wrote or serves ([`MechKind::serves`]). The mechanism
    /// forgets them without writing anything (the memory is gone) and
    /// does not look for others. Returns the probes that were served
    /// there, the session's own left out; their counts stay readable, and
    /// the session may arm them again under the same ids (a pending
    /// probe's module loaded again).
    fn forget_sites(&mut self, cx: &mut Cx<'_>, gone: &[GoneSite]) -> Vec<ProbeId>;

    /// Takes this mechanism out of a target (or forgets it, `gone`: the
    /// target is gone; a live one is detached by one walk of its ledger,
    /// see `session/detach.rs`).
    fn detach(&mut self, cx: &mut Cx<'_>, gone: bool) -> Result<(), EngineError>;

    /// Detach from a live process, first step: makes this mechanism's
    /// sites safe to restore, doing only what it alone can (threads kept
    /// out of its bytes or its scratch, return addresses put back), every
    /// thread left stopped. The session then puts every ledger site back
    /// in one walk. Nothing to do by default.
    fn prepare_detach(&mut self, _cx: &mut Cx<'_>) -> Result<DetachReady, EngineError> {
        Ok(DetachReady::Nothing)
    }

    /// Detach from a live process, last step, told what the walk did:
    /// releases what only this mechanism holds (its scratch memory, its
    /// entries in shared memory, the agent it injected). Nothing to do by
    /// default.
    fn finish_detach(&mut self, _cx: &mut Cx<'_>, _walked: Walked) -> Result<(), EngineError> {
        Ok(())
    }
}

/// The mechanisms registered on one target: the trap engine always; the
/// fast path and the in-process trap on a process; the plugin on a guest
/// started with it.
pub(crate) struct Mechs {
    pub trap: trap::TrapMech,
    pub fast: Option<fast::FastMech>,
    pub inproc: Option<inproc::InProcMech>,
    pub plugin: Option<plugin::PluginMech>,
}

impl Mechs {
    /// The mechanisms of a process target.
    pub(crate) fn process() -> Mechs {
        Mechs {
            trap: trap::TrapMech::default(),
            fast: Some(fast::FastMech::default()),
            inproc: Some(inproc::InProcMech::default()),
            plugin: None,
        }
    }

    /// The mechanisms of any other target (the trap engine alone).
    pub(crate) fn other() -> Mechs {
        Mechs {
            trap: trap::TrapMech::default(),
            fast: None,
            inproc: None,
            plugin: None,
        }
    }

    /// The mechanism `kind`, if registered.
    pub(crate) fn get(&mut self, kind: MechKind) -> Option<&mut dyn ProbeMechanism> {
        match kind {
            MechKind::Trap => Some(&mut self.trap),
            MechKind::Fast => self.fast.as_mut().map(|m| m as &mut dyn ProbeMechanism),
            MechKind::InProcess => self.inproc.as_mut().map(|m| m as &mut dyn ProbeMechanism),
            MechKind::Plugin => self.plugin.as_mut().map(|m| m as &mut dyn ProbeMechanism),
        }
    }

    /// The order a site is planned in: the plugin, the fast path, then
    /// the trap engine, which takes whatever the others passed on. (The
    /// in-process trap is tried at placement, where the trap was planned:
    /// it needs the site's instruction checked in the target.)
    pub(crate) fn planning_order(&mut self) -> Vec<&mut dyn ProbeMechanism> {
        let mut v: Vec<&mut dyn ProbeMechanism> = Vec::new();
        if let Some(p) = &mut self.plugin {
            v.push(p);
        }
        if let Some(f) = &mut self.fast {
            v.push(f);
        }
        v.push(&mut self.trap);
        v
    }

    /// Every registered mechanism, in the order they are taken out of a
    /// target: the plugin, the fast path, the in-process trap, the trap.
    pub(crate) fn all(&mut self) -> Vec<&mut dyn ProbeMechanism> {
        let mut v: Vec<&mut dyn ProbeMechanism> = Vec::new();
        if let Some(p) = &mut self.plugin {
            v.push(p);
        }
        if let Some(f) = &mut self.fast {
            v.push(f);
        }
        if let Some(i) = &mut self.inproc {
            v.push(i);
        }
        v.push(&mut self.trap);
        v
    }

    /// Every registered mechanism (shared).
    pub(crate) fn all_ref(&self) -> Vec<&dyn ProbeMechanism> {
        let mut v: Vec<&dyn ProbeMechanism> = Vec::new();
        if let Some(p) = &self.plugin {
            v.push(p);
        }
        if let Some(f) = &self.fast {
            v.push(f);
        }
        if let Some(i) = &self.inproc {
            v.push(i);
        }
        v.push(&self.trap);
        v
    }
}
