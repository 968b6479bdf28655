//! The process target: a Linux process probed through ptrace.
//!
//! [`ProcessTarget`] spawns (`-- CMD ARGS`) or attaches to (`-p PID`) a
//! process, follows every thread (existing ones and new ones through clone),
//! passes signals through untouched (holding them while a thread single-steps
//! an out-of-line slot), cleans breakpoints out of forked children, notices
//! exec and exit, reports the dynamic loader's changes (dlopen, dlclose)
//! through its rendezvous, and maps scratch pages near the code with remote
//! `mmap` calls. A spawned process stops before any constructor runs. It
//! implements [`hotprobe_target::Target`]; the probe semantics live in the
//! `hotprobe` engine. Every ptrace and wait call goes through one OS layer
//! ([`os::Sys`], the crate `hotprobe-os`), which tests replace with a
//! scripted fake.

mod attach;
mod leader;
mod lend;
mod maps;
mod ready;
mod release;
mod remote;
pub mod remote_call;
mod remote_frame;
pub mod remote_resumable;
mod rendezvous;
mod reverted;
mod sigtrap;
mod sigtrap_agent;
mod sigtrap_lift;
mod spawn;
mod strays;
mod target;
mod uprobes;
mod vforks;
mod wait;
mod watch;
mod watchpoints;

#[cfg(test)]
mod remote_tests;
#[cfg(test)]
mod wait_tests;
#[cfg(test)]
mod wait_tests_fair;
#[cfg(test)]
mod wait_tests_leader;

/// The ptrace layer ([`hotprobe_os::ptrace`]): every ptrace and wait call
/// of the target goes through its [`os::Sys`].
pub use hotprobe_os::ptrace as os;
/// The raw ptrace, wait and signal calls ([`hotprobe_os::sys`]).
pub use hotprobe_os::sys;

use hotprobe_target::{
    ExitStatus, Registers, ResumeMode, RuntimeAddr, ScratchRegion, Target, TargetError,
    TargetEvent, ThreadId,
};
use os::Sys;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use sys::SysError;

pub use maps::{find_free_gap, parse_maps_lines, MapLine};
pub use reverted::RevertedBreakpoints;
pub use strays::Strays;
pub use uprobes::{kernel_uprobes, parse_uprobe_events, KernelUprobe, UprobeOwner};
pub use watch::{dr7, HwWatch, WatchKind, WATCH_SLOTS};

/// How a spawned child's standard streams are set up (inherited where `None`).
#[derive(Debug, Default)]
pub struct SpawnOptions {
    /// Standard input.
    pub stdin: Option<File>,
    /// Standard output.
    pub stdout: Option<File>,
    /// Standard error.
    pub stderr: Option<File>,
    /// Variables added to (or replacing those of) the inherited environment.
    pub env: Vec<(OsString, OsString)>,
    /// Run to the program's entry point (`AT_ENTRY`), after the libraries'
    /// constructors ran, instead of stopping before the first one (see
    /// [`ProcessTarget::spawn_with`]). For callers that need something a
    /// constructor does, such as an `LD_PRELOAD`ed agent attaching itself.
    pub stop_at_entry: bool,
}

/// The int3 opcode.
const INT3: u8 = 0xCC;

/// ptrace options set on every traced thread. `TRACESYSGOOD` marks
/// system-call stops (`SIGTRAP | 0x80`), and keeps a tracer's death
/// harmless while a thread runs to one: the kernel then sends the thread
/// the stop's code, which is SIGTRAP without it (the program dies of it)
/// and not a signal with it.
const TRACE_OPTIONS: i32 = libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACEVFORKDONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACESYSGOOD;

