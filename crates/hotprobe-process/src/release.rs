//! Running untraced: [`ProcessTarget::release`] detaches ptrace from every
//! thread while the process runs, so that signals — the `SIGTRAP`s of the
//! agent's in-process traps above all — and thread starts (no clone stop)
//! cost no ptrace stop; any call that needs the threads stopped
//! (`stop_all`, `detach`) takes them back first
//! ([`ProcessTarget::reacquire`]: `PTRACE_SEIZE` and `PTRACE_INTERRUPT` of
//! every task, as attach does).
//!
//! While released, `wait` watches for:
//! - the end of the process, through a pidfd (readable once the whole
//!   thread group has exited). Its status: a spawned child is reaped with
//!   `waitpid`; for an attached process (not our child) the pidfd's exit
//!   information (`PIDFD_GET_INFO` with `PIDFD_INFO_EXIT`, Linux 6.15: kept
//!   after its parent reaped it), else the zombie's `exit_code` in
//!   `/proc/PID/stat`. An attached process is released only where the
//!   kernel has `PIDFD_GET_INFO` (6.13), so that its status is not lost to
//!   its parent's reaping on most kernels (between 6.13 and 6.15, only the
//!   zombie's field: said as `Disconnected` when the parent reaped first);
//! - an exec: the `/proc/PID/mem` file opened before the release reads
//!   end-of-file once the image it was opened on is gone (its `mm` has no
//!   user left), while `/proc/PID/auxv` still reads (a new image: an
//!   exiting process has none). It is taken back and the exec reported
//!   (seized while its exec is still under way, the exec's own ptrace stop
//!   says it). An exec whose new image already ended when it is looked for
//!   is told by the command name the zombie has (the kernel sets it at
//!   exec; the name is re-read each pass through an open `/proc/PID/comm`,
//!   kept only while the old image is still there): the exec is reported,
//!   then the exit. Not seen: an exec into a program of the same command
//!   name whose image ends within one pass (≤ 5 ms) — the traced run would
//!   report it as an exec; nothing of ours is in that image either way —
//!   and, the other way, a program that renames itself (`PR_SET_NAME`)
//!   and ends within one pass is said to have executed another program.
//!
//! A pass costs three system calls (the pidfd's `poll`, two `pread`s).
//!
//! What a released process does is not followed: new threads (the agent
//! registers them itself), forks (the children inherit the agent's code
//! and its dormant handler), the loader's changes (no pending probes may
//! be in use). Only a process whose ptrace mechanisms have nothing placed
//! can be released (no breakpoint of the engine's; the loader's rendezvous
//! breakpoint is taken out and put back at reacquire).
//!
//! An exec between the last `wait` and a `reacquire` is reported as an
//! error by `reacquire` (nothing is written into the new image) and queued
//! as the next `wait`'s event.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use hotprobe_target::{ExitStatus, RuntimeAddr, Target, TargetError, TargetEvent};

use crate::{exit_status, open_mem, ProcessTarget, RunState};

/// The state of a released process.
#[derive(Debug)]
pub(crate) struct Released {
    /// `/proc/PID/auxv` when released: an exec changes it.
    auxv: Vec<u8>,
    /// The command name when last seen in the released image: an exec
    /// sets it.
    comm: Vec<u8>,
    /// `/proc/PID/comm`, open (read again with `pread`: one system call).
    comm_file: Option<std::fs::File>,
    /// A pidfd of the process: readable once it ended (`None`: its exit is
    /// polled through `waitpid` alone, a spawned child's).
    pidfd: Option<OwnedFd>,
}

fn auxv(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/auxv")).unwrap_or_default()
}

/// The fields of `/proc/PID/stat` after the command name, and the name.
fn stat_of(pid: i32) -> Option<(String, Vec<String>)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s.get(open + 1..close)?.to_string();
    let rest = s.get(close + 1..)?;
    Some((comm, rest.split_whitespace().map(str::to_string).collect()))
}

/// The command name `/proc/PID/comm` holds now (a zombie's too).
fn read_comm(f: &std::fs::File) -> Option<Vec<u8>> {
    let mut b = [0u8; 64];
    let n = f.read_at(&mut b, 0).ok()?;
    (n > 0).then(|| b[..n].to_vec())
}

/// Whether the process executed another image since it was released:
/// `mem` (opened on the old image) reads end-of-file, or `auxv` changed,
/// while a new image can be read. A process that cannot be read (ending)
/// has not.
fn execd(pid: i32, mem: &std::fs::File, before: &[u8]) -> bool {
    // Address 0 is never mapped: the old image answers EIO; with no image
    // left behind the file (its `mm` has no user) the read is empty. Read
    // before `auxv`: an image that ends between the two reads leaves
    // `auxv` empty (an exiting process has none), never the other way.
    let mm_gone = matches!(mem.read_at(&mut [0u8; 1], 0), Ok(0));
    let now = auxv(pid);
    !now.is_empty() && (mm_gone || now != before)
}

