//! hotprobe's fast path: probes whose in-target action (`count`, `record`)
//! runs inside the target, in the hotprobe agent, with no trap and no tracer
//! round trip (iProbe).
//!
//! Per site the mechanism is chosen ([`ModuleInfo::plan`]): **patch** when
//! the function has a placeholder (`-fpatchable-function-entry`,
//! `-pg -mfentry -mnop-mcount`, or a ColdPatched `-finstrument-functions`
//! build with its `BIN.probes` list), then **jump** (the entry's first ≥ 5
//! bytes move to a per-site trampoline within ±2 GiB that calls the agent),
//! else **trap**, which this crate reports with the reason so that the engine
//! uses its trap mechanism. Exits come from ColdPatch exit placeholders, or
//! from the agent's return hook (shadow stack, see `hotprobe_abi::ACTION_EXIT`).
//!
//! Life cycle: [`FastPath::for_spawn`] (memfd + `LD_PRELOAD`) then
//! [`PendingFastPath::attach`] once the process is at its entry point, or
//! [`FastPath::inject`] for a running process (remote `dlopen`); then
//! [`FastPath::add`] per function, [`FastPath::counts`]/[`FastPath::drain`],
//! and [`FastPath::detach`], which takes out every byte it wrote (where
//! another writer changed a site since, see [`ForeignWrite`]).
//!
//! What stays behind after detach (documented, deliberate): the agent
//! library, its near page, the shared memory mapping and the tracer's
//! trampoline pages stay mapped in the target — a thread may still be inside
//! a trampoline or the agent, or return later through a swapped return
//! address (the agent keeps its return trampoline and shadow stacks, so
//! those returns stay correct). No code of the program refers to them any more.

mod agent;
mod agent_check;
mod control;
mod foreign;
mod head_last;
mod inproc;
mod install;
mod ledger;
mod ledger_view;
mod owner;
mod pass;
mod plan;
mod pool;
mod pun;
mod shm;
mod stub;
mod unload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hotprobe_abi::{
    Event, ACTION_COUNT, ACTION_RECORD, CONTROL_ENABLED, CONTROL_RECORD, STATUS_ATTACHED,
};
use hotprobe_process::ProcessTarget;
use hotprobe_target::TargetError;

pub use foreign::{restore_sites, ForeignOutcome, ForeignWrite, SiteRestore};
/// The in-target aggregation tables (`Action::agg`).
pub use hotprobe_abi::agg;
pub use hotprobe_abi::{
    Event as RecordedEvent, EVENT_XMM, EXIT_UNWOUND, INPROC_SITES, KIND_ENTRY, KIND_EXIT, KIND_HIT,
    TRAP_GUARD, TRAP_RETURN, TRAP_SLOTS,
};
pub use inproc::{HandlerCall, InprocInfo, StubHandlerInfo};
pub use ledger::LiveWrite;
pub use ledger_view::{ledger_state, LedgerState, UndoState};
pub use owner::check_not_probed;
pub use plan::{
    explain, probe_list_path, ExitSite, FunctionInfo, FunctionPlan, Mechanism, MechanismChoice,
    ModuleInfo, PatchKind, SitePlan,
};
use pool::Pool;
use shm::OwnedShm;