/// Errors starting or attaching to a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// No process with this pid.
    #[error("no such process: {pid}")]
    NoSuchProcess {
        /// The pid asked for.
        pid: i32,
    },
    /// Pid 1, the system's (or the container's) init.
    #[error("pid {pid} is init: hotprobe does not attach to it")]
    IsInit {
        /// The pid asked for (1).
        pid: i32,
    },
    /// hotprobe's own process (or one of its threads).
    #[error("pid {pid} is hotprobe itself: it cannot probe its own process")]
    IsSelf {
        /// The pid asked for.
        pid: i32,
    },
    /// hotprobe's parent, which waits for hotprobe to exit (`-p $$` in a
    /// shell): probing it would only wait until hotprobe is stopped.
    #[error(
        "pid {pid} is hotprobe's parent, waiting for hotprobe to exit (a shell's $$?): \
         hotprobe does not attach to it; give the pid of the program to probe"
    )]
    IsWaitingParent {
        /// The pid asked for.
        pid: i32,
    },
    /// A kernel thread: no user code, no ptrace.
    #[error("pid {pid} is a kernel thread ({what}): only user processes can be probed")]
    KernelThread {
        /// The pid asked for.
        pid: i32,
        /// `kthreadd's child`, or its name.
        what: String,
    },
    /// A process that exited and that its parent has not reaped.
    #[error("pid {pid} is a zombie (exited, not yet reaped by its parent {parent})")]
    Zombie {
        /// The pid asked for.
        pid: i32,
        /// Its parent.
        parent: i32,
    },
    /// Another tracer (gdb, strace, another hotprobe) holds the process.
    #[error(
        "pid {pid} is already traced by pid {tracer} ({tracer_name}): detach that tracer first"
    )]
    AlreadyTraced {
        /// The pid asked for.
        pid: i32,
        /// The tracer's pid.
        tracer: i32,
        /// The tracer's name (`/proc/TRACER/comm`).
        tracer_name: String,
    },
    /// ptrace was refused.
    #[error("not permitted to ptrace pid {pid}: run as root or grant CAP_SYS_PTRACE (or set /proc/sys/kernel/yama/ptrace_scope to 0); is another tracer (gdb, strace) attached?")]
    PermissionDenied {
        /// The pid.
        pid: i32,
    },
    /// The program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The process ended before it could be probed.
    #[error("{program} ended before it could be probed ({status})")]
    EndedEarly {
        /// The program or pid.
        program: String,
        /// How it ended.
        status: ExitStatus,
    },
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// Any other target-level failure.
    #[error(transparent)]
    Target(#[from] TargetError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    /// Running freely.
    Running,
    /// Stopped with an event the engine owns (it will resume the thread).
    Event,
    /// Stopped by [`Target::stop_all`] (resumed by `resume_all`).
    Parked,
}

#[derive(Debug)]
struct Thread {
    state: RunState,
    /// Resumed with [`ResumeMode::Step`]; the next SIGTRAP is the step.
    stepping: bool,
    /// A PTRACE_INTERRUPT was sent and its stop has not arrived yet.
    interrupt_pending: bool,
    /// Signals that arrived while stepping, delivered on the next continue.
    held_signals: VecDeque<i32>,
    /// Registers as last read or written while stopped.
    regs: Option<Registers>,
    /// The kernel's rip is one past this breakpoint (not yet rewound).
    unrewound_breakpoint: Option<u64>,
    /// Stopped at the loader's rendezvous, reported as `ModulesChanged`:
    /// resuming runs the `ret` there first.
    at_rendezvous: bool,
    /// Watchpoint slots that fired in the same trap as a single-step:
    /// reported as [`TargetEvent::Watchpoint`] when the engine resumes
    /// the thread after the step.
    pending_watch: u8,
    /// The `PTRACE_EVENT_*` of the last stop handled (0: a signal stop).
    last_event: i32,
    /// The program blocks `SIGTRAP` in this thread, as last seen (see
    /// `sigtrap.rs`).
    trap_blocked: bool,
    /// A trap of ours took `SIGTRAP` out of its mask: put back before it
    /// runs freely.
    trap_mask_reset: bool,
    /// The program's own `SIGTRAP`, pending while blocked, was what that
    /// trap delivered: queued again once the mask is back, with this
    /// siginfo (its 128 bytes).
    trap_requeue: Option<[u64; 16]>,
    /// The program blocks `SIGTRAP` here but the kernel's mask does not
    /// (`sigtrap.rs`, "lifted"): a trap of ours resets nothing.
    trap_lifted: bool,
}

