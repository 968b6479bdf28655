//! Probes whose handlers run in the session through shared memory: at a
//! patch or jump site whose call hands the registers over, or at an
//! in-process trap; and the session's side of those calls.

use super::mech::HandlerAsk;
use super::*;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Default spin of each side of a shared-memory handler call.
const DEFAULT_HANDLER_SPIN: Duration = Duration::from_micros(50);
/// Default time a request may wait to be taken before its thread
/// withdraws it (see [`Session::set_handler_timeout`]).
const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(1);

/// How long an untimed serve of a process that runs untraced waits for
/// a call before the loop looks at the process again.
const UNTIMED_SERVE: Duration = Duration::from_millis(20);

/// How long an untimed serve of a traced process waits when its stops
/// ring the doorbell too ([`ServeWake::Stops`]): a bound only, since a
/// stop ends the wait at once (a lost wake would cost this much a stop).
const UNTIMED_TRACED_SERVE: Duration = Duration::from_secs(1);

/// The longest a traced process's stop waits while the session serves
/// its handler calls, where its stops cannot ring the doorbell
/// ([`ServeWake::Slices`]).
const TRACED_SERVE_SLICE: Duration = Duration::from_millis(1);

/// What besides a handler call ends a serve's wait
/// ([`Session::serve_handlers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ServeWake {
    /// Nothing: the process runs untraced (its end is not a stop), or
    /// the caller has an event at hand already (it serves with a zero
    /// timeout), or the target is no process.
    Calls,
    /// A wait status of a child or tracee of this process (the traced
    /// target's stops, a thread's start, its end): the process's waiter
    /// thread rings the doorbell (`FastPath::ring_doorbell_on_child`).
    /// Without a waiter thread, as [`ServeWake::Slices`].
    Stops,
    /// Nothing, but the wait is cut to `TRACED_SERVE_SLICE`: the last
    /// ring was for a status not this process's (a host program's
    /// unreaped child would ring at once every time).
    Slices,
}

