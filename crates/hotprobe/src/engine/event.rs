//! The event loop: one [`TargetEvent`] at a time (fork, exec and exit
//! included).

use super::{Engine, Holds, Notice, Outcome, ProbeKind, Report};
use crate::held::HeldTarget;
use crate::EngineError;
use hotprobe_target::{ExitStatus, ResumeMode, ReturnStrategy, RuntimeAddr, TargetEvent, ThreadId};

impl Engine {
    /// Wait for one event (at most `timeout`) and handle it.
    pub fn poll(
        &mut self,
        target: &mut HeldTarget,
        timeout: Option<std::time::Duration>,
    ) -> Result<Outcome, EngineError> {
        if let Some(st) = &self.gone {
            return Ok(Outcome::Exited(st.clone()));
        }
        let ev = target.wait(timeout)?;
        self.handle(target, ev)?;
        if let Some(st) = &self.gone {
            return Ok(Outcome::Exited(st.clone()));
        }
        if self.stop {
            return Ok(Outcome::Stopped);
        }
        Ok(Outcome::Handled)
    }

    /// Handle one event from the target (an engine on its own: forked
    /// children are released without probes, an exec lets the threads
    /// run on).
    pub fn handle(&mut self, target: &mut HeldTarget, ev: TargetEvent) -> Result<(), EngineError> {
        self.handle_holding(target, ev, Holds::default())
    }

    /// Handle one event from the target, holding back what `holds` says
    /// (the session's choice: it follows forked children and execs).
    pub(crate) fn handle_holding(
        &mut self,
        target: &mut HeldTarget,
        ev: TargetEvent,
        holds: Holds,
    ) -> Result<(), EngineError> {
        match ev {
            TargetEvent::Breakpoint { thread, addr, regs } => {
                self.on_breakpoint(target, thread, addr, regs)
            }
            TargetEvent::Stepped { thread, regs } => self.on_stepped(target, thread, regs),
            TargetEvent::ThreadCreated(_) => Ok(()),
            // Watchpoints are the session's ([`crate::Session::watch`]);
            // an engine on its own lets the thread run on.
            TargetEvent::Watchpoint { thread, .. } => {
                target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::ThreadExited(t) => {
                self.drop_thread(t);
                Ok(())
            }
            TargetEvent::Forked { thread, child } => {
                // Code the fast path rewrote, then the return addresses
                // swapped in the forking thread's stack: the child runs the
                // program as it was, without probes. A followed child keeps
                // the fast path's code (its agent counts into slots of its
                // own) and is reported to the session with its stack fixes.
                let mut fixes = if holds.forks {
                    Vec::new()
                } else {
                    self.fork_restores.clone()
                };
                if self.strategy == ReturnStrategy::Trampoline {
                    // Dropped frames that may be alive after all first, so
                    // that a live instance at the same slot wins.
                    let t = self.trampoline.map_or(0, |t| t.0);
                    for inst in self.graveyard.get(&thread).into_iter().flatten() {
                        let mut b = [0u8; 8];
                        if target.read_memory(RuntimeAddr(inst.slot), &mut b).is_ok()
                            && u64::from_le_bytes(b) == t
                        {
                            fixes.push((
                                RuntimeAddr(inst.slot),
                                inst.return_addr.to_le_bytes().to_vec(),
                            ));
                        }
                    }
                    if let Some(v) = self.shadow.get(&thread) {
                        fixes.extend(
                            v.iter().map(|i| {
                                (RuntimeAddr(i.slot), i.return_addr.to_le_bytes().to_vec())
                            }),
                        );
                    }
                }
                if holds.forks {
                    self.reports.push(Report::Forked { child, fixes });
                    target.resume(thread, ResumeMode::Continue)?;
                    return Ok(());
                }
                target.release_fork_child(child, &fixes)?;
                self.notice(Notice::ForkReleased {
                    target: target.describe(),
                    child,
                });
                target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::Exec => {
                // Nothing is written into the new image: its addresses mean
                // something else. The probes stay, disabled and unarmed, so
                // that what they counted before the exec is still reported.
                let n = self.user_probes(|_| true);
                self.sites.clear();
                self.shadow.clear();
                self.graveyard.clear();
                self.unwind_hooks.clear();
                self.stepping.clear();
                self.return_waiters.clear();
                self.scratch.clear();
                self.trampoline = None;
                self.fork_restores.clear();
                for p in self.probes.values_mut() {
                    p.enabled = false;
                    p.dropped = true;
                    if let ProbeKind::Ret { live, .. } = &mut p.kind {
                        *live = 0;
                    }
                }
                if n > 0 {
                    self.notice(Notice::ExecDropped {
                        target: target.describe(),
                        probes: n,
                    });
                }
                // Held: the session places probes in the new image first
                // and resumes it (`follow_exec`).
                if !holds.exec {
                    for t in target.threads() {
                        let _ = target.resume(t, ResumeMode::Continue);
                    }
                }
                Ok(())
            }
            TargetEvent::Exited(st) => {
                // An exit is the normal end: nothing is "dropped" then. A
                // death by signal, or a guest whose stub went away, says
                // how many of the user's probes were armed in it.
                let n = match st {
                    ExitStatus::Code(_) => 0,
                    _ => self.user_probes(|p| !p.dropped),
                };
                self.notice(Notice::Ended {
                    target: target.describe(),
                    status: st.clone(),
                    probes: n,
                });
                self.gone = Some(st);
                self.sites.clear();
                self.shadow.clear();
                self.graveyard.clear();
                self.unwind_hooks.clear();
                self.stepping.clear();
                Ok(())
            }
            TargetEvent::ModulesChanged { thread } => {
                target.resume(thread, ResumeMode::Continue)?;
                Ok(())
            }
            TargetEvent::Timeout => Ok(()),
        }
    }

    pub(super) fn drop_thread(&mut self, t: ThreadId) {
        // Calls still open when their thread ended never returned.
        if let Some(stack) = self.shadow.remove(&t) {
            for inst in stack {
                self.abandon(t, inst, false);
            }
        }
        self.graveyard.remove(&t);
        self.stepping.remove(&t);
    }
}