impl Thread {
    fn new(state: RunState) -> Self {
        Thread {
            state,
            stepping: false,
            interrupt_pending: false,
            held_signals: VecDeque::new(),
            regs: None,
            unrewound_breakpoint: None,
            last_event: 0,
            at_rendezvous: false,
            pending_watch: 0,
            trap_blocked: false,
            trap_mask_reset: false,
            trap_requeue: None,
            trap_lifted: false,
        }
    }
}

/// Breakpoint changes kept for [`ProcessTarget::take_breakpoint_changes`]
/// before it says "too many" (a session without the agent never takes them).
pub const MAX_BREAKPOINT_CHANGES: usize = 1 << 16;

/// A Linux process under ptrace: the process implementation of [`Target`].
#[derive(Debug)]
pub struct ProcessTarget {
    pid: i32,
    program: PathBuf,
    mem: File,
    /// Ordered by tid: every walk over the threads (interrupts, resumes)
    /// makes its calls in one order, which a scripted test can expect.
    threads: BTreeMap<i32, Thread>,
    /// vfork children sharing our memory until they exec or exit: they are
    /// followed like threads (their hits are real executions of probed code).
    vfork_children: Vec<i32>,
    /// Forked children held stopped until the engine releases them.
    forked_children: Vec<i32>,
    /// Held fork children made by a thread whose `SIGTRAP` was lifted
    /// (`sigtrap.rs`): their kernel mask lacks it too.
    lifted_children: Vec<i32>,
    /// Keep vfork children that exec, stopped at their exec, for the
    /// session to take as targets of their own
    /// ([`ProcessTarget::set_keep_execd_vfork_children`]).
    keep_execd_vfork: bool,
    /// vfork children held stopped at their exec (see `keep_execd_vfork`).
    execd_vfork_children: Vec<i32>,
    breakpoints: HashMap<u64, u8>,
    /// Addresses whose `int3` came or went since the last
    /// [`ProcessTarget::take_breakpoint_changes`]; `None` after a
    /// wholesale change (exec) or past [`MAX_BREAKPOINT_CHANGES`].
    breakpoint_changes: Option<Vec<u64>>,
    scratch: Vec<ScratchRegion>,
    pending: VecDeque<TargetEvent>,
    exited: Option<ExitStatus>,
    spawned: bool,
    attached: bool,
    syscall_insn: Option<u64>,
    /// A sigreturn sequence for remote system calls' frames (`remote.rs`).
    sigreturn_insn: Option<u64>,
    /// The loader's rendezvous breakpoint (internal, invisible to the engine).
    rendezvous: Option<rendezvous::Rendezvous>,
    /// Spawned and stopped before any constructor ran.
    before_constructors: bool,
    /// Running untraced (see [`ProcessTarget::release`]).
    released: Option<release::Released>,
    /// Taken back since the session last asked
    /// ([`ProcessTarget::take_taken_back`]).
    taken_back: bool,
    /// Its end was seen while it ran untraced ([`ProcessTarget::ended_untraced`]).
    ended_untraced: bool,
    /// ptrace stops of this target's tasks handled so far.
    stops: u64,
    /// Hardware watchpoints set on every thread (DR0–DR3, DR7).
    watches: [Option<HwWatch>; WATCH_SLOTS],
    /// The OS layer every ptrace and wait call goes through.
    sys: Sys,
    /// Wait statuses reaped for tasks this target does not follow (shared
    /// with the other targets of the session, see [`Strays`]).
    strays: Strays,
    /// Tasks that ended in an exec of another thread (the kernel reports
    /// their exit after the exec, sometimes): their exit is no event.
    exec_gone: Vec<i32>,
    /// Run at detach (see [`ProcessTarget::on_detach`]).
    detach_hooks: Vec<DetachHook>,
    /// The program's `SIGTRAP` state kept across our traps (`sigtrap.rs`).
    sigtrap: sigtrap::SigTrapState,
    /// The agent's vfork functions, once found (see `vforks.rs`).
    agent_vfork: Option<vforks::AgentVforkFns>,
    /// vfork children the agent was told of: (parent thread, child).
    vfork_armed: Vec<(i32, i32)>,
    /// The leader called `pthread_exit` (or `SYS_exit`) while other
    /// threads run on: a zombie until the last of them ends, when its
    /// wait status is the process's. It is not in `threads`: ptrace never
    /// reports it stopped (`PTRACE_INTERRUPT` on it "succeeds" and no
    /// stop comes), it cannot be seized or detached, and `/proc/PID/`
    /// of the process has no `exe`, `mem` or `maps` any more (a live
    /// thread's `/proc/TID/` has them: [`ProcessTarget::live_task`]).
    zombie_leader: bool,
    /// When each task's status was last handled: a batch of ready
    /// statuses is served least recently served first (`ready.rs`).
    served: ready::Served,
}

