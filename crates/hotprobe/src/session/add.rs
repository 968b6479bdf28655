//! Adding probes: handler and return probes on the trap, and `Count` and
//! `Record` probes on the mechanism the plan chose for each match of a
//! spec.

use super::resolve::{is_pattern, not_an_entry, not_loaded, not_whole_function, short};
use super::*;

impl Session {
    /// Put a probe with handlers on the instruction named by `spec`, on
    /// the ptrace trap (a stop of the target per hit, the handlers run
    /// with it stopped). [`Session::add`] with [`Action::Handler`] picks
    /// the cheapest mechanism instead: a handler through shared memory at
    /// a patch or jump site or an in-process trap, no ptrace stop.
    pub fn probe(&mut self, t: TargetId, spec: &str, probe: Probe) -> Result<ProbeId, EngineError> {
        let r = self.resolve_one(t, spec)?;
        self.probe_addr(t, r.addr, probe)
    }

    /// Put a probe on a run-time address (no symbol checks).
    pub fn probe_addr(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
        probe: Probe,
    ) -> Result<ProbeId, EngineError> {
        self.note_plugin_overlap(t, addr, true);
        self.before_trap_at(t, addr)?;
        let config = self.config.fast_path;
        let (mut cx, mechs) = self.slot(t)?.parts();
        mechs.trap.add_probe(&mut cx, addr, probe, &config)
    }

    /// Put a return probe on the function named by `spec` (its entry).
    pub fn retprobe(
        &mut self,
        t: TargetId,
        spec: &str,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        let r = self.resolve_one(t, spec)?;
        if !r.is_entry() {
            return Err(not_an_entry(spec, &r));
        }
        self.retprobe_addr(t, r.addr, rp)
    }

    /// Put a return probe on the function entered at `addr`. Refused on
    /// functions that return twice (`setjmp`, `vfork`, …) and on Go
    /// functions (see [`crate::nonlocal`]).
    pub fn retprobe_addr(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
        rp: RetProbe,
    ) -> Result<ProbeId, EngineError> {
        self.note_plugin_overlap(t, addr, true);
        if let Some(pid) = self.slot(t)?.pid {
            crate::nonlocal::check_return_probe(pid, addr)?;
        }
        self.before_trap_at(t, addr)?;
        let config = self.config.fast_path;
        let (mut cx, mechs) = self.slot(t)?.parts();
        mechs.trap.add_retprobe(&mut cx, addr, rp, &config)
    }

    /// What `Record` probes added from now on read at their hits beyond the
    /// argument registers: a function the chooser gives a [`Capture`] is
    /// put on the trap mechanism (the capture reads the stopped thread's
    /// vector registers and memory at the hit, so a string is copied while
    /// its pointer is alive), its events reach the sink with the captured
    /// bytes. Children followed after a fork record registers only.
    pub fn set_capture(&mut self, chooser: Option<CaptureChooser>) {
        self.capture = chooser;
    }

    /// Which `Record` probes added from now on record float and double
    /// values from xmm registers on the fast path (patch or jump, with
    /// 64-byte event slots): a function the chooser gives `Some(k)` and
    /// the fast path takes records the first `k` integer argument
    /// registers then xmm0, xmm1, … (its events carry
    /// `hotprobe_abi::EVENT_XMM`), and is not given a [`Capture`]. Others
    /// (no fast path, compact slots) go to the capture chooser as before.
    pub fn set_xmm_layout(&mut self, chooser: Option<XmmChooser>) {
        self.xmm_layout = chooser;
    }

    /// Which `Record` probes added from now on copy typed values in the
    /// target (strings, fields through pointers, stack arguments) on the
    /// fast path (patch or jump, 64-byte event slots): a function the
    /// chooser gives a program and the fast path takes has its entries'
    /// values written by the agent in front of the entry event (the sink
    /// gets them with it, as from a trap's capture), and is not given a
    /// [`Capture`]. Others go to the capture chooser as before.
    pub fn set_fast_capture(&mut self, chooser: Option<FastCaptureChooser>) {
        self.fast_capture = chooser;
    }

