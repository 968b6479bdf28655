//! The fast path's patch and jump sites: a compiler's placeholder NOP
//! rewritten into a call to the agent, or a function's first instructions
//! moved to a trampoline that calls it (`hotprobe_fastpath`). No trap, no
//! stop. One module for both: they differ only in how the fast path
//! rewrites the entry, which it chooses.
//!
//! The agent is a resource of the target this mechanism shares with the
//! in-process trap (see `agent.rs`): its counters count for both (read by
//! the session, `Session::stats_by_process`), its rings are drained by the
//! session, and what happens to the agent's writes at an exec, an exit or
//! an unmapping (forgotten, the image is gone) is done here for both.

use super::*;
use crate::session::agent::{sync_agent_writes, AgentState};
use crate::session::foreign::note_foreign_writes;
use crate::session::from_fast;
use hotprobe_target::RuntimeAddr;
use hotprobe_target::Target;
use std::collections::HashSet;
use std::path::Path;

/// The fast path's state beside the agent's.
#[derive(Default)]
pub(crate) struct FastMech {
    /// Probes removed while the target ran (`Session::remove_probe`):
    /// their counts stay readable, nothing else applies to them.
    removed: HashSet<ProbeId>,
}

impl FastMech {
    /// Places a pre-handler probe (`ask.handler`) at a function's entry on
    /// a patch or a jump whose `call` goes to the agent's handler
    /// trampoline (the register file handed over through shared memory,
    /// no signal) as `plan` says; `Ok(Err(why))`, the probe left in
    /// `ask.handler`, where it does not fit.
    fn place_stub_handler(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        handler: &HandlerAsk,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        let (r, label, choice, existing) = (ask.r, ask.label, ask.choice, ask.existing);
        let (spin, timeout) = (handler.spin, handler.timeout);
        let Plan::Fast {
            path,
            bias,
            function,
            reason,
            ..
        } = plan
        else {
            return Ok(Err("not a fast-path site".into()));
        };
        let Some(probe) = handler.take() else {
            return Ok(Err("no handler probe left to place".into()));
        };
        let refused = |probe, why: String| {
            handler.give_back(probe);
            Ok(Err(why))
        };
        if probe.post.is_some() {
            return refused(probe, "a post handler runs after the instruction".into());
        }
        let started = cx.engine.started;
        let (AgentState::On(fp), Some(pt)) = (&mut cx.agent.state, cx.target.process()) else {
            return refused(probe, "the agent is not loaded".into());
        };
        let placed = fp.add_stub_handler(pt, &path, bias, &function, choice);
        if started {
            if let Err(e) = pt.resume_all() {
                handler.give_back(probe);
                return Err(e.into());
            }
        }
        let info = match placed {
            Ok(info) => info,
            Err(e) => return refused(probe, e.to_string()),
        };
        fp.set_handler_wait(spin, timeout);
        let id = existing.unwrap_or_else(|| cx.ids.take());
        cx.agent.add_handler(id, info.probe_id, probe);
        sync_agent_writes(cx.agent, cx.ledger);
        cx.ledger.add_probe(info.addr, (id, false));
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

    /// Notes probe `id` as removed by a hand-over to the trap (its counts
    /// stay readable).
    pub(crate) fn mark_removed(&mut self, id: ProbeId) {
        self.removed.insert(id);
    }
}

impl ProbeMechanism for FastMech {
    fn kind(&self) -> MechKind {
        MechKind::Fast
    }