/// Work for the last moment of a detach (see [`ProcessTarget::on_detach`]).
pub struct DetachHook(Box<dyn FnOnce(&mut ProcessTarget) + Send>);

impl std::fmt::Debug for DetachHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DetachHook")
    }
}

impl ProcessTarget {
    fn new(pid: i32, program: PathBuf, mem: File, spawned: bool, sys: Sys) -> Self {
        ProcessTarget {
            pid,
            program,
            mem,
            threads: BTreeMap::new(),
            vfork_children: Vec::new(),
            forked_children: Vec::new(),
            lifted_children: Vec::new(),
            keep_execd_vfork: false,
            execd_vfork_children: Vec::new(),
            breakpoints: HashMap::new(),
            breakpoint_changes: Some(Vec::new()),
            scratch: Vec::new(),
            pending: VecDeque::new(),
            exited: None,
            spawned,
            attached: true,
            syscall_insn: None,
            sigreturn_insn: None,
            rendezvous: None,
            before_constructors: false,
            released: None,
            taken_back: false,
            ended_untraced: false,
            stops: 0,
            watches: [None; WATCH_SLOTS],
            sys,
            strays: Strays::new(),
            exec_gone: Vec::new(),
            detach_hooks: Vec::new(),
            sigtrap: sigtrap::SigTrapState::default(),
            agent_vfork: None,
            vfork_armed: Vec::new(),
            zombie_leader: false,
            served: ready::Served::default(),
        }
    }

    /// Runs `f` at detach, once every breakpoint is out and scratch memory
    /// unmapped, with every thread still stopped and traced (remote calls
    /// work), just before the threads are let go: where an injected
    /// library is unloaded (a breakpoint the engine put into it, or into a
    /// library it brought, is out by then). Not run if the process is gone.
    pub fn on_detach(&mut self, f: impl FnOnce(&mut ProcessTarget) + Send + 'static) {
        self.detach_hooks.push(DetachHook(Box::new(f)));
    }

    /// Shares the session's table of stray wait statuses (see [`Strays`]):
    /// every target of one session must share one, since a wait of one
    /// target may reap another's status. What this target kept so far
    /// moves there.
    pub fn share_strays(&mut self, strays: &Strays) {
        strays.absorb(&self.strays);
        self.strays = strays.clone();
    }

    /// The table of stray wait statuses this target uses.
    pub fn strays(&self) -> &Strays {
        &self.strays
    }