    /// Put probes doing `action` on every address `spec` names (a pattern
    /// in a function name names every matching function), each on the
    /// cheapest mechanism that fits — patch, then jump, then trap for
    /// processes; the stub for guests — or on the session's forced one.
    /// Handler actions take one address. For a pattern, matches that
    /// cannot be probed are returned as skipped; otherwise they are errors.
    pub fn add(&mut self, t: TargetId, spec: &str, action: Action) -> Result<Added, EngineError> {
        self.add_filtered(t, spec, action, &|_| true)
    }

    /// As [`Session::add`], with `mechanism` for this spec alone instead of
    /// the session's ([`SessionConfig::mechanism`]): `Trap` is the ptrace
    /// trap, `Patch` and `Jump` the fast path's, `Auto` the usual choice
    /// (an in-process trap where no patch or jump fits). A probe at an
    /// address another mechanism serves joins that site whatever is asked
    /// (its placement says which serves it; see the code ledger in
    /// docs/DESIGN.md).
    pub fn add_using(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        mechanism: MechanismChoice,
    ) -> Result<Added, EngineError> {
        let session = std::mem::replace(&mut self.config.mechanism, mechanism);
        let added = self.add(t, spec, action);
        self.config.mechanism = session;
        added
    }

    /// As [`Session::add`], leaving out the matches whose function name
    /// `keep` refuses (counted in [`Added::left_out`], not probed). The
    /// fast-path sites of all the matches are written in one batch, the
    /// target's threads stopped once (see
    /// [`hotprobe_fastpath::FastPath::begin_batch`]).
    pub fn add_filtered(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Added, EngineError> {
        self.batching = true;
        let record = matches!(action, Action::Record);
        let counting = matches!(action, Action::Count | Action::Record);
        let added = self.add_filtered_unbatched(t, spec, action, keep);
        let added = if counting {
            self.remember_for_exec(t, spec, record, added)
        } else {
            added
        };
        self.batching = false;
        let flushed = self.end_batch(t);
        let added = added?;
        flushed?;
        Ok(added)
    }

    /// Writes what target `t`'s fast path held back in a batch (see
    /// [`Session::add_filtered`]) and lets a started target run again.
    pub(super) fn end_batch(&mut self, t: TargetId) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        let Slot { target, agent, .. } = slot;
        let Some(fp) = agent.fast_path_mut() else {
            return Ok(());
        };
        if !fp.in_batch() {
            return Ok(());
        }
        let Some(pt) = Slot::process(target) else {
            return Ok(());
        };
        let r = fp.end_batch(pt);
        if started {
            pt.resume_all()?;
        }
        Ok(r?)
    }

