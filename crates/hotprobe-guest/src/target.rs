//! [`GuestTarget`]: a VM guest kernel as a [`Target`], through QEMU's GDB
//! stub, with guest RAM optionally mapped from the host.
//!
//! The stub works in all-stop mode: a stop reply means every vCPU is stopped.
//! Threads are vCPUs. Resuming the thread an event was reported for resumes
//! the VM (`vCont;c`); stepping steps that vCPU alone (`vCont;s:TID`, the
//! other vCPUs stay stopped; QEMU masks interrupts and timers while stepping).
//!
//! QEMU does not step over a breakpoint for you: continuing from one reports
//! it again. So when the engine resumes with [`ResumeMode::Continue`] a thread
//! whose instruction pointer still sits on the breakpoint just reported, this
//! target first single-steps that vCPU (QEMU lets a single-step execute the
//! instruction under a breakpoint), then continues: every execution of a
//! probed instruction is reported exactly once. An engine that boosts moves
//! `rip` into the out-of-line area instead, and pays one stop per hit.
//!
//! Packets per hit are kept few (each stop also flushes QEMU's translation
//! cache): asked by the engine ([`Target::set_partial_breakpoint_registers`]),
//! a breakpoint hit reads `rip` alone with one `p` (the rest only if a handler
//! asks), [`Target::set_pc`] keeps `rip` for the resume, which sends it with
//! `c ADDR` (no `P`, no reply to wait for), and no `Hg` follows a trap stop
//! (it selects the stopped vCPU).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hotprobe_target::{
    ExitStatus, GuestPhys, GuestVirt, Registers, ResumeMode, ReturnStrategy, RuntimeAddr,
    ScratchRegion, Target, TargetError, TargetEvent, ThreadId,
};

use crate::client::{GdbClient, GdbError, DEFAULT_TIMEOUT};
use crate::mem::{self, MemError, PhysMemory, RamFile};
use crate::rsp::{RegisterMap, StopReply, ThreadRef};

mod as_target;
mod memory;
mod run;
mod scratch;

/// At most this many extra single-steps per step-over while `rip` stays at
/// the breakpoint; after them the stop is reported as a new hit (a
/// one-instruction loop, or a rep running longer).
const MAX_STEP_REPEATS: u32 = 64;

/// How to reach a guest and what is known about it.
#[derive(Clone, Debug)]
pub struct GuestConfig {
    /// Where the stub listens.
    pub stub: StubAddr,
    /// QEMU's shared `memory-backend-file` (`mem-path=`), to read guest RAM
    /// directly instead of through `m` packets.
    pub ram_file: Option<PathBuf>,
    /// The guest kernel's text `[_stext, _etext)` (from kallsyms or
    /// System.map), where [`Target::alloc_scratch`] looks for unused bytes.
    pub kernel_text: Option<(u64, u64)>,
    /// How long each request waits for its reply.
    pub timeout: Duration,
    /// Whether breakpoint hits may be reported with `rip` alone (one `p`
    /// packet) when the engine asks, the other registers being read only if
    /// a handler needs them (default). Off, every hit reads the whole `g`
    /// block.
    pub partial_registers: bool,
}

/// A GDB stub address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StubAddr {
    /// `host:port` over TCP.
    Tcp(String),
    /// A unix-domain socket path.
    Unix(PathBuf),
}

impl std::fmt::Display for StubAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StubAddr::Tcp(a) => write!(f, "{a}"),
            StubAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

impl GuestConfig {
    /// A configuration with nothing but the stub's address.
    pub fn new(stub: StubAddr) -> Self {
        GuestConfig {
            stub,
            ram_file: None,
            kernel_text: None,
            timeout: DEFAULT_TIMEOUT,
            partial_registers: true,
        }
    }
}