/// Errors of the fast path.
#[derive(Debug, thiserror::Error)]
pub enum FastPathError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a usable ELF file.
    #[error("{path}: not a usable ELF file: {why}")]
    Elf {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A probe list that does not parse.
    #[error("{path}: bad probe list: {why}")]
    ProbeList {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A forced mechanism cannot be used for this function.
    #[error("cannot use the {mechanism} mechanism for {function}: {why}")]
    Impossible {
        /// The function.
        function: String,
        /// The mechanism asked for.
        mechanism: &'static str,
        /// Why.
        why: String,
    },
    /// No function of that name in the main executable or its probe list.
    #[error("no function {0} in the main executable (nor in its probe list)")]
    NoSuchFunction(String),
    /// `HOTPROBE_AGENT` names no usable file.
    #[error("HOTPROBE_AGENT={}: {why}", path.display())]
    AgentOverride {
        /// The path given.
        path: PathBuf,
        /// Why it cannot be used.
        why: String,
    },
    /// The embedded agent could not be written to a memfd.
    #[error("cannot write the embedded agent library to a memfd: {0}")]
    AgentMemfd(String),
    /// The agent did not attach to the shared memory.
    #[error("the agent did not attach in pid {pid}: {why}")]
    AgentNotAttached {
        /// The process.
        pid: i32,
        /// Why.
        why: String,
    },
    /// Shared memory setup failed.
    #[error("shared memory: {0}")]
    Shm(String),
    /// Another hotprobe session probes the process (holds it by ptrace,
    /// or runs it released with its probes in): see [`check_not_probed`].
    #[error("pid {pid} is probed by another hotprobe session (pid {session}); detach it first")]
    ProbedByAnotherSession {
        /// The process.
        pid: i32,
        /// The other session's process.
        session: u32,
    },
    /// A hotprobe session that died left sites in the process that its
    /// agent has not put back yet: see [`check_not_probed`].
    #[error(
        "pid {pid} still holds {sites} probe sites of a hotprobe session (pid {session}) that \
         died, and its agent has not put them back; try again, or restart the program"
    )]
    AbandonedSites {
        /// The process.
        pid: i32,
        /// The dead session's process.
        session: u32,
        /// Its sites still in the code.
        sites: u64,
    },
    /// Every thread kept running inside the bytes to rewrite.
    #[error("a thread stays inside the bytes at {addr:#x} to rewrite; gave up")]
    Busy {
        /// The site.
        addr: u64,
    },
    /// No trampoline memory within ±2 GiB of a site.
    #[error("no memory within ±2 GiB of {addr:#x} for a trampoline: {why}")]
    NoTrampolineMemory {
        /// The site.
        addr: u64,
        /// Why.
        why: String,
    },
    /// The displaced instructions could not be relocated.
    #[error(transparent)]
    Jump(#[from] hotprobe_x86::JumpError),
    /// A per-site stub could not be assembled.
    #[error("cannot assemble the stub for {addr:#x}: {why}")]
    Assemble {
        /// The site.
        addr: u64,
        /// Why.
        why: String,
    },
    /// A target operation failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Symbols of the process could not be read.
    #[error(transparent)]
    Symbols(#[from] hotprobe_symbols::SymbolError),
}

/// What the agent does on each hit of a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    /// Write events (entry: the first [`FastPathConfig::record_args`]
    /// argument registers, rounded up to 2 or 6; exit: rax, rdx) into the
    /// thread's ring; counting always happens.
    pub record: bool,
    /// Also observe the function's exits.
    pub exit: bool,
    /// Record float and double values too (`Some(k)`: see
    /// [`hotprobe_abi::ACTION_XMM_SHIFT`]): entries store the first `k`
    /// integer argument registers then xmm0, xmm1, …, exits rax, rdx and
    /// xmm0. Needs 64-byte event slots ([`FastPathConfig::record_args`] > 2).
    pub xmm: Option<u8>,
    /// Aggregate in the target (`hotprobe_abi::agg`): each hit adds into
    /// the probe's histogram or key count, through the agent (no stub).
    pub agg: Option<hotprobe_abi::agg::AggRule>,
    /// Capture the user stack at each entry (issue 24, `--stacks`): the
    /// agent walks it and counts it in the stacks region
    /// ([`hotprobe_abi::stacks`]); needs [`FastPathConfig::stacks`].
    pub stack: bool,
    /// Typed values copied in the target at each recorded entry (issue 23:
    /// strings, fields through pointers, stack arguments): the program is
    /// published for the probe ([`hotprobe_abi::capture`]), the site takes
    /// the agent's generic trampoline, and the bytes precede the entry
    /// event as continuation events. Needs 64-byte event slots and a site
    /// at the function's first instruction (not a coldpatch placeholder).
    pub capture: Option<hotprobe_abi::capture::CapturePrograms>,
}