    pub(super) fn add_filtered_unbatched(
        &mut self,
        t: TargetId,
        spec: &str,
        action: Action,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Added, EngineError> {
        let parsed: ProbeSpec = spec.parse()?;
        let is_return = parsed.is_return();
        // A module glob (`'*:malloc'`) names functions of several modules:
        // a pattern too, each row named `module:function`.
        let module_glob =
            matches!(&parsed, ProbeSpec::Function { module: Some(m), .. } if is_pattern(m));
        let pattern =
            module_glob || matches!(&parsed, ProbeSpec::Function { name, .. } if is_pattern(name));
        match action {
            Action::Handler(p) => {
                let r = match self.resolve_one(t, spec) {
                    Err(e) if not_loaded(&e) => {
                        return self.add_pending(
                            t,
                            spec,
                            Some(p),
                            None,
                            (false, true),
                            is_return,
                            e,
                        )
                    }
                    r => r?,
                };
                let placed = self.place_handler_probe(t, &r, p, spec.to_string())?;
                return Ok(Added {
                    placements: vec![placed],
                    ..Added::default()
                });
            }
            Action::Return(rp) => {
                let r = match self.resolve_one(t, spec) {
                    Err(e) if not_loaded(&e) => {
                        return self.add_pending(t, spec, None, Some(rp), (false, false), true, e)
                    }
                    r => r?,
                };
                if !r.is_entry() {
                    return Err(not_an_entry(spec, &r));
                }
                if let Some(why) = &r.no_return {
                    return Err(EngineError::RefusedSpec {
                        spec: spec.into(),
                        reason: why.clone(),
                    });
                }
                let id = self.retprobe_addr(t, r.addr, rp)?;
                return Ok(Added {
                    placements: vec![self.placement(t, id, spec.to_string(), &r, None)],
                    ..Added::default()
                });
            }
            Action::Count | Action::Record => {}
        }
        let record = matches!(action, Action::Record);
        let found = match self.resolve_unchecked(t, spec) {
            Err(e) if not_loaded(&e) && !pattern => {
                let (p, rp) = self.trap_form(t, is_return, record, None, true)?;
                return self.add_pending(t, spec, p, rp, (true, false), is_return, e);
            }
            found => found?,
        };
        let many = found.len() > 1;
        let mut added = Added::default();
        let symbols = match self.slot(t)?.pid {
            Some(pid) => Some(self.process_symbols(t, pid)?),
            None => None,
        };
        for r in found {
            if matches!(r.function.as_deref(), Some(f) if !keep(f)) {
                added.left_out += 1;
                continue;
            }
            let label = match (&r.function, pattern || many) {
                (Some(f), true) if r.offset == 0 && pattern => {
                    let m = if module_glob {
                        format!("{}:", r.module)
                    } else {
                        String::new()
                    };
                    format!("{m}{f}{}", if is_return { "%return" } else { "" })
                }
                (_, true) => format!("{spec} @ {}", short(&r)),
                (_, false) => spec.to_string(),
            };
            // A pattern names functions: a `.cold` partition or a label
            // it matches is none (whatever the action).
            if let (true, Some(why)) = (pattern, r.kind.as_ref().and_then(|k| k.summary())) {
                added.skipped.push(Skipped {
                    label,
                    reason: format!("not a function entry: {why}"),
                });
                continue;
            }
            // A USDT marker is an instruction its note names: recorded as
            // a hit (see `TrapMech::form_at`), no entry needed.
            if (record && !r.usdt || is_return) && r.offset == 0 && !r.is_entry() {
                return Err(not_an_entry(spec, &r));
            }
            // No return to hook: `%return` is refused, recording takes
            // the entries only (see `entry_only`).
            if let (true, Some(why)) = (is_return, &r.no_return) {
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: why.clone(),
                    });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason: why.clone(),
                });
            }
            // Inside a function, an in-process trap records hit events
            // (no return to hook); nothing else records there.
            let mid_record = record && r.offset != 0;
            // A USDT marker's hits are recorded on the ptrace trap as well
            // (`TrapMech::form_at`'s hit form): the trap a program a
            // followed process executed gets, or `--mechanism trap`.
            let trap_hits = r.usdt && self.config.mechanism == MechanismChoice::Trap;
            if mid_record
                && (pattern
                    || is_return
                    || (self.config.mechanism != MechanismChoice::Auto && !trap_hits))
            {
                let e = not_whole_function(spec, &r);
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: e.to_string(),
                    });
                    continue;
                }
                return Err(e);
            }
            if let Err(e) = self.check(t, spec, &r) {
                if pattern {
                    added.skipped.push(Skipped {
                        label,
                        reason: match e {
                            EngineError::RefusedSpec { reason, .. } => reason,
                            e => e.to_string(),
                        },
                    });
                    continue;
                }
                return Err(e);
            }
            let mut plan = match self.plan_resolved(t, &r, is_return, record, symbols.as_deref()) {
                // A forced mechanism with a pattern: what cannot take it
                // is listed, the rest placed (issue 23).
                Err(e) if pattern && self.config.mechanism != MechanismChoice::Auto => {
                    let reason = match e {
                        EngineError::RefusedSpec { reason, .. } => reason,
                        e => e.to_string(),
                    };
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                plan => plan?,
            };
            let full_slots = self.config.fast_path.record_args > 2;
            let xmm = match (&self.xmm_layout, record && !is_return, &plan) {
                (Some(choose), true, Plan::Fast { .. }) if full_slots => choose(&r),
                _ => None,
            };
            let program = match (&self.fast_capture, record && !is_return, &plan, xmm) {
                (Some(choose), true, Plan::Fast { .. }, None) if full_slots => choose(&r),
                _ => None,
            };
            // A second typed probe on a function the fast path serves
            // already would chain a second return hook on the same frame,
            // which the agent takes for a tail call: the first hook's exit
            // is dropped as unwound (a typed capture's return values came
            // back empty). Its values are read at the trap instead, which
            // joins the site or is refused with the reason.
            let program = program.filter(|_| !self.fast_site_at(t, r.addr));
            let capture = match (&self.capture, record && !is_return, xmm, program) {
                (Some(choose), true, None, None) => choose(&r),
                _ => None,
            };
            if capture.is_some() && !matches!(plan, Plan::Trap(_)) {
                plan = Plan::Trap("typed values read at the hit (DWARF)".into());
            }
            let fast_ok = capture.is_none() && (record || !is_return);
            plan = self.fit_to_ledger(t, &r, plan, fast_ok)?;
            // The ledger moved it off the fast path: its typed values are
            // read at the hit instead of copied in the target.
            let (program, capture) = match (program, &self.capture) {
                (Some(_), Some(choose)) if !matches!(plan, Plan::Fast { .. }) => (None, choose(&r)),
                (program, _) => (program, capture),
            };
            if let (true, Plan::Trap(why) | Plan::Join(why)) = (self.config.no_traps, &plan) {
                let reason = format!("needs a trap ({why})");
                if pattern {
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                });
            }
            // An in-process trap may still take it (refused below if not);
            // typed values (captured at the hit) need the ptrace trap.
            let inproc_first =
                !is_return && capture.is_none() && self.config.mechanism == MechanismChoice::Auto;
            if let (Plan::Trap(why) | Plan::Join(why), true, false) = (
                &plan,
                record && !self.config.record_traps && capture.is_none(),
                inproc_first && !matches!(plan, Plan::Join(_)),
            ) {
                let reason = format!("needs the trap mechanism ({why})");
                if pattern {
                    added.skipped.push(Skipped { label, reason });
                    continue;
                }
                return Err(EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                });
            }
            let placed = match std::mem::replace(&mut plan, Plan::Trap(String::new())) {
                fast @ Plan::Fast { .. } => {
                    let plan = typed_reason(fast, xmm, program.is_some());
                    let placed =
                        self.place_fast(t, &r, plan, record, (xmm, program), label.clone(), None);
                    match (placed, &self.capture) {
                        // Reading them at the hit needs the ptrace trap:
                        // not under --no-traps (issue 23).
                        (Err(EngineError::FastPath(why)), Some(_))
                            if (xmm.is_some() || program.is_some()) && self.config.no_traps =>
                        {
                            let reason = format!(
                                "needs a trap (typed values read at the hit; fast path: {why})"
                            );
                            if pattern {
                                added.skipped.push(Skipped { label, reason });
                                continue;
                            }
                            return Err(EngineError::RefusedSpec {
                                spec: spec.into(),
                                reason,
                            });
                        }
                        // The fast path refused the xmm layout (compact
                        // slots, coldpatch exits) or the copy in the
                        // target (coldpatch, a full capture table): the
                        // values are read at the hit instead, as without.
                        (Err(EngineError::FastPath(why)), Some(choose))
                            if xmm.is_some() || program.is_some() =>
                        {
                            let capture = choose(&r);
                            let reason =
                                format!("typed values read at the hit (DWARF); fast path: {why}");
                            self.place_trap(t, &r, is_return, record, reason, label, capture)
                        }
                        (placed, _) => placed,
                    }
                }
                Plan::Trap(reason) if inproc_first => {
                    match self.place_inproc(t, &r, &reason, label.clone(), record)? {
                        Ok(p) => Ok(p),
                        Err(why) if mid_record => Err(match not_whole_function(spec, &r) {
                            EngineError::RefusedSpec { spec, reason } => EngineError::RefusedSpec {
                                spec,
                                reason: format!("{reason}; in-process trap: {why}"),
                            },
                            e => e,
                        }),
                        Err(why) => {
                            let reason = format!("{reason}; in-process trap: {why}");
                            if record && !self.config.record_traps && capture.is_none() {
                                Err(EngineError::RefusedSpec {
                                    spec: spec.into(),
                                    reason: format!("needs the trap mechanism ({reason})"),
                                })
                            } else {
                                self.place_trap(t, &r, is_return, record, reason, label, capture)
                            }
                        }
                    }
                }
                Plan::Trap(reason) | Plan::Join(reason) => {
                    self.place_trap(t, &r, is_return, record, reason, label, capture)
                }
                Plan::Plugin(reason) => self.place_plugin(t, &r, is_return, record, reason, label),
            };
            let semaphore = r.semaphore;
            match placed {
                Ok(p) => {
                    if let Some(at) = semaphore {
                        self.raise_semaphore(t, at)?;
                    }
                    added.placements.push(p)
                }
                Err(e) if pattern => added.skipped.push(Skipped {
                    label: r.function.clone().unwrap_or_else(|| r.addr.to_string()),
                    reason: e.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        let slot = self.slot(t)?;
        slot.sync_ledger();
        if record && !added.placements.is_empty() {
            slot.recording = true;
        }
        self.maybe_release(t.0);
        Ok(added)
    }

    /// Places a `Count` or `Record` probe at `r` on a fast-path site as
    /// `plan` says (`existing`: under that probe id, a pending one's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place_fast(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        plan: Plan,
        record: bool,
        (xmm, program): (Option<u8>, Option<hotprobe_abi::capture::CapturePrograms>),
        label: String,
        existing: Option<ProbeId>,
    ) -> Result<Placement, EngineError> {
        let mut ask = self.ask(r, label, (r.is_return, record), None);
        ask.xmm = xmm;
        ask.program = program;
        // The chooser sees `%return` specs too (return values).
        ask.agg = match (&self.aggregate, record) {
            (Some(choose), true) => choose(r),
            _ => None,
        };
        ask.existing = existing;
        let spec = ask.label.clone();
        self.place_on(t, MechKind::Fast, ask, plan)?
            .map_err(|reason| EngineError::RefusedSpec { spec, reason })
    }

    /// Places a `Count` or `Record` probe at `r` on the trap, `reason`
    /// saying why (`capture`: what a `Record` reads at its hits).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place_trap(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        reason: String,
        label: String,
        capture: Option<Capture>,
    ) -> Result<Placement, EngineError> {
        let mut ask = self.ask(r, label, (is_return, record), None);
        ask.capture = capture;
        let spec = ask.label.clone();
        self.place_on(t, MechKind::Trap, ask, Plan::Trap(reason))?
            .map_err(|reason| EngineError::RefusedSpec { spec, reason })
    }

    /// Places a `Count` (or, `record`, a `Record`) probe at `r` as an
    /// in-process trap; `Ok(Err(why))` when the site cannot take one (the
    /// caller falls back to the trap). `fallback`: why not the fast path.
    pub(super) fn place_inproc(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        fallback: &str,
        label: String,
        record: bool,
    ) -> Result<Result<Placement, String>, EngineError> {
        if self.config.fast_path.stacks && r.is_entry() && (!record || self.config.record_traps) {
            // The in-process trap walks no stacks; the ptrace trap's are
            // walked in hotprobe (`stacks::trap`).
            return Ok(Err(
                "--stacks: stacks at a trap are walked in hotprobe".into()
            ));
        }
        let ask = self.ask(r, label, (r.is_return, record), None);
        self.place_on(
            t,
            MechKind::InProcess,
            ask,
            Plan::Trap(fallback.to_string()),
        )
    }

    /// A `Count` or `Record` probe on a guest's QEMU plugin.
    pub(super) fn place_plugin(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        reason: String,
        label: String,
    ) -> Result<Placement, EngineError> {
        let ask = self.ask(r, label, (is_return, record), None);
        let spec = ask.label.clone();
        self.place_on(t, MechKind::Plugin, ask, Plan::Plugin(reason))?
            .map_err(|reason| EngineError::RefusedSpec { spec, reason })
    }

    /// The trap form of a `Count` (`%return`: a return probe) or `Record`
    /// action on target `t` (see `TrapMech::form`).
    pub(super) fn trap_form(
        &mut self,
        t: TargetId,
        is_return: bool,
        record: bool,
        capture: Option<Capture>,
        exits: bool,
    ) -> Result<(Option<Probe>, Option<RetProbe>), EngineError> {
        let limits = (
            self.config.maxactive,
            self.config.fast_path.record_args.min(6) as usize,
        );
        let slot = self.slot(t)?;
        Ok(slot
            .mechs
            .trap
            .form(is_return, record, capture, exits, limits))
    }
}

/// A fast-path plan's reason, saying where its typed values come from:
/// xmm registers (`xmm`), or a copy in the target (`copied`).
pub(super) fn typed_reason(mut plan: Plan, xmm: Option<u8>, copied: bool) -> Plan {
    if let Plan::Fast { reason, .. } = &mut plan {
        match (xmm, copied) {
            (Some(_), _) => reason.push_str("; float/double values from xmm registers"),
            (None, true) => reason.push_str("; typed values copied in the target"),
            (None, false) => {}
        }
    }
    plan
}