/// What ended a serve ([`Session::serve_handlers`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Served {
    /// A handler asked to stop.
    pub(super) stop: bool,
    /// A child or tracee had a wait status ([`ServeWake::Stops`]).
    pub(super) child_rang: bool,
}

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

    pub(super) fn apply_handler_wait(&self) {
        for s in &self.slots {
            if let (Some(fp), false) = (s.agent.fast_path(), s.agent.handlers.is_empty()) {
                fp.set_handler_wait(self.spin(), self.handler_timeout());
            }
        }
    }

    pub(super) fn spin(&self) -> Duration {
        self.handler_spin.unwrap_or(DEFAULT_HANDLER_SPIN)
    }

    pub(super) fn handler_timeout(&self) -> Duration {
        self.handler_timeout.unwrap_or(DEFAULT_HANDLER_TIMEOUT)
    }

    /// Places a probe with handlers ([`Action::Handler`]) at `r` through
    /// the mechanism interface, asking in turn: the fast path (a pre
    /// handler alone, at a function's entry: a patch or jump site whose
    /// call hands the registers over through shared memory, no signal),
    /// the in-process trap (its handlers run here through shared memory;
    /// a post handler: a second hand-over after the displaced
    /// instruction), then the trap (a ptrace stop per hit). The first two
    /// only under `--mechanism auto`, on a process with the agent, where no
    /// site is at the address yet (the trap joins or takes over one there:
    /// `plan.rs`).
    pub(super) fn place_handler_probe(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        probe: Probe,
        label: String,
    ) -> Result<Placement, EngineError> {
        let handler = self.handler_ask(probe);
        self.place_handler_ask(t, r, &handler, label, None)
    }

    /// `probe` as the mechanisms are asked to take it.
    pub(super) fn handler_ask(&self, probe: Probe) -> HandlerAsk {
        HandlerAsk {
            probe: RefCell::new(Some(probe)),
            spin: self.spin(),
            timeout: self.handler_timeout(),
        }
    }

    /// [`Session::place_handler_probe`] of the probe in `handler`, under
    /// `existing`, the id it has already (a pending probe armed as its
    /// module is loaded: `pending.rs`). Where it fails before a mechanism
    /// took the probe, the probe is still in `handler`.
    pub(super) fn place_handler_ask(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        handler: &HandlerAsk,
        label: String,
        existing: Option<ProbeId>,
    ) -> Result<Placement, EngineError> {
        let post = handler
            .probe
            .borrow()
            .as_ref()
            .is_some_and(|p| p.post.is_some());
        if self.shm_handler_fits(t, r)? {
            let mut tried = Vec::new();
            if !post && r.offset == 0 && r.is_entry() && !r.is_return {
                tried.push(MechKind::Fast);
            }
            tried.push(MechKind::InProcess);
            for kind in tried {
                if let Some(p) = self.place_handler_on(t, kind, r, handler, &label, existing)? {
                    self.slot(t)?.owner.insert(p.id, kind);
                    self.maybe_release(t.0);
                    return Ok(p);
                }
            }
        }
        self.note_plugin_overlap(t, r.addr, true);
        self.before_trap_at(t, r.addr)?;
        let mut ask = self.ask(r, label, (false, false), None);
        ask.handler = Some(handler);
        ask.existing = existing;
        let slot = self.slot(t)?;
        let (mut cx, mechs) = slot.parts();
        let reason = Plan::Trap("handlers run in hotprobe".into());
        mechs
            .trap
            .place(&mut cx, ask, reason)?
            .map_err(|reason| EngineError::RefusedSpec {
                spec: r.to_string(),
                reason,
            })
    }

    /// Whether a shared-memory handler may be tried at `r` (see
    /// [`Session::place_handler_probe`]); loads the agent if so.
    fn shm_handler_fits(&mut self, t: TargetId, r: &ResolvedProbe) -> Result<bool, EngineError> {
        if self.config.mechanism != MechanismChoice::Auto {
            return Ok(false);
        }
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        slot.sync_ledger();
        Ok(slot.is_process()
            && slot.mechs.plugin.is_none()
            && slot.engine.execution_of(r.addr).is_none()
            && slot.ledger.site_at(r.addr.0).is_none()
            && slot.agent.ensure(&mut slot.target, &config).is_ok())
    }

    /// Asks mechanism `kind` (the fast path or the in-process trap) to
    /// place `handler` at `r`; `None` when it cannot (the probe stays in
    /// `handler` for the next one).
    fn place_handler_on(
        &mut self,
        t: TargetId,
        kind: MechKind,
        r: &ResolvedProbe,
        handler: &HandlerAsk,
        label: &str,
        existing: Option<ProbeId>,
    ) -> Result<Option<Placement>, EngineError> {
        let symbols;
        let plan = match kind {
            MechKind::Fast => {
                let Some(pid) = self.slot(t)?.pid else {
                    return Ok(None);
                };
                let Ok(s) = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32) else {
                    return Ok(None);
                };
                symbols = s;
                let plan = self.plan_resolved(t, r, false, false, Some(&symbols))?;
                if !matches!(plan, Plan::Fast { .. }) {
                    return Ok(None);
                }
                plan
            }
            _ => Plan::Trap(String::new()),
        };
        let mut ask = self.ask(r, label.to_string(), (false, false), None);
        ask.handler = Some(handler);
        ask.existing = existing;
        if kind == MechKind::InProcess {
            ask.inproc_refusal = self.inproc_refusal(t)?;
        }
        let (mut cx, mechs) = self.slot(t)?.parts();
        let Some(m) = mechs.get(kind) else {
            return Ok(None);
        };
        Ok(m.place(&mut cx, ask, plan)?.ok())
    }

    /// Runs the shared-memory handler calls of slot `i` for up to
    /// `timeout` (without one: `UNTIMED_SERVE`, or `UNTIMED_TRACED_SERVE`
    /// when a stop ends the wait): spinning for the next request for the
    /// handler spin, then sleeping on the doorbell, until a call, or what
    /// `wake` adds, or a signal.
    pub(super) fn serve_handlers(
        &mut self,
        i: usize,
        timeout: Option<Duration>,
        wake: ServeWake,
    ) -> Served {
        let spin = self.spin();
        let slot = &mut self.slots[i];
        let Slot {
            engine,
            target,
            agent,
            ..
        } = slot;
        let agent::Agent {
            state,
            handlers: shm_handlers,
            taken: shm_taken,
            ..
        } = agent;
        let AgentState::On(fp) = state else {
            return Served::default();
        };
        // Made before the first look at the doorbell: a status there
        // already, or coming from here on, rings it.
        let rang = match wake {
            ServeWake::Stops => fp.ring_doorbell_on_child(),
            _ => None,
        };
        let bound = match (wake, &rang) {
            (ServeWake::Calls, _) => UNTIMED_SERVE,
            (ServeWake::Stops, Some(_)) => UNTIMED_TRACED_SERVE,
            _ => TRACED_SERVE_SLICE,
        };
        let timeout = match (wake, &rang) {
            (ServeWake::Calls, _) | (ServeWake::Stops, Some(_)) => timeout,
            _ => Some(timeout.map_or(bound, |t| t.min(bound))),
        };
        let deadline = Instant::now() + timeout.unwrap_or(bound);
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
                    let symbolizer = engine.symbolizer();
                    let mut ctx = crate::HitContext {
                        target: RefCell::new(target.as_target()),
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
                        stack: None,
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
            let child_rang = rang.as_ref().is_some_and(|r| r.fired());
            let now = Instant::now();
            if stop || child_rang || now >= deadline {
                return Served { stop, child_rang };
            }
            // Without a caller's timeout, a sleep never shorter than the
            // kernel's tick (5 ms past the cycle's end at most): a shorter
            // timed wait programs the timer each time, which costs a
            // hand-over microseconds in a VM.
            let until = match timeout {
                None => deadline.max(now + Duration::from_millis(5)),
                Some(_) => deadline,
            };
            if !fp.wait_handler_calls(seen, spin, until) {
                // A signal: the loop looks at why it came (Ctrl-C).
                return Served {
                    stop,
                    child_rang: false,
                };
            }
        }
    }
}
