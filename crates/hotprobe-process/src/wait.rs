//! The wait state machine: every wait status of a traced task becomes a
//! [`TargetEvent`] for the engine or is handled here (`handle_status`).

use crate::*;

/// How long [`ProcessTarget::wait_beside_leader`] waits for a stop before
/// it looks at the leader's state again (ms).
const LEADER_LOOK_MS: u64 = 10;

impl ProcessTarget {
    /// Stop the process (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if self.exited.is_none() {
            let _ = self.sys.kill(self.pid, libc::SIGKILL);
            // This thread's children and tracees only: another thread's
            // session (several in one program, through the C or Python
            // API) must not lose its events to this wait.
            while let Ok(Some((p, st))) = self.sys.waitpid_restart(-1, libc::__WNOTHREAD) {
                if p == self.pid && (libc::WIFEXITED(st) || libc::WIFSIGNALED(st)) {
                    self.exited = Some(exit_status(st));
                    break;
                }
                if p != self.pid && !self.threads.contains_key(&p) {
                    // Another target's of this thread: it takes it from there.
                    self.strays.stash(p, st);
                }
            }
            self.attached = false;
        }
    }

    /// Wait until every thread with a pending interrupt is parked (or gone).
    pub(crate) fn wait_parked(&mut self) -> Result<(), TargetError> {
        loop {
            let Some(tid) = self
                .threads
                .iter()
                // A thread that reported an event instead is stopped too (its
                // interrupt may still be pending, then absorbed when it
                // resumes; or the event's stop cleared it: `stop_all`
                // interrupts again next time).
                .find(|(_, t)| t.interrupt_pending && t.state == RunState::Running)
                .map(|(tid, _)| *tid)
            else {
                return Ok(());
            };
            // That thread's status; for the leader of a process with
            // other threads, if it is there, else the next of any task: a
            // leader ending with the process reports only once its other
            // threads' exits are reaped (a wait on it alone hung detach
            // after a fatal SIGTRAP, all three tasks zombies).
            let leader = tid == self.pid && self.threads.len() > 1;
            let r = match self.strays.take(tid) {
                Some(st) => Some((tid, st)),
                None => match self
                    .sys
                    .waitpid_restart(tid, if leader { libc::WNOHANG } else { 0 })
                {
                    Ok(Some(r)) => Some(r),
                    Ok(None) if !leader => None,
                    Ok(None) => match self.wait_beside_leader(tid) {
                        Ok(Some(r)) => r,
                        Ok(None) => continue,
                        Err(e) if e.errno() == libc::ECHILD => {
                            self.threads.remove(&tid);
                            continue;
                        }
                        Err(e) => return Err(self.sys_err(e)),
                    },
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

    /// The next status of any task, while the leader `leader`, being
    /// stopped, reported nothing (`WNOHANG`): `Ok(None)` when there is
    /// nothing more to wait for from the leader (it is a zombie: see
    /// [`ProcessTarget::leader_became_zombie`]) or the wait is to be
    /// looked at again.
    ///
    /// While another thread runs, its status is waited for, blocking (the
    /// leader of a process that ended reports only once its threads'
    /// exits are reaped). Once every other thread is stopped, a leader
    /// that is still to report is either on its way to its stop or a
    /// zombie (it called `pthread_exit`): the kernel never reports a
    /// zombie leader stopped, and the wait would never end (detach hung,
    /// every other thread parked). Its task's state tells; a leader not
    /// yet a zombie is waited for with a deadline, and looked at again
    /// (one still in its exit becomes a zombie without a status).
    fn wait_beside_leader(&mut self, leader: i32) -> Result<Option<Option<(i32, i32)>>, SysError> {
        let others_stopped = self
            .threads
            .iter()
            .all(|(tid, t)| *tid == leader || t.state != RunState::Running);
        if others_stopped {
            if self.sys.task_state(self.pid, leader) == Some('Z') {
                self.leader_became_zombie();
                return Ok(None);
            }
            match self.sys.waitpid_timeout(
                -1,
                libc::__WNOTHREAD,
                Duration::from_millis(LEADER_LOOK_MS),
            ) {
                Some(Ok(None)) => return Ok(None),
                Some(r) => return r.map(Some),
                // No timed wait: the blocking one below.
                None => {}
            }
        }
        self.sys.waitpid_restart(-1, libc::__WNOTHREAD).map(Some)
    }

    /// Turn one waitpid status into an event for the engine, or handle it
    /// here and return `None`.
    ///
    /// A stopped thread stops answering ptrace when another thread ends
    /// the process (`exit_group`, a fatal signal) or execs: handling its
    /// stop then fails with `ESRCH`. That is not an error of the session:
    /// the thread's exit (or the exec) is reported next, so it counts as
    /// running until then (a Go program's thread at a signal-state site
    /// while `main` returned failed `run` 1 time in 5).
    pub(crate) fn handle_status(
        &mut self,
        pid: i32,
        status: i32,
        stopping: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        match self.handle_status_of_live(pid, status, stopping) {
            Err(_) if self.vanished(pid) => {
                if let Some(t) = self.threads.get_mut(&pid) {
                    t.state = RunState::Running;
                    t.regs = None;
                    t.stepping = false;
                }
                Ok(None)
            }
            r => r,
        }
    }

    /// Whether known thread `pid` no longer answers ptrace (its process
    /// is ending or another thread's exec took it).
    fn vanished(&self, pid: i32) -> bool {
        self.threads.contains_key(&pid)
            && matches!(self.sys.getregs(pid), Err(e) if e.errno() == libc::ESRCH)
    }

    /// [`ProcessTarget::handle_status`] for a thread that answers.
    fn handle_status_of_live(
        &mut self,
        pid: i32,
        status: i32,
        stopping: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if pid == self.pid {
                // Nobody takes the statuses of its tasks any more.
                self.forget_strays();
                self.exec_gone.clear();
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
            if let Some(i) = self.exec_gone.iter().position(|t| *t == pid) {
                // A thread another thread's exec ended, reported after the
                // exec: the engine dropped it with the exec already.
                self.exec_gone.swap_remove(i);
                return Ok(None);
            }
            // Another target's task (a followed fork child, a second
            // process of the session): it takes it from there.
            self.strays.stash(pid, status);
            return Ok(None);
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(None);
        }
        if pid == self.pid && self.zombie_leader && status >> 16 == libc::PTRACE_EVENT_EXEC {
            // Another thread's exec took the zombie leader's place and
            // pid: the process has a live leader again.
            self.zombie_leader = false;
            self.threads.insert(pid, Thread::new(RunState::Running));
        }
        if !self.threads.contains_key(&pid) {
            // A new thread whose clone event is still to come, or another
            // target's task.
            self.strays.stash(pid, status);
            return Ok(None);
        }
        self.stops += 1;
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        {
            let t = self.threads.get_mut(&pid).expect("known thread");
            t.state = RunState::Event;
            t.regs = None;
            t.last_event = event;
        }
        match event {
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let new = self.sys.geteventmsg(pid).map_err(|e| self.sys_err(e))? as i32;
                // The new task starts with a stop of its own.
                let st = match self.strays.take(new) {
                    Some(st) => st,
                    None => self
                        .sys
                        .waitpid_restart(new, 0)
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
                        if let Err(e) = watch::apply(&self.sys, new, &self.watches) {
                            if e.errno() != libc::ESRCH {
                                return Err(self.sys_err(e));
                            }
                        }
                    }
                    if alive {
                        let vfork = event == libc::PTRACE_EVENT_VFORK;
                        let mut th = Thread::new(RunState::Running);
                        if stopping {
                            th.state = RunState::Parked;
                        } else if vfork {
                            th.state = RunState::Event;
                        } else {
                            self.sys.cont(new, 0).map_err(|e| self.sys_err(e))?;
                        }
                        self.threads.insert(new, th);
                        self.inherit_sigtrap_state(pid, new);
                        if vfork {
                            // Its own mask, as the parent's program set it.
                            self.vfork_mask_back(pid, new);
                            // Before it runs: the agent counts it apart.
                            self.vfork_started(pid, new);
                            if !stopping {
                                let th = self.threads.get_mut(&new).expect("inserted");
                                th.state = RunState::Running;
                                self.sys.cont(new, 0).map_err(|e| self.sys_err(e))?;
                            }
                        }
                    }
                    self.park_or_continue(pid, stopping)?;
                    return Ok(if alive {
                        Some(TargetEvent::ThreadCreated(ThreadId(new as u64)))
                    } else {
                        None
                    });
                }
                // fork: a separate address space with every code byte of
                // ours in it, held stopped until it is released or adopted
                // (the caller decides what it gets back: the session from
                // its code ledger, see `release_fork_child_with`).
                if alive {
                    if self.threads.get(&pid).is_some_and(|t| t.trap_lifted) {
                        // Its mask is the lifted one: put back when it is
                        // released, kept lifted when it is adopted.
                        self.lifted_children.push(new);
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
                    let vforked = self.vfork_children.contains(&pid);
                    self.vfork_children.retain(|c| *c != pid);
                    self.threads.remove(&pid);
                    if vforked && self.keep_execd_vfork {
                        // Held at its exec for the session (exec followed).
                        self.execd_vfork_children.push(pid);
                        return Ok(None);
                    }
                    let _ = self.sys.detach(pid, 0);
                    return Ok(None);
                }
                // The target replaced its image; other threads are gone (an
                // exec by a thread other than the leader took the leader's
                // tid). Their exits may still be reported.
                let gone = self.threads.keys().filter(|tid| **tid != pid);
                self.exec_gone.extend(gone);
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
                self.sigreturn_insn = None;
                self.mem = open_mem(&self.sys, self.pid).map_err(|e| match e {
                    ProcessError::Sys(s) => self.sys_err(s),
                    other => TargetError::Protocol {
                        target: self.describe(),
                        why: other.to_string(),
                    },
                })?;
                // The new image's loader is mapped already (it has not run).
                self.arm_rendezvous();
                // Handlers are reset by the exec (ignored ones stay); the
                // old image's sites went with it.
                self.disarm_sig_sites();
                self.learn_sigtrap_state();
                self.agent_vfork = None;
                self.vfork_armed.clear();
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
                            self.sys.step(pid, 0).map_err(|e| self.sys_err(e))?;
                        } else {
                            self.sys.cont(pid, 0).map_err(|e| self.sys_err(e))?;
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
                    self.sys.listen(pid).map_err(|e| self.sys_err(e))?;
                    return Ok(None);
                }
                // The first stop of an auto-attached task, or a spurious one.
                self.park_or_continue(pid, stopping)?;
                return Ok(None);
            }
            0 => {}
            libc::PTRACE_EVENT_VFORK_DONE => {
                // The child executed or exited; the parent runs on (the
                // agent told first, if it was told of the child).
                if self.vfork_armed.iter().any(|a| a.0 == pid) {
                    if let Ok(child) = self.sys.geteventmsg(pid) {
                        self.vfork_finished(pid, child as i32);
                    }
                }
                self.park_or_continue(pid, stopping)?;
                return Ok(None);
            }
            _ => {
                // An event stop not asked for (PTRACE_EVENT_VFORK_DONE,
                // _EXIT, _SECCOMP): no signal to deliver, nothing to report.
                self.park_or_continue(pid, stopping)?;
                return Ok(None);
            }
        }
        // A signal-delivery stop.
        let code = (sig == libc::SIGTRAP && !self.watching())
            .then(|| self.sys.getsiginfo(pid).ok().map(|i| i.code))
            .flatten();
        if code == Some(TRAP_HWBKPT) {
            // A hardware watchpoint's trap queued to the thread before its
            // watchpoint was removed (unwatch while it ran): not the
            // program's signal — dropped, as at detach.
            let _ = watch::take_hits(&self.sys, pid);
            self.note_forced_trap(pid);
            self.park_or_continue(pid, stopping)?;
            return Ok(None);
        }
        // The program's own SIGTRAP queued again: delivered as sent.
        let resent = sig == libc::SIGTRAP && self.is_requeued_trap(pid, code);
        if sig == libc::SIGTRAP && !resent {
            let mut hits = if self.watching() {
                match watch::take_hits(&self.sys, pid) {
                    Ok(h) => h,
                    // Killed meanwhile: its exit comes next.
                    Err(e) if e.errno() == libc::ESRCH => 0,
                    Err(e) => return Err(self.sys_err(e)),
                }
            } else {
                0
            };
            let regs = self.fetch_regs(pid)?;
            let stepping = self.threads.get(&pid).is_some_and(|t| t.stepping);
            if hits == 0 && !stepping && self.watching() {
                // A watchpoint's trap whose DR6 came back empty reaches us
                // as an `icebp`: never the program's.
                if let Ok(info) = self.sys.getsiginfo(pid) {
                    if let Some(h) = self.watch_slots_without_dr6(info.code, regs.rip) {
                        hits = h;
                    }
                }
            }
            let bp = regs.rip.wrapping_sub(1);
            if !stepping && hits == 0 && self.is_sig_site(bp) {
                self.hold_sent_trap(pid, code);
                self.on_sig_site(pid, bp, stopping)?;
                return Ok(None);
            }
            let ours = stepping
                || hits != 0
                || self.is_rendezvous_trap(regs.rip)
                || self.breakpoints.contains_key(&bp);
            if ours {
                // The kernel reset what the thread blocks or ignores.
                self.note_forced_trap(pid);
                // The program's own SIGTRAP in its place: kept, sent again.
                self.hold_sent_trap(pid, code);
            }
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
        if sig == libc::SIGTRAP {
            // The program's own, to a thread where it blocks it: queued
            // again by the kernel once passed on (`sigtrap.rs`, "Lifted").
            self.unlift_at_sent_trap(pid);
        }
        // Pass the signal through untouched, unless the thread is stepping
        // an out-of-line slot: then hold it until the step is done.
        let t = self.threads.get_mut(&pid).expect("known thread");
        if t.stepping {
            t.held_signals.push_back(sig);
            t.state = RunState::Running;
            self.sys.step(pid, 0).map_err(|e| self.sys_err(e))?;
            return Ok(None);
        }
        if stopping && t.interrupt_pending {
            // Deliver it now; the pending interrupt will park the thread.
            t.state = RunState::Running;
            self.sys.cont(pid, sig).map_err(|e| self.sys_err(e))?;
            return Ok(None);
        }
        t.state = RunState::Running;
        self.sys.cont(pid, sig).map_err(|e| self.sys_err(e))?;
        Ok(None)
    }

    pub(crate) fn park_or_continue(&mut self, pid: i32, stopping: bool) -> Result<(), TargetError> {
        let t = self.threads.get_mut(&pid).expect("known thread");
        if stopping {
            t.state = RunState::Parked;
            Ok(())
        } else {
            self.restore_sigtrap_state(pid);
            let t = self.threads.get_mut(&pid).expect("known thread");
            t.state = RunState::Running;
            self.sys.cont(pid, 0).map_err(|e| self.sys_err(e))
        }
    }

    /// Whether the next [`Target::wait`] has an event or a status of this
    /// process at hand that the kernel no longer holds (queued here, or
    /// reaped by another target of this thread), or its end, or a signal
    /// that a status wait retried past and that ends the next wait: a
    /// caller that sleeps until the kernel has a new status must not sleep
    /// then.
    pub fn has_taken_events(&self) -> bool {
        crate::sys::deferred_interrupt()
            || !self.pending.is_empty()
            || self.exited.is_some()
            || self
                .strays
                .has_of(|p| p == self.pid || self.threads.contains_key(&p))
    }

    /// [`Target::wait`] of a traced process.
    pub(crate) fn wait_traced(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<TargetEvent, TargetError> {
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
            // Statuses another target of the session reaped for us, and
            // the batch of ready ones this wait queued (`ready.rs`).
            while let Some((pid, status)) = self
                .strays
                .take_of(|p| p == self.pid || self.threads.contains_key(&p))
            {
                self.note_served(pid);
                if let Some(ev) = self.handle_status(pid, status, false)? {
                    return Ok(ev);
                }
                if let Some(ev) = self.pending.pop_front() {
                    return Ok(ev);
                }
            }
            // A signal a status wait retried past ends this wait now.
            if crate::sys::take_deferred_interrupt() {
                return Ok(TargetEvent::Timeout);
            }
            // With a deadline: a wait that sleeps until a status is there
            // or the deadline passes (`waiter.rs`: a stop wakes us at
            // once), else polling with naps.
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let timed = match left {
                Some(l) if l >= Duration::from_micros(50) => {
                    self.sys.waitpid_timeout(-1, libc::__WNOTHREAD, l)
                }
                _ => None,
            };
            if let Some(Ok(None)) = timed {
                return Ok(TargetEvent::Timeout);
            }
            let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
            let r = match timed.unwrap_or_else(|| self.sys.waitpid(-1, flags | libc::__WNOTHREAD)) {
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
                // With every other status ready now, queued fairly
                // (`ready.rs`) and taken at the top of the loop.
                Some(first) => self.queue_ready(first),
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
}