impl Action {
    /// Count entries.
    pub fn count() -> Action {
        Action {
            record: false,
            exit: false,
            xmm: None,
            agg: None,
            stack: false,
            capture: None,
        }
    }
    /// Count and record entries.
    pub fn record() -> Action {
        Action {
            record: true,
            exit: false,
            xmm: None,
            agg: None,
            stack: false,
            capture: None,
        }
    }
    /// Also observe exits (exit events when recording).
    pub fn with_stack(self) -> Action {
        Action {
            stack: true,
            ..self
        }
    }
    /// Also observe the function's exits.
    pub fn with_exit(self) -> Action {
        Action { exit: true, ..self }
    }
    /// Also record xmm registers: the first `ints` integer argument
    /// registers, then xmm0, xmm1, … (see [`Action::xmm`]).
    pub fn with_xmm(self, ints: u8) -> Action {
        Action {
            xmm: Some(ints.min(6)),
            ..self
        }
    }
    /// Also copy typed values in the target (see [`Action::capture`]).
    pub fn with_capture(self, programs: hotprobe_abi::capture::CapturePrograms) -> Action {
        Action {
            capture: Some(programs),
            ..self
        }
    }
    /// Also aggregate in the target (see [`Action::agg`]).
    pub fn with_agg(self, rule: hotprobe_abi::agg::AggRule) -> Action {
        Action {
            agg: Some(rule),
            ..self
        }
    }
    fn bits(self) -> u32 {
        let xmm = match (self.record, self.xmm) {
            (true, Some(k)) => hotprobe_abi::action_xmm(k),
            _ => 0,
        };
        let agg = if self.agg.is_some() {
            hotprobe_abi::ACTION_AGG
        } else {
            0
        };
        let stack = if self.stack {
            hotprobe_abi::ACTION_STACK
        } else {
            0
        };
        let capture = match (self.record, self.capture) {
            (true, Some(_)) => hotprobe_abi::ACTION_CAPTURE,
            _ => 0,
        };
        ACTION_COUNT | if self.record { ACTION_RECORD } else { 0 } | xmm | agg | stack | capture
    }
}

/// What [`FastPath::add`] did for a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteInfo {
    /// The function.
    pub function: String,
    /// Probe id its events and counter carry.
    pub probe_id: u32,
    /// Run-time address of the rewritten site (or of the function for trap).
    pub addr: u64,
    /// The mechanism. [`Mechanism::Trap`] means nothing was installed: the
    /// engine's trap mechanism must handle the site.
    pub mechanism: Mechanism,
    /// Why this mechanism.
    pub reason: String,
    /// How exits are observed: `"return hook"`, `"exit placeholders"`, or `"none"`.
    pub exits: &'static str,
    /// With exit placeholders: the counter id their hits (the returns) are
    /// counted under (their events carry `probe_id`).
    pub exit_probe_id: Option<u32>,
    /// Hits go through a per-site stub (no register save beyond the few it
    /// uses, no lookup) rather than the agent's generic trampoline.
    pub stub: bool,
}

/// Shared-memory sizes.
#[derive(Clone, Copy, Debug)]
pub struct FastPathConfig {
    /// Probe ids available per target: the size of the reservation for
    /// the site table, the global, missed and per-thread counters. Only
    /// the pages of ids in use (and of the site-table slots under probed
    /// text) are ever touched, so a large reservation costs address space,
    /// not memory: the default, 2^20, is about 4.6 GB of address space in
    /// tracer and target with 1,024 thread slots (most of it the rings), and
    /// ≈ 8 bytes of shared memory per probe id used, plus 8 per probe per
    /// thread that hits it.
    pub max_probes: u32,
    /// Cap on thread slots: threads alive at once that get a ring (a
    /// slot is given back when its thread exits). The slots grow on
    /// demand in chunks of up to [`hotprobe_abi::DEFAULT_CHUNK_SLOTS`]
    /// (see [`hotprobe_abi::SlotDirectory`]): a chunk costs address space
    /// once a thread needs it, and rings are populated as they are
    /// written. At most [`hotprobe_abi::MAX_SLOTS`]; the agent gives slots
    /// to 16,384 threads alive at once at most (its thread table).
    pub max_threads: u32,
    /// Events per thread ring (power of two).
    pub ring_capacity: u32,
    /// Argument registers entry events carry (0–6): at most 2 gives
    /// 32-byte event slots (tsc, meta, 2 values: rdi, rsi on entry, rax, rdx
    /// on exit), more gives 64-byte slots with all 6. Smaller slots write
    /// and drain faster and halve the rings' memory.
    pub record_args: u8,
    /// Heartbeat timeout after which the agent stops recording.
    pub heartbeat_timeout: Duration,
    /// Use per-site stubs where possible (see the `stub` module); false
    /// sends every hit through the agent's generic trampolines (slower;
    /// kept for comparison).
    pub stubs: bool,
    /// Reserve the stacks region ([`hotprobe_abi::stacks`]) after the
    /// main layout, for [`Action::stack`] probes (issue 24, `--stacks`).
    pub stacks: bool,
}

