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
    stepping: Option<ThreadRef>,
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

    /// Classifies a stop reply into an event (None: not for the engine, the
    /// VM was resumed again or stays stopped for stop_all).
    fn on_stop(
        &mut self,
        s: StopReply,
        interrupted: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        self.running = false;
        self.stopped_at.get_or_insert_with(Instant::now);
        self.stats.stops += 1;
        self.invalidate();
        match s {
            StopReply::Exited { code } => {
                let why = format!("guest exited (W{code:02x})");
                self.gone = Some(why.clone());
                Ok(Some(TargetEvent::Exited(ExitStatus::Disconnected(why))))
            }
            StopReply::Terminated { signal } => {
                let why = format!("guest terminated (X{signal:02x})");
                self.gone = Some(why.clone());
                Ok(Some(TargetEvent::Exited(ExitStatus::Disconnected(why))))
            }
            StopReply::Output(_) => Ok(None),
            StopReply::Signal {
                signal,
                thread,
                pairs,
            } => {
                let t = thread.unwrap_or(self.last_thread);
                if !self.threads.contains(&t) {
                    // A vCPU we did not know (hot-plugged): learn the list again.
                    if let Ok(ts) = self.client.threads() {
                        self.threads = ts;
                    }
                }
                self.last_thread = t;
                let thread = ThreadId(t.tid as u64);
                if self.stepping == Some(t) {
                    self.stepping = None;
                    let regs = self.read_regs(t)?;
                    return Ok(Some(TargetEvent::Stepped { thread, regs }));
                }
                let rip = self.stop_pc(t, &pairs)?;
                if signal == 5 && self.breakpoints.contains(&rip) {
                    self.reported.insert(t.tid, rip);
                    self.stats.breakpoint_hits += 1;
                    let regs = self.event_regs(t, rip)?;
                    return Ok(Some(TargetEvent::Breakpoint {
                        thread,
                        addr: RuntimeAddr(rip),
                        regs,
                    }));
                }
                if interrupted {
                    return Ok(None);
                }
                // A stop that is not ours (a breakpoint removed while its hit
                // was in flight, a stray interrupt): keep the VM running.
                self.continue_vm()?;
                Ok(None)
            }
        }
    }

    /// Continues the VM, stepping a vCPU first off a breakpoint it was just
    /// reported at. Returns an event if the step-over itself produced one.
    fn continue_vm(&mut self) -> Result<(), TargetError> {
        let t = self.last_thread;
        if let Some(addr) = self.reported.get(&t.tid).copied() {
            let rip = self.pc(t, &[])?;
            self.reported.remove(&t.tid);
            if rip == addr && self.breakpoints.contains(&addr) {
                self.flush_pc()?;
                self.stats.step_overs += 1;
                let mut repeats = 0;
                loop {
                    self.client.step(t).map_err(|e| self.fail(e))?;
                    self.running = true;
                    self.mark_resumed();
                    let s = self
                        .client
                        .wait_stop(Some(self.config.timeout))
                        .map_err(|e| self.fail(e))?;
                    let Some(s) = s else {
                        return Err(proto(&self.name, "no stop reply to a single-step"));
                    };
                    self.running = false;
                    self.stopped_at = Some(Instant::now());
                    self.stats.stops += 1;
                    self.invalidate();
                    let StopReply::Signal { pairs, .. } = s else {
                        if let Some(ev) = self.on_stop(s, false)? {
                            self.pending.push_back(ev);
                            return Ok(());
                        }
                        break;
                    };
                    let rip = self.stop_pc(t, &pairs)?;
                    if rip == addr && repeats < MAX_STEP_REPEATS {
                        // Still before the probed instruction: QEMU (TCG)
                        // sometimes answers a single-step with a trap stop
                        // taken before the instruction ran (seen: 1 step in
                        // a few hundred, the same T05 and registers), or the
                        // instruction is a rep iteration. Either way this is
                        // the execution already reported: step again, or
                        // it would be reported a second time.
                        repeats += 1;
                        self.stats.step_repeats += 1;
                        continue;
                    }
                    if self.breakpoints.contains(&rip) {
                        // The next instruction is probed too: report it, VM stopped.
                        self.reported.insert(t.tid, rip);
                        self.stats.breakpoint_hits += 1;
                        let regs = self.event_regs(t, rip)?;
                        self.pending.push_back(TargetEvent::Breakpoint {
                            thread: ThreadId(t.tid as u64),
                            addr: RuntimeAddr(rip),
                            regs,
                        });
                        return Ok(());
                    }
                    break;
                }
            }
        }
        self.reported.clear();
        self.invalidate();
        // A rip set for the vCPU of the last stop (QEMU's current vCPU for
        // `c`) goes with the resume: one packet, no reply to wait for.
        let r = match self.pending_pc {
            Some((pt, pc)) if pt == t => {
                self.pending_pc = None;
                self.client.cont_at(pc)
            }
            _ => {
                self.flush_pc()?;
                self.client.cont()
            }
        };
        r.map_err(|e| self.fail(e))?;
        self.running = true;
        self.mark_resumed();
        Ok(())
    }

    /// Stops the VM if it runs; returns whether it did (so the caller
    /// resumes it after). A breakpoint that raced the interrupt is queued.
    fn pause(&mut self) -> Result<bool, TargetError> {
        if !self.running {
            return Ok(false);
        }
        self.client.interrupt().map_err(|e| self.fail(e))?;
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = self
                .client
                .wait_stop(Some(left))
                .map_err(|e| self.fail(e))?;
            let Some(s) = s else {
                return Err(proto(&self.name, "the VM did not stop after an interrupt"));
            };
            if let Some(ev) = self.on_stop(s, true)? {
                self.pending.push_back(ev);
                return Ok(false);
            }
            if !self.running {
                return Ok(true);
            }
        }
    }

    fn unpause(&mut self, paused: bool) -> Result<(), TargetError> {
        if paused && self.pending.is_empty() {
            self.continue_vm()?;
        }
        Ok(())
    }

    fn phys_read_stub(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
        let r = self
            .client
            .set_phys_mode(true)
            .and_then(|_| self.client.read_memory(addr.0, buf));
        let back = self.client.set_phys_mode(false);
        r.and(back).map_err(|e| MemError::Reader {
            addr: addr.0,
            why: e.to_string(),
        })
    }

    /// The paging registers (cr3, cr4) to walk kernel addresses with.
    fn paging(&mut self) -> Result<(u64, u64), TargetError> {
        if let Some(p) = self.paging {
            return Ok(p);
        }
        let t = self.last_thread;
        self.read_regs(t)?;
        self.paging.ok_or_else(|| proto(&self.name, "no cr3"))
    }

    /// Translates a guest-virtual address by walking the guest's page tables
    /// (through the mapped RAM if any, else the stub in physical mode).
    pub fn translate(&mut self, virt: GuestVirt) -> Result<mem::Translation, TargetError> {
        self.check_alive()?;
        let (cr3, cr4) = self.paging()?;
        let r = match self.ram.as_mut() {
            Some(ram) => mem::translate(ram, cr3, cr4, virt),
            None => {
                let paused = self.pause()?;
                let r = {
                    let mut sp = StubPhys(self);
                    mem::translate(&mut sp, cr3, cr4, virt)
                };
                self.unpause(paused)?;
                r
            }
        };
        r.map_err(|e| proto(&self.name, e))
    }

    /// Reads guest-virtual memory through the stub (`m`) only.
    pub fn read_memory_stub(&mut self, addr: GuestVirt, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        self.stats.stub_reads += 1;
        self.client.read_memory(addr.0, buf).map_err(|e| match e {
            GdbError::ErrorReply { .. } => TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: buf.len(),
                target: self.name.clone(),
            },
            e => self.fail(e),
        })
    }

    /// Reads guest-virtual memory from the mapped RAM (page-table walk from
    /// the last cr3); an error if no RAM file is mapped or a page is absent.
    pub fn read_memory_direct(
        &mut self,
        addr: GuestVirt,
        buf: &mut [u8],
    ) -> Result<(), TargetError> {
        let (cr3, cr4) = self.paging()?;
        let name = self.name.clone();
        let ram = self
            .ram
            .as_mut()
            .ok_or_else(|| proto(&name, "no guest RAM file mapped"))?;
        mem::read_virt(ram, cr3, cr4, addr, buf).map_err(|e| proto(&name, e))?;
        self.stats.direct_reads += 1;
        Ok(())
    }

    /// Reads guest-physical memory (mapped RAM, else the stub in physical mode).
    pub fn read_physical(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        let r = match self.ram.as_mut() {
            Some(ram) => ram.read(addr, buf),
            None => self.phys_read_stub(addr, buf),
        };
        r.map_err(|e| proto(&self.name, e))
    }

    /// Finds unused executable bytes in kernel text for out-of-line slots:
    /// first the fill between `_etext` and the end of its page (the page is
    /// proven mapped and executable by a page-table walk, the bytes proven to
    /// be 0x00/0xcc fill), then runs of int3 padding between functions.
    fn find_scratch(&mut self, near: u64, len: u64) -> Result<ScratchArea, String> {
        let Some((stext, etext)) = self.config.kernel_text else {
            return Err(
                "the kernel text bounds are unknown (give _stext/_etext from kallsyms)".into(),
            );
        };
        if len == 0 || len > 4096 {
            return Err(format!(
                "{len} bytes asked; at most 4096 can be found in text padding"
            ));
        }
        let within = |a: u64| a.abs_diff(near) < (1u64 << 31) - 4096;
        let mut reasons = Vec::new();
        // 1. the tail of the last text page
        let end = (etext + 4095) & !4095;
        let taken = |s: &Self, a: u64, l: u64| {
            s.scratch
                .iter()
                .any(|x| a < x.start + x.len && x.start < a + l)
        };
        if end > etext && within(etext) {
            match self.prove_unused(etext, end - etext) {
                Ok(()) => {
                    let start = (etext + 15) & !15;
                    if end - start >= len && !taken(self, start, end - start) {
                        return self.claim(
                            start,
                            end - start,
                            format!("fill after _etext ({etext:#x}..{end:#x})"),
                        );
                    }
                    reasons.push(format!(
                        "fill after _etext: {} bytes only or taken",
                        end - start
                    ));
                }
                Err(why) => reasons.push(format!("fill after _etext: {why}")),
            }
        }
        // 2. int3 padding between functions, scanned around `near`
        let win = 256 * 1024;
        let lo = near.saturating_sub(win).max(stext);
        let hi = (near + win).min(etext);
        let mut at = lo;
        let mut run_start = None;
        while at < hi {
            let n = (hi - at).min(16384) as usize;
            let mut buf = vec![0u8; n];
            if let Err(e) = self.read_memory(RuntimeAddr(at), &mut buf) {
                reasons.push(format!("scanning text at {at:#x}: {e}"));
                break;
            }
            for (i, b) in buf.iter().enumerate() {
                let a = at + i as u64;
                if *b == 0xcc {
                    let s = *run_start.get_or_insert(a);
                    // keep one int3 before and after the slot
                    let slot = (s + 1 + 15) & !15;
                    if a >= slot + len && !taken(self, slot, len) && within(slot) {
                        if let Ok(()) = self.prove_unused(slot, len) {
                            return self.claim(slot, len, format!("int3 padding at {s:#x}"));
                        }
                    }
                } else {
                    run_start = None;
                }
            }
            at += n as u64;
        }
        reasons.push(format!(
            "no run of {} int3 bytes within {lo:#x}..{hi:#x}",
            len + 2
        ));
        Err(reasons.join("; "))
    }

    fn prove_unused(&mut self, start: u64, len: u64) -> Result<(), String> {
        let mut page = start & !4095;
        while page < start + len {
            let t = self.translate(GuestVirt(page)).map_err(|e| e.to_string())?;
            if !t.executable {
                return Err(format!("page {page:#x} is not executable"));
            }
            page += 4096;
        }
        let mut buf = vec![0u8; len as usize];
        self.read_memory(RuntimeAddr(start), &mut buf)
            .map_err(|e| e.to_string())?;
        if let Some(i) = buf.iter().position(|b| *b != 0xcc && *b != 0) {
            return Err(format!(
                "byte {:#x} at {:#x} is not fill",
                buf[i],
                start + i as u64
            ));
        }
        Ok(())
    }

    fn claim(&mut self, start: u64, len: u64, how: String) -> Result<ScratchArea, String> {
        let mut original = vec![0u8; len as usize];
        self.read_memory(RuntimeAddr(start), &mut original)
            .map_err(|e| e.to_string())?;
        Ok(ScratchArea {
            start,
            len,
            used: 0,
            dirty: false,
            original,
            how,
        })
    }

    /// [`Target::resume`] without publishing the counters.
    fn resume_inner(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Ok(()); // all-stop: the VM already runs
        }
        if !self.pending.is_empty() {
            // An event is queued for the engine: the VM stays stopped until
            // it is taken and answered.
            return Ok(());
        }
        self.stopped_by_stop_all = false;
        match mode {
            ResumeMode::Step => {
                self.flush_pc()?;
                self.reported.remove(&t.tid);
                self.invalidate();
                self.stepping = Some(t);
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.running = true;
                self.mark_resumed();
                Ok(())
            }
            ResumeMode::Continue => {
                self.last_thread = t;
                self.continue_vm()
            }
        }
    }

    /// [`Target::wait`] without publishing the counters.
    fn wait_inner(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(ev);
        }
        if let Some(why) = &self.gone {
            return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why.clone())));
        }
        if !self.running {
            return Ok(TargetEvent::Timeout);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // A signal (Ctrl-C) ends the wait: the session checks its flag.
            match self.client.wait_stop_interruptible(left) {
                Ok(None) => return Ok(TargetEvent::Timeout),
                Ok(Some(s)) => {
                    let ev = match self.on_stop(s, false) {
                        Ok(ev) => ev,
                        // The stub died while the stop was being examined.
                        Err(_) if self.gone.is_some() => {
                            let why = self.gone.clone().unwrap_or_default();
                            return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why)));
                        }
                        Err(e) => return Err(e),
                    };
                    if let Some(ev) = ev {
                        return Ok(ev);
                    }
                    if let Some(ev) = self.pending.pop_front() {
                        return Ok(ev);
                    }
                    if !self.running {
                        return Ok(TargetEvent::Timeout);
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    self.gone = Some(why.clone());
                    self.running = false;
                    return Ok(TargetEvent::Exited(ExitStatus::Disconnected(why)));
                }
            }
        }
    }

    /// Where the scratch areas lie and how each was found.
    pub fn scratch_areas(&self) -> Vec<(ScratchRegion, String)> {
        self.scratch
            .iter()
            .map(|a| {
                (
                    ScratchRegion {
                        start: RuntimeAddr(a.start),
                        len: a.len,
                    },
                    a.how.clone(),
                )
            })
            .collect()
    }

    fn restore_scratch(&mut self) -> Result<(), TargetError> {
        let areas = std::mem::take(&mut self.scratch);
        for a in &areas {
            if a.dirty {
                self.client
                    .write_memory(a.start, &a.original)
                    .map_err(|e| self.fail(e))?;
            }
        }
        Ok(())
    }
}

