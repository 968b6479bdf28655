//! The Target model shared by every hotprobe target and the engine.
//!
//! A *target* is something whose instructions can be probed: a Linux process
//! (ptrace) or a VM guest kernel (GDB stub). The engine in the `hotprobe` crate
//! implements the probe semantics (pre/post handlers, out-of-line execution,
//! boosting, return probes) once, on top of the small [`Target`] trait defined
//! here. Optional capabilities (scratch memory in the target, how return probes
//! are implemented) are separate, opt-in methods.

mod addr;
mod regs;
pub mod syscalls;

pub use addr::{GuestPhys, GuestVirt, LinkAddr, LoadBias, RuntimeAddr};
pub use regs::Registers;

use std::time::Duration;

/// Identifies one thread of execution in a target: a Linux tid, or a vCPU's
/// thread id as the GDB stub numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId(pub u64);

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How a stopped thread is to be resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeMode {
    /// Run freely until the next event.
    Continue,
    /// Execute exactly one instruction, then report [`TargetEvent::Stepped`].
    Step,
}

/// Something that happened in a target, as reported by [`Target::wait`].
///
/// Every event that names a thread leaves that thread stopped: the engine
/// resumes it with [`Target::resume`]. Signals and other events that the
/// engine does not need to see are handled inside the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetEvent {
    /// A thread reached a breakpoint inserted with
    /// [`Target::insert_breakpoint`]. `regs.rip` equals `addr` (the target
    /// rewinds the instruction pointer where the CPU reports it past the trap).
    Breakpoint {
        /// The thread that hit it.
        thread: ThreadId,
        /// The breakpoint's address.
        addr: RuntimeAddr,
        /// The thread's registers at the hit (`rip` alone, the rest zero,
        /// if the caller asked for that with
        /// [`Target::set_partial_breakpoint_registers`]).
        regs: Registers,
    },
    /// A thread resumed with [`ResumeMode::Step`] executed one instruction.
    Stepped {
        /// The thread that stepped.
        thread: ThreadId,
        /// Its registers after the step.
        regs: Registers,
    },
    /// A hardware watchpoint (debug registers DR0–DR3) fired: the data
    /// access is done, `regs.rip` is the instruction after the accessing
    /// one (process targets; see `ProcessTarget::set_watchpoints`).
    Watchpoint {
        /// The thread that made the access.
        thread: ThreadId,
        /// Which watchpoint slots fired (bit `i`: slot `i`, DR6's B0–B3).
        slots: u8,
        /// The thread's registers after the access.
        regs: Registers,
    },
    /// A new thread appeared (it is already running; nothing to resume).
    ThreadCreated(ThreadId),
    /// A thread ended; whatever the engine kept for it can be dropped.
    ThreadExited(ThreadId),
    /// `thread` forked a child. The target has already removed every
    /// breakpoint from the child's copy of memory; the child stays stopped
    /// until the engine calls [`Target::release_fork_child`] (after putting
    /// back, in the child's stack, return addresses it had swapped).
    Forked {
        /// The forking thread (stopped).
        thread: ThreadId,
        /// The child's process id.
        child: u64,
    },
    /// The target replaced its program image (execve): every probe address is
    /// now meaningless. The target has not re-inserted anything.
    Exec,
    /// The dynamic loader finished adding or removing objects (`dlopen`,
    /// `dlclose`, or the program's own libraries after exec): its `r_debug`
    /// says `RT_CONSISTENT` again. The thread is stopped at the loader's
    /// rendezvous (`_dl_debug_state`, `r_brk`); the objects now mapped are
    /// in /proc/PID/maps. After an addition the new objects are relocated
    /// but their constructors have NOT run yet. Resume the thread with
    /// [`Target::resume`] (`Continue`), as after a breakpoint. Process
    /// targets only.
    ModulesChanged {
        /// The thread stopped at the rendezvous.
        thread: ThreadId,
    },
    /// The target is gone (exit, kill, or the guest/stub went away). The
    /// engine drops its probes.
    Exited(ExitStatus),
    /// [`Target::wait`] timed out with nothing to report.
    Timeout,
}

