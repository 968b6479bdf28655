//! The process target: a Linux process probed through ptrace.
//!
//! [`ProcessTarget`] spawns (`-- CMD ARGS`) or attaches to (`-p PID`) a
//! process, follows every thread (existing ones and new ones through clone),
//! passes signals through untouched (holding them while a thread single-steps
//! an out-of-line slot), cleans breakpoints out of forked children, notices
//! exec and exit, reports the dynamic loader's changes (dlopen, dlclose)
//! through its rendezvous, and maps scratch pages near the code with remote
//! `mmap` calls. A spawned process stops before any constructor runs. It implements [`hotprobe_target::Target`]; the probe semantics live
//! in the `hotprobe` engine.

mod maps;
mod release;
mod remote;
pub mod remote_call;
mod rendezvous;
pub mod sys;
mod uprobes;
mod wake;
mod watch;

use hotprobe_target::{
    ExitStatus, Registers, ResumeMode, RuntimeAddr, ScratchRegion, Target, TargetError,
    TargetEvent, ThreadId,
};
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use sys::SysError;

pub use maps::{find_free_gap, parse_maps_lines, MapLine};
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

/// Wait statuses `waitpid(-1)` returned to one target for a task it does
/// not follow: another target's of this thread (several processes in one
/// session, followed fork children), or a new thread of its own whose
/// clone event has not come yet. Each target takes its own from here.
static STRAYS: std::sync::Mutex<Vec<(i32, i32)>> = std::sync::Mutex::new(Vec::new());

fn stash(pid: i32, status: i32) {
    if let Ok(mut v) = STRAYS.lock() {
        v.push((pid, status));
    }
}

fn take_stray(pid: i32) -> Option<i32> {
    take_stray_of(|p| p == pid).map(|(_, st)| st)
}

fn take_stray_of(mut mine: impl FnMut(i32) -> bool) -> Option<(i32, i32)> {
    let mut v = STRAYS.lock().ok()?;
    let i = v.iter().position(|(p, _)| mine(*p))?;
    Some(v.remove(i))
}

/// The int3 opcode.
const INT3: u8 = 0xCC;

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The fields of `/proc/PID/status` hotprobe reads before attaching.
#[derive(Debug, Default)]
struct ProcStatus {
    state: char,
    tgid: i32,
    ppid: i32,
    tracer: i32,
}

fn proc_status(pid: i32) -> Option<ProcStatus> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut st = ProcStatus::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let num = || value.split_whitespace().next().and_then(|v| v.parse().ok());
        match key {
            "State" => st.state = value.chars().next().unwrap_or('?'),
            "Tgid" => st.tgid = num().unwrap_or(0),
            "PPid" => st.ppid = num().unwrap_or(0),
            "TracerPid" => st.tracer = num().unwrap_or(0),
            _ => {}
        }
    }
    Some(st)
}

/// The `flags` field of `/proc/PID/stat` (after the parenthesised name,
/// which may hold spaces and parentheses).
fn proc_flags(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(6)?.parse().ok()
}

fn proc_comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Whether every thread of `pid` is blocked in `wait4` or `waitid`
/// (`/proc/PID/task/TID/syscall`; false when it cannot be read).
fn all_threads_wait(pid: i32) -> bool {
    const WAIT4: &str = "61";
    const WAITID: &str = "247";
    let tasks = list_tasks(pid);
    !tasks.is_empty()
        && tasks.iter().all(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
                .is_ok_and(|s| matches!(s.split_whitespace().next(), Some(WAIT4 | WAITID)))
        })
}