/// `PIDFD_GET_INFO` (`_IOWR(0xFF, 11, struct pidfd_info)`, 64 bytes).
const PIDFD_GET_INFO: libc::c_ulong = 0xC040_FF0B;
/// `PIDFD_INFO_EXIT`: the exit status is asked (and, in the answer's
/// mask, known).
const PIDFD_INFO_EXIT: u64 = 1 << 3;

/// The kernel's `struct pidfd_info` up to `exit_code` (its first size).
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    ids: [u32; 11],
    exit_code: i32,
}

/// A pidfd of `pid`, or `None` (kernel before 5.3, or it is gone).
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor just returned to us, owned from here on.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `PIDFD_GET_INFO` of `pidfd` asking for the exit status; `None` where
/// the kernel has no such request (before 6.13).
fn pidfd_info(pidfd: &OwnedFd) -> Option<PidfdInfo> {
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_EXIT,
        ..Default::default()
    };
    // SAFETY: the request reads and writes a `struct pidfd_info` of the
    // size encoded in it (64 bytes, `PidfdInfo`'s), which lives across
    // the call.
    let r = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO as _,
            &mut info as *mut PidfdInfo,
        )
    };
    (r == 0).then_some(info)
}

/// Whether the process of `pidfd` has ended (its whole thread group).
fn pidfd_ended(pidfd: &OwnedFd, wait: Duration) -> bool {
    poll_pidfd(Some(pidfd), wait) == Polled::Ready
}

/// What [`poll_pidfd`] found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// The pidfd is readable: its process ended.
    Ready,
    /// A signal cut the wait short.
    Interrupted,
    /// Neither, within the wait.
    TimedOut,
}

