//! Running untraced: [`ProcessTarget::release`] detaches ptrace from every
//! thread while the process runs, so that signals — the `SIGTRAP`s of the
//! agent's in-process traps above all — cost no ptrace stop; any call that
//! needs the threads stopped (`stop_all`, `detach`) takes them back first
//! ([`ProcessTarget::reacquire`]: `PTRACE_SEIZE` and `PTRACE_INTERRUPT` of
//! every task, as attach does).
//!
//! While released, `wait` only watches for the end of the process (a
//! spawned child is reaped with `waitpid`; an attached process is watched
//! through `/proc`) and for an exec (the process's `/proc/PID/auxv`
//! changes: it is taken back and the exec reported). What a released
//! process does is not followed: new threads (the agent registers them
//! itself), forks (the children inherit the agent's code and its dormant
//! handler), the loader's changes (no pending probes may be in use).
//! Only a process whose ptrace mechanisms have nothing placed can be
//! released (no breakpoint of the engine's; the loader's rendezvous
//! breakpoint is taken out and put back at reacquire).
//!
//! Not covered: an exec between the last `wait` and a `reacquire` is
//! reported as an error by `reacquire` (nothing is written into the new
//! image).

use std::time::{Duration, Instant};

use hotprobe_target::{ExitStatus, RuntimeAddr, Target, TargetError, TargetEvent};

use crate::{exit_status, list_tasks, open_mem, ProcessTarget, RunState, Thread};

/// The state of a released process.
#[derive(Debug)]
pub(crate) struct Released {
    /// `/proc/PID/auxv` when released: an exec changes it.
    auxv: Vec<u8>,
}

fn auxv(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/auxv")).unwrap_or_default()
}

/// Whether the process executed another image since `before` was read.
/// A process that cannot be read (ending) has not.
fn execd(pid: i32, before: &[u8]) -> bool {
    let now = auxv(pid);
    !now.is_empty() && now != before
}

impl ProcessTarget {
    /// Stops tracing the process while it runs (see the module docs).
    /// `Ok(false)` (nothing done) when something needs ptrace: a
    /// breakpoint of the engine's, a hardware watchpoint, a thread stopped
    /// with an event, a stepping thread, a held fork child or vfork child.
    pub fn release(&mut self) -> Result<bool, TargetError> {
        if self.released.is_some() {
            return Ok(true);
        }
        if !self.attached
            || self.exited.is_some()
            || !self.vfork_children.is_empty()
            || !self.forked_children.is_empty()
            || !self.pending.is_empty()
            || self.rendezvous.as_ref().is_some_and(|r| r.engine_owned)
            || self.watches.iter().any(Option::is_some)
        {
            return Ok(false);
        }
        let rendezvous = self.rendezvous.as_ref().map(|r| r.brk);
        if self
            .breakpoints
            .keys()
            .any(|a| Some(*a) != rendezvous && !self.is_sig_site(*a))
        {
            return Ok(false);
        }
        if self.threads.values().any(|t| {
            t.stepping
                || t.state == RunState::Event
                || t.unrewound_breakpoint.is_some()
                || t.at_rendezvous
                || !t.held_signals.is_empty()
        }) {
            return Ok(false);
        }
        self.stop_all()?;
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
        for tid in self.threads.keys() {
            let _ = self.sys.detach(*tid, 0);
        }
        self.threads.clear();
        self.released = Some(Released { auxv: snapshot });
        Ok(true)
    }

    /// Whether the process runs untraced ([`ProcessTarget::release`]).
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }

    /// Takes a released process back: every thread seized and stopped
    /// (parked), the loader's rendezvous breakpoint armed again. An error
    /// if the process executed another image meanwhile (nothing of ours
    /// is in it: the caller must not write into it).
    pub fn reacquire(&mut self) -> Result<(), TargetError> {
        let Some(rel) = self.released.take() else {
            return Ok(());
        };
        let execd = execd(self.pid, &rel.auxv);
        self.seize_all().map_err(|e| TargetError::Protocol {
            target: self.describe(),
            why: format!("cannot take the released process back: {e}"),
        })?;
        if self.threads.is_empty() {
            return self.gone();
        }
        if execd {
            self.on_untraced_exec()?;
            return Err(TargetError::Protocol {
                target: self.describe(),
                why: "it executed another program while untraced: nothing restored".into(),
            });
        }
        self.arm_rendezvous();
        Ok(())
    }

    /// Seizes and interrupts every task (re-listing until stable), and
    /// waits until they are parked.
    pub(crate) fn seize_all(&mut self) -> Result<(), crate::ProcessError> {
        loop {
            let mut new = 0;
            for tid in list_tasks(self.pid) {
                if self.threads.contains_key(&tid) {
                    continue;
                }
                match self.sys.seize(tid, crate::TRACE_OPTIONS) {
                    Ok(()) => {}
                    Err(e) if e.errno() == libc::ESRCH => continue,
                    Err(e) if e.errno() == libc::EPERM => {
                        return Err(crate::ProcessError::PermissionDenied { pid: self.pid })
                    }
                    Err(e) => return Err(e.into()),
                }
                let mut th = Thread::new(RunState::Running);
                th.interrupt_pending = true;
                self.sys.interrupt(tid)?;
                self.threads.insert(tid, th);
                new += 1;
            }
            if new == 0 {
                break;
            }
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
            if let Some(st) = self.ended_untraced() {
                self.released = None;
                self.threads.clear();
                self.attached = false;
                self.exited = Some(st.clone());
                return Ok(TargetEvent::Exited(st));
            }
            let changed = self
                .released
                .as_ref()
                .is_some_and(|r| execd(self.pid, &r.auxv));
            if changed {
                self.released = None;
                self.seize_all().map_err(|e| TargetError::Protocol {
                    target: self.describe(),
                    why: format!("cannot take the process back after its exec: {e}"),
                })?;
                if self.threads.is_empty() {
                    // It ended meanwhile: reported by the next pass.
                    self.released = Some(Released { auxv: Vec::new() });
                    continue;
                }
                self.on_untraced_exec()?;
                if let Some(t) = self.threads.get_mut(&self.pid) {
                    t.state = RunState::Event;
                }
                return Ok(TargetEvent::Exec);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(TargetEvent::Timeout);
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// How the released process ended, if it did.
    fn ended_untraced(&mut self) -> Option<ExitStatus> {
        if let Some(st) = self.strays.take(self.pid) {
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                return Some(exit_status(st));
            }
        }
        if self.spawned {
            // Our child: reap it (it is not traced any more).
            match self.sys.waitpid(self.pid, libc::WNOHANG) {
                Ok(Some((_, st))) if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) => {
                    Some(exit_status(st))
                }
                Ok(_) => None,
                Err(e) if e.errno() == libc::ECHILD => {
                    Some(ExitStatus::Disconnected("reaped elsewhere".into()))
                }
                Err(_) => None,
            }
        } else {
            let alive = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace()
                        .next()
                        .map(|st| !matches!(st, "Z" | "X"))
                })
                .unwrap_or(false);
            (!alive).then(|| ExitStatus::Disconnected("ended while untraced".into()))
        }
    }
}