/// Counters of what the target did, for benchmarks and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestStats {
    /// Stop replies received (each one stops the VM and, under TCG, flushes
    /// QEMU's translation cache).
    pub stops: u64,
    /// Breakpoint events reported.
    pub breakpoint_hits: u64,
    /// Breakpoints stepped over internally (one per reported hit resumed
    /// in place).
    pub step_overs: u64,
    /// Extra single-steps of a step-over whose stop still showed `rip` at
    /// the breakpoint (a stop before the instruction ran, or a rep
    /// iteration): the same execution, not a new hit.
    pub step_repeats: u64,
    /// Memory reads served from the mapped RAM file.
    pub direct_reads: u64,
    /// Memory reads served by the stub (`m`).
    pub stub_reads: u64,
    /// Whole register blocks read (`g`).
    pub register_reads: u64,
    /// `rip` alone read (`p`) or taken from an expedited stop reply.
    pub pc_reads: u64,
    /// `rip` alone written ([`Target::set_pc`]): with the resume
    /// (`c ADDR`), or by a `P` when something else came first.
    pub pc_writes: u64,
    /// RSP packets sent to the stub (the client's count).
    pub packets_sent: u64,
    /// RSP packets received from the stub (the client's count).
    pub packets_received: u64,
    /// Requests whose reply was waited for (the client's count).
    pub round_trips: u64,
    /// Microseconds the VM spent stopped between a stop reply's arrival and
    /// the resume this target sent (its own packets and the engine's
    /// handling; not QEMU's cost of stopping and restarting).
    pub stopped_us: u64,
}

/// A shared, read-only view of a [`GuestTarget`]'s counters that stays
/// readable after the target is moved into a session (updated whenever the
/// target returns an event or resumes the VM).
#[derive(Clone, Debug, Default)]
pub struct StatsHandle(Arc<Mutex<GuestStats>>);

impl StatsHandle {
    /// The counters as last published.
    pub fn get(&self) -> GuestStats {
        match self.0.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }
}

#[derive(Clone, Debug)]
struct ScratchArea {
    start: u64,
    len: u64,
    used: u64,
    dirty: bool,
    original: Vec<u8>,
    how: String,
}

/// A VM guest kernel probed through a GDB stub.
pub struct GuestTarget {
    client: GdbClient,
    name: String,
    config: GuestConfig,
    regmap: RegisterMap,
    threads: Vec<ThreadRef>,
    running: bool,
    gone: Option<String>,
    pending: VecDeque<TargetEvent>,
    breakpoints: BTreeSet<u64>,
    /// Per vCPU: the breakpoint reported and not yet executed.
    reported: HashMap<i64, u64>,
    /// The vCPU an engine single-step runs on, the `rip` it started at,
    /// and how many times it was stepped again for a stop taken before the
    /// instruction ran.
    stepping: Option<(ThreadRef, u64, u32)>,
    regs: HashMap<i64, (Vec<u8>, Registers)>,
    /// Per vCPU: `rip` alone, read with `p` (or expedited in the stop reply)
    /// when the whole `g` block was not needed.
    pcs: HashMap<i64, u64>,
    /// Breakpoint events carry `rip` alone (the engine asked for it).
    partial_regs: bool,
    /// A `rip` set by [`Target::set_pc`] and not yet sent: it goes with the
    /// resume (`c ADDR`), or as a `P` before anything else needs it.
    pending_pc: Option<(ThreadRef, u64)>,
    /// When the VM last stopped (for [`GuestStats::stopped_us`]).
    stopped_at: Option<Instant>,
    last_thread: ThreadRef,
    /// cr3 and cr4 of the last register block read (kernel mappings are
    /// shared by every address space).
    paging: Option<(u64, u64)>,
    ram: Option<RamFile>,
    stopped_by_stop_all: bool,
    scratch: Vec<ScratchArea>,
    stats: GuestStats,
    shared_stats: StatsHandle,
}

impl std::fmt::Debug for GuestTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestTarget")
            .field("name", &self.name)
            .field("running", &self.running)
            .field("breakpoints", &self.breakpoints.len())
            .finish()
    }
}

fn proto(target: &str, e: impl std::fmt::Display) -> TargetError {
    TargetError::Protocol {
        target: target.to_string(),
        why: e.to_string(),
    }
}

