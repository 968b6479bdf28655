//! The session's side of the in-process trap mechanism
//! ([`Mechanism::InProcessTrap`]) and of running untraced.
//!
//! A `Count` probe whose site neither a patch nor a jump can take (a
//! function shorter than 5 bytes, a jump target, an instruction inside a
//! function) goes to an in-process trap when the target has the agent:
//! an `int3` the agent's `SIGTRAP` handler takes inside the target
//! (`hotprobe_fastpath::FastPath::add_inproc`). It stays on the ptrace
//! trap, with both reasons, where the instruction cannot run in-process
//! (see `hotprobe-fastpath`'s `inproc` module), where the engine has a
//! breakpoint at the same address, or with `--mechanism trap`.
//!
//! Once the targets run ([`Session::start`], and after probes added while
//! running) a process whose ptrace mechanisms have nothing placed — no
//! trap probe, no pending probe, no followed forks — runs untraced
//! ([`hotprobe_process::ProcessTarget::release`]): the in-process traps'
//! `SIGTRAP`s then cost no ptrace stop at all
//! ([`Session::ptrace_stops`] stays constant); the process is taken back
//! (seized again) when the session needs it stopped: to add a probe, to
//! detach.

use super::*;
use std::time::{Duration, Instant};

impl Session {
    /// Places a `Count` (or, `record`, a `Record`) probe at `r` as an
    /// in-process trap; `Err(why)`
    /// when the site cannot take one (the caller falls back to the trap).
    pub(super) fn place_inproc(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        fallback: &str,
        label: String,
        record: bool,
    ) -> Result<Result<Placement, String>, EngineError> {
        if let Some(why) = self.inproc_refusal(t)? {
            return Ok(Err(why));
        }
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        if !slot.is_process() || slot.plugin.is_some() {
            return Ok(Err("not a process".into()));
        }
        if slot.engine.execution_of(r.addr).is_some() {
            return Ok(Err("a trap probe is already at this address".into()));
        }
        if let Err(why) = slot.ensure_fast(&config) {
            return Ok(Err(why));
        }
        let started = slot.engine.started;
        let id = slot.engine.new_id();
        let Slot { engine, fast, .. } = slot;
        let Fast::On(fp) = fast else {
            return Ok(Err("the agent is not loaded".into()));
        };
        let Some(pt) = Slot::process(engine) else {
            return Ok(Err("not a process".into()));
        };
        // A recording probe at a function's entry has its return hooked
        // from the handler too; inside a function it records hit events.
        let exit = r.offset == 0 && r.is_entry() && r.no_return.is_none();
        let placed = if record {
            fp.add_inproc_record(pt, r.addr.0, exit)
        } else {
            fp.add_inproc(pt, r.addr.0)
        };
        if started {
            pt.resume_all()?;
        }
        let info = match placed {
            Ok(info) => info,
            Err(hotprobe_fastpath::FastPathError::Impossible { why, .. }) => return Ok(Err(why)),
            Err(e) => return Ok(Err(e.to_string())),
        };
        slot.bind_fast(id, info.probe_id, None);
        slot.inproc.insert(id, (r.addr.0, false));
        let entry_only = r.no_return.clone().filter(|_| record);
        Ok(Ok(Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism: Mechanism::InProcessTrap,
            reason: format!(
                "{fallback}: int3 taken by the agent's SIGTRAP handler ({})",
                info.instruction
            ),
            execution: if record {
                format!(
                    "{} ({}, recorded: {})",
                    Mechanism::InProcessTrap,
                    info.execution,
                    match (exit, &entry_only) {
                        (true, _) => "return hooked",
                        (false, Some(_)) => "entries only",
                        (false, None) => "hit events",
                    }
                )
            } else {
                format!("{} ({})", Mechanism::InProcessTrap, info.execution)
            },
            entry_only,
        }))
    }

    /// Why target `t` may get no in-process trap, whose `int3` needs
    /// `SIGTRAP` unblocked in every thread and out of every handler's mask
    /// (issue 22): the preloaded agent keeps it so through the libc calls
    /// it interposes (`hotprobe-agent`'s `sigmask`). An agent injected into
    /// a running process cannot (the program's calls are bound to libc's
    /// already), nor can any agent in a Go program (its runtime sets masks
    /// with raw system calls). `None`: it may.
    fn inproc_refusal(&mut self, t: TargetId) -> Result<Option<String>, EngineError> {
        let slot = self.slot(t)?;
        let Some(pid) = slot.pid.filter(|_| slot.is_process()) else {
            return Ok(Some("not a process".into()));
        };
        if !slot.spawned {
            return Ok(Some(
                "the agent was injected into a running process, whose signal-mask calls are \
                 bound to libc's: it cannot keep SIGTRAP unblocked in every thread"
                    .into(),
            ));
        }
        let symbols = self.process_symbols(t, pid)?;
        if symbols.modules().iter().any(crate::nonlocal::is_go_module) {
            return Ok(Some(
                "a Go runtime sets signal masks with raw system calls: SIGTRAP may be blocked"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// ptrace stops of target `t`'s process so far (`None` for a guest).
    /// With only fast-path and in-process mechanisms placed it stays
    /// constant while the process runs (it runs untraced).
    pub fn ptrace_stops(&mut self, t: TargetId) -> Option<u64> {
        let slot = self.slots.get_mut(t.0)?;
        Slot::process(&mut slot.engine).map(|p| p.ptrace_stops())
    }

    /// Whether target `t` runs untraced now (see the module docs).
    pub fn is_untraced(&mut self, t: TargetId) -> bool {
        self.slots
            .get_mut(t.0)
            .and_then(|s| Slot::process(&mut s.engine))
            .is_some_and(|p| p.is_released())
    }

    /// Lets the started process of slot `i` run untraced when nothing of
    /// its needs ptrace (see the module docs); otherwise leaves it.
    pub(super) fn maybe_release(&mut self, i: usize) {
        let follow = self.config.follow_forks;
        let slot = &mut self.slots[i];
        if (slot.inproc.is_empty() && slot.shm_handlers.is_empty())
            || follow
            || !slot.engine.started
            || slot.engine.gone().is_some()
            || !slot.pending.is_empty()
            || slot.root.is_some()
            || !slot.followable.is_empty()
            || slot.plugin.is_some()
        {
            return;
        }
        if let Some(pt) = Slot::process(&mut slot.engine) {
            if let Err(e) = pt.release() {
                slot.engine.notices.push(format!(
                    "cannot run untraced: {e}; the process stays traced"
                ));
            }
        }
    }
}

/// Default spin of each side of a shared-memory handler call.
const DEFAULT_HANDLER_SPIN: Duration = Duration::from_micros(50);
/// Default time a request may wait to be taken before its thread
/// withdraws it (see [`Session::set_handler_timeout`]).
const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(1);

impl Session {
    /// How long each side of a shared-memory handler call spins before it
    /// sleeps on a futex: the target's thread for the answer, the session
    /// for the next request (default 50 µs; zero: both sleep at once).
    /// Applies to targets whose first such probe is added afterwards, and
    /// to the session's own waiting at once.
    pub fn set_handler_spin(&mut self, spin: Duration) {
        self.handler_spin = Some(spin);
        self.apply_handler_wait();
    }

    /// How long a thread's shared-memory handler request may wait for the
    /// session to take it before the thread withdraws it and resumes
    /// unmodified — the handler does not run for that hit, which is
    /// counted in the probe's `nmissed` ([`Session::stats`]). Default
    /// 1 s: it bounds how long a program stalls on
    /// a session that stopped serving (not in `run`, or stuck); a session
    /// that serves loses no request to it unless it cannot get to one for
    /// that long (its process starved of CPU, a handler that blocks).
    /// A request already taken is waited for as long as the session is
    /// alive. Applies at once, and to targets given handler probes later.
    pub fn set_handler_timeout(&mut self, timeout: Duration) {
        self.handler_timeout = Some(timeout);
        self.apply_handler_wait();
    }

    fn apply_handler_wait(&self) {
        for s in &self.slots {
            if let (Fast::On(fp), false) = (&s.fast, s.shm_handlers.is_empty()) {
                fp.set_handler_wait(self.spin(), self.handler_timeout());
            }
        }
    }

    fn spin(&self) -> Duration {
        self.handler_spin.unwrap_or(DEFAULT_HANDLER_SPIN)
    }

    fn handler_timeout(&self) -> Duration {
        self.handler_timeout.unwrap_or(DEFAULT_HANDLER_TIMEOUT)
    }

    /// Places a probe with a pre handler and no post handler on a patch or
    /// jump site whose call hands the registers over (see
    /// `place_stub_handler`), else — or with a post handler — as an
    /// in-process trap whose handlers run here through shared memory
    /// (a post handler: a second hand-over after the displaced
    /// instruction): no ptrace stop. `Ok(Err(probe))` (the probe handed back) when it cannot
    /// go there: the caller places it on the trap.
    pub(super) fn place_shm_handler(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        mut probe: Probe,
        label: String,
    ) -> Result<Result<Placement, Probe>, EngineError> {
        if self.config.mechanism != MechanismChoice::Auto {
            return Ok(Err(probe));
        }
        let post = probe.post.is_some();
        let pre = probe.pre.is_some();
        let config = self.config.fast_path;
        let spin = self.spin();
        let timeout = self.handler_timeout();
        let slot = self.slot(t)?;
        // A site already at the address (or holding it in its bytes):
        // the trap joins or takes it over (`session_ledger.rs`).
        if !slot.is_process()
            || slot.plugin.is_some()
            || slot.engine.execution_of(r.addr).is_some()
            || slot.owner_at(r.addr.0).is_some()
            || slot.ensure_fast(&config).is_err()
        {
            return Ok(Err(probe));
        }
        if !post && r.offset == 0 && r.is_entry() && !r.is_return {
            match self.place_stub_handler(t, r, probe, label.clone(), (spin, timeout))? {
                Ok(p) => return Ok(Ok(p)),
                Err(p) => probe = p,
            }
        }
        if self.inproc_refusal(t)?.is_some() {
            return Ok(Err(probe));
        }
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        let Slot { engine, fast, .. } = slot;
        let Fast::On(fp) = fast else {
            return Ok(Err(probe));
        };
        let Some(pt) = Slot::process(engine) else {
            return Ok(Err(probe));
        };
        let placed = fp.add_inproc_handler(pt, r.addr.0, post);
        if started {
            pt.resume_all()?;
        }
        let Ok(info) = placed else {
            return Ok(Err(probe));
        };
        fp.set_handler_wait(spin, timeout);
        let id = slot.add_shm_handler(info.probe_id, probe);
        slot.inproc.insert(id, (r.addr.0, true));
        Ok(Ok(Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism: Mechanism::InProcessTrap,
            reason: format!(
                "the {} runs in hotprobe through shared memory ({})",
                match (pre, post) {
                    (true, true) => "pre and post handlers",
                    (false, true) => "post handler",
                    _ => "pre handler",
                },
                info.instruction
            ),
            execution: format!(
                "{} ({}, shared-memory handler)",
                Mechanism::InProcessTrap,
                info.execution
            ),
            entry_only: None,
        }))
    }

    /// Places a pre-handler probe at a function's entry on a patch or a
    /// jump whose `call` goes to the agent's handler trampoline (the
    /// register file handed over through shared memory, no signal);
    /// `Ok(Err(probe))` where neither fits (the caller tries the
    /// in-process trap).
    fn place_stub_handler(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        probe: Probe,
        label: String,
        (spin, timeout): (Duration, Duration),
    ) -> Result<Result<Placement, Probe>, EngineError> {
        let choice = self.config.mechanism;
        let Some(pid) = self.slot(t)?.pid else {
            return Ok(Err(probe));
        };
        let Ok(symbols) = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32) else {
            return Ok(Err(probe));
        };
        let Plan::Fast {
            path,
            bias,
            function,
            reason,
            ..
        } = self.plan_resolved(t, r, false, false, Some(&symbols))?
        else {
            return Ok(Err(probe));
        };
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        let Slot { engine, fast, .. } = slot;
        let (Fast::On(fp), Some(pt)) = (fast, Slot::process(engine)) else {
            return Ok(Err(probe));
        };
        let written_before = fp.written_count();
        let placed = fp.add_stub_handler(pt, &path, bias, &function, choice);
        if started {
            pt.resume_all()?;
        }
        let Ok(info) = placed else {
            return Ok(Err(probe));
        };
        fp.set_handler_wait(spin, timeout);
        let id = slot.add_shm_handler(info.probe_id, probe);
        if let Fast::On(fp) = &slot.fast {
            ledger::FastSpan::add(
                &mut slot.fast_ranges,
                fp.written_spans_since(written_before),
            );
        }
        ledger::FastSpan::add_probe(&mut slot.fast_ranges, info.addr, (id, false));
        let mechanism = from_fast(info.mechanism);
        Ok(Ok(Placement {
            id,
            label,
            addr: RuntimeAddr(info.addr),
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism,
            reason: format!(
                "{reason}; the pre handler runs in hotprobe through shared memory \
                 (the site's call saves the registers: no signal)"
            ),
            execution: format!("{mechanism} (shared-memory handler)"),
            entry_only: None,
        }))
    }

    /// Runs the shared-memory handler calls of slot `i` for up to
    /// `timeout` (20 ms without one): spinning for the next request for
    /// the handler spin, then sleeping on the doorbell. True when a
    /// handler asked to stop.
    pub(super) fn serve_handlers(&mut self, i: usize, timeout: Option<Duration>) -> bool {
        let spin = self.spin();
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_millis(20));
        let slot = &mut self.slots[i];
        let Slot {
            engine,
            fast,
            shm_handlers,
            shm_taken,
            ..
        } = slot;
        let Fast::On(fp) = fast else {
            return false;
        };
        let mut stop = false;
        loop {
            let seen = fp.handler_doorbell();
            // No call taken once a handler asked to stop: the next waits
            // for the next run (as a trap hit waits stopped).
            while let Some(call) = (!stop).then(|| fp.take_handler_call()).flatten() {
                // A hit is its pre call (a post call is the same hit's
                // second hand-over).
                if !call.post {
                    *shm_taken.entry(call.counter).or_insert(0) += 1;
                }
                let Some((id, probe)) = shm_handlers.get_mut(&call.counter) else {
                    fp.finish_handler_call(&call, None);
                    continue;
                };
                let mut regs = crate::handler::HitRegs::complete(call.regs);
                {
                    let (target, symbolizer) = engine.target_and_symbolizer();
                    let mut ctx = crate::HitContext {
                        target: RefCell::new(target),
                        thread: hotprobe_target::ThreadId(u64::from(call.tid)),
                        regs: &mut regs,
                        probe: *id,
                        addr: RuntimeAddr(call.addr),
                        kind: if call.post {
                            crate::HitKind::Post
                        } else {
                            crate::HitKind::Pre
                        },
                        stop: &mut stop,
                        symbolizer,
                        entry: None,
                        fetch_error: RefCell::new(None),
                        watch: None,
                    };
                    let handler = if call.post {
                        probe.post.as_mut()
                    } else {
                        probe.pre.as_mut()
                    };
                    if let Some(h) = handler {
                        h(&mut ctx);
                    }
                }
                let after = regs.fetched().copied().filter(|r| *r != call.regs);
                fp.finish_handler_call(&call, after.as_ref());
            }
            let now = Instant::now();
            if stop || now >= deadline {
                return stop;
            }
            // Without a caller's timeout, a sleep never shorter than the
            // kernel's tick (5 ms past the cycle's end at most): a shorter
            // timed wait programs the timer each time, which costs a
            // hand-over microseconds in a VM.
            let until = match timeout {
                None => deadline.max(now + Duration::from_millis(5)),
                Some(_) => deadline,
            };
            fp.wait_handler_calls(seen, spin, until);
        }
    }
}