/// In [`TargetEvent::Watchpoint`]'s `slots`: the CPU did not say which
/// watchpoint fired (DR6 empty, as a virtual CPU may leave it), and the
/// low bits name every one that may have. The engine keeps those the
/// accessing instruction touched.
pub const WATCH_SLOTS_UNKNOWN: u8 = 0x80;

/// How a target ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// The process called exit with this code.
    Code(i32),
    /// The process was killed by this signal.
    Signal(i32),
    /// The connection to the target was lost (guest stub closed, VM died).
    Disconnected(String),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exited with code {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by signal {s}"),
            ExitStatus::Disconnected(why) => write!(f, "disconnected: {why}"),
        }
    }
}

/// How return probes get control back when a probed function returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnStrategy {
    /// Swap the return address on the stack for a trampoline in scratch
    /// memory (Kprobes' kretprobe): needs [`Target::alloc_scratch`].
    Trampoline,
    /// Leave the stack alone and put a breakpoint at the real return address,
    /// matching hits to live instances by stack pointer (for targets whose
    /// memory must not be written but for breakpoints).
    BreakpointAtReturn,
}

/// A block of executable memory in the target that the engine may fill with
/// out-of-line instruction slots and trampolines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchRegion {
    /// First byte.
    pub start: RuntimeAddr,
    /// Length in bytes.
    pub len: u64,
}

impl ScratchRegion {
    /// Whether `addr` lies inside this region.
    pub fn contains(&self, addr: RuntimeAddr) -> bool {
        addr.0 >= self.start.0 && addr.0 < self.start.0 + self.len
    }
}