impl GuestTarget {
    /// Connects to the stub, handshakes, learns the vCPUs and the current
    /// stop (QEMU stops the VM when a client connects), and maps guest RAM if
    /// configured. The VM is left stopped: resume it with
    /// [`Target::resume_all`].
    pub fn connect(config: GuestConfig) -> Result<Self, TargetError> {
        let name = format!("guest {}", config.stub);
        let mut client = match &config.stub {
            StubAddr::Tcp(a) => GdbClient::connect_tcp(a, config.timeout),
            StubAddr::Unix(p) => GdbClient::connect_unix(p, config.timeout),
        }
        .map_err(|e| proto(&name, e))?;
        let ram = match &config.ram_file {
            Some(p) => Some(RamFile::open(p).map_err(|e| proto(&name, e))?),
            None => None,
        };
        let stop = client.query_stop().map_err(|e| proto(&name, e))?;
        let threads = client.threads().map_err(|e| proto(&name, e))?;
        let last_thread = match &stop {
            StopReply::Signal {
                thread: Some(t), ..
            } => *t,
            _ => threads.first().copied().unwrap_or(ThreadRef {
                pid: Some(1),
                tid: 1,
            }),
        };
        let regmap = client.register_map().clone();
        let mut target = GuestTarget {
            client,
            name,
            config,
            regmap,
            threads,
            running: false,
            gone: None,
            pending: VecDeque::new(),
            breakpoints: BTreeSet::new(),
            reported: HashMap::new(),
            stepping: None,
            regs: HashMap::new(),
            pcs: HashMap::new(),
            partial_regs: false,
            pending_pc: None,
            stopped_at: None,
            last_thread,
            paging: None,
            ram,
            stopped_by_stop_all: true,
            scratch: Vec::new(),
            stats: GuestStats::default(),
            shared_stats: StatsHandle::default(),
        };
        // cr3/cr4 for page walks now, while the VM is stopped: breakpoint
        // hits may not read the whole register block again.
        target.read_regs(last_thread)?;
        Ok(target)
    }

    /// The underlying protocol client (for packets this type does not wrap).
    pub fn client(&mut self) -> &mut GdbClient {
        &mut self.client
    }

    /// Counters.
    pub fn stats(&self) -> GuestStats {
        let c = self.client.stats();
        GuestStats {
            packets_sent: c.packets_sent,
            packets_received: c.packets_received,
            round_trips: c.round_trips,
            ..self.stats
        }
    }

    /// A handle on the counters that outlives moving the target into a
    /// session.
    pub fn stats_handle(&self) -> StatsHandle {
        self.publish_stats();
        self.shared_stats.clone()
    }

    fn publish_stats(&self) {
        let now = self.stats();
        match self.shared_stats.0.lock() {
            Ok(mut g) => *g = now,
            Err(p) => *p.into_inner() = now,
        }
    }

    /// Whether guest RAM is mapped from the host.
    pub fn has_direct_ram(&self) -> bool {
        self.ram.is_some()
    }

    /// Whether the VM is running (no stop reply pending).
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// The configured RAM file, if any.
    pub fn ram_file(&self) -> Option<&Path> {
        self.config.ram_file.as_deref()
    }

    /// Sets the kernel text bounds used by [`Target::alloc_scratch`].
    pub fn set_kernel_text(&mut self, stext: u64, etext: u64) {
        self.config.kernel_text = Some((stext, etext));
    }

    fn gone_err(&self) -> TargetError {
        TargetError::Gone {
            target: self.name.clone(),
            status: ExitStatus::Disconnected(self.gone.clone().unwrap_or_default()),
        }
    }

    /// Turns a client error into a target error, remembering fatal ones.
    fn fail(&mut self, e: GdbError) -> TargetError {
        if e.is_fatal() {
            self.gone = Some(e.to_string());
            self.running = false;
            self.gone_err()
        } else {
            proto(&self.name, e)
        }
    }

    fn check_alive(&self) -> Result<(), TargetError> {
        match self.gone {
            Some(_) => Err(self.gone_err()),
            None => Ok(()),
        }
    }

    fn thread_ref(&self, t: ThreadId) -> Result<ThreadRef, TargetError> {
        self.threads
            .iter()
            .copied()
            .find(|r| r.tid as u64 == t.0)
            .ok_or(TargetError::NoSuchThread {
                thread: t,
                target: self.name.clone(),
            })
    }

