//! Attaching to a running process: the refusals read from `/proc` alone
//! (`check_attachable`), seizing every thread, adopting a forked child.

use crate::*;

/// `PF_KTHREAD` in the flags of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The fields of `/proc/PID/status` hotprobe reads before attaching.
#[derive(Debug, Default)]
pub(crate) struct ProcStatus {
    state: char,
    tgid: i32,
    ppid: i32,
    /// `TracerPid`: the tracing thread, 0 for none.
    pub(crate) tracer: i32,
}

/// The fields of `/proc/PID/status` the target reads.
pub(crate) fn proc_status(pid: i32) -> Option<ProcStatus> {
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

/// A task of process `pid` whose `/proc/TID/` shows the process's memory
/// and executable: `pid` itself, unless its leader is a zombie while
/// other threads run on (then the first of those).
fn live_task_of(pid: i32) -> i32 {
    let dead = |s: &ProcStatus| matches!(s.state, 'Z' | 'X');
    if proc_status(pid).is_none_or(|s| !dead(&s)) {
        return pid;
    }
    list_tasks(pid)
        .into_iter()
        .find(|tid| *tid != pid && proc_status(*tid).is_some_and(|s| !dead(&s)))
        .unwrap_or(pid)
}

/// The calling thread's id (a tracee's `TracerPid` names the tracing thread).
pub(crate) fn current_tid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
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

impl ProcessTarget {
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
        // A leader that exited while its threads run on (`pthread_exit`)
        // has no memory left: its process's `/proc/PID/exe` and `mem` are
        // gone, a live thread's are there.
        let live = live_task_of(pid);
        let program = std::fs::read_link(format!("/proc/{live}/exe")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                ProcessError::PermissionDenied { pid }
            } else {
                ProcessError::NoSuchProcess { pid }
            }
        })?;
        let sys = Sys::real();
        let mem = open_mem(&sys, live).map_err(|e| match e {
            ProcessError::Sys(s) if s.errno() == libc::EACCES || s.errno() == libc::EPERM => {
                ProcessError::PermissionDenied { pid }
            }
            other => other,
        })?;
        let mut t = ProcessTarget::new(pid, program, mem, false, sys);
        match t.seize_tasks() {
            Ok(()) => {}
            Err(e) if e.errno() == libc::EPERM && t.threads.is_empty() => {
                // Checked again: a tracer that came since the first
                // check, or a leader now exiting, is named as such rather
                // than as a missing permission.
                check_attachable(pid)?;
                return Err(ProcessError::PermissionDenied { pid });
            }
            Err(e) => {
                t.attached = !t.threads.is_empty();
                return Err(e.into());
            }
        }
        t.wait_parked()?;
        if t.threads.is_empty() {
            t.attached = false;
            return Err(ProcessError::NoSuchProcess { pid });
        }
        t.absorb_attach_exec(pid);
        t.arm_rendezvous();
        t.learn_sigtrap_state();
        Ok(t)
    }

    /// Seizes and interrupts every task of the process not followed yet,
    /// listing `/proc/PID/task` again until a pass finds none new (threads
    /// are made while it runs; those a seized thread makes are
    /// auto-attached, their stop coming with the clone event). Attach and
    /// [`ProcessTarget::reacquire`] both take a process so. A task that
    /// ends meanwhile is simply gone, never the process: `ESRCH`, and
    /// `EPERM` from a task already exiting (the kernel refuses a zombie),
    /// from one a seized thread just made (already ours), or from a zombie
    /// leader whose threads run on, skip that task. The error is the
    /// `EPERM` of a live task we do not hold (a tracer of its own, no
    /// permission), or any other failure. (`reacquire` took every `EPERM`
    /// for the process's: "cannot take the released process back: not
    /// permitted".)
    pub(crate) fn seize_tasks(&mut self) -> Result<(), SysError> {
        let me = current_tid();
        loop {
            let mut new = 0;
            for tid in list_tasks(self.pid) {
                if self.threads.contains_key(&tid) || tid == self.pid && self.zombie_leader {
                    continue;
                }
                match self.sys.seize(tid, TRACE_OPTIONS) {
                    Ok(()) => {}
                    Err(e) if e.errno() == libc::ESRCH => continue,
                    Err(e)
                        if e.errno() == libc::EPERM && self.seize_refused_by_zombie_leader(tid) =>
                    {
                        continue
                    }
                    Err(e)
                        if e.errno() == libc::EPERM
                            && tid != self.pid
                            && (self.thread_ended(ThreadId(tid as u64))
                                || proc_status(tid).is_some_and(|s| s.tracer == me)) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                }
                match self.sys.interrupt(tid) {
                    Ok(()) => {}
                    // Seized, then gone before the interrupt: nothing to
                    // wait for.
                    Err(e) if e.errno() == libc::ESRCH => continue,
                    Err(e) => return Err(e),
                }
                let mut th = Thread::new(RunState::Running);
                th.interrupt_pending = true;
                self.threads.insert(tid, th);
                new += 1;
            }
            if new == 0 {
                return Ok(());
            }
        }
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
    pub(crate) fn absorb_attach_exec(&mut self, pid: i32) {
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

    /// Lets the forked child `child` (held stopped since its
    /// [`TargetEvent::Forked`]) run on its own after writing `bytes`
    /// (address, bytes) into its memory, and nothing else: the caller
    /// decides every byte the child gets back (the session, from one walk
    /// of its code ledger: the `int3`s, the agent's writes, the return
    /// addresses swapped in the forking thread's stack). A write that
    /// fails does not stop the others.
    pub fn release_fork_child_with(
        &mut self,
        child: u64,
        bytes: &[(RuntimeAddr, Vec<u8>)],
    ) -> Result<(), TargetError> {
        if !self.forked_children.contains(&(child as i32)) {
            return Ok(());
        }
        self.write_into_child(child, bytes);
        let child = child as i32;
        self.forked_children.retain(|c| *c != child);
        self.child_mask_back(child);
        self.sys.detach(child, 0).map_err(|e| self.sys_err(e))
    }

    /// Writes `bytes` into the memory of `child` (a forked child held
    /// stopped, not yet released or adopted), adjacent writes as one: the
    /// number of bytes written (a write that fails does not stop the
    /// others).
    pub fn write_into_child(&self, child: u64, bytes: &[(RuntimeAddr, Vec<u8>)]) -> usize {
        let child = child as i32;
        if bytes.is_empty() || !self.forked_children.contains(&child) {
            return 0;
        }
        let Ok(mem) = open_mem(&self.sys, child) else {
            return 0;
        };
        let mut sorted: Vec<&(RuntimeAddr, Vec<u8>)> = bytes.iter().collect();
        // Stable: of two writes at one address, the later one wins.
        sorted.sort_by_key(|(a, _)| a.0);
        let mut written = 0;
        let mut span: Option<(u64, Vec<u8>)> = None;
        let flush = |span: &mut Option<(u64, Vec<u8>)>, written: &mut usize| {
            if let Some((at, b)) = span.take() {
                if matches!(mem.write_at(&b, at), Ok(n) if n == b.len()) {
                    *written += b.len();
                }
            }
        };
        for (a, b) in sorted {
            match &mut span {
                Some((at, v)) if *at + v.len() as u64 >= a.0 => {
                    let off = (a.0 - *at) as usize;
                    let end = off + b.len();
                    if v.len() < end {
                        v.resize(end, 0);
                    }
                    v[off..end].copy_from_slice(b);
                }
                _ => {
                    flush(&mut span, &mut written);
                    span = Some((a.0, b.clone()));
                }
            }
        }
        flush(&mut span, &mut written);
        written
    }

    /// The original byte under each of this target's `int3`s, as writes
    /// (what a forked child gets back from a caller without a ledger).
    pub(crate) fn int3_originals(&self) -> Vec<(RuntimeAddr, Vec<u8>)> {
        self.breakpoints
            .iter()
            .map(|(a, b)| (RuntimeAddr(*a), vec![*b]))
            .collect()
    }

    /// Takes the forked child `child` (held stopped since its
    /// [`TargetEvent::Forked`]) as a target of its own, stopped, instead of
    /// releasing it. Its memory is its parent's copy, our `int3`s and the
    /// other mechanisms' writes included: the caller writes back what it
    /// must not keep (the session, from one walk of its code ledger).
    pub fn adopt_fork_child(&mut self, child: u64) -> Result<ProcessTarget, ProcessError> {
        let child = child as i32;
        if !self.forked_children.contains(&child) {
            return Err(ProcessError::NoSuchProcess { pid: child });
        }
        self.forked_children.retain(|c| *c != child);
        let mem = open_mem(&self.sys, child)?;
        let mut t = ProcessTarget::new(
            child,
            self.program.clone(),
            mem,
            self.spawned,
            self.sys.clone(),
        );
        // Its statuses may reach any target of the session, and theirs it.
        t.strays = self.strays.clone();
        let mut th = Thread::new(RunState::Parked);
        if let Some(i) = self.lifted_children.iter().position(|c| *c == child) {
            // Forked by a lifted thread: lifted too (`sigtrap.rs`).
            self.lifted_children.swap_remove(i);
            th.trap_blocked = true;
            th.trap_lifted = true;
        }
        t.threads.insert(child, th);
        t.arm_rendezvous();
        Ok(t)
    }

    /// Whether vfork children that execute a program are held stopped at
    /// their exec for [`ProcessTarget::adopt_execd_vfork_child`] (rather
    /// than let go at once, without probes).
    pub fn set_keep_execd_vfork_children(&mut self, keep: bool) {
        self.keep_execd_vfork = keep;
    }

    /// The vfork children held at their exec since the last call.
    pub fn take_execd_vfork_children(&mut self) -> Vec<i32> {
        std::mem::take(&mut self.execd_vfork_children)
    }

    /// Releases a vfork child held at its exec without taking it (it runs
    /// on untraced).
    pub fn release_execd_vfork_child(&mut self, child: i32) {
        let _ = self.sys.detach(child, 0);
    }

    /// A vfork child held at its exec (see
    /// [`ProcessTarget::take_execd_vfork_children`]) as a target of its
    /// own, still stopped there: its new program's loader is mapped and has
    /// not run.
    pub fn adopt_execd_vfork_child(&mut self, child: i32) -> Result<ProcessTarget, ProcessError> {
        let mem = open_mem(&self.sys, child)?;
        let program = std::fs::read_link(format!("/proc/{child}/exe")).unwrap_or_default();
        let mut t = ProcessTarget::new(child, program, mem, self.spawned, self.sys.clone());
        t.strays = self.strays.clone();
        t.keep_execd_vfork = self.keep_execd_vfork;
        let mut th = Thread::new(RunState::Parked);
        if let Some(i) = self.lifted_children.iter().position(|c| *c == child) {
            // Forked by a lifted thread: lifted too (`sigtrap.rs`).
            self.lifted_children.swap_remove(i);
            th.trap_blocked = true;
            th.trap_lifted = true;
        }
        t.threads.insert(child, th);
        t.arm_rendezvous();
        Ok(t)
    }

    /// Seizes process `pid` while its `execve` is held in the kernel (by
    /// [`hotprobe_os::exec_gate::ExecGate`]): once the gate lets it go on,
    /// its exec ends in a ptrace exec stop, before the new program's first
    /// instruction ([`ProcessTarget::take_at_exec`]).
    pub fn seize_before_exec(pid: i32) -> Result<(), ProcessError> {
        Sys::real().seize(pid, TRACE_OPTIONS)?;
        Ok(())
    }

    /// The process seized by [`ProcessTarget::seize_before_exec`] as a
    /// target, once its exec stop came (waited for up to `limit`: `None`
    /// when it has not come yet; a status another target of the session
    /// reaped is found in `strays`): stopped there, its new program's
    /// loader mapped and not run. Signals that stop it before are
    /// delivered; an exit before is `NoSuchProcess`.
    pub fn take_at_exec(
        pid: i32,
        strays: &Strays,
        limit: std::time::Duration,
    ) -> Result<Option<ProcessTarget>, ProcessError> {
        let sys = Sys::real();
        let deadline = std::time::Instant::now() + limit;
        loop {
            let status = match strays.take(pid) {
                Some(st) => Some(st),
                None => match sys.waitpid_timeout(
                    pid,
                    libc::__WALL,
                    limit.min(std::time::Duration::from_millis(20)),
                ) {
                    Some(Ok(Some((_, st)))) => Some(st),
                    Some(Ok(None)) | None => None,
                    Some(Err(e)) => return Err(e.into()),
                },
            };
            match status {
                Some(st) if libc::WIFSTOPPED(st) && st >> 16 == libc::PTRACE_EVENT_EXEC => break,
                Some(st) if libc::WIFSTOPPED(st) => {
                    // A signal (or a group stop) before the exec ended.
                    let sig = libc::WSTOPSIG(st);
                    let pass = if st >> 16 == 0 { sig } else { 0 };
                    sys.cont(pid, pass)?;
                }
                Some(_) => return Err(ProcessError::NoSuchProcess { pid }),
                None if std::time::Instant::now() >= deadline => return Ok(None),
                None => {}
            }
        }
        let mem = open_mem(&sys, pid)?;
        let program = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let mut t = ProcessTarget::new(pid, program, mem, false, sys);
        t.strays = strays.clone();
        t.threads.insert(pid, Thread::new(RunState::Parked));
        t.arm_rendezvous();
        Ok(Some(t))
    }
}
