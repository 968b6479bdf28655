//! hotprobe: probes on any instruction of a running Linux process (and, with
//! the guest crate, of a VM guest kernel), with handlers in the tracer.
//!
//! ```no_run
//! use hotprobe::{Probe, RetProbe, Session};
//! let mut s = Session::new();
//! let t = s.spawn("./prog".as_ref(), &[]).unwrap();
//! let p = s.probe(t, "compute", Probe::new().pre(|ctx| println!("arg0 = {}", ctx.arg(0).unwrap()))).unwrap();
//! s.retprobe(t, "compute", RetProbe::new(16).ret(|ctx| println!("= {}", ctx.return_value()))).unwrap();
//! s.start().unwrap();
//! s.run().unwrap();
//! println!("{} hits", s.stats(p).unwrap().hits);
//! ```
//!
//! The engine ([`Engine`]) implements Kprobes' semantics once for any
//! [`Target`]: an `int3` at the probe point, the original instruction run
//! out of line in a scratch slot (boosted with a jump back when there is no
//! post handler and the instruction allows it, emulated for branches and
//! simple prologue instructions, single-stepped otherwise), return probes
//! through a trampoline and a per-thread shadow stack bounded by
//! `maxactive`, several probes per address, enable/disable at run time.

pub mod agg;
pub mod calibration;
pub mod cond;
mod count;
mod engine;
mod exec_trace;
pub mod guest_boot;
mod handler;
mod held;
pub mod kernel_source;
pub mod nonlocal;
pub mod observer;
pub mod pending;
mod plugin;
mod recorder;
mod session;
pub mod stacks;
pub mod typed;
pub mod typed_capture;
pub mod typed_program;

pub use count::{tsc_ticks_per_ns, CountError, CountSink};
pub use engine::{Engine, EngineView, Outcome, ProbeStats, StandaloneEngine};
pub use handler::{EntryInfo, Handler, HitContext, HitKind, Probe, ProbeId, RetProbe};
pub use held::HeldTarget;
pub use hotprobe_fastpath::{FastPathConfig, RecordedEvent, KIND_ENTRY, KIND_EXIT, KIND_HIT};
/// The OS layer (ptrace and wait, memfd and mappings, futex, clocks).
pub use hotprobe_os as os;
pub use hotprobe_process::{ProcessError, ProcessTarget, SpawnOptions};
pub use hotprobe_symbols::{ProbeSpec, ResolvedProbe, SymbolError};
pub use hotprobe_target::{
    ExitStatus, Registers, ResumeMode, ReturnStrategy, RuntimeAddr, Target, TargetError,
    TargetEvent, ThreadId,
};
pub use plugin::PluginOptions;
pub use recorder::{DrainStats, EventSink, SinkError};
// Resolution lives below the engine (target crates implement `Resolver`
// without depending on it); re-exported under the names it always had.
pub use exec_trace::ExecTraceSink;
pub use hotprobe_resolve::{
    check_probe_point, module_blacklist, BlacklistEntry, CheckOptions, ProcessResolver, Resolver,
    Symbolizer, SIGRETURN_SYMBOLS,
};
pub use session::stacks::ProbeStack;
pub use session::watch::{ValueSource, WatchAt, WatchHit, WatchKind, WatchSpec, WatchStats};
pub use session::ArmedPending;
pub use session::{
    Action, Added, AggChooser, Capture, CaptureChooser, FastCaptureChooser, Mechanism,
    MechanismChoice, PatchKind, Placement, RunEnd, Session, SessionConfig, Skipped, TargetId,
    XmmChooser,
};
pub use session::{CodeOwner, CodeSite};
pub use session::{ExecCapture, ExecImage, ExecPlacing, ProcessMatch, AT_EXEC};
// The facade, as ripgrep's `grep` crate: the crates a front end (the CLI,
// the bindings) parses, prints and reads traces with, under short names.
pub use hotprobe_coldpatch as coldpatch;
pub use hotprobe_dwarf as dwarf;
pub use hotprobe_fastpath as fastpath;
pub use hotprobe_guest as guest;
pub use hotprobe_kernel as kernel;
pub use hotprobe_qemu as qemu;
pub use hotprobe_symbols as symbols;
pub use hotprobe_trace as trace;
pub use hotprobe_x86 as x86;

/// Errors of the engine and the session.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A source of the host kernel's events (an observer) failed.
    #[error(transparent)]
    Kernel(#[from] hotprobe_kernel::KernelError),
    /// Starting or attaching to a process failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A probe spec did not resolve.
    #[error(transparent)]
    Symbol(#[from] SymbolError),
    /// The address cannot be probed safely.
    #[error("cannot probe {addr:#x}: {reason}")]
    Refused {
        /// The address.
        addr: u64,
        /// Why.
        reason: String,
    },
    /// A probe spec is not probeable (blacklisted, ambiguous).
    #[error("cannot probe {spec}: {reason}")]
    RefusedSpec {
        /// The spec as given.
        spec: String,
        /// Why.
        reason: String,
    },
    /// The fast path (agent, shared memory, patch and jump sites) failed.
    #[error(transparent)]
    FastPath(#[from] hotprobe_fastpath::FastPathError),
    /// Recorded events could not be handed on.
    #[error(transparent)]
    Sink(crate::SinkError),
    /// A local I/O operation failed.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// No probe with this id.
    #[error("no probe with id {}", .0 .0)]
    NoSuchProbe(ProbeId),
    /// No target with this id.
    #[error("no target with id {0}")]
    NoSuchTarget(usize),
    /// A thread's state no longer matches what the engine followed.
    #[error("thread {thread}: {why}")]
    Lost {
        /// The thread.
        thread: ThreadId,
        /// What went wrong.
        why: String,
    },
}