    /// Log every ptrace and wait call of this target and its result to
    /// `out`, one line each, in the format the scripted fake replays
    /// (`None`: stop). `HOTPROBE_OS_LOG=FILE` does it from the start.
    pub fn set_os_log(&mut self, out: Option<Box<dyn std::io::Write + Send>>) {
        self.sys.set_log(out);
    }

    /// Forgets the stray statuses of this target's tasks (it ended or is
    /// dropped: nobody takes them any more).
    fn forget_strays(&self) {
        let mine = |p: i32| {
            p == self.pid
                || self.threads.contains_key(&p)
                || self.vfork_children.contains(&p)
                || self.forked_children.contains(&p)
                || self.exec_gone.contains(&p)
        };
        self.strays.forget(mine);
    }

    /// Whether task `tid` is a vfork child (sharing this process's memory
    /// until it executes or exits), not a thread of the process.
    pub fn is_vfork_child(&self, tid: i32) -> bool {
        self.vfork_children.contains(&tid)
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The executable's path (/proc/PID/exe at start).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Whether this target was started by us (and is killed on drop unless
    /// detached) rather than attached to.
    pub fn is_spawned(&self) -> bool {
        self.spawned
    }

    /// Whether [`ProcessTarget::spawn_with`] stopped the process before any
    /// library constructor ran (at the loader's rendezvous) rather than at
    /// its entry point. False for attached processes.
    pub fn stopped_before_constructors(&self) -> bool {
        self.before_constructors
    }

    /// Where the target keeps its internal breakpoint at the dynamic
    /// loader's rendezvous (`_dl_debug_state`), if it found one: the source
    /// of [`TargetEvent::ModulesChanged`]. The engine never sees its hits.
    pub fn rendezvous_breakpoint(&self) -> Option<RuntimeAddr> {
        self.rendezvous.as_ref().map(|r| RuntimeAddr(r.brk))
    }

    /// Every `int3` this target has written and not taken out (the
    /// engine's breakpoints, its return trampoline, the loader-rendezvous
    /// breakpoint): (address, original byte), sorted by address.
    pub fn breakpoints(&self) -> Vec<(u64, u8)> {
        let mut v: Vec<(u64, u8)> = self.breakpoints.iter().map(|(a, b)| (*a, *b)).collect();
        v.sort_unstable();
        v
    }

    /// The original byte under this target's `int3` at `addr`, if it has
    /// one there.
    pub fn breakpoint_at(&self, addr: u64) -> Option<u8> {
        self.breakpoints.get(&addr).copied()
    }

    /// The addresses whose `int3` was written or taken out since the last
    /// call (each at most once, sorted; a caller looks at what is there
    /// now with [`ProcessTarget::breakpoint_at`]), or `None` when too much
    /// changed to say (an exec; more than [`MAX_BREAKPOINT_CHANGES`]
    /// untaken): then look at [`ProcessTarget::breakpoints`].
    pub fn take_breakpoint_changes(&mut self) -> Option<Vec<u64>> {
        let mut v = self.breakpoint_changes.replace(Vec::new())?;
        v.sort_unstable();
        v.dedup();
        Some(v)
    }

    fn breakpoint_changed(&mut self, addr: u64) {
        if let Some(v) = &mut self.breakpoint_changes {
            if v.len() >= MAX_BREAKPOINT_CHANGES {
                self.breakpoint_changes = None;
            } else {
                v.push(addr);
            }
        }
    }

    /// The scratch memory this target mapped for out-of-line execution:
    /// (start, end).
    pub fn scratch_regions(&self) -> Vec<(u64, u64)> {
        self.scratch
            .iter()
            .map(|r| (r.start.0, r.start.0 + r.len))
            .collect()
    }

    /// How the process ended, once it has.
    /// ptrace stops of this process's tasks handled so far (every
    /// `waitpid` stop status: breakpoints, steps, signal deliveries,
    /// clone/fork/exec events, interrupts). Constant while the process
    /// runs untraced ([`ProcessTarget::release`]).
    pub fn ptrace_stops(&self) -> u64 {
        self.stops
    }

    /// How the process ended, once it has.
    pub fn exit_status(&self) -> Option<&ExitStatus> {
        self.exited.as_ref()
    }

    fn describe_tid(&self, tid: i32) -> String {
        if tid == self.pid {
            format!("pid {}", self.pid)
        } else {
            format!("pid {}, tid {tid}", self.pid)
        }
    }

    fn sys_err(&self, e: SysError) -> TargetError {
        if e.errno() == libc::ESRCH {
            if let Some(st) = &self.exited {
                return TargetError::Gone {
                    target: self.describe(),
                    status: st.clone(),
                };
            }
        }
        TargetError::Sys {
            call: e.call,
            target: self.describe_tid(e.pid),
            source: e.source,
        }
    }

    fn fetch_regs(&self, tid: i32) -> Result<Registers, TargetError> {
        self.sys
            .getregs(tid)
            .map(|r| sys::regs_from_user(&r))
            .map_err(|e| self.sys_err(e))
    }

    fn stopped_thread(&mut self, tid: ThreadId) -> Result<&mut Thread, TargetError> {
        let target = self.describe();
        match self.threads.get_mut(&(tid.0 as i32)) {
            Some(t) if t.state != RunState::Running => Ok(t),
            _ => Err(TargetError::NoSuchThread {
                thread: tid,
                target,
            }),
        }
    }

    /// A thread that is stopped, for remote syscalls.
    fn any_stopped_thread(&self) -> Option<i32> {
        // A thread at a clone, fork, vfork or exec event stop is inside that
        // system call: run on, it first finishes it (the kernel writes the
        // call's result into rax), so a remote call made on it saw its own
        // number replaced (a remote mmap failed with ENOSYS), and the
        // registers put back afterwards held the stop's rax (-ENOSYS)
        // instead of the result: glibc's clone3 "failed" and it started
        // the thread again with clone (count -p on a program creating
        // threads: SIGSEGV after detach). Any other stopped thread first.
        // (Parked too: a clone event taken while stopping parks the thread
        // where it is, inside the call.)
        let in_call = |t: &Thread| {
            matches!(
                t.last_event,
                libc::PTRACE_EVENT_CLONE
                    | libc::PTRACE_EVENT_FORK
                    | libc::PTRACE_EVENT_VFORK
                    | libc::PTRACE_EVENT_VFORK_DONE
                    | libc::PTRACE_EVENT_EXEC
            )
        };
        self.threads
            .iter()
            .filter(|(tid, t)| {
                t.state != RunState::Running && !t.stepping && !self.vfork_children.contains(tid)
            })
            .min_by_key(|(tid, t)| (in_call(t), **tid))
            .map(|(tid, _)| *tid)
    }

    /// A stopped thread for a remote call ([`ProcessTarget::any_stopped_thread`]).
    /// When the only one is inside a clone, fork, vfork-done or exec call
    /// (at its event stop), that call is finished first: the thread runs
    /// to the call's exit stop (`PTRACE_SYSCALL`), where `rax` holds its
    /// result, so that the remote call neither loses its own system call
    /// nor puts back a `-ENOSYS` the program would take for the result (a
    /// single-threaded program at its fork). A vfork parent is taken as it
    /// is: it would wait there for its child.
    pub(crate) fn thread_for_remote(&mut self) -> Result<Option<i32>, TargetError> {
        let Some(tid) = self.any_stopped_thread() else {
            return Ok(None);
        };
        let in_call = self.threads.get(&tid).is_some_and(|t| {
            matches!(
                t.last_event,
                libc::PTRACE_EVENT_CLONE
                    | libc::PTRACE_EVENT_FORK
                    | libc::PTRACE_EVENT_VFORK_DONE
                    | libc::PTRACE_EVENT_EXEC
            )
        });
        if in_call {
            self.finish_event_call(tid)?;
        }
        Ok(Some(tid))
    }

    /// Runs stopped thread `tid` from its event stop to the exit stop of
    /// the system call it is in; signals that come meanwhile are kept for
    /// its next resume.
    fn finish_event_call(&mut self, tid: i32) -> Result<(), TargetError> {
        let mut held = Vec::new();
        loop {
            self.sys
                .syscall_resume(tid, 0)
                .map_err(|e| self.sys_err(e))?;
            let Some((_, status)) = self
                .sys
                .waitpid_restart(tid, 0)
                .map_err(|e| self.sys_err(e))?
            else {
                continue;
            };
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(TargetError::Gone {
                    target: self.describe(),
                    status: exit_status(status),
                });
            }
            if status >> 16 == libc::PTRACE_EVENT_STOP {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.interrupt_pending = false;
                }
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            if status >> 16 == 0 && sig & 0x7f == libc::SIGTRAP {
                break;
            }
            if status >> 16 == 0 {
                held.push(sig);
            }
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.last_event = 0;
            t.regs = None;
            t.held_signals.extend(held);
        }
        Ok(())
    }