struct StubPhys<'a>(&'a mut GuestTarget);

impl PhysMemory for StubPhys<'_> {
    fn read_phys(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
        self.0.phys_read_stub(addr, buf)
    }
}

impl Target for GuestTarget {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn threads(&self) -> Vec<ThreadId> {
        self.threads
            .iter()
            .map(|t| ThreadId(t.tid as u64))
            .collect()
    }

    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.ram.is_some() && self.read_memory_direct(GuestVirt(addr.0), buf).is_ok() {
            return Ok(());
        }
        let paused = self.pause()?;
        let r = self.read_memory_stub(GuestVirt(addr.0), buf);
        self.unpause(paused)?;
        r
    }

    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError> {
        self.check_alive()?;
        let paused = self.pause()?;
        let r = self.client.write_memory(addr.0, data).map_err(|e| match e {
            GdbError::ErrorReply { .. } => TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: data.len(),
                target: self.name.clone(),
            },
            e => self.fail(e),
        });
        if r.is_ok() {
            for a in &mut self.scratch {
                if addr.0 < a.start + a.len && a.start < addr.0 + data.len() as u64 {
                    a.dirty = true;
                }
            }
        }
        self.unpause(paused)?;
        r
    }

    fn registers(&mut self, thread: ThreadId) -> Result<Registers, TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        self.read_regs(t)
    }

    fn set_registers(&mut self, thread: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        // A rip kept for the resume first, so the diff below is against
        // what the stub holds.
        self.flush_pc()?;
        let old = self.read_regs(t)?;
        let mut new = *regs;
        let mut old_m = old;
        let changed: Vec<(&'static str, u64)> = RegisterMap::fields(&mut new)
            .into_iter()
            .zip(RegisterMap::fields(&mut old_m))
            .filter(|((_, n), (_, o))| **n != **o)
            .map(|((name, n), _)| (name, *n))
            .collect();
        for (name, value) in &changed {
            let Some(info) = self.regmap.get(name).cloned() else {
                continue;
            };
            let bytes = (info.bitsize as usize).div_ceil(8).min(8);
            let v = value.to_le_bytes();
            self.client
                .write_register(t, info.regnum, v.get(..bytes).unwrap_or(&v))
                .map_err(|e| self.fail(e))?;
        }
        if let Some((g, r)) = self.regs.get_mut(&t.tid) {
            self.regmap.store(g, regs);
            *r = self.regmap.registers(g);
        }
        self.pcs.remove(&t.tid);
        if old.rip != regs.rip {
            // Moved off the reported breakpoint (boosted): nothing to step over.
            self.reported.remove(&t.tid);
        }
        Ok(())
    }

    fn set_pc(&mut self, thread: ThreadId, pc: u64) -> Result<(), TargetError> {
        self.check_alive()?;
        let t = self.thread_ref(thread)?;
        if self.running {
            return Err(TargetError::NoSuchThread {
                thread,
                target: self.name.clone(),
            });
        }
        let Some(info) = self.regmap.get("rip").cloned() else {
            let mut regs = self.read_regs(t)?;
            regs.rip = pc;
            return self.set_registers(thread, &regs);
        };
        if info.bitsize == 0 {
            return Err(proto(&self.name, "rip has no size"));
        }
        let old = self.pc(t, &[])?;
        if self.pending_pc.is_some_and(|(pt, _)| pt != t) {
            self.flush_pc()?;
        }
        // Sent with the resume (`c ADDR`), or as a `P` if anything needs
        // the registers first.
        self.pending_pc = Some((t, pc));
        self.stats.pc_writes += 1;
        if let Some((g, r)) = self.regs.get_mut(&t.tid) {
            r.rip = pc;
            self.regmap.store(g, r);
        }
        self.pcs.insert(t.tid, pc);
        if old != pc {
            // Moved off the reported breakpoint (boosted): nothing to step over.
            self.reported.remove(&t.tid);
        }
        Ok(())
    }

    fn set_partial_breakpoint_registers(&mut self, on: bool) -> bool {
        self.partial_regs = on && self.config.partial_registers;
        self.partial_regs
    }

    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let r = self.resume_inner(thread, mode);
        self.publish_stats();
        r
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
        let r = self.wait_inner(timeout);
        self.publish_stats();
        r
    }

    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.breakpoints.contains(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.name.clone(),
                why: "already inserted",
            });
        }
        let paused = self.pause()?;
        let r = self
            .client
            .insert_breakpoint(0, addr.0)
            .map_err(|e| self.fail(e));
        if r.is_ok() {
            self.breakpoints.insert(addr.0);
        }
        self.unpause(paused)?;
        r
    }

    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        self.check_alive()?;
        if !self.breakpoints.remove(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.name.clone(),
                why: "none inserted",
            });
        }
        let paused = self.pause()?;
        let r = self
            .client
            .remove_breakpoint(0, addr.0)
            .map_err(|e| self.fail(e));
        self.reported.retain(|_, a| *a != addr.0);
        self.unpause(paused)?;
        r
    }

    fn stop_all(&mut self) -> Result<(), TargetError> {
        self.check_alive()?;
        self.stopped_by_stop_all = self.pause()?;
        Ok(())
    }

    fn resume_all(&mut self) -> Result<(), TargetError> {
        self.check_alive()?;
        if self.stopped_by_stop_all && !self.running && self.pending.is_empty() {
            self.stopped_by_stop_all = false;
            self.continue_vm()?;
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), TargetError> {
        if self.gone.is_some() {
            return Ok(());
        }
        self.pause()?;
        self.flush_pc()?;
        self.pending.clear();
        // No vCPU may be left inside a scratch area about to be restored.
        for t in self.threads.clone() {
            for _ in 0..64 {
                let rip = self.read_regs(t)?.rip;
                if !self
                    .scratch
                    .iter()
                    .any(|a| rip >= a.start && rip < a.start + a.len)
                {
                    break;
                }
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.client
                    .wait_stop(Some(self.config.timeout))
                    .map_err(|e| self.fail(e))?;
                self.invalidate();
            }
        }
        for a in std::mem::take(&mut self.breakpoints) {
            self.client
                .remove_breakpoint(0, a)
                .map_err(|e| self.fail(e))?;
        }
        self.restore_scratch()?;
        let r = self.client.detach().map_err(|e| self.fail(e));
        self.gone = Some("detached".into());
        self.running = false;
        r
    }

    fn alloc_scratch(&mut self, near: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        self.check_alive()?;
        // Bump-allocate in areas found earlier.
        for a in &mut self.scratch {
            let start = (a.start + a.used + 15) & !15;
            if start + len <= a.start + a.len && start.abs_diff(near.0) < (1u64 << 31) - 4096 {
                a.used = start + len - a.start;
                return Ok(ScratchRegion {
                    start: RuntimeAddr(start),
                    len,
                });
            }
        }
        match self.find_scratch(near.0, len) {
            Ok(mut area) => {
                area.used = len;
                let region = ScratchRegion {
                    start: RuntimeAddr(area.start),
                    len,
                };
                self.scratch.push(area);
                Ok(region)
            }
            Err(why) => Err(TargetError::NoScratch {
                near: near.0,
                target: self.name.clone(),
                why,
            }),
        }
    }

    fn return_strategy(&self) -> ReturnStrategy {
        ReturnStrategy::BreakpointAtReturn
    }
}
