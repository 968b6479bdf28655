//! The in-process trap ([`crate::Mechanism::InProcessTrap`]): an `int3`
//! the agent's `SIGTRAP` handler takes inside the target
//! (`hotprobe_fastpath::FastPath::add_inproc`), no ptrace stop.
//!
//! A `Count` probe whose site neither a patch nor a jump can take (a
//! function shorter than 5 bytes, a jump target, an instruction inside a
//! function) goes here when the target has the agent. It stays on the
//! ptrace trap, with both reasons, where the instruction cannot run
//! in-process (see `hotprobe-fastpath`'s `inproc` module), where the engine
//! has a breakpoint at the same address, or with `--mechanism trap`. A
//! handler probe goes here too, its handlers run in the session through
//! shared memory (`session/handlers.rs`).

use super::*;
use crate::session::agent::{sync_agent_writes, AgentState};
use crate::session::foreign::note_foreign_writes;
use crate::session::{Mechanism, Probe};
use hotprobe_target::Target;
use std::collections::HashMap;

/// The in-process traps placed.
#[derive(Default)]
pub(crate) struct InProcMech {
    /// Probe → (address, has a shared-memory handler).
    probes: HashMap<ProbeId, (u64, bool)>,
    /// Address → probe.
    at: HashMap<u64, ProbeId>,
}

impl InProcMech {
    /// The probe on the in-process trap at `addr`.
    pub(crate) fn probe_at(&self, addr: u64) -> Option<ProbeId> {
        self.at.get(&addr).copied()
    }

    fn insert(&mut self, id: ProbeId, addr: u64, handler: bool) {
        self.probes.insert(id, (addr, handler));
        self.at.insert(addr, id);
    }

    /// Places a probe whose pre (and post) handler runs in the session
    /// through shared memory (`ask.handler`), as an in-process trap at
    /// `r` (a post handler: a second hand-over after the displaced
    /// instruction); `Ok(Err(why))`, the probe left in `ask.handler`, when
    /// the site cannot take one.
    fn place_handler(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        handler: &HandlerAsk,
    ) -> Result<Result<Placement, String>, EngineError> {
        let (r, label, existing) = (ask.r, ask.label, ask.existing);
        let (spin, timeout) = (handler.spin, handler.timeout);
        if let Some(why) = ask.inproc_refusal {
            return Ok(Err(why));
        }
        let Some(probe) = handler.take() else {
            return Ok(Err("no handler probe left to place".into()));
        };
        let refused = |probe, why: &str| {
            handler.give_back(probe);
            Ok(Err(why.to_string()))
        };
        let post = probe.post.is_some();
        let pre = probe.pre.is_some();
        let started = cx.engine.started;
        let AgentState::On(fp) = &mut cx.agent.state else {
            return refused(probe, "the agent is not loaded");
        };
        let Some(pt) = cx.target.process() else {
            return refused(probe, "not a process");
        };
        let placed = fp.add_inproc_handler(pt, r.addr.0, post);
        if started {
            if let Err(e) = pt.resume_all() {
                handler.give_back(probe);
                return Err(e.into());
            }
        }
        let info = match placed {
            Ok(info) => info,
            Err(e) => return refused(probe, &e.to_string()),
        };
        fp.set_handler_wait(spin, timeout);
        let id = existing.unwrap_or_else(|| cx.ids.take());
        cx.agent.add_handler(id, info.probe_id, probe);
        self.insert(id, r.addr.0, true);
        sync_agent_writes(cx.agent, cx.ledger);
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

    /// Takes the in-process trap at `addr` out for the trap engine, which
    /// takes its probe over (see `Session::before_trap_at`): the probe,
    /// and its shared-memory handler if it had one.
    pub(crate) fn hand_over(
        &mut self,
        cx: &mut Cx<'_>,
        addr: u64,
    ) -> Result<Option<(ProbeId, Probe)>, EngineError> {
        let Some(id) = self.probe_at(addr) else {
            return Ok(None);
        };
        let started = cx.engine.started;
        if let (AgentState::On(fp), Some(pt)) = (&mut cx.agent.state, cx.target.process()) {
            let r = fp.remove_inproc(pt, addr);
            let resumed = match started {
                true => pt.resume_all(),
                false => Ok(()),
            };
            note_foreign_writes(cx.engine, cx.agent, cx.inbox);
            resumed?;
            r?;
        }
        cx.ledger
            .remove(addr, crate::session::ledger::CodeOwner::InProcess);
        self.probes.remove(&id);
        self.at.remove(&addr);
        let probe = cx.agent.take_handler(id).unwrap_or_default();
        Ok(Some((id, probe)))
    }
}

impl ProbeMechanism for InProcMech {
    fn kind(&self) -> MechKind {
        MechKind::InProcess
    }