    /// A function entry the fast path can rewrite: what
    /// `FastPath::plan` says of it (patch, then jump).
    fn plan(
        &mut self,
        cx: &mut Cx<'_>,
        ask: &SiteAsk<'_>,
        _before: Option<String>,
    ) -> Result<Verdict, EngineError> {
        let (r, choice) = (ask.r, ask.choice);
        let forced = matches!(choice, MechanismChoice::Patch | MechanismChoice::Jump);
        let Some(symbols) = ask.symbols else {
            return Ok(Verdict::Pass("guest probes use the GDB stub".into()));
        };
        let trap_only = if choice == MechanismChoice::Trap {
            Some("--mechanism trap".to_string())
        } else if ask.is_return && !ask.record {
            Some("return counts use a return probe".to_string())
        } else if r.offset != 0 || !r.is_entry() {
            Some("not a function entry (the fast path probes entries)".to_string())
        } else {
            None
        };
        if let Some(why) = trap_only {
            if forced {
                return Err(EngineError::RefusedSpec {
                    spec: r.to_string(),
                    reason: format!("--mechanism patch|jump applies to function entries: {why}"),
                });
            }
            return Ok(Verdict::Pass(why));
        }
        let Some(module) = symbols.modules().iter().find(|m| m.contains(r.addr)) else {
            return Ok(Verdict::Pass("no module maps this address".into()));
        };
        // The file the symbols were read from: a program or library
        // replaced on disk since it was mapped is read through the
        // mapping (`/proc/PID/map_files`), never through its old path,
        // which now names another file (issue 22).
        let (path, bias) = (module.module.path().to_path_buf(), module.bias.0);
        let fp = match cx.agent.ensure(cx.target, &ask.fast_path) {
            Ok(fp) => fp,
            Err(why) if !forced => return Ok(Verdict::Pass(why)),
            Err(why) => {
                return Err(EngineError::RefusedSpec {
                    spec: r.to_string(),
                    reason: why,
                })
            }
        };
        let function = match fp.function_at(&path, r.link_addr.0, r.function.as_deref()) {
            Ok(f) => f,
            Err(e) if !forced => return Ok(Verdict::Pass(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let mut plan = fp.plan(&path, &function, choice)?;
        if plan.mechanism
            == hotprobe_fastpath::Mechanism::Patch(hotprobe_fastpath::PatchKind::Coldpatch)
            && wants_values(ask)
        {
            // A coldpatched -finstrument-functions placeholder runs after
            // the prologue, with the hook's arguments in the registers,
            // and its exit before the return value is in rax: no value
            // read there is the function's. The entry is, on a jump (or
            // the next mechanism's trap).
            let why = "arguments and return values are not the function's at a coldpatched \
                       -finstrument-functions placeholder (it runs after the prologue)";
            if choice == MechanismChoice::Patch {
                return Err(EngineError::RefusedSpec {
                    spec: r.to_string(),
                    reason: format!("{why}: use --mechanism jump or trap"),
                });
            }
            plan = match fp.plan(&path, &function, MechanismChoice::Jump) {
                Ok(p) => hotprobe_fastpath::SitePlan {
                    reason: format!("{} ({why})", p.reason),
                    ..p
                },
                Err(e) => return Ok(Verdict::Pass(format!("{why}; no jump: {e}"))),
            };
        }
        Ok(match plan.mechanism {
            hotprobe_fastpath::Mechanism::Trap => Verdict::Pass(plan.reason),
            _ => Verdict::Take(Plan::Fast {
                path,
                bias,
                function,
                reason: plan.reason,
                site: plan.site.wrapping_add(bias),
                len: plan.len,
                jump: plan.mechanism == hotprobe_fastpath::Mechanism::Jump,
            }),
        })
    }

    fn place(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        if let Some(handler) = ask.handler {
            return self.place_stub_handler(cx, ask, handler, plan);
        }
        let Plan::Fast {
            path,
            bias,
            function,
            reason,
            jump,
            ..
        } = plan
        else {
            return Ok(Err("not a fast-path site".into()));
        };
        // A jump planned where the choice alone would give a placeholder
        // (values read at a coldpatch placeholder's function): installed
        // as planned.
        let choice = match (jump, ask.choice) {
            (true, MechanismChoice::Auto) => MechanismChoice::Jump,
            (_, c) => c,
        };
        let (r, record, label) = (ask.r, ask.record, ask.label);
        let id = match ask.existing {
            Some(id) => id,
            None => cx.ids.take(),
        };
        let started = cx.engine.started;
        let AgentState::On(fp) = &mut cx.agent.state else {
            unreachable!("planned on the fast path")
        };
        let pt = cx
            .target
            .process()
            .ok_or_else(|| EngineError::RefusedSpec {
                spec: label.clone(),
                reason: "not a process".into(),
            })?;
        let entry_only = r.no_return.clone().filter(|_| record);
        let action = if let Some(rule) = ask.agg {
            // Aggregated in the target: counted, no event; return values
            // at the return.
            let a = hotprobe_fastpath::Action::count().with_agg(rule);
            match (rule.source, &entry_only) {
                (hotprobe_fastpath::agg::AGG_SRC_RETVAL, None) => a.with_exit(),
                _ => a,
            }
        } else if record {
            let a = hotprobe_fastpath::Action::record();
            let a = match entry_only {
                Some(_) => a,
                None => a.with_exit(),
            };
            let a = match ask.xmm {
                Some(k) => a.with_xmm(k),
                None => a,
            };
            match ask.program {
                Some(p) => a.with_capture(p),
                None => a,
            }
        } else {
            hotprobe_fastpath::Action::count()
        };
        // `--stacks`: every entry walks its stack (issue 24).
        let stacks = fp.stacks().is_some();
        let action = if stacks { action.with_stack() } else { action };
        if ask.batching {
            fp.begin_batch();
        }
        let info = fp.add_function(pt, Path::new(&path), bias, &function, action, choice);
        if started && !fp.in_batch() {
            pt.resume_all()?;
        }
        let info = info?;
        cx.agent.bind(id, info.probe_id, info.exit_probe_id);
        if stacks {
            if let Some(n) = cx.agent.refresh_stacks(pt.pid()) {
                cx.notice(n);
            }
        }
        sync_agent_writes(cx.agent, cx.ledger);
        cx.ledger.add_probe(info.addr, (id, record));
        let mechanism = from_fast(info.mechanism);
        Ok(Ok(Placement {
            id,
            label,
            addr: RuntimeAddr(info.addr),
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism,
            reason,
            execution: mechanism.to_string(),
            entry_only,
        }))
    }

    fn set_enabled(&mut self, cx: &mut Cx<'_>, id: ProbeId, on: bool) -> Result<(), EngineError> {
        if self.removed.contains(&id) {
            return Err(EngineError::NoSuchProbe(id));
        }
        cx.agent
            .change(cx.engine, cx.target, cx.inbox, id, |fp, pt, c| {
                fp.set_probe_enabled(pt, c, on).map(|_| ())
            })
    }

    fn remove(&mut self, cx: &mut Cx<'_>, id: ProbeId) -> Result<(), EngineError> {
        if self.removed.contains(&id) {
            return Err(EngineError::NoSuchProbe(id));
        }
        cx.agent
            .change(cx.engine, cx.target, cx.inbox, id, |fp, pt, c| {
                fp.remove_probe(pt, c).map(|_| ())
            })?;
        self.removed.insert(id);
        // Its site stays in the ledger while another probe holds it (the
        // fast path took the bytes out otherwise).
        cx.ledger.drop_probe(id);
        sync_agent_writes(cx.agent, cx.ledger);
        // Its counters stay readable (stats); no handler call is served
        // any more (a thread waiting in one resumes unmodified).
        cx.agent.take_handler(id);
        Ok(())
    }

    /// The agent's counters count for this mechanism: the session reads
    /// them once for both of the agent's mechanisms (`Agent::add_counts`).
    fn stats(&self, _engine: &Engine, _id: ProbeId, _me: i32, _by: &mut ByProcess) -> bool {
        false
    }

    /// The agent's rings are drained by the session (for both of the
    /// agent's mechanisms, merged with the trap's events).
    fn drain(
        &mut self,
        _sink: &mut dyn EventSink,
        _queued: &mut Vec<(RecordedEvent, Option<Vec<u8>>)>,
    ) -> Result<(u64, u64), SinkError> {
        Ok((0, 0))
    }

    /// The image the agent wrote into is gone (exec, exit): its writes are
    /// forgotten, nothing is restored. Counts and rings stay the
    /// session's.
    ///
    /// A fork changes nothing here: the session's walk of the ledger puts
    /// the original bytes back into a child not followed, and a followed
    /// child's agent counts through the sites it keeps into slots of its
    /// own (`FastPath::set_follow_forks`). A module mapped changes nothing
    /// either: pending probes in it are placed by the session
    /// (`Session::refresh_pending`), the agent's pages are where they were.
    fn on_change(&mut self, cx: &mut Cx<'_>, change: &TargetChange) {
        let AgentState::On(fp) = &mut cx.agent.state else {
            return;
        };
        match change {
            TargetChange::Exec => {
                let n = cx.agent.counters.len();
                if !fp.is_detached() && n > 0 {
                    let who = cx.target.as_target().describe();
                    cx.inbox.notice(
                        cx.engine,
                        format!(
                            "{who}: exec: {n} fast-path probes dropped (their counts and events \
                         before the exec are kept)"
                        ),
                    );
                }
                fp.forget();
            }
            TargetChange::Exited => fp.forget(),
            TargetChange::Forked { .. } | TargetChange::ModuleMapped => return,
        }
        sync_agent_writes(cx.agent, cx.ledger);
    }

    /// The agent's writes at those sites (patch calls, jumps, in-process
    /// traps: its one list) are forgotten, nothing is written; the probes
    /// the ledger had on them went with them (a shared-memory handler is
    /// kept for the probe's next arming).
    fn forget_sites(&mut self, cx: &mut Cx<'_>, gone: &[GoneSite]) -> Vec<ProbeId> {
        let addrs: Vec<u64> = gone.iter().map(|s| s.addr).collect();
        if let AgentState::On(fp) = &mut cx.agent.state {
            fp.forget_sites(&addrs);
        }
        sync_agent_writes(cx.agent, cx.ledger);
        let mut probes: Vec<ProbeId> = gone.iter().flat_map(|s| s.probes.clone()).collect();
        probes.dedup();
        probes
    }

    /// Every thread stopped, none strictly inside a site's bytes (patch
    /// calls, jumps, in-process traps: the agent's one list), every site's
    /// action off.
    fn prepare_detach(&mut self, cx: &mut Cx<'_>) -> Result<DetachReady, EngineError> {
        let (AgentState::On(fp), Some(pt)) = (&mut cx.agent.state, cx.target.process()) else {
            return Ok(DetachReady::Nothing);
        };
        Ok(match fp.prepare_detach(pt)? {
            true => DetachReady::Ready,
            false => DetachReady::Nothing,
        })
    }

    /// Its shared-memory ledger entries dropped and the agent it injected
    /// unloaded at the target's detach once its bytes are out; forgotten
    /// when the target is gone; the sites another writer changed named.
    fn finish_detach(&mut self, cx: &mut Cx<'_>, walked: Walked) -> Result<(), EngineError> {
        if let (AgentState::On(fp), Some(pt)) = (&mut cx.agent.state, cx.target.process()) {
            match walked {
                Walked::Restored { foreign } => fp.finish_detach(pt, foreign),
                Walked::Gone => fp.forget(),
                Walked::Failed | Walked::Skipped => {}
            }
        }
        note_foreign_writes(cx.engine, cx.agent, cx.inbox);
        Ok(())
    }

    fn detach(&mut self, cx: &mut Cx<'_>, gone: bool) -> Result<(), EngineError> {
        let AgentState::On(fp) = &mut cx.agent.state else {
            return Ok(());
        };
        if gone {
            fp.forget();
            return Ok(());
        }
        let Some(pt) = cx.target.process() else {
            return Ok(());
        };
        let r = fp.detach(pt);
        note_foreign_writes(cx.engine, cx.agent, cx.inbox);
        Ok(r?)
    }
}

/// Whether a probe reads values at its site (argument registers, typed
/// values, a return value, an aggregation of one): not at a coldpatch
/// placeholder.
fn wants_values(ask: &SiteAsk<'_>) -> bool {
    use hotprobe_fastpath::agg::{AGG_SRC_COMM, AGG_SRC_TID};
    ask.nargs > 0
        || ask.capture.is_some()
        || ask.program.is_some()
        || ask.xmm.is_some()
        || ask
            .agg
            .is_some_and(|a| !matches!(a.source, AGG_SRC_TID | AGG_SRC_COMM))
}