/// Errors a target reports.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A system call on the target failed.
    #[error("{call} failed on {target}: {source}")]
    Sys {
        /// The call (e.g. `ptrace(PTRACE_GETREGS)`).
        call: &'static str,
        /// The target it was made for (e.g. `pid 42, tid 43`).
        target: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Memory could not be read or written.
    #[error("cannot {op} {len} bytes at {addr:#x} in {target}")]
    Memory {
        /// `read` or `write`.
        op: &'static str,
        /// The address.
        addr: u64,
        /// How many bytes.
        len: usize,
        /// The target.
        target: String,
    },
    /// The target is gone.
    #[error("{target} is gone ({status})")]
    Gone {
        /// The target.
        target: String,
        /// How it ended.
        status: ExitStatus,
    },
    /// The thread is unknown or not stopped.
    #[error("thread {thread} of {target} is not a stopped thread")]
    NoSuchThread {
        /// The thread.
        thread: ThreadId,
        /// The target.
        target: String,
    },
    /// A breakpoint already exists at this address, or none exists to remove.
    #[error("breakpoint at {addr:#x} in {target}: {why}")]
    Breakpoint {
        /// Address.
        addr: u64,
        /// Target.
        target: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The target has no scratch memory to give near this address.
    #[error("no scratch memory within reach of {near:#x} in {target}: {why}")]
    NoScratch {
        /// The address the scratch memory had to be near.
        near: u64,
        /// The target.
        target: String,
        /// Why.
        why: String,
    },
    /// A protocol-level failure talking to the target (GDB stub).
    #[error("{target}: protocol error: {why}")]
    Protocol {
        /// The target.
        target: String,
        /// What went wrong.
        why: String,
    },
}

/// A probeable target: a process or a guest kernel.
///
/// Required methods are the primitives every target has; the engine builds
/// probes, out-of-line execution and return probes on top of them.
pub trait Target {
    /// A short human name for messages: `pid 4242`, `guest 127.0.0.1:1234`.
    fn describe(&self) -> String;

    /// The threads currently known (all of them stopped or running).
    fn threads(&self) -> Vec<ThreadId>;

    /// Whether thread `t` has ended though its end is not handled yet (a
    /// traced thread that exited stays a zombie until its tracer waits
    /// for it). `false` where a target cannot tell.
    fn thread_ended(&self, _t: ThreadId) -> bool {
        false
    }

    /// Read `buf.len()` bytes at `addr`.
    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError>;

    /// Write `data` at `addr`, even into read-only text.
    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError>;

    /// Registers of a stopped thread.
    fn registers(&mut self, thread: ThreadId) -> Result<Registers, TargetError>;

    /// Replace the registers of a stopped thread.
    fn set_registers(&mut self, thread: ThreadId, regs: &Registers) -> Result<(), TargetError>;

    /// The low 64 bits of xmm0–xmm15 of a stopped thread (float and double
    /// arguments and return values). The default: a target that cannot read
    /// them says so.
    fn xmm_registers(&mut self, thread: ThreadId) -> Result<[u64; 16], TargetError> {
        let _ = thread;
        Err(TargetError::Protocol {
            target: self.describe(),
            why: "this target does not give its vector registers".into(),
        })
    }

    /// Move a stopped thread's instruction pointer to `pc`, leaving every
    /// other register as it is. The default reads and writes the whole set;
    /// a target where that costs round trips (a GDB stub) writes `rip` alone.
    fn set_pc(&mut self, thread: ThreadId, pc: u64) -> Result<(), TargetError> {
        let mut regs = self.registers(thread)?;
        regs.rip = pc;
        self.set_registers(thread, &regs)
    }

    /// Asks the target to report [`TargetEvent::Breakpoint`] with `rip`
    /// alone (every other field of its `regs` zero) when fetching the rest
    /// costs it a round trip; a caller that asks fetches them with
    /// [`Target::registers`] when it needs them, and moves the thread with
    /// [`Target::set_pc`]. Other events keep carrying every register.
    /// Returns whether the target will do so; by default it will not.
    fn set_partial_breakpoint_registers(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// Resume one stopped thread.
    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError>;

    /// Wait for the next event, at most `timeout` (forever if `None`).
    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError>;

    /// Insert a breakpoint at `addr` (an instruction boundary). Hits are
    /// reported as [`TargetEvent::Breakpoint`]; the original instruction is
    /// kept by the target and [`Target::read_memory`] keeps returning the
    /// original bytes.
    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError>;

    /// Remove a breakpoint inserted earlier, restoring the original bytes.
    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError>;

    /// The addresses of the breakpoints this target holds, where it keeps
    /// them itself and writes no byte (a guest's stub breakpoints), for
    /// the session's code ledger. `None` (the default): it does not list
    /// them this way (a process lists its `int3`s with their bytes).
    fn stub_breakpoints(&self) -> Option<Vec<u64>> {
        None
    }

    /// Stop every thread (stop-the-world, for patching); events that arrive
    /// meanwhile are kept for later [`Target::wait`] calls.
    fn stop_all(&mut self) -> Result<(), TargetError>;

    /// Resume every thread stopped by [`Target::stop_all`].
    fn resume_all(&mut self) -> Result<(), TargetError>;

    /// Detach: every breakpoint removed, scratch memory released, the target
    /// left running on its own. The engine restores return addresses first.
    fn detach(&mut self) -> Result<(), TargetError>;

    /// Executable memory of at least `len` bytes within ±2 GiB of `near`, for
    /// out-of-line slots and trampolines. Targets that cannot give any
    /// return `TargetError::NoScratch`; the engine then single-steps in place.
    fn alloc_scratch(
        &mut self,
        near: RuntimeAddr,
        _len: u64,
    ) -> Result<ScratchRegion, TargetError> {
        Err(TargetError::NoScratch {
            near: near.0,
            target: self.describe(),
            why: "this target has no scratch memory".into(),
        })
    }

    /// Let a forked child (see [`TargetEvent::Forked`]) run on its own, after
    /// writing `restores` (address, original bytes) into its memory: return
    /// addresses swapped in its stack and code rewritten by mechanisms the
    /// target does not know about (the fast path's patches and jumps).
    fn release_fork_child(
        &mut self,
        _child: u64,
        _restores: &[(RuntimeAddr, Vec<u8>)],
    ) -> Result<(), TargetError> {
        Ok(())
    }

    /// Forget the breakpoint at `addr` without writing anything: the
    /// memory it was in is gone (a library was unmapped). No-op by default.
    fn forget_breakpoint(&mut self, _addr: RuntimeAddr) {}

    /// How this target implements return probes.
    fn return_strategy(&self) -> ReturnStrategy {
        ReturnStrategy::Trampoline
    }
}