impl Default for FastPathConfig {
    fn default() -> Self {
        FastPathConfig {
            max_probes: 1 << 20,
            max_threads: 16384,
            ring_capacity: 1 << 16,
            record_args: 6,
            heartbeat_timeout: Duration::from_secs(2),
            stubs: true,
            stacks: false,
        }
    }
}

/// The agent library (`libhotprobe_agent.so`, release build), embedded at
/// build time by this crate's build script.
pub static EMBEDDED_AGENT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/libhotprobe_agent.so"));

/// The name of the memfd holding the embedded agent (it shows in a target's
/// `/proc/PID/maps` as `/memfd:libhotprobe_agent.so (deleted)`, and
/// `hotprobe_symbols` names that module `libhotprobe_agent.so`).
pub const AGENT_MEMFD_NAME: &str = "libhotprobe_agent.so";

/// The agent library to load into targets: `$HOTPROBE_AGENT` when set (an
/// explicit path, which must name a file: an error otherwise, no fallback),
/// else [`embedded_agent`].
pub fn find_agent() -> Result<PathBuf, FastPathError> {
    if let Some(p) = std::env::var_os("HOTPROBE_AGENT") {
        let path = PathBuf::from(p);
        let bad = |why: String| FastPathError::AgentOverride {
            path: path.clone(),
            why,
        };
        return match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {
                agent_check::check_agent_elf(&path).map_err(bad)?;
                std::fs::canonicalize(&path).map_err(|e| bad(e.to_string()))
            }
            Ok(_) => Err(bad("not a file".into())),
            Err(e) => Err(bad(e.to_string())),
        };
    }
    embedded_agent()
}

/// The embedded agent ([`EMBEDDED_AGENT`]), written once per process into a
/// sealed memfd named [`AGENT_MEMFD_NAME`] that stays open for the life of
/// the process: returns `/proc/OUR_PID/fd/N`, a path a spawned target
/// (`LD_PRELOAD`) and an injected remote `dlopen` can open while this
/// process lives. The descriptor is close-on-exec: programs we spawn do
/// not inherit it, they open it by that path.
pub fn embedded_agent() -> Result<PathBuf, FastPathError> {
    static AGENT: std::sync::OnceLock<Result<std::os::fd::OwnedFd, String>> =
        std::sync::OnceLock::new();
    match AGENT.get_or_init(agent_memfd) {
        Ok(fd) => {
            use std::os::fd::AsRawFd;
            Ok(PathBuf::from(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                fd.as_raw_fd()
            )))
        }
        Err(e) => Err(FastPathError::AgentMemfd(e.clone())),
    }
}

/// Creates the memfd holding [`EMBEDDED_AGENT`], sealed against any change.
fn agent_memfd() -> Result<std::os::fd::OwnedFd, String> {
    hotprobe_os::Memfd::sealed_executable(AGENT_MEMFD_NAME, EMBEDDED_AGENT)
        .map(Into::into)
        .map_err(|e| e.to_string())
}

