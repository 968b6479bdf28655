//! What users hand the engine: probes, return probes, and the context their
//! handlers receive on each hit.

use hotprobe_resolve::Symbolizer;
use hotprobe_target::{Registers, RuntimeAddr, Target, TargetError, ThreadId};
use std::cell::{OnceCell, RefCell};
use std::time::Instant;

/// A handler: called on a hit with a context to read and write registers and
/// memory. Closures keep their own state (counters, buffers).
pub type Handler = Box<dyn FnMut(&mut HitContext<'_>)>;

/// A probe on one instruction (Kprobes' `kprobe`, Xenprobes' XP): `pre` runs
/// before the instruction executes, `post` right after it.
///
/// A `pre` handler that moves `rip` (through [`HitContext::regs_mut`])
/// redirects the thread: the probed instruction and the `post` handlers are
/// skipped, as with a Kprobes pre handler returning 1.
#[derive(Default)]
pub struct Probe {
    /// Runs before the probed instruction.
    pub pre: Option<Handler>,
    /// Runs after it (forces a single-step: no boosting).
    pub post: Option<Handler>,
}

impl Probe {
    /// A probe with no handlers (it still counts hits).
    pub fn new() -> Self {
        Probe::default()
    }

    /// Set the pre handler.
    pub fn pre(mut self, f: impl FnMut(&mut HitContext<'_>) + 'static) -> Self {
        self.pre = Some(Box::new(f));
        self
    }

    /// Set the post handler.
    pub fn post(mut self, f: impl FnMut(&mut HitContext<'_>) + 'static) -> Self {
        self.post = Some(Box::new(f));
        self
    }
}

/// A function-return probe (Kprobes' `kretprobe`): `entry` runs when the
/// function is entered, `ret` when that call returns. At most `maxactive`
/// calls are followed at once per target; entries beyond are counted in
/// `nmissed` and their returns are not seen.
pub struct RetProbe {
    /// Runs at function entry (only for instances that are followed).
    pub entry: Option<Handler>,
    /// Runs when the function returns (`rax` holds the return value).
    pub ret: Option<Handler>,
    /// How many live instances may be followed at once.
    pub maxactive: usize,
}

impl RetProbe {
    /// A return probe following at most `maxactive` live calls.
    pub fn new(maxactive: usize) -> Self {
        RetProbe {
            entry: None,
            ret: None,
            maxactive,
        }
    }

    /// Set the entry handler.
    pub fn entry(mut self, f: impl FnMut(&mut HitContext<'_>) + 'static) -> Self {
        self.entry = Some(Box::new(f));
        self
    }

    /// Set the return handler.
    pub fn ret(mut self, f: impl FnMut(&mut HitContext<'_>) + 'static) -> Self {
        self.ret = Some(Box::new(f));
        self
    }
}

/// Identifies a probe (or return probe) in a [`crate::Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u32);

/// Which handler of a probe is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitKind {
    /// A probe's pre handler.
    Pre,
    /// A probe's post handler.
    Post,
    /// A return probe's entry handler.
    Entry,
    /// A return probe's return handler.
    Return,
    /// A watchpoint's handler, after the watched access
    /// ([`HitContext::watch`] says what was accessed).
    Watch,
}

/// What a return handler knows about the call it closes.
#[derive(Clone, Copy, Debug)]
pub struct EntryInfo {
    /// Registers at function entry (arguments).
    pub regs: Registers,
    /// When the entry was hit.
    pub time: Instant,
    /// How many followed calls were live on this thread beneath this one.
    pub depth: usize,
    /// The real return address.
    pub return_addr: u64,
}

/// A hit thread's registers as the engine knows them: every register, or
/// `rip` alone until something asks for the rest (a target reporting
/// partial registers, see [`Target::set_partial_breakpoint_registers`]).
#[derive(Debug)]
pub(crate) struct HitRegs {
    /// `rip` (and nothing else) while `full` is empty.
    partial: Registers,
    full: OnceCell<Registers>,
}

impl HitRegs {
    /// Every register known.
    pub(crate) fn complete(regs: Registers) -> Self {
        HitRegs {
            partial: regs,
            full: OnceCell::from(regs),
        }
    }

    /// Only `rip` known.
    pub(crate) fn rip_only(rip: u64) -> Self {
        HitRegs {
            partial: Registers {
                rip,
                ..Registers::default()
            },
            full: OnceCell::new(),
        }
    }

    /// The instruction pointer (always known).
    pub(crate) fn rip(&self) -> u64 {
        self.full.get().map_or(self.partial.rip, |r| r.rip)
    }

    /// Every register, if fetched (and possibly changed by a handler).
    pub(crate) fn fetched(&self) -> Option<&Registers> {
        self.full.get()
    }

    /// Every register, fetched from `target` the first time.
    pub(crate) fn fetch(
        &mut self,
        target: &mut dyn Target,
        thread: ThreadId,
    ) -> Result<&mut Registers, TargetError> {
        if self.full.get().is_none() {
            let r = target.registers(thread)?;
            let _ = self.full.set(r);
        }
        Ok(self.full.get_mut().unwrap_or(&mut self.partial))
    }
}

/// The context a handler runs in: the hit thread's registers (writable), the
/// target's memory, symbolization, and a way to stop the event loop.
///
/// The registers are fetched from the target the first time a handler asks
/// for them ([`HitContext::regs`], [`HitContext::arg`], ...), so a handler
/// that needs none costs a guest no register packet.
pub struct HitContext<'a> {
    pub(crate) target: RefCell<&'a mut dyn Target>,
    pub(crate) thread: ThreadId,
    pub(crate) regs: &'a mut HitRegs,
    pub(crate) probe: ProbeId,
    pub(crate) addr: RuntimeAddr,
    pub(crate) kind: HitKind,
    pub(crate) stop: &'a mut bool,
    pub(crate) symbolizer: Option<&'a dyn Symbolizer>,
    pub(crate) entry: Option<EntryInfo>,
    /// A failure to fetch the registers, reported by the engine after the
    /// handler (which saw `rip` alone meanwhile).
    pub(crate) fetch_error: RefCell<Option<TargetError>>,
    /// A watchpoint hit: what was accessed, old and new value.
    pub(crate) watch: Option<crate::WatchHit>,
    /// The id of the stack the tracer walked at this entry (`--stacks` on
    /// a trap probe, `crate::stacks::TrapStacks::on_hit`).
    pub(crate) stack: Option<u32>,
}

impl HitContext<'_> {
    /// The id of the stack the tracer walked at this entry (`--stacks` on
    /// a trap probe at a function's entry), for a recorded entry event.
    pub(crate) fn stack_id(&self) -> Option<u32> {
        self.stack
    }

    /// The probe whose handler is running.
    pub fn probe(&self) -> ProbeId {
        self.probe
    }

    /// Which handler is running.
    pub fn kind(&self) -> HitKind {
        self.kind
    }

    /// The probed address.
    pub fn addr(&self) -> RuntimeAddr {
        self.addr
    }

    /// The thread that hit the probe.
    pub fn thread(&self) -> ThreadId {
        self.thread
    }

    /// The thread's registers (fetched from the target on first use; if
    /// that fails, `rip` alone and the engine reports the error after the
    /// handler).
    pub fn regs(&self) -> &Registers {
        self.regs
            .full
            .get_or_init(|| match self.target.borrow_mut().registers(self.thread) {
                Ok(r) => r,
                Err(e) => {
                    *self.fetch_error.borrow_mut() = Some(e);
                    self.regs.partial
                }
            })
    }

    /// The thread's registers, writable: changes are applied when the
    /// thread resumes.
    pub fn regs_mut(&mut self) -> &mut Registers {
        let _ = self.regs();
        let HitRegs { partial, full } = &mut *self.regs;
        full.get_mut().unwrap_or(partial)
    }

    /// The `n`th integer argument at entry (System V: rdi, rsi, rdx, rcx,
    /// r8, r9). In a return handler, the arguments the call was made with.
    pub fn arg(&self, n: usize) -> Option<u64> {
        match &self.entry {
            Some(e) if self.kind == HitKind::Return => e.regs.arg(n),
            _ => self.regs().arg(n),
        }
    }

    /// The low 64 bits of xmm0–xmm15 (float and double arguments at an
    /// entry, the return value in xmm0 at a return), read from the target.
    pub fn xmm_registers(&mut self) -> Result<[u64; 16], TargetError> {
        self.target.get_mut().xmm_registers(self.thread)
    }

    /// The return value (rax); meaningful in a return handler.
    pub fn return_value(&self) -> u64 {
        self.regs().rax
    }

    /// For entry and return handlers of a return probe: the call's entry
    /// registers, time, depth and return address.
    pub fn entry(&self) -> Option<&EntryInfo> {
        self.entry.as_ref()
    }

    /// Read target memory.
    pub fn read_memory(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), TargetError> {
        self.target.get_mut().read_memory(RuntimeAddr(addr), buf)
    }

    /// Write target memory.
    pub fn write_memory(&mut self, addr: u64, data: &[u8]) -> Result<(), TargetError> {
        self.target.get_mut().write_memory(RuntimeAddr(addr), data)
    }

    /// Read a little-endian u64.
    pub fn read_u64(&mut self, addr: u64) -> Result<u64, TargetError> {
        let mut b = [0u8; 8];
        self.read_memory(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Read a NUL-terminated string of at most `max` bytes (lossy UTF-8).
    pub fn read_cstr(&mut self, addr: u64, max: usize) -> Result<String, TargetError> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 64];
        while out.len() < max {
            let a = addr + out.len() as u64;
            // Do not cross into a possibly unmapped page.
            let room = (0x1000 - (a & 0xfff)) as usize;
            let n = room.min(chunk.len()).min(max - out.len());
            self.read_memory(a, &mut chunk[..n])?;
            if let Some(z) = chunk[..n].iter().position(|b| *b == 0) {
                out.extend_from_slice(&chunk[..z]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// `function+0xoff [module]` for an address of the target, if known.
    pub fn symbolize(&self, addr: u64) -> Option<String> {
        self.symbolizer.and_then(|s| s.symbolize(RuntimeAddr(addr)))
    }

    /// In a watchpoint's handler ([`HitKind::Watch`]): the access, the
    /// value before and after, the accessing instruction.
    pub fn watch(&self) -> Option<&crate::WatchHit> {
        self.watch.as_ref()
    }

    /// Stop the session's event loop after this hit is finished.
    pub fn stop(&mut self) {
        *self.stop = true;
    }
}