/// Whether our parent `pid` waits for us: in `wait4`/`waitid` now, or
/// within 200 ms (a shell that just forked us may not have reached its
/// wait yet: we can run first).
fn parent_waits(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_millis(200);
    loop {
        if all_threads_wait(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Refuses, before anything is done to it, a process hotprobe must not or
/// cannot attach to: none with this pid, init, hotprobe itself, its parent
/// waiting for it, a kernel thread, a zombie, a process another tracer
/// holds.
fn check_attachable(pid: i32) -> Result<(), ProcessError> {
    if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(ProcessError::NoSuchProcess { pid });
    }
    let Some(st) = proc_status(pid) else {
        return Err(ProcessError::NoSuchProcess { pid });
    };
    let me = std::process::id() as i32;
    if pid == me || st.tgid == me {
        return Err(ProcessError::IsSelf { pid });
    }
    if pid == 1 {
        return Err(ProcessError::IsInit { pid });
    }
    if proc_flags(pid).is_some_and(|f| f & PF_KTHREAD != 0) {
        let what = if st.ppid == 2 {
            "kthreadd's child".to_string()
        } else {
            proc_comm(pid)
        };
        return Err(ProcessError::KernelThread { pid, what });
    }
    if matches!(st.state, 'Z' | 'X') {
        // A leader that exited while other threads run on is no zombie.
        let alive = list_tasks(pid).into_iter().any(|tid| {
            tid != pid && proc_status(tid).is_some_and(|t| !matches!(t.state, 'Z' | 'X'))
        });
        if !alive {
            return Err(ProcessError::Zombie {
                pid,
                parent: st.ppid,
            });
        }
    }
    if st.tracer != 0 {
        // TracerPid is the tracing thread: name its process.
        let tracer = proc_status(st.tracer)
            .map(|t| t.tgid)
            .filter(|&t| t > 0)
            .unwrap_or(st.tracer);
        return Err(ProcessError::AlreadyTraced {
            pid,
            tracer,
            tracer_name: if tracer == me {
                "this very process".into()
            } else {
                proc_comm(tracer)
            },
        });
    }
    // SAFETY: getppid has no preconditions.
    if pid == unsafe { libc::getppid() } && parent_waits(pid) {
        return Err(ProcessError::IsWaitingParent { pid });
    }
    Ok(())
}

/// ptrace options set on every traced thread.
const TRACE_OPTIONS: i32 = libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACEEXEC;

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
            at_rendezvous: false,
            pending_watch: 0,
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
    threads: HashMap<i32, Thread>,
    /// vfork children sharing our memory until they exec or exit: they are
    /// followed like threads (their hits are real executions of probed code).
    vfork_children: Vec<i32>,
    /// Forked children held stopped until the engine releases them.
    forked_children: Vec<i32>,
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
    /// The loader's rendezvous breakpoint (internal, invisible to the engine).
    rendezvous: Option<rendezvous::Rendezvous>,
    /// Spawned and stopped before any constructor ran.
    before_constructors: bool,
    /// Running untraced (see [`ProcessTarget::release`]).
    released: Option<release::Released>,
    /// ptrace stops of this target's tasks handled so far.
    stops: u64,
    /// Hardware watchpoints set on every thread (DR0–DR3, DR7).
    watches: [Option<HwWatch>; WATCH_SLOTS],
}

impl ProcessTarget {
    /// Start `program` with `args` under ptrace, stopped once the dynamic
    /// loader has mapped and relocated its libraries, before any constructor
    /// runs (see [`ProcessTarget::spawn_with`]).
    pub fn spawn(program: &Path, args: &[OsString]) -> Result<Self, ProcessError> {
        Self::spawn_with(program, args, &SpawnOptions::default())
    }

    /// As [`ProcessTarget::spawn`], with the child's standard streams
    /// redirected as `opts` says.
    ///
    /// The process is run from its exec to the dynamic loader's first
    /// `RT_CONSISTENT` rendezvous: the program, its `LD_PRELOAD` and
    /// `DT_NEEDED` libraries and libc are mapped (see /proc/PID/maps) and
    /// relocated, and no constructor (`.preinit_array`, `.init_array`,
    /// `DT_INIT`) of any of them has run; the leader is stopped at
    /// `_dl_debug_state`. Statically linked programs, programs whose loader
    /// has no usable rendezvous, and `opts.stop_at_entry` run to the entry
    /// point (`AT_ENTRY`) instead: the libraries' constructors have run there
    /// (the program's own run later, from `__libc_start_main`).
    /// [`ProcessTarget::stopped_before_constructors`] tells which.
    pub fn spawn_with(
        program: &Path,
        args: &[OsString],
        opts: &SpawnOptions,
    ) -> Result<Self, ProcessError> {
        let redirects: [(Option<i32>, i32); 3] = [
            (opts.stdin.as_ref().map(|f| f.as_raw_fd()), 0),
            (opts.stdout.as_ref().map(|f| f.as_raw_fd()), 1),
            (opts.stderr.as_ref().map(|f| f.as_raw_fd()), 2),
        ];
        let resolved = resolve_program(program).ok_or_else(|| ProcessError::Spawn {
            program: program.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found (nor in PATH)"),
        })?;
        let path_c =
            CString::new(resolved.as_os_str().as_bytes()).map_err(|_| ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"),
            })?;
        let mut argv_c = vec![CString::new(program.as_os_str().as_bytes()).unwrap_or_default()];
        for a in args {
            argv_c.push(CString::new(a.as_bytes()).map_err(|_| ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in argument"),
            })?);
        }
        let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !opts.env.iter().any(|(ok, _)| ok == k))
            .collect();
        env.extend(opts.env.iter().cloned());
        let envp_c: Vec<CString> = env
            .iter()
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        let mut envp: Vec<*const libc::c_char> = envp_c.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());

        let (go_r, go_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        // SAFETY: fork; the child only calls async-signal-safe functions
        // (read, write, execv, _exit) on data prepared before the fork.
        let child = unsafe { libc::fork() };
        if child == -1 {
            return Err(ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        if child == 0 {
            // SAFETY: async-signal-safe calls only, see above.
            unsafe {
                libc::close(go_w);
                libc::close(err_r);
                let mut b = 0u8;
                libc::read(go_r, &mut b as *mut u8 as *mut libc::c_void, 1);
                for (from, to) in redirects {
                    if let Some(fd) = from {
                        libc::dup2(fd, to);
                    }
                }
                libc::execve(path_c.as_ptr(), argv.as_ptr(), envp.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_w, &errno as *const i32 as *const libc::c_void, 4);
                libc::_exit(127);
            }
        }
        close_fd(go_r);
        close_fd(err_w);
        let seized = sys::seize(child, TRACE_OPTIONS | libc::PTRACE_O_EXITKILL);
        // Let the child exec.
        // SAFETY: writing one byte from a live local to our pipe.
        unsafe { libc::write(go_w, b"g".as_ptr() as *const libc::c_void, 1) };
        close_fd(go_w);
        if let Err(e) = seized {
            let _ = sys::kill(child, libc::SIGKILL);
            let _ = sys::waitpid_restart(child, 0);
            close_fd(err_r);
            return Err(e.into());
        }
        let mut errno = 0i32;
        // SAFETY: reading 4 bytes into a live local; returns 0 on CLOEXEC close.
        let n = unsafe { libc::read(err_r, &mut errno as *mut i32 as *mut libc::c_void, 4) };
        close_fd(err_r);
        if n == 4 {
            let _ = sys::waitpid_restart(child, 0);
            return Err(ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let mem = open_mem(child)?;
        let mut t = ProcessTarget::new(child, resolved, mem, true);
        t.threads.insert(child, Thread::new(RunState::Running));
        // Wait for the exec stop.
        loop {
            let (pid, status) =
                sys::waitpid_restart(child, 0)?.expect("blocking waitpid returns a pid");
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                t.attached = false;
                return Err(ProcessError::EndedEarly {
                    program: program.display().to_string(),
                    status: exit_status(status),
                });
            }
            if libc::WIFSTOPPED(status) && status >> 16 == libc::PTRACE_EVENT_EXEC {
                t.threads.get_mut(&pid).expect("leader").state = RunState::Parked;
                break;
            }
            // Anything else before exec (the seize's own stop): keep going.
            sys::cont(pid, 0)?;
        }
        // The exec replaced the memory: reopen /proc/PID/mem.
        t.mem = open_mem(child)?;
        t.arm_rendezvous();
        t.run_to_start(opts.stop_at_entry)?;
        Ok(t)
    }

    /// Refuses, before anything is done to it, a process that
    /// [`ProcessTarget::attach`] must not or cannot take: no process with
    /// this pid ([`ProcessError::NoSuchProcess`]), init
    /// ([`ProcessError::IsInit`]), hotprobe itself
    /// ([`ProcessError::IsSelf`]), its parent waiting for it
    /// ([`ProcessError::IsWaitingParent`]), a kernel thread
    /// ([`ProcessError::KernelThread`]), a zombie
    /// ([`ProcessError::Zombie`]), a process another tracer holds
    /// ([`ProcessError::AlreadyTraced`]).
    pub fn check_attachable(pid: i32) -> Result<(), ProcessError> {
        check_attachable(pid)
    }

    /// Attach to a running process and every one of its threads, leaving
    /// them all stopped (call [`Target::resume_all`] once probes are in).
    pub fn attach(pid: i32) -> Result<Self, ProcessError> {
        Self::check_attachable(pid)?;
        let program = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                ProcessError::PermissionDenied { pid }
            } else {
                ProcessError::NoSuchProcess { pid }
            }
        })?;
        let mem = open_mem(pid).map_err(|e| match e {
            ProcessError::Sys(s) if s.errno() == libc::EACCES || s.errno() == libc::EPERM => {
                ProcessError::PermissionDenied { pid }
            }
            other => other,
        })?;
        let mut t = ProcessTarget::new(pid, program, mem, false);
        // Seize threads until the list is stable (threads may be created
        // while we attach; those made by seized threads are auto-attached).
        loop {
            let mut new = 0;
            for tid in list_tasks(pid) {
                if t.threads.contains_key(&tid) {
                    continue;
                }
                match sys::seize(tid, TRACE_OPTIONS) {
                    Ok(()) => {}
                    Err(e) if e.errno() == libc::EPERM => {
                        t.attached = !t.threads.is_empty();
                        if t.threads.is_empty() {
                            return Err(ProcessError::PermissionDenied { pid });
                        }
                        return Err(e.into());
                    }
                    Err(e) if e.errno() == libc::ESRCH => continue,
                    Err(e) => return Err(e.into()),
                }
                let mut th = Thread::new(RunState::Running);
                th.interrupt_pending = true;
                sys::interrupt(tid)?;
                t.threads.insert(tid, th);
                new += 1;
            }
            if new == 0 {
                break;
            }
        }
        t.wait_parked()?;
        if t.threads.is_empty() {
            t.attached = false;
            return Err(ProcessError::NoSuchProcess { pid });
        }
        t.absorb_attach_exec(pid);
        t.arm_rendezvous();
        Ok(t)
    }

    /// An exec that was ending as we attached — a program started with
    /// fork and exec is attached as soon as its exec closed the parent's
    /// close-on-exec pipe (`std::process::Command::spawn` returns then),
    /// before the exec returns — reports `PTRACE_EVENT_EXEC` while attach
    /// waits for the threads to park. The image attached to is already
    /// the new one and nothing of ours was in the old one: that is no
    /// event for the engine (which would drop what it places in the new
    /// image meanwhile). Its handling armed the new image's rendezvous
    /// and reopened its memory; the program's path is read again (it may
    /// have been the old image's), and the thread is parked like the
    /// others.
    fn absorb_attach_exec(&mut self, pid: i32) {
        let before = self.pending.len();
        self.pending.retain(|e| !matches!(e, TargetEvent::Exec));
        if self.pending.len() == before {
            return;
        }
        if let Ok(p) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            self.program = p;
        }
        if self.pending.is_empty() {
            for th in self.threads.values_mut() {
                if th.state == RunState::Event {
                    th.state = RunState::Parked;
                }
            }
        }
    }

    fn new(pid: i32, program: PathBuf, mem: File, spawned: bool) -> Self {
        ProcessTarget {
            pid,
            program,
            mem,
            threads: HashMap::new(),
            vfork_children: Vec::new(),
            forked_children: Vec::new(),
            breakpoints: HashMap::new(),
            breakpoint_changes: Some(Vec::new()),
            scratch: Vec::new(),
            pending: VecDeque::new(),
            exited: None,
            spawned,
            attached: true,
            syscall_insn: None,
            rendezvous: None,
            before_constructors: false,
            released: None,
            stops: 0,
            watches: [None; WATCH_SLOTS],
        }
    }

    /// Takes the forked child `child` (held stopped since its
    /// [`TargetEvent::Forked`]) as a target of its own, stopped, instead of
    /// releasing it: it keeps whatever other mechanisms wrote into its
    /// memory (our breakpoints were already taken out of it).
    pub fn adopt_fork_child(&mut self, child: u64) -> Result<ProcessTarget, ProcessError> {
        let child = child as i32;
        if !self.forked_children.contains(&child) {
            return Err(ProcessError::NoSuchProcess { pid: child });
        }
        self.forked_children.retain(|c| *c != child);
        let mem = open_mem(child)?;
        let mut t = ProcessTarget::new(child, self.program.clone(), mem, self.spawned);
        t.threads.insert(child, Thread::new(RunState::Parked));
        t.arm_rendezvous();
        Ok(t)
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

    /// Stop the process (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if self.exited.is_none() {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            // This thread's children and tracees only: another thread's
            // session (several in one program, through the C or Python
            // API) must not lose its events to this wait.
            while let Ok(Some((p, st))) = sys::waitpid_restart(-1, libc::__WNOTHREAD) {
                if p == self.pid && (libc::WIFEXITED(st) || libc::WIFSIGNALED(st)) {
                    self.exited = Some(exit_status(st));
                    break;
                }
                if p != self.pid && !self.threads.contains_key(&p) {
                    // Another target's of this thread: it takes it from there.
                    stash(p, st);
                }
            }
            self.attached = false;
        }
    }

    /// The hardware watchpoints set (slot `i` is DR`i`).
    pub fn watchpoints(&self) -> [Option<HwWatch>; WATCH_SLOTS] {
        self.watches
    }

    /// Set the hardware watchpoints (slot `i` in DR`i`, `None` for a free
    /// slot) on every thread, and on every thread created from now on.
    /// Threads running are stopped for it and resumed; threads stopped
    /// stay stopped. Each watchpoint is checked first ([`HwWatch::check`]);
    /// a thread refusing them is an error (no thread is left unwatched
    /// silently). A hit is reported as [`TargetEvent::Watchpoint`].
    pub fn set_watchpoints(
        &mut self,
        slots: [Option<HwWatch>; WATCH_SLOTS],
    ) -> Result<(), TargetError> {
        for w in slots.iter().flatten() {
            w.check().map_err(|why| TargetError::Protocol {
                target: self.describe(),
                why,
            })?;
        }
        if let Some(st) = &self.exited {
            return Err(TargetError::Gone {
                target: self.describe(),
                status: st.clone(),
            });
        }
        // A released process (running untraced) is taken back first: its
        // threads get their debug registers through ptrace, and a hit is
        // then a ptrace stop (release refuses while a watchpoint is set).
        // Threads stopped already stay so; every other one runs on after,
        // threads created while stopping included.
        let held: Vec<i32> = if self.released.is_some() {
            self.reacquire()?;
            Vec::new()
        } else {
            self.threads
                .iter()
                .filter(|(_, t)| t.state != RunState::Running)
                .map(|(tid, _)| *tid)
                .collect()
        };
        if self.threads.values().any(|t| t.state == RunState::Running) {
            self.stop_all()?;
        }
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        let mut result = Ok(());
        for tid in tids {
            match watch::apply(tid, &slots) {
                Ok(()) => {}
                // Gone meanwhile: its exit is still to be reported.
                Err(e) if e.errno() == libc::ESRCH => {}
                Err(e) => {
                    result = Err(self.sys_err(e));
                    break;
                }
            }
        }
        if result.is_ok() {
            self.watches = slots;
        } else {
            // Leave no thread with a partial set.
            for tid in self.threads.keys().copied().collect::<Vec<_>>() {
                let _ = watch::apply(tid, &self.watches);
            }
        }
        let parked: Vec<i32> = self
            .threads
            .iter()
            .filter(|(tid, t)| t.state == RunState::Parked && !held.contains(tid))
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            self.resume(ThreadId(tid as u64), ResumeMode::Continue)?;
        }
        result
    }

    fn watching(&self) -> bool {
        self.watches.iter().any(Option::is_some)
    }

    /// Clear every thread's debug registers (threads stopped), and take
    /// each watchpoint trap already queued to a thread but not yet
    /// reported (it would kill the program once detached): the thread is
    /// let run into its signal-delivery stop, where the trap is dropped.
    fn clear_watchpoints_for_detach(&mut self) {
        if !self.watching() {
            return;
        }
        let none = [None; WATCH_SLOTS];
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in &tids {
            let _ = watch::apply(*tid, &none);
        }
        self.watches = none;
        for tid in tids {
            if !sigtrap_pending(tid) {
                continue;
            }
            if sys::cont(tid, 0).is_err() {
                continue;
            }
            // The queued SIGTRAP comes first (synchronous signals are
            // dequeued before others).
            match sys::waitpid_restart(tid, libc::__WALL) {
                Ok(Some((_, st)))
                    if libc::WIFSTOPPED(st)
                        && libc::WSTOPSIG(st) == libc::SIGTRAP
                        && st >> 16 == 0 =>
                {
                    let ours = sys::getsiginfo(tid)
                        .map(|i| i.si_code == TRAP_HWBKPT)
                        .unwrap_or(false);
                    if !ours {
                        // The program's own: delivered at detach.
                        if let Some(t) = self.threads.get_mut(&tid) {
                            t.held_signals.push_front(libc::SIGTRAP);
                        }
                    }
                }
                Ok(Some((p, st))) if libc::WIFSTOPPED(st) && st >> 16 == 0 => {
                    // Another signal: delivered at detach.
                    if let Some(t) = self.threads.get_mut(&p) {
                        t.held_signals.push_front(libc::WSTOPSIG(st));
                    }
                }
                _ => {}
            }
        }
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

    /// Run from the exec stop to the loader's first `RT_CONSISTENT`
    /// rendezvous of the base namespace (unless `at_entry`), or else to the
    /// program's entry point (AT_ENTRY), which also catches programs
    /// whose loader never reports.
    fn run_to_start(&mut self, at_entry: bool) -> Result<(), ProcessError> {
        let entry =
            rendezvous::read_auxv(self.pid, libc::AT_ENTRY).ok_or_else(|| ProcessError::Spawn {
                program: self.program.display().to_string(),
                source: std::io::Error::other("no AT_ENTRY in /proc/PID/auxv"),
            })?;
        let addr = RuntimeAddr(entry);
        let leader = ThreadId(self.pid as u64);
        self.insert_breakpoint(addr)?;
        self.resume(leader, ResumeMode::Continue)?;
        loop {
            match self.wait(None)? {
                TargetEvent::Breakpoint {
                    thread,
                    addr: a,
                    mut regs,
                } if a == addr => {
                    self.remove_breakpoint(addr)?;
                    regs.rip = entry;
                    self.set_registers(thread, &regs)?;
                    self.threads.get_mut(&self.pid).expect("leader").state = RunState::Parked;
                    return Ok(());
                }
                TargetEvent::ModulesChanged { thread }
                    if !at_entry
                        && thread == leader
                        && self.rendezvous.as_ref().is_some_and(|r| r.base_loaded) =>
                {
                    self.remove_breakpoint(addr)?;
                    self.before_constructors = true;
                    self.threads.get_mut(&self.pid).expect("leader").state = RunState::Parked;
                    return Ok(());
                }
                TargetEvent::Exited(status) => {
                    return Err(ProcessError::EndedEarly {
                        program: self.program.display().to_string(),
                        status,
                    })
                }
                TargetEvent::Breakpoint { thread, .. }
                | TargetEvent::Stepped { thread, .. }
                | TargetEvent::ModulesChanged { thread } => {
                    self.resume(thread, ResumeMode::Continue)?;
                }
                _ => {}
            }
        }
    }

    /// Wait until every thread with a pending interrupt is parked (or gone).
    fn wait_parked(&mut self) -> Result<(), TargetError> {
        loop {
            let Some(tid) = self
                .threads
                .iter()
                // A thread that reported an event instead is stopped too (its
                // interrupt stays pending and is absorbed when it resumes).
                .find(|(_, t)| t.interrupt_pending && t.state == RunState::Running)
                .map(|(tid, _)| *tid)
            else {
                return Ok(());
            };
            let r = match take_stray(tid) {
                Some(st) => Some((tid, st)),
                None => match sys::waitpid_restart(tid, 0) {
                    Ok(r) => r,
                    Err(e) if e.errno() == libc::ECHILD => {
                        self.threads.remove(&tid);
                        continue;
                    }
                    Err(e) => return Err(self.sys_err(e)),
                },
            };
            if let Some((p, st)) = r {
                if let Some(ev) = self.handle_status(p, st, true)? {
                    self.pending.push_back(ev);
                }
            }
        }
    }

    /// Turn one waitpid status into an event for the engine, or handle it
    /// here and return `None`.
    fn handle_status(
        &mut self,
        pid: i32,
        status: i32,
        stopping: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if pid == self.pid {
                self.threads.clear();
                self.attached = false;
                let st = exit_status(status);
                self.exited = Some(st.clone());
                return Ok(Some(TargetEvent::Exited(st)));
            }
            if self.threads.remove(&pid).is_some() {
                self.vfork_children.retain(|c| *c != pid);
                return Ok(Some(TargetEvent::ThreadExited(ThreadId(pid as u64))));
            }
            // Another target's task (a followed fork child, a second
            // process of the session): it takes it from there.
            stash(pid, status);
            return Ok(None);
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(None);
        }
        if !self.threads.contains_key(&pid) {
            // A new thread whose clone event is still to come, or another
            // target's task.
            stash(pid, status);
            return Ok(None);
        }
        self.stops += 1;
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        {
            let t = self.threads.get_mut(&pid).expect("known thread");
            t.state = RunState::Event;
            t.regs = None;
        }
        match event {
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let new = sys::geteventmsg(pid).map_err(|e| self.sys_err(e))? as i32;
                // The new task starts with a stop of its own.
                let st = match take_stray(new) {
                    Some(st) => st,
                    None => sys::waitpid_restart(new, 0)
                        .map_err(|e| self.sys_err(e))?
                        .map(|x| x.1)
                        .unwrap_or(0),
                };
                let alive = libc::WIFSTOPPED(st);
                if event == libc::PTRACE_EVENT_CLONE || event == libc::PTRACE_EVENT_VFORK {
                    if event == libc::PTRACE_EVENT_VFORK {
                        self.vfork_children.push(new);
                    }
                    if alive && self.watching() {
                        // A new thread starts without debug registers.
                        if let Err(e) = watch::apply(new, &self.watches) {
                            if e.errno() != libc::ESRCH {
                                return Err(self.sys_err(e));
                            }
                        }
                    }
                    if alive {
                        let mut th = Thread::new(RunState::Running);
                        if stopping {
                            th.state = RunState::Parked;
                        } else {
                            sys::cont(new, 0).map_err(|e| self.sys_err(e))?;
                        }
                        self.threads.insert(new, th);
                    }
                    self.park_or_continue(pid, stopping)?;
                    return Ok(if alive {
                        Some(TargetEvent::ThreadCreated(ThreadId(new as u64)))
                    } else {
                        None
                    });
                }
                // fork: a separate address space with our breakpoints in it.
                if alive {
                    if let Ok(child_mem) = open_mem(new) {
                        for (addr, orig) in &self.breakpoints {
                            let _ = child_mem.write_at(&[*orig], *addr);
                        }
                    }
                    self.forked_children.push(new);
                }
                return Ok(Some(TargetEvent::Forked {
                    thread: ThreadId(pid as u64),
                    child: new as u64,
                }));
            }
            libc::PTRACE_EVENT_EXEC => {
                if self.vfork_children.contains(&pid)
                    || pid != self.pid && !self.threads.contains_key(&self.pid)
                {
                    // A vfork child ran exec: it is a process of its own now.
                    self.vfork_children.retain(|c| *c != pid);
                    self.threads.remove(&pid);
                    let _ = sys::detach(pid, 0);
                    return Ok(None);
                }
                // The target replaced its image; other threads are gone.
                self.threads.retain(|tid, _| *tid == pid);
                if let Some(t) = self.threads.get_mut(&pid) {
                    t.at_rendezvous = false;
                    t.unrewound_breakpoint = None;
                }
                self.breakpoints.clear();
                self.breakpoint_changes = None;
                self.rendezvous = None;
                self.scratch.clear();
                // The kernel drops a thread's debug registers at exec.
                self.watches = [None; WATCH_SLOTS];
                self.syscall_insn = None;
                self.mem = open_mem(self.pid).map_err(|e| match e {
                    ProcessError::Sys(s) => self.sys_err(s),
                    other => TargetError::Protocol {
                        target: self.describe(),
                        why: other.to_string(),
                    },
                })?;
                // The new image's loader is mapped already (it has not run).
                self.arm_rendezvous();
                return Ok(Some(TargetEvent::Exec));
            }
            libc::PTRACE_EVENT_STOP => {
                let t = self.threads.get_mut(&pid).expect("known thread");
                if t.interrupt_pending {
                    t.interrupt_pending = false;
                    if stopping {
                        t.state = RunState::Parked;
                    } else {
                        t.state = RunState::Running;
                        if t.stepping {
                            sys::step(pid, 0).map_err(|e| self.sys_err(e))?;
                        } else {
                            sys::cont(pid, 0).map_err(|e| self.sys_err(e))?;
                        }
                    }
                    return Ok(None);
                }
                if matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ) {
                    // A group-stop of the program's own: stay stopped, keep listening.
                    t.state = RunState::Running;
                    sys::listen(pid).map_err(|e| self.sys_err(e))?;
                    return Ok(None);
                }
                // The first stop of an auto-attached task, or a spurious one.
                self.park_or_continue(pid, stopping)?;
                return Ok(None);
            }
            _ => {}
        }
        // A signal-delivery stop.
        if sig == libc::SIGTRAP
            && !self.watching()
            && sys::getsiginfo(pid).is_ok_and(|i| i.si_code == TRAP_HWBKPT)
        {
            // A hardware watchpoint's trap queued to the thread before its
            // watchpoint was removed (unwatch while it ran): not the
            // program's signal — dropped, as at detach.
            let _ = watch::take_hits(pid);
            self.park_or_continue(pid, stopping)?;
            return Ok(None);
        }
        if sig == libc::SIGTRAP {
            let hits = if self.watching() {
                match watch::take_hits(pid) {
                    Ok(h) => h,
                    // Killed meanwhile: its exit comes next.
                    Err(e) if e.errno() == libc::ESRCH => 0,
                    Err(e) => return Err(self.sys_err(e)),
                }
            } else {
                0
            };
            let regs = self.fetch_regs(pid)?;
            let t = self.threads.get_mut(&pid).expect("known thread");
            if t.stepping {
                t.stepping = false;
                t.regs = Some(regs);
                t.pending_watch |= hits;
                return Ok(Some(TargetEvent::Stepped {
                    thread: ThreadId(pid as u64),
                    regs,
                }));
            }
            if hits != 0 {
                t.regs = Some(regs);
                return Ok(Some(TargetEvent::Watchpoint {
                    thread: ThreadId(pid as u64),
                    slots: hits,
                    regs,
                }));
            }
            if self.is_rendezvous_trap(regs.rip) {
                return self.on_rendezvous(pid, regs);
            }
            let bp = regs.rip.wrapping_sub(1);
            if self.breakpoints.contains_key(&bp) {
                let mut r = regs;
                r.rip = bp;
                let t = self.threads.get_mut(&pid).expect("known thread");
                t.regs = Some(r);
                t.unrewound_breakpoint = Some(bp);
                return Ok(Some(TargetEvent::Breakpoint {
                    thread: ThreadId(pid as u64),
                    addr: RuntimeAddr(bp),
                    regs: r,
                }));
            }
        }
        // Pass the signal through untouched, unless the thread is stepping
        // an out-of-line slot: then hold it until the step is done.
        let t = self.threads.get_mut(&pid).expect("known thread");
        if t.stepping {
            t.held_signals.push_back(sig);
            t.state = RunState::Running;
            sys::step(pid, 0).map_err(|e| self.sys_err(e))?;
            return Ok(None);
        }
        if stopping && t.interrupt_pending {
            // Deliver it now; the pending interrupt will park the thread.
            t.state = RunState::Running;
            sys::cont(pid, sig).map_err(|e| self.sys_err(e))?;
            return Ok(None);
        }
        t.state = RunState::Running;
        sys::cont(pid, sig).map_err(|e| self.sys_err(e))?;
        Ok(None)
    }

    fn park_or_continue(&mut self, pid: i32, stopping: bool) -> Result<(), TargetError> {
        let t = self.threads.get_mut(&pid).expect("known thread");
        if stopping {
            t.state = RunState::Parked;
            Ok(())
        } else {
            t.state = RunState::Running;
            sys::cont(pid, 0).map_err(|e| self.sys_err(e))
        }
    }

    fn fetch_regs(&self, tid: i32) -> Result<Registers, TargetError> {
        sys::getregs(tid)
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
        let mut tids: Vec<i32> = self
            .threads
            .iter()
            .filter(|(tid, t)| {
                t.state != RunState::Running && !t.stepping && !self.vfork_children.contains(tid)
            })
            .map(|(tid, _)| *tid)
            .collect();
        tids.sort();
        tids.first().copied()
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

impl Target for ProcessTarget {
    fn describe(&self) -> String {
        format!("pid {}", self.pid)
    }

    fn threads(&self) -> Vec<ThreadId> {
        let mut v: Vec<ThreadId> = self.threads.keys().map(|t| ThreadId(*t as u64)).collect();
        v.sort();
        v
    }

    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        let len = buf.len();
        let err = |me: &Self| TargetError::Memory {
            op: "read",
            addr: addr.0,
            len,
            target: me.describe(),
        };
        if addr.0 > i64::MAX as u64 {
            return Err(err(self));
        }
        match self.mem.read_at(buf, addr.0) {
            Ok(n) if n == buf.len() => {}
            _ => return Err(err(self)),
        }
        if !self.breakpoints.is_empty() {
            let end = addr.0.saturating_add(buf.len() as u64);
            if buf.len() <= 64 {
                for (i, b) in buf.iter_mut().enumerate() {
                    if let Some(orig) = self.breakpoints.get(&(addr.0 + i as u64)) {
                        *b = *orig;
                    }
                }
            } else {
                for (a, orig) in &self.breakpoints {
                    if *a >= addr.0 && *a < end {
                        buf[(*a - addr.0) as usize] = *orig;
                    }
                }
            }
        }
        Ok(())
    }

    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError> {
        let mut data = data.to_vec();
        // Bytes under a breakpoint: remember them as the new original and keep the int3.
        // Whichever is shorter is walked: the bytes or the breakpoints (a
        // span of patched text is written at once, issue 14).
        let end = addr.0.saturating_add(data.len() as u64);
        if self.breakpoints.len() < data.len() {
            for (a, orig) in self.breakpoints.iter_mut() {
                if *a >= addr.0 && *a < end {
                    let b = &mut data[(*a - addr.0) as usize];
                    *orig = *b;
                    *b = INT3;
                }
            }
        } else {
            for (i, b) in data.iter_mut().enumerate() {
                if let Some(orig) = self.breakpoints.get_mut(&(addr.0 + i as u64)) {
                    *orig = *b;
                    *b = INT3;
                }
            }
        }
        match self.mem.write_at(&data, addr.0) {
            Ok(n) if n == data.len() => Ok(()),
            _ => Err(TargetError::Memory {
                op: "write",
                addr: addr.0,
                len: data.len(),
                target: self.describe(),
            }),
        }
    }

    fn registers(&mut self, thread: ThreadId) -> Result<Registers, TargetError> {
        let t = self.stopped_thread(thread)?;
        if let Some(r) = t.regs {
            return Ok(r);
        }
        let r = self.fetch_regs(thread.0 as i32)?;
        self.stopped_thread(thread)?.regs = Some(r);
        Ok(r)
    }

    fn xmm_registers(&mut self, thread: ThreadId) -> Result<[u64; 16], TargetError> {
        self.stopped_thread(thread)?;
        sys::getxmm(thread.0 as i32).map_err(|e| self.sys_err(e))
    }

    fn set_registers(&mut self, thread: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.stopped_thread(thread)?;
        sys::setregs(thread.0 as i32, &sys::regs_to_user(regs)).map_err(|e| self.sys_err(e))?;
        let t = self.stopped_thread(thread)?;
        t.regs = Some(*regs);
        t.unrewound_breakpoint = None;
        Ok(())
    }

    fn resume(&mut self, thread: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let tid = thread.0 as i32;
        let t = self.stopped_thread(thread)?;
        let at_rendezvous = std::mem::take(&mut t.at_rendezvous);
        if let Some(bp) = t.unrewound_breakpoint.take() {
            // The engine did not move the thread: it re-executes the breakpoint
            // address (only meaningful if the breakpoint was removed).
            let mut r = match t.regs {
                Some(r) => r,
                None => self.fetch_regs(tid)?,
            };
            r.rip = bp;
            sys::setregs(tid, &sys::regs_to_user(&r)).map_err(|e| self.sys_err(e))?;
            self.stopped_thread(thread)?.regs = Some(r);
        }
        if at_rendezvous {
            if let Some(ev) = self.leave_rendezvous(thread, mode == ResumeMode::Step)? {
                // Reported instead: the thread stays stopped.
                self.stopped_thread(thread)?.state = RunState::Event;
                self.pending.push_back(ev);
                return Ok(());
            }
        }
        let t = self.stopped_thread(thread)?;
        if mode == ResumeMode::Continue && t.pending_watch != 0 {
            // The step that just ended also made a watched access: that is
            // reported now, with the thread where the engine left it.
            let slots = std::mem::take(&mut t.pending_watch);
            let regs = match t.regs {
                Some(r) => r,
                None => self.fetch_regs(tid)?,
            };
            let t = self.stopped_thread(thread)?;
            t.regs = Some(regs);
            t.state = RunState::Event;
            self.pending.push_back(TargetEvent::Watchpoint {
                thread,
                slots,
                regs,
            });
            return Ok(());
        }
        let t = self.stopped_thread(thread)?;
        t.regs = None;
        t.state = RunState::Running;
        let r = match mode {
            ResumeMode::Continue => {
                let sig = t.held_signals.pop_front().unwrap_or(0);
                let rest: Vec<i32> = t.held_signals.drain(..).collect();
                for s in rest {
                    let _ = sys::tgkill(self.pid, tid, s);
                }
                sys::cont(tid, sig)
            }
            ResumeMode::Step => {
                t.stepping = true;
                sys::step(tid, 0)
            }
        };
        r.map_err(|e| self.sys_err(e))
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<TargetEvent, TargetError> {
        if let Some(ev) = self.pending.pop_front() {
            return Ok(ev);
        }
        if let Some(st) = &self.exited {
            return Ok(TargetEvent::Exited(st.clone()));
        }
        if self.released.is_some() {
            return self.wait_released(timeout);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut nap = Duration::from_micros(20);
        loop {
            // Statuses another target of this thread reaped for us.
            while let Some((pid, status)) =
                take_stray_of(|p| p == self.pid || self.threads.contains_key(&p))
            {
                if let Some(ev) = self.handle_status(pid, status, false)? {
                    return Ok(ev);
                }
                if let Some(ev) = self.pending.pop_front() {
                    return Ok(ev);
                }
            }
            // A signal a status wait retried past ends this wait now.
            if sys::take_deferred_interrupt() {
                return Ok(TargetEvent::Timeout);
            }
            // With a deadline: a blocking wait a timer interrupts (a stop
            // wakes us at once), else polling with naps.
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let timed = match left {
                Some(l) if l >= Duration::from_micros(50) => {
                    wake::waitpid_for(-1, libc::__WNOTHREAD, l)
                }
                _ => None,
            };
            if let Some(Ok(None)) = timed {
                return Ok(TargetEvent::Timeout);
            }
            let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
            let r = match timed.unwrap_or_else(|| sys::waitpid(-1, flags | libc::__WNOTHREAD)) {
                Ok(r) => r,
                Err(e) if e.errno() == libc::EINTR => return Ok(TargetEvent::Timeout),
                Err(e) if e.errno() == libc::ECHILD => {
                    let st = ExitStatus::Disconnected("no traced task left".into());
                    self.exited = Some(st.clone());
                    self.attached = false;
                    return Ok(TargetEvent::Exited(st));
                }
                Err(e) => return Err(self.sys_err(e)),
            };
            match r {
                Some((pid, status)) => {
                    if let Some(ev) = self.handle_status(pid, status, false)? {
                        return Ok(ev);
                    }
                    if let Some(ev) = self.pending.pop_front() {
                        return Ok(ev);
                    }
                }
                None => {
                    let d = deadline.expect("WNOHANG only with a deadline");
                    let now = Instant::now();
                    if now >= d {
                        return Ok(TargetEvent::Timeout);
                    }
                    std::thread::sleep(nap.min(d - now));
                    nap = (nap * 2).min(Duration::from_millis(2));
                }
            }
        }
    }

    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        if let Some(rv) = self.rendezvous.as_mut().filter(|r| r.brk == addr.0) {
            // The internal int3 is there already: share it.
            if rv.engine_owned {
                return Err(TargetError::Breakpoint {
                    addr: addr.0,
                    target: self.describe(),
                    why: "already inserted",
                });
            }
            rv.engine_owned = true;
            return Ok(());
        }
        self.insert_int3(addr)
    }

    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        if let Some(rv) = self.rendezvous.as_mut().filter(|r| r.brk == addr.0) {
            // The internal int3 stays.
            if !rv.engine_owned {
                return Err(TargetError::Breakpoint {
                    addr: addr.0,
                    target: self.describe(),
                    why: "not inserted",
                });
            }
            rv.engine_owned = false;
            return Ok(());
        }
        self.remove_int3(addr)
    }

    fn stop_all(&mut self) -> Result<(), TargetError> {
        if self.released.is_some() {
            return self.reacquire();
        }
        let running: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state == RunState::Running && !t.interrupt_pending)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in running {
            match sys::interrupt(tid) {
                Ok(()) => self.threads.get_mut(&tid).expect("known").interrupt_pending = true,
                Err(e) if e.errno() == libc::ESRCH => {}
                Err(e) => return Err(self.sys_err(e)),
            }
        }
        self.wait_parked()
    }

    fn resume_all(&mut self) -> Result<(), TargetError> {
        let parked: Vec<i32> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state == RunState::Parked)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            self.resume(ThreadId(tid as u64), ResumeMode::Continue)?;
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), TargetError> {
        if !self.attached {
            return Ok(());
        }
        if self.released.is_some() && self.exited.is_none() {
            self.reacquire()?;
        }
        self.stop_all()?;
        self.clear_watchpoints_for_detach();
        // Threads whose breakpoint event the engine never handled re-execute
        // the (restored) original instruction.
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in &tids {
            if let Some(bp) = self.threads.get(tid).and_then(|t| t.unrewound_breakpoint) {
                if let Ok(mut r) = self.fetch_regs(*tid) {
                    r.rip = bp;
                    let _ = sys::setregs(*tid, &sys::regs_to_user(&r));
                }
            }
        }
        // Every int3, the rendezvous one included (a thread stopped there
        // runs the original `ret`).
        self.rendezvous = None;
        let bps: Vec<u64> = self.breakpoints.keys().copied().collect();
        for a in bps {
            self.remove_int3(RuntimeAddr(a))?;
        }
        // Release scratch memory no thread is executing in.
        let regions = std::mem::take(&mut self.scratch);
        for region in regions {
            let busy = tids.iter().any(|tid| {
                self.fetch_regs(*tid)
                    .map(|r| region.contains(RuntimeAddr(r.rip)))
                    .unwrap_or(false)
            });
            if !busy {
                if let Some(tid) = self.any_stopped_thread() {
                    let _ = remote::syscall(
                        self,
                        tid,
                        libc::SYS_munmap as u64,
                        &[region.start.0, region.len],
                    );
                }
            }
        }
        for child in std::mem::take(&mut self.forked_children) {
            let _ = sys::detach(child, 0);
        }
        for tid in tids {
            let sig = self
                .threads
                .get_mut(&tid)
                .and_then(|t| t.held_signals.pop_front())
                .unwrap_or(0);
            let _ = sys::detach(tid, sig);
        }
        self.threads.clear();
        self.attached = false;
        Ok(())
    }

    fn release_fork_child(
        &mut self,
        child: u64,
        restores: &[(RuntimeAddr, Vec<u8>)],
    ) -> Result<(), TargetError> {
        let child = child as i32;
        if !self.forked_children.contains(&child) {
            return Ok(());
        }
        self.forked_children.retain(|c| *c != child);
        if !restores.is_empty() {
            if let Ok(mem) = open_mem(child) {
                for (addr, bytes) in restores {
                    let _ = mem.write_at(bytes, addr.0);
                }
            }
        }
        sys::detach(child, 0).map_err(|e| self.sys_err(e))
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forget_breakpoint(&mut self, addr: RuntimeAddr) {
        if self.breakpoints.remove(&addr.0).is_some() {
            self.breakpoint_changed(addr.0);
        }
    }

    fn alloc_scratch(&mut self, near: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        let no = |why: String, me: &Self| TargetError::NoScratch {
            near: near.0,
            target: me.describe(),
            why,
        };
        let len = (len + 0xfff) & !0xfff;
        let maps_text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map_err(|e| no(format!("cannot read maps: {e}"), self))?;
        let lines = parse_maps_lines(&maps_text);
        let Some(addr) = find_free_gap(&lines, near.0, len) else {
            return Err(no("no free gap within ±1 GiB".into(), self));
        };
        let Some(tid) = self.any_stopped_thread() else {
            return Err(no("no stopped thread to make the mmap call".into(), self));
        };
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
        let r = remote::syscall(
            self,
            tid,
            libc::SYS_mmap as u64,
            &[addr, len, prot, flags, u64::MAX, 0],
        )?;
        if r != addr {
            if (r as i64) > 0 {
                let _ = remote::syscall(self, tid, libc::SYS_munmap as u64, &[r, len]);
            }
            return Err(no(
                format!("remote mmap at {addr:#x} returned {:#x}", r),
                self,
            ));
        }
        let region = ScratchRegion {
            start: RuntimeAddr(addr),
            len,
        };
        // Fill with int3 so a stray jump into unused scratch traps.
        self.write_memory(region.start, &vec![INT3; len as usize])?;
        self.scratch.push(region);
        Ok(region)
    }
}

impl Drop for ProcessTarget {
    fn drop(&mut self) {
        if !self.attached {
            return;
        }
        if self.spawned {
            self.kill();
        } else {
            let _ = self.detach();
        }
    }
}

/// `si_code` of a SIGTRAP from a hardware breakpoint or watchpoint.
const TRAP_HWBKPT: i32 = 4;

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

fn open_mem(pid: i32) -> Result<File, ProcessError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| {
            ProcessError::Sys(SysError {
                call: "open(/proc/PID/mem)",
                pid,
                source: e,
            })
        })
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

fn resolve_program(program: &Path) -> Option<PathBuf> {
    if program.as_os_str().as_bytes().contains(&b'/') {
        return program.exists().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsStr::new("/usr/bin:/bin").to_owned());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn pipe_cloexec() -> Result<(i32, i32), ProcessError> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(ProcessError::Sys(SysError {
            call: "pipe2",
            pid: 0,
            source: std::io::Error::last_os_error(),
        }));
    }
    Ok((fds[0], fds[1]))
}

fn close_fd(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd) };
}