    fn invalidate(&mut self) {
        self.regs.clear();
        self.pcs.clear();
    }

    /// The instruction pointer of a stopped vCPU: from the registers read
    /// already, an expedited `rip` in the stop reply's `pairs`, or one `p`.
    fn pc(&mut self, t: ThreadRef, pairs: &[(String, String)]) -> Result<u64, TargetError> {
        if let Some((_, r)) = self.regs.get(&t.tid) {
            return Ok(r.rip);
        }
        if let Some(pc) = self.pcs.get(&t.tid) {
            return Ok(*pc);
        }
        let Some(info) = self.regmap.get("rip").cloned() else {
            return Ok(self.read_regs(t)?.rip);
        };
        let len = (info.bitsize as usize).div_ceil(8).min(8);
        let expedited = pairs
            .iter()
            .find(|(k, _)| u32::from_str_radix(k, 16).ok() == Some(info.regnum))
            .and_then(|(_, v)| crate::rsp::decode_hex(v.as_bytes()).ok());
        let bytes = match expedited {
            Some(b) => b,
            None => self
                .client
                .read_register(t, info.regnum)
                .map_err(|e| self.fail(e))?,
        };
        let mut v = [0u8; 8];
        match (v.get_mut(..len), bytes.get(..len)) {
            (Some(dst), Some(src)) => dst.copy_from_slice(src),
            _ => {
                return Err(proto(
                    &self.name,
                    format!("rip: {} bytes, {len} expected", bytes.len()),
                ))
            }
        }
        let pc = u64::from_le_bytes(v);
        self.stats.pc_reads += 1;
        self.pcs.insert(t.tid, pc);
        Ok(pc)
    }

    /// Adds the time since the last stop to [`GuestStats::stopped_us`].
    fn mark_resumed(&mut self) {
        if let Some(t0) = self.stopped_at.take() {
            self.stats.stopped_us += t0.elapsed().as_micros() as u64;
        }
    }

    /// Sends a `rip` that [`Target::set_pc`] kept for the resume (`P`).
    fn flush_pc(&mut self) -> Result<(), TargetError> {
        let Some((t, pc)) = self.pending_pc.take() else {
            return Ok(());
        };
        let Some(info) = self.regmap.get("rip").cloned() else {
            return Err(proto(&self.name, "no rip in the register description"));
        };
        let bytes = (info.bitsize as usize).div_ceil(8).min(8);
        let v = pc.to_le_bytes();
        self.client
            .write_register(t, info.regnum, v.get(..bytes).unwrap_or(&v))
            .map_err(|e| self.fail(e))
    }

    /// `rip` after a stop: alone if breakpoint events carry `rip` alone,
    /// else from the whole register block (read for the event anyway).
    fn stop_pc(&mut self, t: ThreadRef, pairs: &[(String, String)]) -> Result<u64, TargetError> {
        if self.partial_regs {
            self.pc(t, pairs)
        } else {
            Ok(self.read_regs(t)?.rip)
        }
    }

    /// The registers of a breakpoint event: `rip` alone if the engine asked
    /// for partial registers (and the rest is not read already), else all.
    fn event_regs(&mut self, t: ThreadRef, rip: u64) -> Result<Registers, TargetError> {
        match self.regs.get(&t.tid) {
            Some((_, r)) => Ok(*r),
            None if self.partial_regs => Ok(Registers {
                rip,
                ..Registers::default()
            }),
            None => self.read_regs(t),
        }
    }

    fn read_regs(&mut self, t: ThreadRef) -> Result<Registers, TargetError> {
        if let Some((_, r)) = self.regs.get(&t.tid) {
            return Ok(*r);
        }
        self.flush_pc()?;
        let g = self.client.read_g(t).map_err(|e| self.fail(e))?;
        self.stats.register_reads += 1;
        let r = self.regmap.registers(&g);
        let cr4 = self.regmap.read(&g, "cr4").unwrap_or(0);
        self.paging = Some((r.cr3, cr4));
        self.regs.insert(t.tid, (g, r));
        Ok(r)
    }
}
