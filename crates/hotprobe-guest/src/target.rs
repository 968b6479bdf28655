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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hotprobe_target::{
    ExitStatus, GuestPhys, GuestVirt, Registers, ResumeMode, ReturnStrategy, RuntimeAddr,
    ScratchRegion, Target, TargetError, TargetEvent, ThreadId,
};

use crate::client::{GdbClient, GdbError, DEFAULT_TIMEOUT};
use crate::mem::{self, MemError, PhysMemory, RamFile};
use crate::rsp::{RegisterMap, StopReply, ThreadRef};

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
    /// Single-steps taken internally to step over a reported breakpoint.
    pub step_overs: u64,
    /// Memory reads served from the mapped RAM file.
    pub direct_reads: u64,
    /// Memory reads served by the stub (`m`).
    pub stub_reads: u64,
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
    last_thread: ThreadRef,
    /// cr3 and cr4 of the last register block read (kernel mappings are
    /// shared by every address space).
    paging: Option<(u64, u64)>,
    ram: Option<RamFile>,
    stopped_by_stop_all: bool,
    scratch: Vec<ScratchArea>,
    stats: GuestStats,
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
        Ok(GuestTarget {
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
            last_thread,
            paging: None,
            ram,
            stopped_by_stop_all: true,
            scratch: Vec::new(),
            stats: GuestStats::default(),
        })
    }

    /// The underlying protocol client (for packets this type does not wrap).
    pub fn client(&mut self) -> &mut GdbClient {
        &mut self.client
    }

    /// Counters.
    pub fn stats(&self) -> GuestStats {
        self.stats
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
    }

    fn read_regs(&mut self, t: ThreadRef) -> Result<Registers, TargetError> {
        if let Some((_, r)) = self.regs.get(&t.tid) {
            return Ok(*r);
        }
        let g = self.client.read_g(t).map_err(|e| self.fail(e))?;
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
            StopReply::Signal { signal, thread, .. } => {
                let t = thread.unwrap_or(self.last_thread);
                if !self.threads.contains(&t) {
                    // A vCPU we did not know (hot-plugged): learn the list again.
                    if let Ok(ts) = self.client.threads() {
                        self.threads = ts;
                    }
                }
                self.last_thread = t;
                let regs = self.read_regs(t)?;
                let thread = ThreadId(t.tid as u64);
                if self.stepping == Some(t) {
                    self.stepping = None;
                    return Ok(Some(TargetEvent::Stepped { thread, regs }));
                }
                if signal == 5 && self.breakpoints.contains(&regs.rip) {
                    self.reported.insert(t.tid, regs.rip);
                    self.stats.breakpoint_hits += 1;
                    return Ok(Some(TargetEvent::Breakpoint {
                        thread,
                        addr: RuntimeAddr(regs.rip),
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
            let rip = self.read_regs(t)?.rip;
            self.reported.remove(&t.tid);
            if rip == addr && self.breakpoints.contains(&addr) {
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.running = true;
                self.stats.step_overs += 1;
                let s = self
                    .client
                    .wait_stop(Some(self.config.timeout))
                    .map_err(|e| self.fail(e))?;
                let Some(s) = s else {
                    return Err(proto(&self.name, "no stop reply to a single-step"));
                };
                self.running = false;
                self.stats.stops += 1;
                self.invalidate();
                if let StopReply::Signal { .. } = s {
                    let regs = self.read_regs(t)?;
                    if self.breakpoints.contains(&regs.rip) {
                        // The next instruction is probed too: report it, VM stopped.
                        self.reported.insert(t.tid, regs.rip);
                        self.stats.breakpoint_hits += 1;
                        self.pending.push_back(TargetEvent::Breakpoint {
                            thread: ThreadId(t.tid as u64),
                            addr: RuntimeAddr(regs.rip),
                            regs,
                        });
                        return Ok(());
                    }
                } else if let Some(ev) = self.on_stop(s, false)? {
                    self.pending.push_back(ev);
                    return Ok(());
                }
            }
        }
        self.reported.clear();
        self.invalidate();
        self.client.cont().map_err(|e| self.fail(e))?;
        self.running = true;
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
        if old.rip != regs.rip {
            // Moved off the reported breakpoint (boosted): nothing to step over.
            self.reported.remove(&t.tid);
        }
        Ok(())
    }

    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
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
                self.reported.remove(&t.tid);
                self.invalidate();
                self.stepping = Some(t);
                self.client.step(t).map_err(|e| self.fail(e))?;
                self.running = true;
                Ok(())
            }
            ResumeMode::Continue => {
                self.last_thread = t;
                self.continue_vm()
            }
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
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