impl Session {
    /// Before the engine places a breakpoint at `addr` of target `t`: a
    /// released process is taken back (the engine's `int3`s need ptrace),
    /// and an in-process probe at `addr` is handed over to the engine —
    /// its `int3` taken out, a trap probe at the same address counting on
    /// for it (its handler moved there, if it has one) — since the
    /// engine's site cannot share the byte.
    pub(super) fn before_trap_at(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
    ) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        if let Some(pt) = Slot::process(&mut slot.engine) {
            if pt.is_released() {
                pt.reacquire()?;
                if started {
                    pt.resume_all()?;
                }
            }
        }
        let Some((&id, _)) = slot.inproc.iter().find(|(_, (a, _))| *a == addr.0) else {
            // A jump or patch whose bytes hold `addr` goes to the engine.
            return self.hand_fast_to_trap(t, addr);
        };
        let Slot { engine, fast, .. } = &mut *slot;
        if let (Fast::On(fp), Some(pt)) = (fast, Slot::process(engine)) {
            let r = fp.remove_inproc(pt, addr.0);
            let resumed = match started {
                true => pt.resume_all(),
                false => Ok(()),
            };
            slot.note_foreign_writes();
            resumed?;
            r?;
        }
        slot.inproc.remove(&id);
        let mut probe = Probe::default();
        let mut key = None;
        for (k, (p, _)) in slot.shm_handlers.iter() {
            if *p == id {
                key = Some(*k);
            }
        }
        if let Some((_, p)) = key.and_then(|k| slot.shm_handlers.remove(&k)) {
            probe = p;
        }
        slot.prepublish_trap(addr);
        let x = slot.change_traps(|e| e.add_probe(addr, probe))?;
        slot.handed.insert(id, x);
        Ok(())
    }
}

impl Slot {
    /// A new session probe on fast-path counter `counter` whose handler
    /// runs in the session through shared memory (a stub handler or an
    /// in-process trap's): its hits are the calls taken or withdrawn
    /// (`shm_taken`), not the agent's count, which includes a call still
    /// waiting.
    fn add_shm_handler(&mut self, counter: u32, probe: crate::Probe) -> ProbeId {
        let id = self.engine.new_id();
        self.bind_fast(id, counter, None);
        self.shm_handlers.insert(counter, (id, probe));
        self.shm_taken.entry(counter).or_insert(0);
        id
    }
}