/// The trap table of a fast path's shared memory (a cheap handle: clone it
/// into the trap mechanism's handlers). Everything the tracer writes as an
/// `int3` — trap probes, the return trampoline, the loader's rendezvous —
/// is published here (address → original byte), with the out-of-line
/// memory and each live call of a trap return probe (thread, stack slot,
/// real return address), so that the agent's `SIGTRAP` handler puts the
/// program back on its feet when the tracer is killed with SIGKILL.
#[derive(Clone, Debug)]
pub struct TrapTable(Arc<OwnedShm>);

impl TrapTable {
    /// Publishes the `int3` at `addr` over `orig`; `flags`:
    /// [`TRAP_RETURN`] (the return trampoline), [`TRAP_GUARD`] (a guard
    /// one byte into a trapped instruction). False when the table is full.
    pub fn publish(&self, addr: u64, orig: u8, flags: u32) -> bool {
        self.0.shm().publish_trap(addr, orig, flags)
    }

    /// Takes the `int3` at `addr` out of the table.
    pub fn unpublish(&self, addr: u64) {
        self.0.shm().unpublish_trap(addr)
    }

    /// Publishes the out-of-line memory (start, end), replacing the list.
    pub fn set_regions(&self, regions: &[(u64, u64)]) {
        self.0.shm().set_trap_regions(regions)
    }

    /// Publishes a call of a trap return probe of thread `tid` whose
    /// return address at `slot` is about to be swapped; the real one is
    /// `real`. Publish before the swap, and leave the entry when the call
    /// returns (the next call with the same stack slot replaces it): a
    /// tracer that dies anywhere between the swap and the thread's resumed
    /// return leaves the agent what it needs.
    pub fn publish_return(&self, tid: u32, slot: u64, real: u64) -> bool {
        self.0.shm().publish_return(tid, slot, real)
    }

    /// Whether `addr` is the published return trampoline (a return address
    /// already swapped).
    pub fn is_return_trampoline(&self, addr: u64) -> bool {
        self.0
            .shm()
            .lookup_trap(addr)
            .is_some_and(|(_, f)| f & TRAP_RETURN != 0)
    }

    /// Every call's real return address is back in place (detach).
    pub fn clear_returns(&self) {
        self.0.shm().clear_returns()
    }
}

/// A fast path prepared for a process about to be spawned.
#[derive(Debug)]
pub struct PendingFastPath {
    shm: Arc<OwnedShm>,
    stubs: bool,
}

#[derive(Debug)]
struct Installed {
    addr: u64,
    original: Vec<u8>,
    /// What this fast path wrote there (`bytes` of `install`, or the
    /// in-process trap's `int3`).
    written: Vec<u8>,
    key: u64,
    /// Its entry in the shared memory's code ledger (see the `ledger`
    /// module); `None` when the ledger was full.
    ledger: Option<u32>,
}

/// A stacks region ([`FastPath::stacks_handle`]) that keeps the shared
/// memory mapped while it lives (the fast path may be dropped first).
#[derive(Clone, Debug)]
pub struct StacksHandle {
    view: hotprobe_abi::stacks::StacksView,
    _mapping: Arc<OwnedShm>,
}

impl StacksHandle {
    /// The region (valid as long as this handle).
    pub fn view(&self) -> &hotprobe_abi::stacks::StacksView {
        &self.view
    }
}

