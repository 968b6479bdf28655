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

mod agent_check;
mod control;
mod inproc;
mod plan;
mod shm;
mod stub;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hotprobe_abi::patch::{
    call_rel32, jmp_rel32, tail_exit_stub, NEAR_STUB_ENTRY, NEAR_STUB_EXIT, TAIL_STUB_KEY_OFFSET,
};
use hotprobe_abi::{
    Event, ACTION_ALT_COUNTER, ACTION_COUNT, ACTION_COUNTER_SHIFT, ACTION_EXIT, ACTION_RECORD,
    CONTROL_ENABLED, CONTROL_RECORD, EVENT_SIZE_FULL, STATUS_ATTACHED,
};
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{RuntimeAddr, Target, TargetError};
use hotprobe_x86::plan_jump;

pub use hotprobe_abi::{
    Event as RecordedEvent, EVENT_XMM, EXIT_UNWOUND, INPROC_SITES, KIND_ENTRY, KIND_EXIT, KIND_HIT,
    TRAP_GUARD, TRAP_RETURN, TRAP_SLOTS,
};
pub use inproc::{HandlerCall, InprocInfo, StubHandlerInfo};
pub use plan::{
    explain, probe_list_path, ExitSite, FunctionInfo, FunctionPlan, Mechanism, MechanismChoice,
    ModuleInfo, PatchKind, SitePlan,
};
use shm::OwnedShm;
use stub::StubKind;

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
}

impl Action {
    /// Count entries.
    pub fn count() -> Action {
        Action {
            record: false,
            exit: false,
            xmm: None,
        }
    }
    /// Count and record entries.
    pub fn record() -> Action {
        Action {
            record: true,
            exit: false,
            xmm: None,
        }
    }
    /// Also observe exits (exit events when recording).
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
    fn bits(self) -> u32 {
        let xmm = match (self.record, self.xmm) {
            (true, Some(k)) => hotprobe_abi::action_xmm(k),
            _ => 0,
        };
        ACTION_COUNT | if self.record { ACTION_RECORD } else { 0 } | xmm
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
    /// not memory: the default, 2^20, is about 800 MB of address space in
    /// tracer and target with 64 thread slots (most of it the rings), and
    /// ≈ 8 bytes of shared memory per probe id used, plus 8 per probe per
    /// thread that hits it.
    pub max_probes: u32,
    /// Thread slots.
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
}

impl Default for FastPathConfig {
    fn default() -> Self {
        FastPathConfig {
            max_probes: 1 << 20,
            max_threads: 64,
            ring_capacity: 1 << 16,
            record_args: 6,
            heartbeat_timeout: Duration::from_secs(2),
            stubs: true,
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
}

/// A probe site another writer changed while hotprobe's bytes were in it.
/// A kernel uprobe (bpftrace, `perf probe`) placed on the same instruction
/// writes its `int3` over the first byte, and puts the file's byte back
/// when it goes if its `int3` is still there. When hotprobe takes its code
/// out it recognises those two cases; anything else it leaves as found
/// (see `docs/DESIGN.md`, "Code shared with other tools").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignWrite {
    /// The site's address.
    pub addr: u64,
    /// The bytes hotprobe left there.
    pub expected: Vec<u8>,
    /// The bytes found there.
    pub found: Vec<u8>,
    /// What hotprobe did about it.
    pub outcome: ForeignOutcome,
}

/// What hotprobe did at a site another writer changed ([`ForeignWrite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignOutcome {
    /// An `int3` over the first byte, the rest hotprobe's: the `int3` was
    /// kept, over the original instructions (the uprobe works on).
    Int3Kept,
    /// The first byte back to the original, the rest hotprobe's (a uprobe
    /// that came and went): the original was put back whole.
    Restored,
    /// Bytes hotprobe cannot account for: the site was left as found.
    LeftAsFound,
    /// A disabled probe's site changed since the disable: it was not
    /// enabled again (writing over the other writer's bytes would break
    /// its probe, and its removal would then break hotprobe's).
    LeftDisabled,
}

/// Whether `bytes` decode as NOP instructions to their end.
fn all_nops(bytes: &[u8]) -> bool {
    use hotprobe_x86::iced_x86::{Decoder, DecoderOptions, Mnemonic};
    // The usual placeholders, without a decoder.
    if bytes == hotprobe_abi::patch::NOP5 || (!bytes.is_empty() && bytes.iter().all(|b| *b == 0x90))
    {
        return true;
    }
    let mut d = Decoder::new(64, bytes, DecoderOptions::NONE);
    while d.can_decode() {
        if d.decode().mnemonic() != Mnemonic::Nop {
            return false;
        }
    }
    !bytes.is_empty()
}

/// Takes hotprobe's bytes out of `live` (a site's bytes now), where
/// hotprobe wrote `expected` over `original`. Decided per site, never per
/// byte (another writer's code merged with the original would be neither):
/// hotprobe's bytes untouched give the original (`None`); the two changes
/// a kernel uprobe makes are recognised; anything else is left as found.
fn take_own_bytes_out(live: &mut [u8], expected: &[u8], original: &[u8]) -> Option<ForeignOutcome> {
    if live == expected {
        live.copy_from_slice(original);
        return None;
    }
    let rest_ours = !live.is_empty() && live[1..] == expected[1..];
    if rest_ours && live[0] == 0xcc {
        live[1..].copy_from_slice(&original[1..]);
        return Some(ForeignOutcome::Int3Kept);
    }
    if rest_ours && live[0] == original[0] {
        live.copy_from_slice(original);
        return Some(ForeignOutcome::Restored);
    }
    Some(ForeignOutcome::LeftAsFound)
}

/// Size of the first page pool mapped for stubs and trampolines; each
/// further pool doubles, up to [`POOL_SIZE_MAX`], so that 100,000 stubs
/// take a dozen remote `mmap`s, not hundreds.
const POOL_SIZE: u64 = 64 * 1024;
/// The largest pool.
const POOL_SIZE_MAX: u64 = 4 << 20;
/// Room a pool must have for a stub to be assembled in place at its next
/// free address (the longest stub is well under this).
const STUB_ROOM: u64 = 512;
/// Pending writes of a batch closer than this are written as one span
/// (the bytes between read back first): one `pwrite` per page or so of
/// patched text instead of one per site.
const BATCH_GAP: u64 = 1024;
/// The longest span a batch writes at once.
const BATCH_SPAN: u64 = 256 * 1024;

#[derive(Debug)]
struct Pool {
    start: u64,
    next: u64,
    end: u64,
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
}

impl FastPath {
    /// Prepares the shared memory and the environment (`LD_PRELOAD` of
    /// `agent`, `HOTPROBE_SHM_PATH` naming our memfd) of a process to be spawned with `opts`,
    /// and sets `opts.stop_at_entry`: the agent attaches from its constructor.
    pub fn for_spawn(
        opts: &mut SpawnOptions,
        agent: &Path,
        config: FastPathConfig,
    ) -> Result<PendingFastPath, FastPathError> {
        let shm = Arc::new(OwnedShm::create(config)?);
        let mut preload = OsString::from(agent);
        if let Some(old) = std::env::var_os("LD_PRELOAD") {
            preload.push(":");
            preload.push(old);
        }
        opts.env.push(("LD_PRELOAD".into(), preload));
        // The agent is mapped and relocated at the spawn stop (before any
        // constructor runs, its own included): `PendingFastPath::attach`
        // attaches it there by a remote call, so that probes go in before
        // any constructor of the program or its libraries runs.
        Ok(PendingFastPath {
            shm,
            stubs: config.stubs,
        })
    }