/// Waits up to `wait` for `pidfd` (if any; without one, a plain sleep).
/// `ppoll`, to the microsecond: `poll`'s milliseconds made every nap
/// under 1 ms a poll that returns at once, and `wait_released` (naps of
/// 200, 400 and 800 µs) a busy loop on a CPU the released program needed
/// (an 8-thread start under `record`, whose run loop waits 1 ms at most,
/// ran 4–18× native).
fn poll_pidfd(pidfd: Option<&OwnedFd>, wait: Duration) -> Polled {
    let mut p = pidfd.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let ts = libc::timespec {
        tv_sec: wait.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
    };
    let (fds, n) = match p.as_mut() {
        Some(p) => (p as *mut libc::pollfd, 1),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `n` pollfds at `fds` (none: a plain sleep) and a timespec,
    // valid across the call; no mask.
    let r = unsafe { libc::ppoll(fds, n, &ts, std::ptr::null()) };
    let ready = p.is_some_and(|p| p.revents & (libc::POLLIN | libc::POLLHUP) != 0);
    match r {
        -1 if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {
            Polled::Interrupted
        }
        r if r > 0 && ready => Polled::Ready,
        _ => Polled::TimedOut,
    }
}

/// The exit status of an ended process that is not our child: the
/// pidfd's exit information, else its zombie's `exit_code` (a wait
/// status, `/proc/PID/stat` field 52).
fn foreign_exit_status(pid: i32, pidfd: &OwnedFd) -> ExitStatus {
    if let Some(info) = pidfd_info(pidfd).filter(|i| i.mask & PIDFD_INFO_EXIT != 0) {
        return exit_status(info.exit_code);
    }
    let zombie = stat_of(pid).and_then(|(_, f)| {
        (f.first().map(String::as_str) == Some("Z"))
            .then(|| f.get(49)?.parse::<i32>().ok())
            .flatten()
    });
    match zombie {
        Some(st) => exit_status(st),
        None => ExitStatus::Disconnected(
            "ended while untraced; its parent reaped it before its status could be read".into(),
        ),
    }
}

impl ProcessTarget {
    /// Stops tracing the process while it runs (see the module docs).
    /// `Ok(false)` (nothing done) when something needs ptrace: a
    /// breakpoint of the engine's, a hardware watchpoint, a thread stopped
    /// with an event, a stepping thread, a held fork child or vfork child;
    /// or an attached process whose exit status could not be read
    /// untraced (no pidfd, or a kernel without `PIDFD_GET_INFO`).
    pub fn release(&mut self) -> Result<bool, TargetError> {
        if self.released.is_some() {
            return Ok(true);
        }
        let pidfd = pidfd_open(self.pid);
        if !self.spawned && pidfd.as_ref().and_then(pidfd_info).is_none() {
            // Not our child: only the tracer or the pidfd's exit
            // information tells how it ended.
            return Ok(false);
        }
        if self.held_by_ptrace() {
            return Ok(false);
        }
        self.stop_all()?;
        // What the threads did before they stopped (a fork, an exec, a
        // library loaded: events queued for the next `wait`) is the
        // session's to handle traced.
        if self.held_by_ptrace() {
            self.resume_all()?;
            return Ok(false);
        }
        let rendezvous = self.rendezvous.as_ref().map(|r| r.brk);
        // Untraced, no trap of ours resets the program's signal state:
        // the sites are not needed, and what was reset goes back.
        self.disarm_sig_sites();
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.restore_sigtrap_state(tid);
        }
        if let Some(brk) = rendezvous {
            self.rendezvous = None;
            self.remove_int3(RuntimeAddr(brk))?;
        }
        let snapshot = auxv(self.pid);
        let comm_file = std::fs::File::open(format!("/proc/{}/comm", self.pid)).ok();
        let comm = comm_file.as_ref().and_then(read_comm).unwrap_or_default();
        for tid in self.threads.keys() {
            let _ = self.sys.detach(*tid, 0);
        }
        self.detach_unfollowed_tasks();
        self.threads.clear();
        self.released = Some(Released {
            auxv: snapshot,
            comm,
            comm_file,
            pidfd,
        });
        Ok(true)
    }

    /// Whether something needs ptrace now (see [`ProcessTarget::release`]).
    fn held_by_ptrace(&self) -> bool {
        self.ptrace_need().is_some()
    }

    /// What keeps the process traced now, if anything (see
    /// [`ProcessTarget::release`]), in a few words for a notice. A thread
    /// stopped at the loader's rendezvous (a spawned process before it
    /// first runs) needs nothing: it was rewound to the `int3` at its
    /// stop, and the original instruction goes back at the release.
    pub fn ptrace_need(&self) -> Option<String> {
        let whole = |why: &str| Some(why.to_string());
        if self.probes_need_ptrace() {
            whole("a breakpoint or watchpoint is set")
        } else if !self.attached {
            whole("it is not attached yet")
        } else if self.exited.is_some() {
            whole("it exited")
        } else if !self.vfork_children.is_empty() {
            whole("a vfork child is held")
        } else if !self.forked_children.is_empty() {
            whole("a fork child is held")
        } else if !self.pending.is_empty() {
            whole("an event is queued")
        } else {
            self.threads
                .values()
                .find_map(crate::Thread::held_for)
                .map(|why| format!("a thread is {why}"))
        }
    }

    /// Whether the process stays traced for as long as its probes are in
    /// (a breakpoint of the engine's, a hardware watchpoint), by design,
    /// rather than for a passing state of its threads.
    pub fn probes_need_ptrace(&self) -> bool {
        let rendezvous = self.rendezvous.as_ref().map(|r| r.brk);
        self.rendezvous.as_ref().is_some_and(|r| r.engine_owned)
            || self.watches.iter().any(Option::is_some)
            || self
                .breakpoints
                .keys()
                .any(|a| Some(*a) != rendezvous && !self.is_sig_site(*a))
    }

    /// Detaches the tasks of the process still traced by us that the
    /// target does not follow yet: a thread whose clone event a wait
    /// queued (`ready.rs`) but nobody handled before the release. Left
    /// traced, it kept the process from running untraced ("cannot take
    /// the released process back: not permitted" at the next seize, a
    /// released process never seen untraced). Each is waited for at its
    /// first stop (an auto-attached thread stops at once), at most 1 s.
    fn detach_unfollowed_tasks(&mut self) {
        // `TracerPid` names the tracing thread: this one.
        let me = crate::attach::current_tid();
        for tid in crate::list_tasks(self.pid) {
            if self.threads.contains_key(&tid)
                || crate::attach::proc_status(tid).is_none_or(|s| s.tracer != me)
            {
                continue;
            }
            let stopped = self.strays.take(tid).is_some() || {
                let deadline = Instant::now() + Duration::from_secs(1);
                loop {
                    match self.sys.waitpid(tid, libc::WNOHANG | libc::__WALL) {
                        Ok(Some(_)) => break true,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_micros(100))
                        }
                        _ => break false,
                    }
                }
            };
            if stopped {
                let _ = self.sys.detach(tid, 0);
            }
        }
    }

    /// Whether the process runs untraced ([`ProcessTarget::release`]).
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }

    /// Whether the process ended while it ran untraced (its end seen by
    /// the pidfd or its status, not by a ptrace stop).
    pub fn ended_while_untraced(&self) -> bool {
        self.ended_untraced
    }

    /// Whether the process was taken back ([`ProcessTarget::reacquire`],
    /// or a [`hotprobe_target::Target::stop_all`] of a released process)
    /// since the last call: whoever took it back for a moment (a probe
    /// added, a reverted site armed again) leaves it traced, and the
    /// caller that lets it go untraced must try again.
    pub fn take_taken_back(&mut self) -> bool {
        std::mem::take(&mut self.taken_back)
    }

    /// Takes a released process back: every thread seized and stopped
    /// (parked), the loader's rendezvous breakpoint armed again. An error
    /// if the process executed another image meanwhile (nothing of ours
    /// is in it: the caller must not write into it).
    pub fn reacquire(&mut self) -> Result<(), TargetError> {
        let Some(rel) = self.released.take() else {
            return Ok(());
        };
        self.taken_back = true;
        let execd = execd(self.pid, &self.mem, &rel.auxv);
        self.seize_all().map_err(|e| TargetError::Protocol {
            target: self.describe(),
            why: format!("cannot take the released process back: {e}"),
        })?;
        if self.threads.is_empty() {
            return self.gone();
        }
        if execd || self.exec_seen_traced() {
            if !self.exec_seen_traced() {
                self.on_untraced_exec()?;
                // Said at the next wait as a traced run says it.
                self.pending.push_back(TargetEvent::Exec);
            }
            return Err(TargetError::Protocol {
                target: self.describe(),
                why: "it executed another program while untraced: nothing restored".into(),
            });
        }
        self.arm_rendezvous();
        Ok(())
    }

    /// Whether the stops met while seizing the process again held its
    /// exec's (`PTRACE_EVENT_EXEC`: the exec was under way).
    fn exec_seen_traced(&self) -> bool {
        self.pending.iter().any(|e| matches!(e, TargetEvent::Exec))
    }

    /// Seizes and interrupts every task (`ProcessTarget::seize_tasks`: a
    /// thread that ends meanwhile is skipped), and waits until they are
    /// parked.
    pub(crate) fn seize_all(&mut self) -> Result<(), crate::ProcessError> {
        match self.seize_tasks() {
            Ok(()) => {}
            Err(e) if e.errno() == libc::EPERM => {
                return Err(crate::ProcessError::PermissionDenied { pid: self.pid })
            }
            Err(e) => return Err(e.into()),
        }
        self.wait_parked()?;
        Ok(())
    }

    /// After an exec seen while untraced (the process is seized again):
    /// the old image's state is forgotten.
    fn on_untraced_exec(&mut self) -> Result<(), TargetError> {
        self.breakpoints.clear();
        self.breakpoint_changes = None;
        self.rendezvous = None;
        self.scratch.clear();
        self.syscall_insn = None;
        self.sigreturn_insn = None;
        self.mem = open_mem(&self.sys, self.pid).map_err(|e| TargetError::Protocol {
            target: self.describe(),
            why: e.to_string(),
        })?;
        self.arm_rendezvous();
        Ok(())
    }

    fn gone(&mut self) -> Result<(), TargetError> {
        let st = self
            .exited
            .clone()
            .unwrap_or_else(|| ExitStatus::Disconnected("ended while untraced".into()));
        self.exited = Some(st.clone());
        self.attached = false;
        Err(TargetError::Gone {
            target: self.describe(),
            status: st,
        })
    }

    /// `wait` of a released process: its end, an exec (the process is
    /// taken back and the exec reported, its one thread stopped with the
    /// event), or a timeout.
    pub(crate) fn wait_released(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<TargetEvent, TargetError> {
        // Without a timeout, a timeout all the same every 20 ms: the
        // caller's loop checks its interrupt flag (the naps here restart
        // after a signal, where a blocked waitpid would have returned).
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_millis(20));
        let mut nap = Duration::from_micros(200);
        loop {
            if let Some((st, execd)) = self.ended_untraced() {
                self.released = None;
                self.ended_untraced = true;
                self.threads.clear();
                self.attached = false;
                self.exited = Some(st.clone());
                if execd {
                    // It executed another program, which ended before
                    // this look: the exec first, as a traced run says it.
                    self.pending.push_back(TargetEvent::Exited(st));
                    return Ok(TargetEvent::Exec);
                }
                return Ok(TargetEvent::Exited(st));
            }
            // The name first, then whether the image it was read in is
            // still there (an exec replaces the image before it sets the
            // name): a name read so is the released image's.
            let name = self
                .released
                .as_ref()
                .and_then(|r| r.comm_file.as_ref())
                .and_then(read_comm);
            // Address 0 is never mapped: the image answers EIO; with no
            // image left behind the file (its `mm` has no user) the read
            // is empty: an exec if a new image is there (an exiting
            // process has none: its end is seen by a next pass).
            let mm_gone = matches!(self.mem.read_at(&mut [0u8; 1], 0), Ok(0));
            if mm_gone && !auxv(self.pid).is_empty() {
                let rel = self.released.take();
                if let Err(e) = self.seize_all() {
                    // An exiting process cannot be seized (EPERM): its
                    // end is reported by a next pass.
                    for tid in std::mem::take(&mut self.threads).into_keys() {
                        let _ = self.sys.detach(tid, 0);
                    }
                    let ending = rel
                        .as_ref()
                        .and_then(|r| r.pidfd.as_ref())
                        .is_some_and(|fd| pidfd_ended(fd, Duration::from_millis(100)));
                    self.released = rel;
                    if ending {
                        continue;
                    }
                    return Err(TargetError::Protocol {
                        target: self.describe(),
                        why: format!("cannot take the process back after its exec: {e}"),
                    });
                }
                if self.threads.is_empty() {
                    // It ended meanwhile: reported by the next pass.
                    self.released = rel;
                    continue;
                }
                if self.exec_seen_traced() {
                    // Seized while its exec was still under way: the
                    // exec's own ptrace stop came, handled as a traced
                    // exec's (the new image's rendezvous armed once).
                    if let Some(ev) = self.pending.pop_front() {
                        return Ok(ev);
                    }
                }
                self.on_untraced_exec()?;
                if let Some(t) = self.threads.get_mut(&self.pid) {
                    t.state = RunState::Event;
                }
                return Ok(TargetEvent::Exec);
            }
            if let (Some(rel), Some(name), false) = (self.released.as_mut(), name, mm_gone) {
                rel.comm = name;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(TargetEvent::Timeout);
            }
            let nap_now = nap.min(deadline - now);
            // Wakes at once when the process ends (its pidfd), or a signal
            // comes: the caller's loop checks its interrupt flag (Ctrl-C
            // waited out the rest of a 1 s wait before).
            let pidfd = self.released.as_ref().and_then(|r| r.pidfd.as_ref());
            if poll_pidfd(pidfd, nap_now) == Polled::Interrupted {
                return Ok(TargetEvent::Timeout);
            }
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// How the released process ended, if it did, and whether it executed
    /// another program before (its zombie's command name is not the one
    /// it had).
    fn ended_untraced(&mut self) -> Option<(ExitStatus, bool)> {
        if let Some(st) = self.strays.take(self.pid) {
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                // Reaped: no zombie to read the name of.
                return Some((exit_status(st), false));
            }
        }
        let rel = self.released.as_ref()?;
        let ended = rel.pidfd.as_ref().map(|fd| pidfd_ended(fd, Duration::ZERO));
        if ended == Some(false) {
            return None;
        }
        // Ended (or, without a pidfd, maybe): the zombie's name first.
        let execd = ended.is_some()
            && rel
                .comm_file
                .as_ref()
                .and_then(read_comm)
                .is_some_and(|c| c != rel.comm);
        if self.spawned {
            // Our child: reap it (it is not traced any more).
            match self.sys.waitpid(self.pid, libc::WNOHANG) {
                Ok(Some((_, st))) if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) => {
                    Some((exit_status(st), execd))
                }
                Ok(_) => None,
                Err(e) if e.errno() == libc::ECHILD => {
                    Some((ExitStatus::Disconnected("reaped elsewhere".into()), execd))
                }
                Err(_) => None,
            }
        } else {
            // Released only with a pidfd (see `release`).
            let fd = rel.pidfd.as_ref()?;
            Some((foreign_exit_status(self.pid, fd), execd))
        }
    }
}

impl crate::Thread {
    /// Why this stopped thread needs ptrace, in a few words ("a thread
    /// is …"), or `None` when it is merely parked: stepping, an event of
    /// its own the engine has not handled, a breakpoint it has not been
    /// moved off, a signal held for it.
    pub(crate) fn held_for(&self) -> Option<&'static str> {
        if self.stepping {
            Some("single-stepping")
        } else if self.state == RunState::Event {
            Some("stopped with an event not yet handled")
        } else if self.unrewound_breakpoint.is_some() {
            Some("stopped at a breakpoint")
        } else if !self.held_signals.is_empty() {
            Some("holding a signal not yet delivered")
        } else {
            None
        }
    }
}