    /// Write an `int3` at `addr`, keeping the original byte (the engine's
    /// breakpoints and the target's own).
    fn insert_int3(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        if self.breakpoints.contains_key(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.describe(),
                why: "already inserted",
            });
        }
        let mut orig = [0u8];
        self.read_memory(addr, &mut orig)?;
        self.mem
            .write_at(&[INT3], addr.0)
            .map_err(|_| TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: 1,
                target: self.describe(),
            })?;
        self.breakpoints.insert(addr.0, orig[0]);
        self.breakpoint_changed(addr.0);
        Ok(())
    }

    /// Put back the original byte under the `int3` at `addr`.
    fn remove_int3(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        let Some(orig) = self.breakpoints.remove(&addr.0) else {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: self.describe(),
                why: "not inserted",
            });
        };
        self.breakpoint_changed(addr.0);
        // The original byte goes back only over our `int3`: a byte
        // rewritten since (a patch or jump written over the site) would
        // be torn by it.
        let mut now = [0u8];
        if self.mem.read_at(&mut now, addr.0).is_ok() && now[0] != INT3 {
            return Ok(());
        }
        self.mem
            .write_at(&[orig], addr.0)
            .map_err(|_| TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: 1,
                target: self.describe(),
            })?;
        Ok(())
    }

    /// Read a little-endian u64 from the target.
    pub fn read_u64(&mut self, addr: RuntimeAddr) -> Result<u64, TargetError> {
        let mut b = [0u8; 8];
        self.read_memory(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl Drop for ProcessTarget {
    fn drop(&mut self) {
        if self.attached {
            if self.spawned {
                self.kill();
            } else {
                let _ = self.detach();
            }
        }
        self.forget_strays();
    }
}

/// `si_code` of a SIGTRAP from a hardware breakpoint or watchpoint.
const TRAP_HWBKPT: i32 = 4;

/// `si_code` of a SIGTRAP from an `icebp`, or from a debug exception
/// whose DR6 said nothing (`watch_slots_without_dr6`).
const TRAP_BRKPT: i32 = 1;

/// Whether a SIGTRAP is queued to thread `tid` (its `SigPnd`).
fn sigtrap_pending(tid: i32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("SigPnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTRAP - 1)) != 0)
}

fn exit_status(status: i32) -> ExitStatus {
    if libc::WIFEXITED(status) {
        ExitStatus::Code(libc::WEXITSTATUS(status))
    } else {
        ExitStatus::Signal(libc::WTERMSIG(status))
    }
}

fn open_mem(sys: &Sys, pid: i32) -> Result<File, ProcessError> {
    sys.open_mem(pid).map_err(ProcessError::Sys)
}

fn list_tasks(pid: i32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