/// The fast path of one process target.
#[derive(Debug)]
pub struct FastPath {
    shm: Arc<OwnedShm>,
    pid: i32,
    modules: HashMap<PathBuf, ModuleInfo>,
    installed: Vec<Installed>,
    pools: Vec<Pool>,
    next_probe: u32,
    heartbeat: Option<shm::Heartbeat>,
    detached: bool,
    stubs: bool,
    /// Handler sites on patch or jump (`inproc`): site key → site.
    handler_keys: HashMap<u64, u64>,
    /// The handler slot [`FastPath::take_handler_call`] scans first (one
    /// past the last one taken: round robin).
    handler_cursor: std::sync::atomic::AtomicUsize,
    /// Writes held back while a batch is open ([`FastPath::begin_batch`]).
    batch: Option<Vec<(u64, Vec<u8>)>>,
    /// Bumped whenever entries leave `installed` (see
    /// [`FastPath::written_since`]).
    removals: u64,
    /// Stubs assembled once per shape, patched per site.
    templates: stub::StubTemplates,
    /// The page last read for a site's original bytes in the open batch.
    page_cache: Option<(u64, Vec<u8>)>,
    /// Sites of disabled probes (see the `control` module): address →
    /// (the patched bytes taken out, the site's action bits).
    disabled: HashMap<u64, (Vec<u8>, u32)>,
    /// Sites found changed by another writer when hotprobe took its bytes
    /// out, not yet taken by [`FastPath::take_foreign_writes`].
    foreign: Vec<ForeignWrite>,
    /// Code-ledger entries free again (see the `ledger` module).
    ledger_free: Vec<u32>,
    /// Code-ledger entries never used start here.
    ledger_next: u32,
    /// How to unload the agent at detach: set when we injected it.
    unload: Option<unload::Unload>,
    /// The agent's `hotprobe_agent_map_rings` in the target, until it has
    /// been called (see [`FastPath::map_ring_pool`]).
    map_rings: Option<u64>,
    /// What stayed in the target at detach, and why (see `unload`):
    /// filled at the target's detach.
    left_behind: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FastPath {
    fn new(
        shm: Arc<OwnedShm>,
        t: &mut ProcessTarget,
        stubs: bool,
    ) -> Result<FastPath, FastPathError> {
        let h = shm.shm().header();
        // Acquire pairs with the agent's `status.fetch_or(ATTACHED, Release)`.
        if h.status.load(Acquire) & STATUS_ATTACHED == 0 {
            return Err(FastPathError::AgentNotAttached {
                pid: t.pid(),
                why: "its constructor did not map the shared memory (LD_PRELOAD ignored? a setuid or static binary?)".into(),
            });
        }
        h.control.store(CONTROL_ENABLED | CONTROL_RECORD, Relaxed);
        let heartbeat = Some(shm::Heartbeat::start(shm.clone()));
        Ok(FastPath {
            shm,
            pid: t.pid(),
            modules: HashMap::new(),
            installed: Vec::new(),
            pools: Vec::new(),
            next_probe: 0,
            heartbeat,
            detached: false,
            stubs,
            handler_keys: HashMap::new(),
            handler_cursor: std::sync::atomic::AtomicUsize::new(0),
            batch: None,
            removals: 0,
            templates: stub::StubTemplates::default(),
            page_cache: None,
            disabled: HashMap::new(),
            foreign: Vec::new(),
            ledger_free: Vec::new(),
            ledger_next: 0,
            unload: None,
            map_rings: None,
            left_behind: Arc::default(),
        })
    }

    /// The validated shared-memory view (counters, rings, header).
    pub fn shm(&self) -> &hotprobe_abi::Shm {
        self.shm.shm()
    }

    /// The stacks region, when [`FastPathConfig::stacks`] reserved one.
    pub fn stacks(&self) -> Option<hotprobe_abi::stacks::StacksView> {
        hotprobe_abi::stacks::StacksView::of(self.shm())
    }

    /// The stacks region with the mapping held ([`StacksHandle`]): its
    /// stacks stay readable however long the handle is kept.
    pub fn stacks_handle(&self) -> Option<StacksHandle> {
        Some(StacksHandle {
            view: self.stacks()?,
            _mapping: self.shm.clone(),
        })
    }

    /// Hits of `probe_id` so far (exact once the target's threads are quiescent).
    pub fn count(&self, probe_id: u32) -> u64 {
        self.shm().counter(probe_id)
    }

    /// Hits of `probe_id` per process (the owner pid of each thread slot;
    /// hits of threads without a slot go to the agent's first process).
    /// Differs from [`FastPath::count`] only when forked children are
    /// followed (see [`FastPath::set_follow_forks`]).
    pub fn counts_by_process(&self, probe_id: u32) -> Vec<(u32, u64)> {
        use std::sync::atomic::Ordering::Relaxed as R;
        let shm = self.shm();
        let i = probe_id as usize;
        let mut by: std::collections::BTreeMap<u32, u64> = Default::default();
        let first = shm.header().agent_pid.load(R);
        if let Some(c) = shm.global_counters().get(i) {
            *by.entry(first).or_default() += c.load(R);
        }
        for slot in 0..shm.threads_in_use() {
            let Some((pid, _)) = shm.thread_owner(slot) else {
                continue;
            };
            if let Some(c) = shm.thread_counters(slot).and_then(|c| c.get(i)) {
                *by.entry(pid).or_default() += c.load(R);
            }
        }
        by.into_iter().filter(|(_, n)| *n > 0).collect()
    }

    /// Whether forked children keep the probes and count into thread
    /// slots of their own (true) or run dormant (false, the default).
    pub fn set_follow_forks(&self, follow: bool) {
        use std::sync::atomic::Ordering::Relaxed as R;
        let c = &self.shm().header().control;
        if follow {
            c.fetch_or(hotprobe_abi::CONTROL_FOLLOW_FORKS, R);
        } else {
            c.fetch_and(!hotprobe_abi::CONTROL_FOLLOW_FORKS, R);
        }
    }

    /// Hits of every probe id handed out, indexed by probe id.
    pub fn counts(&self) -> Vec<u64> {
        (0..self.next_probe).map(|p| self.count(p)).collect()
    }

    /// Hands every recorded event to `f`, ring by ring (each ring is one
    /// thread, in order). Returns the number of events. The continuation
    /// events of typed values copied in the target (`KIND_DATA`) come as
    /// events of their own, before the event they belong to.
    ///
    /// Call it in batches — e.g. sleep ≈ 100 µs whenever a pass returned
    /// less than an eighth of a ring, see [`FastPath::ring_capacity`] —
    /// rather than in a tight loop: a consumer right behind the producer
    /// pulls each cache line of the ring (and the ring's head) away from the
    /// target's thread while it is still writing it, slowing the target.
    pub fn drain(&mut self, mut f: impl FnMut(&Event)) -> u64 {
        let shm = self.shm.shm();
        let mut n = 0;
        for slot in 0..shm.threads_in_use() {
            if let Some(mut c) = shm.consumer(slot) {
                if let Ok(s) = c.drain(&mut f) {
                    n += s.read;
                }
            }
        }
        n
    }

    /// Events one thread's ring holds.
    pub fn ring_capacity(&self) -> u32 {
        self.shm().layout().params.ring_capacity
    }

    /// Events lost so far (full rings, threads without a slot).
    pub fn drops(&self) -> u64 {
        self.shm().total_drops()
    }

    /// Returns not hooked (shadow stack full, or a hit refused on
    /// re-entry): the `nmissed` of exits.
    pub fn return_misses(&self) -> u64 {
        self.shm().header().return_misses.load(Relaxed)
    }

    /// Events of `probe_id` the agent could not write: a full ring, a
    /// thread without a ring slot (or still registering), a hit refused
    /// because its thread was already inside the agent (a signal handler
    /// interrupting a probed function), a return not hooked. Hits are
    /// counted all the same: this is the `nmissed` of a recording probe.
    pub fn missed(&self, probe_id: u32) -> u64 {
        self.shm().missed(probe_id)
    }

    /// Events refused because their thread was already inside the agent
    /// (or its return could not be hooked), per thread slot: (owner tid,
    /// count). Part of [`FastPath::drops`].
    pub fn refused_by_thread(&self) -> Vec<(u32, u64)> {
        let shm = self.shm();
        (0..shm.threads_in_use())
            .filter_map(|s| shm.ring_ctl(s))
            .map(|c| (c.owner_tid.load(Relaxed), c.refused.load(Relaxed)))
            .collect()
    }

    /// The shared memory's trap table, where the trap mechanism publishes
    /// its `int3`s and live return instances so that the agent undoes them
    /// if the tracer dies without restoring them (see [`TrapTable`]).
    pub fn trap_table(&self) -> TrapTable {
        TrapTable(self.shm.clone())
    }

    /// Whether [`FastPath::detach`] or [`FastPath::forget`] ran.
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Probe ids handed out so far.
    pub fn probe_ids(&self) -> u32 {
        self.next_probe
    }

    /// The process id this fast path serves.
    pub fn pid(&self) -> i32 {
        self.pid
    }
}
