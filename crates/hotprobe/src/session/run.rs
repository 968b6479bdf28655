//! The run: starting the targets, the loop that waits for their events
//! and hands each to every mechanism, the end (grace, detach).

use super::foreign::uprobes_on_rewritten_sites;
use super::reverted;
use super::*;

use super::handlers::ServeWake;

impl Session {
    /// Registers a source of events that follows the processes from
    /// outside (the host kernel's, `crate::kernel_source::KernelSource`):
    /// it is told of each process about to run for the first time, in
    /// [`Session::start`]. Keep a clone to read what it gathered.
    pub fn observe(&mut self, o: Rc<std::cell::RefCell<dyn crate::observer::TargetObserver>>) {
        self.observers.push(o);
    }

    /// Let every target run (after attaching/spawning and adding probes).
    pub fn start(&mut self) -> Result<(), EngineError> {
        for s in &self.slots {
            if let (Some(pid), false, None) = (s.pid, s.engine.started, s.engine.gone()) {
                for o in &self.observers {
                    o.borrow_mut().process_starting(pid)?;
                }
            }
        }
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            if let Some(p) = &mut s.mechs.plugin {
                let p = &mut p.plugin;
                // The candidate sites are final before the VM's first
                // translation, the enable flags applied.
                p.host.freeze().map_err(|e| EngineError::RefusedSpec {
                    spec: "the QEMU plugin's probes".into(),
                    reason: e.to_string(),
                })?;
            }
            if s.engine.gone().is_none() && !s.engine.started {
                // Without the agent nothing in the program can take the
                // int3s out if hotprobe dies: said once, at the start.
                if let (AgentState::Off(why), Some(pid), true) =
                    (&s.agent.state, s.pid, s.engine.has_armed_sites())
                {
                    s.notice(format!(
                        "pid {pid}: {why}: a hotprobe killed with SIGKILL would leave its \
                         int3s in the program (Ctrl-C, --duration and the program's exit take \
                         them out)"
                    ));
                }
                // Let go untraced before it runs, where it may: its
                // first threads start with no clone stop (a release
                // after the resume found their clone stops queued, and
                // kept it traced, 1 run in 2 of an 8-thread start).
                s.engine.started = true;
                self.maybe_release(i);
                self.slots[i].target.as_target().resume_all()?;
            }
        }
        for i in 0..self.slots.len() {
            self.maybe_release(i);
        }
        Ok(())
    }

    /// Handle events until a handler stops, or every target is gone.
    pub fn run(&mut self) -> Result<RunEnd, EngineError> {
        self.run_until(&AtomicBool::new(false))
    }

    /// As [`Session::run`], also returning when `interrupt` becomes true.
    /// With one target the loop blocks until the target's next event: set
    /// `interrupt` from a signal handler installed without `SA_RESTART`
    /// (the signal interrupts the wait), as the CLI does for Ctrl-C.
    pub fn run_until(&mut self, interrupt: &AtomicBool) -> Result<RunEnd, EngineError> {
        self.run_with(interrupt, None)
    }

    /// Bounds every wait of the run loop by `deadline` (then by 1 ms), so
    /// that an `interrupt` set at that moment is seen at once even if the
    /// signal meant to cut the wait short came before the wait began (the
    /// CLI's `--duration`: a lost wake-up ran 1 s past it).
    pub fn set_wait_deadline(&mut self, deadline: Option<std::time::Instant>) {
        self.wait_deadline = deadline;
    }

    /// As [`Session::run_until`], handing every recorded event (fast path
    /// rings and trap record probes) to `sink` while the targets run. The
    /// last events are drained before it returns.
    pub fn run_with<'s>(
        &mut self,
        interrupt: &AtomicBool,
        mut sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<RunEnd, EngineError> {
        loop {
            if interrupt.load(Ordering::Relaxed) {
                self.drain(sink.as_deref_mut(), 1)?;
                return Ok(RunEnd::Interrupted);
            }
            match self.step(sink.as_deref_mut())? {
                Some(end) => {
                    self.drain(sink.as_deref_mut(), 1)?;
                    return Ok(end);
                }
                None => continue,
            }
        }
    }

    /// One pass: drain the rings, then wait for (and handle) one event of
    /// each live target. `Some(end)` when the loop is over.
    pub(super) fn step<'s>(
        &mut self,
        sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<Option<RunEnd>, EngineError> {
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.slots[*i].engine.gone().is_none())
            .collect();
        if live.is_empty() {
            if self.new_processes.is_some() {
                // Waiting for the next process to take.
                self.serve_gate(Duration::from_millis(50));
                return Ok(None);
            }
            return Ok(Some(RunEnd::AllExited));
        }
        self.serve_gate(Duration::ZERO);
        let recording = live.iter().any(|i| self.slots[*i].recording);
        if recording && sink.is_none() {
            self.drain(None, 0)?;
        }
        self.check_reverted_sites(false);
        self.watch_tracers();
        let retry = self.retry_releases();
        let timeout = if recording && sink.is_some() {
            Some(self.drain(sink, 0)?)
        } else if self.new_processes.is_some() {
            Some(Duration::from_millis(1))
        } else if live.len() == 1 && !self.has_code_to_watch() {
            None
        } else if live.len() == 1 {
            Some(reverted::REVERTED_CHECK_EVERY)
        } else {
            Some(Duration::from_millis(1))
        };
        let timeout = match retry {
            Some(r) => Some(timeout.map_or(r, |t| t.min(r))),
            None => timeout,
        };
        let timeout = match self.wait_deadline {
            Some(d) => {
                let left = d
                    .saturating_duration_since(std::time::Instant::now())
                    .max(Duration::from_millis(1));
                Some(timeout.map_or(left, |t| t.min(left)))
            }
            None => timeout,
        };
        for i in live {
            if self.poll_slot(i, timeout)? {
                return Ok(Some(RunEnd::Stopped));
            }
        }
        Ok(None)
    }

    /// Waits up to `timeout` for one event of slot `i` and handles it, for
    /// every mechanism of the target. True when a handler asked to stop.
    pub(super) fn poll_slot(
        &mut self,
        i: usize,
        timeout: Option<Duration>,
    ) -> Result<bool, EngineError> {
        let mut timeout = timeout;
        if !self.slots[i].agent.handlers.is_empty() && self.slots[i].engine.gone().is_none() {
            // A traced process's stops (a trap hit, a thread's start) end
            // the wait for handler calls as a call does: the process's
            // waiter thread rings the doorbell for them. (Unwoken, a stop
            // waited the whole 20 ms of an untimed serve, twice per trap
            // hit; cut to 1 ms slices, the tracer woke 1,000 times a
            // second.) An event already taken from the kernel is handled
            // first, after the calls waiting now.
            let slot = &mut self.slots[i];
            let wake = match Slot::process(&mut slot.target) {
                Some(p) if p.is_released() => ServeWake::Calls,
                Some(p) if p.has_taken_events() => {
                    timeout = Some(Duration::ZERO);
                    ServeWake::Calls
                }
                Some(_) if slot.agent.child_wake_missed => ServeWake::Slices,
                Some(_) => ServeWake::Stops,
                None => ServeWake::Calls,
            };
            let served = self.serve_handlers(i, timeout, wake);
            if served.stop {
                return Ok(true);
            }
            let (stop, seen) = self.poll_slot_event(i, Some(Duration::ZERO))?;
            // Rung for another thread's child: the next serve waits in a
            // slice (a status nobody takes would ring at once each time),
            // the one after is rung again.
            self.slots[i].agent.child_wake_missed = served.child_rang && !seen;
            return Ok(stop);
        }
        self.poll_slot_events(i, timeout)
    }

    /// [`Session::poll_slot`] without serving shared-memory handler calls
    /// (at detach: a call made after a handler asked to stop waits for a
    /// next run, and is withdrawn, never served, once the probe goes).
    pub(super) fn poll_slot_events(
        &mut self,
        i: usize,
        timeout: Option<Duration>,
    ) -> Result<bool, EngineError> {
        self.poll_slot_event(i, timeout).map(|(stop, _)| stop)
    }

    /// [`Session::poll_slot_events`], also saying whether the target had
    /// an event (not a timeout).
    fn poll_slot_event(
        &mut self,
        i: usize,
        timeout: Option<Duration>,
    ) -> Result<(bool, bool), EngineError> {
        let slot = &mut self.slots[i];
        let stops = |slot: &mut Slot| Slot::process(&mut slot.target).map(|p| p.ptrace_stops());
        let stops_before = stops(slot);
        let ev = match slot.target.as_target().wait(timeout) {
            Ok(ev) => ev,
            Err(TargetError::Gone { .. }) => return Ok((false, false)),
            Err(e) => return Err(e.into()),
        };
        // A stop the target handled itself (a signal it forwarded, an
        // in-process trap's SIGTRAP passed on) is one of this process's
        // too, though no event comes of it: the doorbell rung for it was
        // not another child's (else the next serve waited in 1 ms slices,
        // `hotprobe-bench handlerwait`).
        let seen = !matches!(ev, TargetEvent::Timeout) || stops(slot) != stops_before;
        let change = match &ev {
            TargetEvent::Exec => Some(mech::TargetChange::Exec),
            TargetEvent::Exited(status) => {
                // SIGILL, SIGTRAP, SIGBUS, SIGSEGV (x86-64 Linux).
                if matches!(status, ExitStatus::Signal(4 | 5 | 7 | 11))
                    && slot.agent.fast_path().is_some()
                {
                    slot.sync_ledger();
                    let written: Vec<(u64, usize)> = slot
                        .ledger
                        .agent_writes()
                        .into_iter()
                        .map(|(a, b)| (a, b.len()))
                        .collect();
                    if !written.is_empty() {
                        if let Some(n) = uprobes_on_rewritten_sites(slot, &written, status) {
                            slot.notice(n);
                        }
                    }
                }
                Some(mech::TargetChange::Exited)
            }
            _ => None,
        };
        if let Some(change) = change {
            // The image the mechanisms wrote into is gone: nothing is
            // restored into the new one, the ledger forgets every entry of
            // the old one. Counts and rings stay ours.
            let (mut cx, mechs) = slot.parts();
            for m in mechs.all() {
                m.on_change(&mut cx, &change);
            }
            slot.ledger.forget_image();
            // How probes in the old image's modules were asked, and which
            // of its modules were loaded at run time: neither holds for
            // the new image (whose probes `exec.rs` places anew).
            slot.placed_specs.clear();
            slot.unloads = Default::default();
        }
        if let TargetEvent::Watchpoint {
            thread,
            slots,
            regs,
        } = ev
        {
            return Ok((self.on_watchpoint(i, thread, slots, regs)?, seen));
        }
        let exec = matches!(ev, TargetEvent::Exec);
        if exec {
            self.watches_exec(i);
        }
        if matches!(ev, TargetEvent::ModulesChanged { .. }) {
            // Forgets the sites of unloaded modules first, then arms.
            self.refresh_pending(i);
            self.slots[i].tell_mechanisms_of(&mech::TargetChange::ModuleMapped);
        }
        if matches!(
            ev,
            TargetEvent::ModulesChanged { .. } | TargetEvent::ThreadCreated(_)
        ) {
            self.stacks_on_event(i, &ev);
        }
        self.note_thread_process(i, &ev);
        let slot = &mut self.slots[i];
        let holds = slot.holds();
        slot.engine.handle_holding(&mut slot.target, ev, holds)?;
        if exec {
            slot.sync_ledger();
            slot.semaphores.clear();
            let (mut cx, mechs) = slot.parts();
            mechs.trap.publish(&mut cx);
            self.follow_exec(i);
        }
        let slot = &mut self.slots[i];
        let stop = slot.engine.take_stop();
        for held in slot.inbox.take_children(&mut slot.engine) {
            self.take_fork_child(i, held.child, held.fixes);
        }
        self.follow_execd_vfork_children(i);
        Ok((stop, seen))
    }

    /// Ends the run: spawned targets still alive get `grace` to exit on
    /// their own (a terminal's Ctrl-C reaches them as well as hotprobe)
    /// while their events are handled and drained; every target still
    /// alive then is detached (code restored, running on). The last events
    /// are drained into `sink`. A target that dies meanwhile is no error.
    pub fn finish<'s>(
        &mut self,
        grace: Duration,
        mut sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<(), EngineError> {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && self
                .slots
                .iter()
                .any(|s| s.spawned && s.engine.gone().is_none())
        {
            let live: Vec<usize> = (0..self.slots.len())
                .filter(|i| self.slots[*i].engine.gone().is_none())
                .collect();
            self.drain(sink.as_deref_mut(), 0)?;
            for i in live {
                self.poll_slot(i, Some(Duration::from_millis(5)))?;
            }
        }
        self.drain(sink.as_deref_mut(), 1)?;
        let r = self.detach();
        self.drain(sink, 1)?;
        r
    }

    /// Detach from every target: handlers stop, threads leave scratch
    /// slots, return addresses are put back, original bytes restored
    /// (the fast path's and the traps'), targets run on. Targets already
    /// gone are skipped.
    pub fn detach(&mut self) -> Result<(), EngineError> {
        // Sites the program took back since the last walk are named
        // before the ledger goes.
        self.check_reverted_sites(true);
        let mut first_err = None;
        // A process running untraced may have executed another program or
        // ended since the last wait: said and handled as any exec or end
        // first, so that the detach restores nothing into a new image.
        for i in 0..self.slots.len() {
            if self.slots[i].engine.gone().is_none() && self.is_untraced(TargetId(i)) {
                if let Err(e) = self.poll_slot_events(i, Some(Duration::ZERO)) {
                    first_err.get_or_insert(e);
                }
            }
        }
        for s in &mut self.slots {
            let gone = s.engine.gone().is_some();
            if !gone {
                super::usdt::lower_semaphores(s);
            }
            if !gone {
                // One walk of the code ledger, a process's or a guest's
                // (`detach.rs`).
                if let Err(e) = s.detach_by_ledger() {
                    first_err.get_or_insert(e);
                }
                continue;
            }
            // Gone: nothing is restored; each mechanism forgets its sites.
            let (mut cx, mechs) = s.parts();
            for m in mechs.all() {
                if m.kind() == MechKind::Trap {
                    continue;
                }
                if let Err(e) = m.detach(&mut cx, true) {
                    first_err.get_or_insert(e);
                }
            }
            s.ledger.clear();
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