    /// Loads the agent into the running, attached, stopped process `t`
    /// (remote `dlopen`, then `hotprobe_agent_attach_fd` — found with a
    /// remote `dlsym` on the handle, so whatever the library's name in the
    /// target's maps, e.g. a memfd's — on a descriptor the target opens on
    /// our memfd through `/proc/OUR_PID/fd`). An agent the target already
    /// has (a previous tracer's) is attached again instead, when it speaks
    /// this layout version.
    pub fn inject(
        t: &mut ProcessTarget,
        agent: &Path,
        config: FastPathConfig,
    ) -> Result<FastPath, FastPathError> {
        let shm = Arc::new(OwnedShm::create(config)?);
        t.stop_all()?;
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
        let libc_mod = syms
            .modules()
            .iter()
            .find(|m| m.name.starts_with("libc.so") || m.name.starts_with("libc-"))
            .ok_or_else(|| FastPathError::AgentNotAttached {
                pid: t.pid(),
                why: "no libc mapped in the target".into(),
            })?;
        let libc_fn = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| libc_mod.module.find(n))
                .map(|s| libc_mod.runtime(s.addr).0)
        };
        let dlopen = libc_fn(&["dlopen", "__libc_dlopen_mode"]).ok_or_else(|| {
            FastPathError::AgentNotAttached {
                pid: t.pid(),
                why: "no dlopen in the target's libc".into(),
            }
        })?;
        let dlsym = libc_fn(&["dlsym", "__libc_dlsym"]);
        // An agent already loaded (a previous tracer's, preloaded or
        // injected, from another path or memfd than ours) is attached
        // again rather than joined by a second copy, if it speaks our
        // layout: its stubs and thread registrations stay consistent.
        let existing = syms
            .modules()
            .iter()
            .filter(|m| m.name.starts_with("libhotprobe_agent"))
            .find_map(|m| {
                let f = |n: &str| m.module.find(n).map(|s| m.runtime(s.addr).0);
                Some((f("hotprobe_agent_attach_fd")?, f("hotprobe_agent_version")?))
            });
        drop(syms);
        let pid = t.pid();
        let fail = |why: String| FastPathError::AgentNotAttached { pid, why };
        let timeout = Duration::from_secs(10);
        let mut attach_fn = None;
        if let Some((attach, version)) = existing {
            let v = hotprobe_process::remote_call::remote_call(t, version, &[], timeout)?;
            if v as u32 == hotprobe_abi::VERSION {
                attach_fn = Some(attach);
            }
        }
        // Scratch page for the strings.
        let page = remote_page(t)?;
        let agent_c = format!("{}\0", agent.display());
        if agent_c.len() > 2048 {
            return Err(fail(format!("agent path too long: {}", agent.display())));
        }
        const ATTACH_NAME: &[u8] = b"hotprobe_agent_attach_fd\0";
        t.write_memory(RuntimeAddr(page), agent_c.as_bytes())?;
        t.write_memory(RuntimeAddr(page + 3072), ATTACH_NAME)?;
        if attach_fn.is_none() {
            let handle = hotprobe_process::remote_call::remote_call(
                t,
                dlopen,
                &[page, (libc::RTLD_NOW | libc::RTLD_GLOBAL) as u64],
                timeout,
            )?;
            if handle == 0 {
                return Err(fail(format!("dlopen({}) returned NULL", agent.display())));
            }
            // The symbol of the copy just loaded, whatever its file is
            // called in the target's maps (a memfd's name).
            if let Some(dlsym) = dlsym {
                let a = hotprobe_process::remote_call::remote_call(
                    t,
                    dlsym,
                    &[handle, page + 3072],
                    timeout,
                )?;
                attach_fn = (a != 0).then_some(a);
            }
            if attach_fn.is_none() {
                let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
                attach_fn = syms
                    .modules()
                    .iter()
                    .find(|m| m.name.starts_with("libhotprobe_agent"))
                    .and_then(|m| {
                        m.module
                            .find("hotprobe_agent_attach_fd")
                            .map(|s| m.runtime(s.addr).0)
                    });
            }
        }
        let attach_fn = attach_fn
            .ok_or_else(|| fail("agent mapped but hotprobe_agent_attach_fd not found".into()))?;
        let _ = hotprobe_process::remote_call::remote_syscall(
            t,
            libc::SYS_munmap as u64,
            &[page, 4096],
        );
        remote_attach(t, &shm, attach_fn)?;
        FastPath::new(shm, t, config.stubs)
    }

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
        })
    }

    /// The validated shared-memory view (counters, rings, header).
    pub fn shm(&self) -> &hotprobe_abi::Shm {
        self.shm.shm()
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
    /// thread, in order). Returns the number of events.
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

    fn module(&mut self, path: &Path) -> Result<&ModuleInfo, FastPathError> {
        if !self.modules.contains_key(path) {
            let m = ModuleInfo::open(path)?;
            self.modules.insert(path.to_path_buf(), m);
        }
        Ok(&self.modules[path])
    }

    /// Probes `function` of the main executable: picks the mechanism
    /// (or uses `choice`), installs it with every thread stopped, and says
    /// what it did. [`Mechanism::Trap`] installs nothing. Threads stay
    /// stopped; resume them with `t.resume_all()`.
    pub fn add(
        &mut self,
        t: &mut ProcessTarget,
        function: &str,
        action: Action,
        choice: MechanismChoice,
    ) -> Result<SiteInfo, FastPathError> {
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
        let main = syms
            .main_module()
            .ok_or_else(|| FastPathError::NoSuchFunction(function.into()))?;
        let bias = main.bias.0;
        let path = main.path.clone();
        let f = self
            .module(&path)?
            .function(function)
            .cloned()
            .ok_or_else(|| FastPathError::NoSuchFunction(function.into()))?;
        self.add_function(t, &path, bias, &f, action, choice)
    }

    /// The function of the module at `path` whose entry is at link address
    /// `link_addr` (or, failing that, named `name`), as the planner sees it.
    pub fn function_at(
        &mut self,
        path: &Path,
        link_addr: u64,
        name: Option<&str>,
    ) -> Result<FunctionInfo, FastPathError> {
        let m = self.module(path)?;
        m.function_at(link_addr)
            .or_else(|| name.and_then(|n| m.function(n)))
            .cloned()
            .ok_or_else(|| {
                FastPathError::NoSuchFunction(
                    name.map_or_else(|| format!("{link_addr:#x}"), str::to_string),
                )
            })
    }

    /// The mechanism `f` (a function of the module at `path`) gets under
    /// `choice`, and why, without installing anything.
    pub fn plan(
        &mut self,
        path: &Path,
        f: &FunctionInfo,
        choice: MechanismChoice,
    ) -> Result<SitePlan, FastPathError> {
        self.module(path)?.plan(f, choice)
    }

    /// Probes function `f` of the module at `path`, loaded with load bias
    /// `bias`: picks the mechanism (or uses `choice`), installs it with
    /// every thread stopped, and says what it did. [`Mechanism::Trap`]
    /// installs nothing. Threads stay stopped.
    pub fn add_function(
        &mut self,
        t: &mut ProcessTarget,
        path: &Path,
        bias: u64,
        f: &FunctionInfo,
        action: Action,
        choice: MechanismChoice,
    ) -> Result<SiteInfo, FastPathError> {
        let function = f.name.as_str();
        let f = f.clone();
        let plan = self.module(path)?.plan(&f, choice)?;
        let probe_id = self.next_probe;
        let mut info = SiteInfo {
            function: function.to_string(),
            probe_id,
            addr: plan.site.wrapping_add(bias),
            mechanism: plan.mechanism,
            reason: plan.reason.clone(),
            exits: "none",
            exit_probe_id: None,
            stub: false,
        };
        if plan.mechanism == Mechanism::Trap {
            return Ok(info);
        }
        if action.record
            && action.xmm.is_some()
            && self.shm().layout().params.event_size != EVENT_SIZE_FULL
        {
            return Err(FastPathError::Shm(
                "float/double values need 64-byte event slots (record_args > 2)".into(),
            ));
        }
        if action.record
            && action.xmm.is_some()
            && action.exit
            && plan.mechanism == Mechanism::Patch(PatchKind::Coldpatch)
        {
            // An exit placeholder (`__cyg_profile_func_exit`'s call) runs
            // before the return value is in xmm0.
            return Err(FastPathError::Shm(
                "float/double return values are not in xmm0 at coldpatch exit placeholders".into(),
            ));
        }
        if probe_id >= self.shm().layout().params.n_probes {
            return Err(FastPathError::Shm(
                "no probe id left: raise max_probes".into(),
            ));
        }
        let site = plan.site.wrapping_add(bias);
        // A patch site's key is the address after its call (`install`):
        // one already in the site table is this fast path's own patch.
        let ours = || self.shm().lookup_site(site + 5).is_some();
        if matches!(plan.mechanism, Mechanism::Patch(_)) && !ours() {
            // Planned from the file: the placeholder in memory must still
            // be NOPs (a kernel uprobe's int3 or call goes over it).
            let (mut small, mut big) = ([0u8; 16], Vec::new());
            let live: &mut [u8] = match small.get_mut(..plan.len) {
                Some(s) => s,
                None => {
                    big.resize(plan.len, 0);
                    &mut big
                }
            };
            self.read_original(t, site, live)?;
            if !all_nops(live) {
                return Err(FastPathError::Impossible {
                    function: function.to_string(),
                    mechanism: "patch",
                    why: format!(
                        "its placeholder is no NOP in memory ({}): a breakpoint already (a kernel \
                         uprobe's, another debugger's)",
                        live.iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                });
            }
        }
        self.next_probe += 1;
        let bits = action.bits();
        t.stop_all()?;
        match plan.mechanism {
            Mechanism::Patch(kind) => {
                let mut bits = bits;
                let coldpatch = kind == PatchKind::Coldpatch;
                if action.exit && !coldpatch {
                    bits |= ACTION_EXIT;
                    info.exits = "return hook";
                }
                let target = self.entry_target(t, site, probe_id, action, bits, &mut info)?;
                let mut bytes = call_rel32(site, target)
                    .expect("target within reach")
                    .to_vec();
                bytes.resize(plan.len, 0x90);
                self.install(t, site, &bytes, site + 5, probe_id, bits)?;
                if action.exit && coldpatch {
                    info.exits = "exit placeholders";
                    let exit_id = self.next_probe;
                    if exit_id >= self.shm().layout().params.n_probes {
                        return Err(FastPathError::Shm(
                            "no probe id left: raise max_probes".into(),
                        ));
                    }
                    self.next_probe += 1;
                    info.exit_probe_id = Some(exit_id);
                    let bits = bits | ACTION_ALT_COUNTER | exit_id << ACTION_COUNTER_SHIFT;
                    for e in &plan.exits {
                        match *e {
                            ExitSite::Call(a) => {
                                let a = a.wrapping_add(bias);
                                let target = match self.stub(
                                    t,
                                    a,
                                    StubKind::Exit,
                                    exit_id,
                                    probe_id,
                                    action,
                                )? {
                                    Some(s) => s,
                                    None => self.call_target(t, a, NEAR_STUB_EXIT)?,
                                };
                                let mut b = call_rel32(a, target).expect("in reach").to_vec();
                                let mut old = [0u8; 6];
                                t.read_memory(RuntimeAddr(a), &mut old)?;
                                if old[..5] != hotprobe_abi::patch::NOP5
                                    && old != hotprobe_abi::patch::NOP6
                                {
                                    continue;
                                }
                                if old == hotprobe_abi::patch::NOP6 {
                                    b.push(0x90);
                                }
                                self.install(t, a, &b, a + 5, probe_id, bits)?;
                            }
                            ExitSite::Tail(a) => {
                                let a = a.wrapping_add(bias);
                                // The tail stub calls the per-site exit stub
                                // (or the generic exit trampoline) through
                                // its absolute address.
                                let exit_tramp = match self.stub(
                                    t,
                                    a,
                                    StubKind::Exit,
                                    exit_id,
                                    probe_id,
                                    action,
                                )? {
                                    Some(s) => s,
                                    None => self.shm().header().exit_trampoline.load(Relaxed),
                                };
                                let stub = self.alloc(t, a, 16)?;
                                self.write(t, stub, &tail_exit_stub(exit_tramp))?;
                                let b = jmp_rel32(a, stub).expect("stub within reach");
                                self.install(
                                    t,
                                    a,
                                    &b,
                                    stub + TAIL_STUB_KEY_OFFSET,
                                    probe_id,
                                    bits,
                                )?;
                            }
                        }
                    }
                }
            }
            Mechanism::Jump => {
                let mut code = vec![0u8; f.size as usize];
                let fstart = f.addr.wrapping_add(bias);
                t.read_memory(RuntimeAddr(fstart), &mut code)?;
                let jp = plan_jump(&code, fstart, site)?;
                let mut bits = bits;
                if action.exit {
                    bits |= ACTION_EXIT;
                    info.exits = "return hook";
                }
                let tramp = self.alloc(t, site, 64)?;
                let target = self.entry_target(t, tramp, probe_id, action, bits, &mut info)?;
                let mut body = call_rel32(tramp, target).expect("in reach").to_vec();
                body.extend(jp.relocate(tramp + 5)?);
                if body.len() > 64 {
                    return Err(FastPathError::NoTrampolineMemory {
                        addr: site,
                        why: "trampoline longer than 64 bytes".into(),
                    });
                }
                self.write(t, tramp, &body)?;
                let bytes = jp.patch_bytes(tramp).expect("trampoline within reach");
                self.install(t, site, &bytes, tramp + 5, probe_id, bits)?;
            }
            Mechanism::Trap => unreachable!("returned above"),
        }
        Ok(info)
    }

    /// Writes a per-site stub (see the `stub` module) within ±2 GiB of
    /// `near` and returns its address; `None` when stubs are off or the
    /// agent published no TLS offset (the generic trampoline is used then).
    /// Where the entry `call` at `at` (a site or a jump trampoline) goes:
    /// a per-site stub, or — when the return hook is wanted, which swaps the
    /// return address — the agent's generic entry trampoline.
    fn entry_target(
        &mut self,
        t: &mut ProcessTarget,
        at: u64,
        probe_id: u32,
        action: Action,
        bits: u32,
        info: &mut SiteInfo,
    ) -> Result<u64, FastPathError> {
        let stub = if bits & ACTION_EXIT == 0 {
            self.stub(t, at, StubKind::Entry, probe_id, probe_id, action)?
        } else {
            None
        };
        info.stub = stub.is_some();
        match stub {
            Some(s) => Ok(s),
            None => self.call_target(t, at, NEAR_STUB_ENTRY),
        }
    }

    fn stub(
        &mut self,
        t: &mut ProcessTarget,
        near: u64,
        kind: StubKind,
        counter: u32,
        probe: u32,
        action: Action,
    ) -> Result<Option<u64>, FastPathError> {
        let (record, xmm) = (action.record, action.xmm);
        let h = self.shm().header();
        let tpoff = h.thread_tpoff.load(Relaxed);
        if !self.stubs || tpoff == 0 {
            return Ok(None);
        }
        let generic = match kind {
            StubKind::Entry => h.entry_trampoline.load(Relaxed),
            StubKind::Exit => h.exit_trampoline.load(Relaxed),
        };
        let p = stub::StubParams {
            tpoff,
            counter,
            probe,
            kind,
            record,
            generic,
            event_size: self.shm().layout().params.event_size,
            key: self.shm().stub_key(),
            missed_offset: self.shm().layout().missed_offset as u64,
            xmm_ints: if record { xmm } else { None },
        };
        let err = |e: stub::StubError| FastPathError::Assemble {
            addr: near,
            why: e.to_string(),
        };
        // Assembled once, in place at the next free address of a pool with
        // room (the common case), else sized first and placed in a new pool.
        let (at, code) = match self.pool_with_room(near, STUB_ROOM) {
            Some(i) => {
                let at = self.pools[i].next;
                let code = self.templates.build(&p).map_err(err)?;
                let len = (code.len() as u64 + 63) & !63;
                if len > STUB_ROOM {
                    return Err(FastPathError::Assemble {
                        addr: near,
                        why: format!("a stub of {} bytes (at most {STUB_ROOM})", code.len()),
                    });
                }
                self.pools[i].next += len;
                (at, code)
            }
            None => {
                let len = stub::build(0, &p).map_err(err)?.len() as u64;
                let at = self.alloc(t, near, len)?;
                (at, stub::build(at, &p).map_err(err)?)
            }
        };
        self.write(t, at, &code)?;
        Ok(Some(at))
    }

    /// The address a `call` at `from` should target to reach the agent's
    /// trampoline behind near-page stub `stub_off`: the trampoline itself
    /// when within ±2 GiB, else the agent's near-page stub, else a stub of
    /// ours allocated near `from`.
    fn call_target(
        &mut self,
        t: &mut ProcessTarget,
        from: u64,
        stub_off: u64,
    ) -> Result<u64, FastPathError> {
        let h = self.shm().header();
        let tramp = if stub_off == NEAR_STUB_EXIT {
            h.exit_trampoline.load(Relaxed)
        } else {
            h.entry_trampoline.load(Relaxed)
        };
        if call_rel32(from, tramp).is_some() {
            return Ok(tramp);
        }
        let near = h.near_page.load(Relaxed);
        if near != 0 && call_rel32(from, near + stub_off).is_some() {
            return Ok(near + stub_off);
        }
        let stub = self.alloc(t, from, 16)?;
        self.write(t, stub, &hotprobe_abi::patch::abs_jmp_stub(tramp))?;
        Ok(stub)
    }

    /// The pages this fast path mapped for its stubs and trampolines
    /// (start, end): no probe may go there.
    pub fn pages(&self) -> Vec<(u64, u64)> {
        self.pools.iter().map(|p| (p.start, p.end)).collect()
    }

    /// The first pool within ±2 GiB of `near` with `len` bytes free.
    fn pool_with_room(&self, near: u64, len: u64) -> Option<usize> {
        self.pools.iter().position(|p| {
            p.next + len <= p.end
                && jmp_rel32(near, p.next).is_some()
                && jmp_rel32(near, p.end).is_some()
        })
    }

    /// Writes `bytes` at `addr` in the target now, or at the end of the
    /// open batch.
    fn write(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        bytes: &[u8],
    ) -> Result<(), FastPathError> {
        match &mut self.batch {
            Some(b) => b.push((addr, bytes.to_vec())),
            None => t.write_memory(RuntimeAddr(addr), bytes)?,
        }
        Ok(())
    }

    /// Opens a batch: until [`FastPath::end_batch`], the code this fast
    /// path writes (stubs, trampolines, patched sites) is held back and
    /// then written span by span — one read and one write of
    /// `/proc/PID/mem` per run of nearby sites (about a page of text)
    /// instead of two per site. The target's threads must stay stopped
    /// from the first [`FastPath::add_function`] of the batch to its end
    /// (nothing held back is ever half written: a thread that ran in
    /// between would run the original code).
    pub fn begin_batch(&mut self) {
        if self.batch.is_none() {
            self.batch = Some(Vec::new());
            self.page_cache = None;
        }
    }

    /// Whether a batch is open (see [`FastPath::begin_batch`]).
    pub fn in_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// Writes what the open batch held back (see [`FastPath::begin_batch`])
    /// and closes it. Threads stay stopped.
    pub fn end_batch(&mut self, t: &mut ProcessTarget) -> Result<(), FastPathError> {
        self.page_cache = None;
        let Some(writes) = self.batch.take() else {
            return Ok(());
        };
        let bps = t.breakpoints().into_iter().map(|b| b.0).collect();
        write_spans(t, writes, Some(&bps))
    }

    /// `len` bytes of executable memory within ±2 GiB of `near` (64-byte
    /// aligned), from our pages or a new remote mapping. Never freed.
    fn alloc(&mut self, t: &mut ProcessTarget, near: u64, len: u64) -> Result<u64, FastPathError> {
        let len = (len + 63) & !63;
        self.page_cache = None;
        for p in &mut self.pools {
            if p.next + len <= p.end
                && jmp_rel32(near, p.next).is_some()
                && jmp_rel32(near, p.end).is_some()
            {
                let a = p.next;
                p.next += len;
                return Ok(a);
            }
        }
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid())).unwrap_or_default();
        let lines = hotprobe_process::parse_maps_lines(&maps);
        let grown = POOL_SIZE
            .checked_shl(self.pools.len() as u32)
            .unwrap_or(POOL_SIZE_MAX)
            .min(POOL_SIZE_MAX);
        let size = grown.max((len + 4095) & !4095);
        let addr = hotprobe_process::find_free_gap(&lines, near, size).ok_or_else(|| {
            FastPathError::NoTrampolineMemory {
                addr: near,
                why: "no free gap".into(),
            }
        })?;
        let r = hotprobe_process::remote_call::remote_syscall(
            t,
            libc::SYS_mmap as u64,
            &[
                addr,
                size,
                (libc::PROT_READ | libc::PROT_EXEC) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if r != addr {
            return Err(FastPathError::NoTrampolineMemory {
                addr: near,
                why: format!("remote mmap at {addr:#x} returned {r:#x}"),
            });
        }
        t.write_memory(RuntimeAddr(addr), &vec![0xcc; size as usize])?;
        self.pools.push(Pool {
            start: addr,
            next: addr + len,
            end: addr + size,
        });
        Ok(addr)
    }

    /// Writes `bytes` at `addr` once no thread's PC lies strictly inside
    /// them (resuming the threads briefly while one does), after publishing
    /// the site key. Expects every thread stopped; leaves them stopped.
    fn install(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        bytes: &[u8],
        key: u64,
        probe_id: u32,
        bits: u32,
    ) -> Result<(), FastPathError> {
        wait_pcs_outside(t, addr, bytes.len() as u64)?;
        let mut original = vec![0u8; bytes.len()];
        self.read_original(t, addr, &mut original)?;
        self.shm()
            .insert_site(key, probe_id, bits)
            .map_err(|e| FastPathError::Shm(e.to_string()))?;
        self.write(t, addr, bytes)?;
        self.installed.push(Installed {
            addr,
            original,
            written: bytes.to_vec(),
            key,
        });
        Ok(())
    }

    /// Reads the bytes a site replaces. In a batch nothing is written until
    /// `end_batch`, so the page last read is kept and serves the next site
    /// on it (sites come in address order: one `pread` per page instead of
    /// one per site); a remote `mmap` ([`FastPath::alloc`]) forgets it.
    fn read_original(
        &mut self,
        t: &mut ProcessTarget,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), FastPathError> {
        let page = addr & !0xfff;
        let len = out.len() as u64;
        if self.batch.is_none() || (addr + len - 1) & !0xfff != page {
            t.read_memory(RuntimeAddr(addr), out)?;
            return Ok(());
        }
        if self.page_cache.as_ref().map(|(p, _)| *p) != Some(page) {
            let mut buf = vec![0u8; 4096];
            t.read_memory(RuntimeAddr(page), &mut buf)?;
            self.page_cache = Some((page, buf));
        }
        let (_, buf) = self.page_cache.as_ref().expect("filled above");
        let off = (addr - page) as usize;
        out.copy_from_slice(&buf[off..off + out.len()]);
        Ok(())
    }

    /// Takes out every byte written (the original back, or what
    /// [`ForeignOutcome`] says where another writer changed a site; see
    /// [`FastPath::take_foreign_writes`]), disables every site, stops the
    /// heartbeat. The threads are stopped for the restore and left stopped
    /// (resume or detach the target afterwards). Trampoline pages and the
    /// agent stay mapped (see the crate docs).
    pub fn detach(&mut self, t: &mut ProcessTarget) -> Result<(), FastPathError> {
        if self.detached {
            return Ok(());
        }
        if let Err(e) = t.stop_all() {
            // A process that is gone has nothing left to restore.
            if matches!(e, TargetError::Gone { .. }) {
                self.forget();
                return Ok(());
            }
            return Err(e.into());
        }
        // Every original put back in one batch: a write per span of
        // nearby sites (see `end_batch`), in reverse order of installation
        // (the batch keeps that order for writes to one address).
        let mut restore = Vec::with_capacity(self.installed.len());
        for s in self.installed.iter().rev() {
            // A thread can sit at the first byte of a site (fine: it runs
            // the original instruction) but never strictly inside: the
            // patched bytes are one instruction, padded with int3 never run.
            wait_pcs_outside(t, s.addr, s.original.len() as u64)?;
            // A disabled site holds its original bytes already: nothing
            // of hotprobe's to take out.
            if !self.disabled.contains_key(&s.addr) {
                restore.push(Restore {
                    addr: s.addr,
                    expected: &s.written,
                    original: &s.original,
                });
            }
            if s.key == 0 {
                // An in-process trap (`inproc`): its entry stays.
                self.shm.shm().quiet_inproc(s.addr);
            } else {
                let _ = self.shm.shm().set_site_action(s.key, 0);
            }
        }
        // The process's own int3s (the trap engine's) over our sites.
        let bps: Option<std::collections::BTreeSet<u64>> =
            Some(t.breakpoints().into_iter().map(|b| b.0).collect());
        let mut foreign = Vec::new();
        let restored = restore_spans(t, restore, bps.as_ref(), &mut foreign);
        // What was found before a failure is reported all the same.
        self.foreign.extend(foreign);
        restored?;
        self.disabled.clear();
        self.installed.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
        Ok(())
    }

    /// The sites found changed by another writer (a kernel uprobe, a
    /// debugger) when hotprobe took its bytes out of them (detach, disable,
    /// removal) since the last call, each with what was done about it.
    pub fn take_foreign_writes(&mut self) -> Vec<ForeignWrite> {
        std::mem::take(&mut self.foreign)
    }

    /// Every byte range this fast path wrote into the target's code
    /// (address, original bytes), in the order written.
    pub fn written_bytes(&self) -> Vec<(u64, Vec<u8>)> {
        self.written_since(0)
    }

    /// [`FastPath::written_bytes`] from the `from`-th write on, so that a
    /// caller keeping a copy adds only what is new (probing names one at a
    /// time stays linear); with the number of writes and
    /// [`FastPath::removals`] the caller tells when its copy is stale.
    pub fn written_since(&self, from: usize) -> Vec<(u64, Vec<u8>)> {
        self.installed
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|i| (i.addr, i.original.clone()))
            .collect()
    }

    /// How many writes [`FastPath::written_bytes`] lists.
    pub fn written_count(&self) -> usize {
        self.installed.len()
    }

    /// How many times writes left the list (detach, forget): a copy taken
    /// before a change of this number is stale.
    pub fn removals(&self) -> u64 {
        self.removals
    }

    /// Forgets every byte written without restoring anything (the image
    /// they were written into is gone: exec, exit, or a library unmapped),
    /// disables the sites and stops the heartbeat. Counters and rings stay
    /// readable.
    pub fn forget(&mut self) {
        for s in &self.installed {
            let _ = self.shm.shm().set_site_action(s.key, 0);
        }
        self.installed.clear();
        self.disabled.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
    }

    /// Forgets the byte ranges written inside `[start, end)` (a library
    /// that was unmapped) without restoring them; the other sites stay.
    pub fn forget_range(&mut self, start: u64, end: u64) {
        let shm = self.shm.clone();
        self.removals += 1;
        // A library mapped there again is probed afresh, enabled.
        self.disabled.retain(|a, _| *a < start || *a >= end);
        self.installed.retain(|s| {
            let inside = s.addr >= start && s.addr < end;
            if inside {
                let _ = shm.shm().set_site_action(s.key, 0);
            }
            !inside
        });
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

impl PendingFastPath {
    /// Attaches the preloaded agent to our shared memory by a remote call
    /// of `hotprobe_agent_attach_fd`, wherever the process stopped after
    /// its spawn (before any constructor: the agent is mapped and
    /// relocated there; or at its entry point).
    pub fn attach(self, t: &mut ProcessTarget) -> Result<FastPath, FastPathError> {
        let pid = t.pid();
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32)?;
        let attach_fn = syms
            .modules()
            .iter()
            .filter(|m| m.name.starts_with("libhotprobe_agent"))
            .find_map(|m| {
                m.module
                    .find("hotprobe_agent_attach_fd")
                    .map(|s| m.runtime(s.addr).0)
            })
            .ok_or_else(|| FastPathError::AgentNotAttached {
                pid,
                why: "the agent is not mapped (LD_PRELOAD ignored? a setuid or static binary?)"
                    .into(),
            })?;
        drop(syms);
        remote_attach(t, &self.shm, attach_fn)?;
        FastPath::new(self.shm, t, self.stubs)
    }
}

/// A fresh read-write page in the stopped target (a remote `mmap`), for
/// the strings of remote calls; the caller unmaps it.
fn remote_page(t: &mut ProcessTarget) -> Result<u64, FastPathError> {
    let page = hotprobe_process::remote_call::remote_syscall(
        t,
        libc::SYS_mmap as u64,
        &[
            0,
            4096,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if (page as i64) < 0 {
        return Err(FastPathError::AgentNotAttached {
            pid: t.pid(),
            why: format!("remote mmap failed: errno {}", -(page as i64)),
        });
    }
    Ok(page)
}

/// Makes the stopped target open our memfd (through `/proc/OUR_PID/fd`)
/// and call the agent's `attach_fn` (`hotprobe_agent_attach_fd`) on it.
fn remote_attach(
    t: &mut ProcessTarget,
    shm: &OwnedShm,
    attach_fn: u64,
) -> Result<(), FastPathError> {
    use hotprobe_process::remote_call::{remote_call, remote_syscall};
    let pid = t.pid();
    let fail = |why: String| FastPathError::AgentNotAttached { pid, why };
    let page = remote_page(t)?;
    let fd_path = format!("/proc/{}/fd/{}\0", std::process::id(), shm.fd());
    t.write_memory(RuntimeAddr(page), fd_path.as_bytes())?;
    let fd = remote_syscall(
        t,
        libc::SYS_open as u64,
        &[page, (libc::O_RDWR | libc::O_CLOEXEC) as u64],
    );
    let _ = remote_syscall(t, libc::SYS_munmap as u64, &[page, 4096]);
    let fd = fd?;
    if (fd as i64) < 0 {
        return Err(fail(format!(
            "remote open of our memfd: errno {}",
            -(fd as i64)
        )));
    }
    let r = remote_call(t, attach_fn, &[fd], Duration::from_secs(10));
    let _ = remote_syscall(t, libc::SYS_close as u64, &[fd]);
    let r = r?;
    if r as i32 != 0 {
        return Err(fail(format!(
            "hotprobe_agent_attach_fd returned {}",
            r as i32
        )));
    }
    Ok(())
}

/// Writes `writes` (address, bytes; none overlapping, except writes to the
/// same address, which go out in their order) in spans: writes closer than [`BATCH_GAP`] go out as one read and one
/// write of the span between them. Bytes under a breakpoint (`bps`; `None`:
/// unknown, so every write alone) must go through `write_memory` one write
/// at a time — it keeps the int3 and records the new original — so a span
/// never reaches over a breakpoint.
/// The span of address-sorted ranges starting at the `i`-th of `n`
/// (`range(k)`: address and length): ranges closer than [`BATCH_GAP`], up
/// to [`BATCH_SPAN`] bytes in all. Returns one past its last range, its
/// start and its end.
fn span_from(i: usize, n: usize, range: impl Fn(usize) -> (u64, usize)) -> (usize, u64, u64) {
    let (start, len) = range(i);
    let mut end = start + len as u64;
    let mut j = i + 1;
    while j < n {
        let (a, len) = range(j);
        if a > end + BATCH_GAP || a + len as u64 - start > BATCH_SPAN {
            break;
        }
        end = end.max(a + len as u64);
        j += 1;
    }
    (j, start, end)
}

fn write_spans(
    t: &mut dyn Target,
    mut writes: Vec<(u64, Vec<u8>)>,
    bps: Option<&std::collections::BTreeSet<u64>>,
) -> Result<(), FastPathError> {
    // Stable: writes to one address keep their order.
    writes.sort_by_key(|w| w.0);
    let mut i = 0;
    while i < writes.len() {
        let (j, start, end) = span_from(i, writes.len(), |k| (writes[k].0, writes[k].1.len()));
        let group = &writes[i..j];
        if group.len() == 1 || bps.is_none_or(|b| b.range(start..end).next().is_some()) {
            for (a, b) in group {
                t.write_memory(RuntimeAddr(*a), b)?;
            }
        } else {
            let mut buf = vec![0u8; (end - start) as usize];
            t.read_memory(RuntimeAddr(start), &mut buf)?;
            for (a, b) in group {
                let o = (a - start) as usize;
                buf[o..o + b.len()].copy_from_slice(b);
            }
            t.write_memory(RuntimeAddr(start), &buf)?;
        }
        i = j;
    }
    Ok(())
}

/// A site to take hotprobe's bytes out of (see [`restore_spans`]).
struct Restore<'a> {
    addr: u64,
    /// The bytes hotprobe left there.
    expected: &'a [u8],
    original: &'a [u8],
}

/// Takes hotprobe's bytes out of every site of `sites` (in their order for
/// sites at one address), span by span as [`write_spans`] writes: each span
/// is read, each site's bytes still hotprobe's get their original back
/// ([`take_own_bytes_out`]), and the span is written. The sites another
/// writer changed go to `foreign`.
fn restore_spans(
    t: &mut dyn Target,
    mut sites: Vec<Restore<'_>>,
    bps: Option<&std::collections::BTreeSet<u64>>,
    foreign: &mut Vec<ForeignWrite>,
) -> Result<(), FastPathError> {
    let mut check = |s: &Restore<'_>, live: &mut [u8]| {
        let found = (live != s.expected).then(|| live.to_vec());
        if let (Some(outcome), Some(found)) =
            (take_own_bytes_out(live, s.expected, s.original), found)
        {
            if !foreign.iter().any(|f: &ForeignWrite| f.addr == s.addr) {
                foreign.push(ForeignWrite {
                    addr: s.addr,
                    expected: s.expected.to_vec(),
                    found,
                    outcome,
                });
            }
        }
    };
    // Stable: sites at one address keep their order.
    sites.sort_by_key(|s| s.addr);
    let mut i = 0;
    while i < sites.len() {
        let (j, start, end) =
            span_from(i, sites.len(), |k| (sites[k].addr, sites[k].expected.len()));
        let group = &sites[i..j];
        if group.len() == 1 || bps.is_none_or(|b| b.range(start..end).next().is_some()) {
            for s in group {
                let mut live = vec![0u8; s.expected.len()];
                t.read_memory(RuntimeAddr(s.addr), &mut live)?;
                check(s, &mut live);
                t.write_memory(RuntimeAddr(s.addr), &live)?;
            }
        } else {
            let mut buf = vec![0u8; (end - start) as usize];
            t.read_memory(RuntimeAddr(start), &mut buf)?;
            for s in group {
                let o = (s.addr - start) as usize;
                check(s, &mut buf[o..o + s.expected.len()]);
            }
            t.write_memory(RuntimeAddr(start), &buf)?;
        }
        i = j;
    }
    Ok(())
}

fn wait_pcs_outside(t: &mut dyn Target, addr: u64, len: u64) -> Result<(), FastPathError> {
    for _ in 0..200 {
        let mut inside = false;
        for th in t.threads() {
            let rip = t.registers(th)?.rip;
            if rip > addr && rip < addr + len {
                inside = true;
            }
        }
        if !inside {
            return Ok(());
        }
        t.resume_all()?;
        std::thread::sleep(Duration::from_millis(1));
        t.stop_all()?;
    }
    Err(FastPathError::Busy { addr })
}

#[cfg(test)]
mod tests {
    use super::{all_nops, take_own_bytes_out, ForeignOutcome};

    #[test]
    fn only_hotprobes_own_bytes_are_taken_out() {
        let original = [0x48, 0x85, 0xff, 0x7e, 0x23, 0x31];
        let jump = [0xe9, 0x2b, 0xde, 0xfe, 0xff, 0xcc];
        // Untouched: the original comes back whole.
        let mut live = jump;
        assert_eq!(take_own_bytes_out(&mut live, &jump, &original), None);
        assert_eq!(live, original);
        // A uprobe's int3 over the first byte stays, over the original
        // instructions (the kernel runs the first one out of line).
        let mut live = jump;
        live[0] = 0xcc;
        assert_eq!(
            take_own_bytes_out(&mut live, &jump, &original),
            Some(ForeignOutcome::Int3Kept)
        );
        assert_eq!(live, [0xcc, 0x85, 0xff, 0x7e, 0x23, 0x31]);
        // A uprobe gone put the file's byte back: the original, whole.
        let mut live = jump;
        live[0] = 0x48;
        assert_eq!(
            take_own_bytes_out(&mut live, &jump, &original),
            Some(ForeignOutcome::Restored)
        );
        assert_eq!(live, original);
    }

    #[test]
    fn code_hotprobe_cannot_account_for_is_left_as_found() {
        // A patch site (NOP5 -> call) where the kernel optimised a uprobe
        // into its own call: same first byte, other target. Merging byte
        // by byte would give `0f` + the kernel's rel32, neither's code.
        let nop5 = [0x0f, 0x1f, 0x44, 0x00, 0x00];
        let ours = [0xe8, 0x10, 0x20, 0x30, 0x00];
        let theirs = [0xe8, 0x99, 0x88, 0x77, 0x66];
        let mut live = theirs;
        assert_eq!(
            take_own_bytes_out(&mut live, &ours, &nop5),
            Some(ForeignOutcome::LeftAsFound)
        );
        assert_eq!(live, theirs);
    }

    #[test]
    fn placeholders_are_nops_only() {
        assert!(all_nops(&[0x0f, 0x1f, 0x44, 0x00, 0x00]));
        assert!(all_nops(&[0x66, 0x90, 0x0f, 0x1f, 0x00]));
        assert!(!all_nops(&[0xcc, 0x1f, 0x44, 0x00, 0x00]));
        assert!(!all_nops(&[0xe8, 0x10, 0x20, 0x30, 0x00]));
        assert!(!all_nops(&[0x0f, 0x1f, 0x44, 0x00]), "cut short");
        assert!(!all_nops(&[]));
    }
}