    /// Tried at placement, where the trap was planned (see
    /// [`Mechs::planning_order`]).
    fn plan(
        &mut self,
        _cx: &mut Cx<'_>,
        _ask: &SiteAsk<'_>,
        before: Option<String>,
    ) -> Result<Verdict, EngineError> {
        Ok(Verdict::Take(Plan::Trap(before.unwrap_or_default())))
    }

    /// Places a `Count` (or a `Record`) probe as an in-process trap; the
    /// plan's reason is why the fast path did not take it.
    fn place(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        if let Some(handler) = ask.handler {
            return self.place_handler(cx, ask, handler);
        }
        let Plan::Trap(fallback) = plan else {
            return Ok(Err("not a trap site".into()));
        };
        if let Some(why) = ask.inproc_refusal {
            return Ok(Err(why));
        }
        let (r, record) = (ask.r, ask.record);
        if cx.engine.execution_of(r.addr).is_some() {
            return Ok(Err("a trap probe is already at this address".into()));
        }
        if let Err(why) = cx.agent.ensure(cx.target, &ask.fast_path) {
            return Ok(Err(why));
        }
        let started = cx.engine.started;
        // A probe made pending when its module went is armed again under
        // its id.
        let id = ask.existing.unwrap_or_else(|| cx.ids.take());
        let AgentState::On(fp) = &mut cx.agent.state else {
            return Ok(Err("the agent is not loaded".into()));
        };
        let Some(pt) = cx.target.process() else {
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
        cx.agent.bind(id, info.probe_id, None);
        self.insert(id, r.addr.0, false);
        sync_agent_writes(cx.agent, cx.ledger);
        let entry_only = r.no_return.clone().filter(|_| record);
        Ok(Ok(Placement {
            id,
            label: ask.label,
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

    fn set_enabled(&mut self, cx: &mut Cx<'_>, id: ProbeId, on: bool) -> Result<(), EngineError> {
        if let (Some(&(addr, handler)), Some(fp)) = (self.probes.get(&id), cx.agent.fast_path()) {
            fp.set_inproc_enabled(addr, handler, on);
        }
        Ok(())
    }

    /// Disabled for good (its handler dropped); the `int3` goes at detach.
    fn remove(&mut self, cx: &mut Cx<'_>, id: ProbeId) -> Result<(), EngineError> {
        if let (Some(&(addr, handler)), Some(fp)) = (self.probes.get(&id), cx.agent.fast_path()) {
            fp.set_inproc_enabled(addr, handler, false);
        }
        cx.agent.take_handler(id);
        Ok(())
    }

    /// The agent's counters count for this mechanism: the session reads
    /// them once for both of the agent's mechanisms (`Agent::add_counts`).
    fn stats(&self, _engine: &Engine, _id: ProbeId, _me: i32, _by: &mut ByProcess) -> bool {
        false
    }

    /// Its events are in the agent's rings, drained by the session.
    fn drain(
        &mut self,
        _sink: &mut dyn EventSink,
        _queued: &mut Vec<(RecordedEvent, Option<Vec<u8>>)>,
    ) -> Result<(u64, u64), SinkError> {
        Ok((0, 0))
    }

    /// Exec, exit: the agent's writes are forgotten by the fast path's
    /// module (one list for both), and so are its sites here: a site the
    /// new image gets at the same address (the same program run again by
    /// `exec`) is a new probe's, which the old one's removal or disabling
    /// must not touch. Their counts stay in the agent's counters.
    ///
    /// A fork changes nothing here: the session's walk of the ledger puts
    /// the original bytes back into a child not followed, and a followed
    /// child's agent takes the traps it keeps with its own counters. A
    /// module mapped changes nothing either: pending probes in it are
    /// placed by the session (`Session::refresh_pending`).
    fn on_change(&mut self, _cx: &mut Cx<'_>, change: &TargetChange) {
        match change {
            TargetChange::Exec | TargetChange::Exited => {
                self.probes.clear();
                self.at.clear();
            }
            TargetChange::Forked { .. } | TargetChange::ModuleMapped => {}
        }
    }

    /// Its traps at those sites are forgotten (the fast path's module
    /// forgets the agent's bytes there): their probes went with them.
    fn forget_sites(&mut self, _cx: &mut Cx<'_>, gone: &[GoneSite]) -> Vec<ProbeId> {
        let mut probes = Vec::new();
        for s in gone {
            if let Some(id) = self.at.remove(&s.addr) {
                self.probes.remove(&id);
                probes.push(id);
            }
        }
        probes
    }

    /// Taken out with the agent's other writes (`FastPath::detach`).
    fn detach(&mut self, _cx: &mut Cx<'_>, _gone: bool) -> Result<(), EngineError> {
        Ok(())
    }
}
