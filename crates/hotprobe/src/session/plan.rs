//! Where a resolved site goes: an ordered choice over the target's
//! mechanisms (the plugin, the fast path, then the trap, which takes what
//! the others passed on, with their reason), fitted to the code ledger:
//!
//! - a site of the trap engine at the address: the new probe joins it
//!   (the engine serves several probes on one `int3`);
//! - an in-process trap there: the new probe goes on the ptrace trap,
//!   which takes the in-process one over (`before_trap_at`);
//! - a jump of the fast path starting there, and the new probe is a count
//!   or record the fast path takes with a jump too: the new jump chains on
//!   it (its trampoline runs the first's), both count;
//! - otherwise a fast-path site whose bytes hold the address (a second count, a
//!   `%return` or a handler at a patch's or jump's entry, `mix+3` inside
//!   the jump at `mix`): a site calls the agent for one probe, so the
//!   site's probes are handed to the trap engine (their counts go on
//!   there; a recording one is refused instead), the original bytes come
//!   back, and the new probe goes on the trap;
//! - a jump or patch that would cover another site is planned as a trap.
//!
//! No mechanism ever writes over another's bytes.

use super::ledger::CodeOwner;
use super::mech::{SiteAsk, Verdict};
use super::*;

/// Where a resolved site goes.
pub(super) enum Plan {
    /// A patch or jump of the fast path.
    Fast {
        path: PathBuf,
        bias: u64,
        function: FunctionInfo,
        reason: String,
        /// The run-time address and length of the bytes it rewrites.
        site: u64,
        len: usize,
        /// A jump (not a patch's call): a second jump at the same entry
        /// chains on it (`fit_to_ledger`).
        jump: bool,
    },
    /// The trap (or, where allowed, an in-process trap), and why.
    Trap(String),
    /// The ptrace trap, joining a site already at the address: never an
    /// in-process trap.
    Join(String),
    /// The guest's QEMU plugin.
    Plugin(String),
}

impl Session {
    /// A stub probe where the guest's QEMU plugin instruments too (`stub`:
    /// a stub probe is being added; else a plugin probe): the stub emulates
    /// the instruction or runs it out of line, so the plugin's probes there
    /// do not see those executions. Said in a notice.
    pub(super) fn note_plugin_overlap(&mut self, t: TargetId, addr: RuntimeAddr, stub: bool) {
        let Ok(slot) = self.slot(t) else { return };
        let Some(p) = &slot.mechs.plugin else { return };
        let plugin_there = !stub || p.plugin.is_site(addr.0);
        let stub_there = stub || slot.engine.execution_of(addr).is_some();
        if plugin_there && stub_there {
            slot.notice(format!(
                "{addr}: a GDB-stub probe shares this address with QEMU-plugin probes: the \
                 executions the stub handles (it emulates the instruction or runs it out of \
                 line) are not seen by the plugin's probes"
            ));
        }
    }

    /// What a `Count` (or, `record`, a `Record`) probe at `r` asks of a
    /// mechanism, with the session's settings.
    pub(super) fn ask<'r>(
        &self,
        r: &'r ResolvedProbe,
        label: String,
        (is_return, record): (bool, bool),
        symbols: Option<&'r hotprobe_symbols::ProcessSymbols>,
    ) -> SiteAsk<'r> {
        SiteAsk {
            r,
            label,
            is_return,
            record,
            capture: None,
            xmm: None,
            program: None,
            agg: None,
            existing: None,
            choice: self.config.mechanism,
            maxactive: self.config.maxactive,
            nargs: self.config.fast_path.record_args.min(6) as usize,
            fast_path: self.config.fast_path,
            batching: self.batching,
            inproc_refusal: None,
            plugin: self.plugin_options.clone(),
            return_thunk: None,
            symbols,
            handler: None,
        }
    }

    /// Plans `r` by asking the target's mechanisms in order (see the
    /// module docs): the first that takes it, with the reason the ones
    /// before it passed.
    pub(super) fn plan_resolved(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        is_return: bool,
        record: bool,
        symbols: Option<&hotprobe_symbols::ProcessSymbols>,
    ) -> Result<Plan, EngineError> {
        let symbols = symbols.filter(|_| self.slots.get(t.0).is_some_and(Slot::is_process));
        let ask = self.ask(r, String::new(), (is_return, record), symbols);
        let slot = self.slot(t)?;
        let (mut cx, mechs) = slot.parts();
        let mut before = None;
        for m in mechs.planning_order() {
            match m.plan(&mut cx, &ask, before.take())? {
                Verdict::Take(plan) => return Ok(plan),
                Verdict::Pass(why) => before = Some(why),
            }
        }
        unreachable!("the trap mechanism takes every site")
    }

    /// Places `ask` on mechanism `kind` as `plan` says, noting which
    /// mechanism serves the probe. The trap first takes over what another
    /// mechanism has at the address (`before_trap_at`).
    pub(super) fn place_on(
        &mut self,
        t: TargetId,
        kind: MechKind,
        mut ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        let addr = ask.r.addr;
        match kind {
            MechKind::Trap => {
                self.note_plugin_overlap(t, addr, true);
                if let (true, Some(pid)) = (ask.is_return || ask.record, self.slot(t)?.pid) {
                    if ask.is_return || ask.r.no_return.is_none() {
                        crate::nonlocal::check_return_probe(pid, addr)?;
                    }
                }
                self.before_trap_at(t, addr)?;
            }
            MechKind::InProcess => {
                ask.inproc_refusal = self.inproc_refusal(t)?;
            }
            MechKind::Plugin => {
                let wants = self
                    .slot(t)?
                    .mechs
                    .plugin
                    .as_ref()
                    .is_some_and(|p| p.wants_thunk());
                if wants {
                    ask.return_thunk = self
                        .resolve_unchecked(t, "__x86_return_thunk")
                        .ok()
                        .and_then(|v| v.first().map(|r| r.addr.0));
                }
            }
            MechKind::Fast => {}
        }
        // Made pending again if its module is unloaded (`unmapped.rs`).
        let placed_spec = self.placed_spec(t, &ask);
        let slot = self.slot(t)?;
        let stub_there = slot.engine.execution_of(addr).is_some();
        let at_entry = ask.r.is_entry();
        let (mut cx, mechs) = slot.parts();
        let Some(m) = mechs.get(kind) else {
            return Ok(Err("not a mechanism of this target".into()));
        };
        let placed = m.place(&mut cx, ask, plan)?;
        if let Ok(p) = &placed {
            if kind != MechKind::Trap {
                slot.owner.insert(p.id, kind);
            }
            if let (Some(spec), true) = (placed_spec, slot.pid.is_some()) {
                slot.placed_specs.insert(p.id, spec);
            }
            if kind == MechKind::Plugin && stub_there {
                self.note_plugin_overlap(t, addr, false);
            }
            if kind == MechKind::Trap {
                self.trap_stacks_placed(t, p.id, at_entry);
            }
        }
        Ok(placed)
    }

    /// The placement of trap probe `id` at `r`, as a table shows it.
    pub(super) fn placement(
        &mut self,
        t: TargetId,
        id: ProbeId,
        label: String,
        r: &ResolvedProbe,
        reason: Option<String>,
    ) -> Placement {
        let slot = &self.slots[t.0];
        let process = slot.is_process();
        slot.mechs
            .trap
            .placement(&slot.engine, process, (id, label), r, reason)
    }

    /// Whether a fast-path site with probes starts at `addr` of target `t`.
    pub(super) fn fast_site_at(&mut self, t: TargetId, addr: RuntimeAddr) -> bool {
        let Ok(slot) = self.slot(t) else {
            return false;
        };
        if !slot.is_process() {
            return false;
        }
        slot.sync_ledger();
        slot.ledger.site_at(addr.0).is_some_and(|site| {
            site.owner == CodeOwner::Fast && site.start == addr.0 && site.has_probes()
        })
    }

    /// Fits `plan`, made for a new probe at `r` from the file, to the
    /// sites already in target `t` (see the module docs). `fast_ok`: the
    /// fast path could serve the new probe's action (a count or a record
    /// of entries, nothing read at the hit), said in the reason when a
    /// fast-path site is there already.
    pub(super) fn fit_to_ledger(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        plan: Plan,
        fast_ok: bool,
    ) -> Result<Plan, EngineError> {
        let a = r.addr.0;
        let slot = self.slot(t)?;
        if !slot.is_process() {
            return Ok(plan);
        }
        slot.sync_ledger();
        if let Some(site) = slot.ledger.site_at(a) {
            let start = site.start;
            return match site.owner {
                CodeOwner::Trap | CodeOwner::Guard => {
                    Ok(Plan::Join("joins the trap already at this address".into()))
                }
                CodeOwner::InProcess => Ok(Plan::Join(
                    "joins the in-process trap at this address (taken over by the trap, which \
                     serves both)"
                        .into(),
                )),
                CodeOwner::Inherited => Err(EngineError::RefusedSpec {
                    spec: r.addr.to_string(),
                    reason: format!(
                        "{} lies in code this followed child inherited from its parent's fast \
                         path (at {start:#x})",
                        r.addr
                    ),
                }),
                CodeOwner::Fast => {
                    let here = start == a && site.has_probes();
                    // A count or record jump at the entry of a function
                    // whose entry holds a jump of ours already chains on
                    // it: its trampoline runs the first jump's, each probe
                    // counts (the two counts of `count f f`, of C's
                    // `hotprobe_count_if` beside `hotprobe_count`).
                    let chains = matches!(&plan, Plan::Fast { site, jump: true, .. } if *site == a);
                    if here && fast_ok && chains && slot.jump_at(start) {
                        return Ok(plan);
                    }
                    // Any other fast-path site calls the agent for one
                    // probe (one site key, one counter, one action): a
                    // second probe there goes to the trap with the site's
                    // probes, never onto the site's bytes (a patch written
                    // over a patch or a jump took the first's call for the
                    // original code, and its probe counted nothing).
                    // `before_trap_at` hands the site over.
                    let why = match (here, fast_ok) {
                        (true, true) => "a fast-path site serves one probe",
                        (true, false) => "the fast path cannot serve this probe",
                        (false, _) => "this address lies in its bytes",
                    };
                    Ok(Plan::Join(format!(
                        "the fast-path site at {start:#x} goes to the trap, which serves both \
                         ({why})"
                    )))
                }
            };
        }
        if let Plan::Fast { site, len, .. } = &plan {
            let (site, end) = (*site, *site + *len as u64);
            if let Some(other) = slot.ledger.first_start_in(site + 1, end) {
                return Ok(Plan::Trap(format!(
                    "a probe at {other:#x} lies in the {} bytes the fast path would rewrite",
                    end - site
                )));
            }
        }
        Ok(plan)
    }

    /// Before the engine places a breakpoint at `addr` of target `t`: a
    /// released process is taken back (the engine's `int3`s need ptrace),
    /// and what the agent's mechanisms have at `addr` is handed over to
    /// the engine: an in-process trap (its `int3` taken out, a trap probe
    /// at the same address counting on for it, its handler moved there if
    /// it has one), or a fast-path site whose bytes hold `addr`
    /// ([`Session::hand_fast_to_trap`]) — the engine's site cannot share
    /// the bytes.
    pub(super) fn before_trap_at(
        &mut self,
        t: TargetId,
        addr: RuntimeAddr,
    ) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        let started = slot.engine.started;
        if let Some(pt) = Slot::process(&mut slot.target) {
            if pt.is_released() {
                pt.reacquire()?;
                if started {
                    pt.resume_all()?;
                }
            }
        }
        let (mut cx, mechs) = slot.parts();
        let Some(inproc) = mechs.inproc.as_mut() else {
            return Ok(());
        };
        match inproc.hand_over(&mut cx, addr.0)? {
            Some((id, probe)) => {
                mechs.trap.take_over(&mut cx, id, addr, probe)?;
                slot.owner.insert(id, MechKind::Trap);
                Ok(())
            }
            // A jump or patch whose bytes hold `addr` goes to the engine.
            None => self.hand_fast_to_trap(t, addr),
        }
    }

    /// Before the engine writes an `int3` at `at` of target `t`: a
    /// fast-path site whose bytes hold `at` is handed to the trap engine:
    /// each of its probes (counts, shared-memory handlers) goes on as a
    /// trap probe at the site's address, counting on from where it was,
    /// and the site's original bytes come back. Refused (nothing changed)
    /// when one of them records: its events would change hands in the
    /// middle of a call.
    pub(super) fn hand_fast_to_trap(
        &mut self,
        t: TargetId,
        at: RuntimeAddr,
    ) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        if slot.agent.fast_path().is_none() {
            return Ok(());
        }
        slot.sync_ledger();
        let Some(site) = slot
            .ledger
            .site_at(at.0)
            .filter(|s| s.owner == CodeOwner::Fast)
        else {
            return Ok(());
        };
        let start = site.start;
        let probes: Vec<(ProbeId, bool)> = site.probes().collect();
        if probes.is_empty() {
            return Err(EngineError::RefusedSpec {
                spec: at.to_string(),
                reason: format!(
                    "{at} lies in bytes the fast path rewrote at {start:#x} (an exit \
                     placeholder or a stub) for no probe that can move to the trap"
                ),
            });
        }
        if probes.iter().any(|(_, record)| *record) {
            return Err(EngineError::RefusedSpec {
                spec: at.to_string(),
                reason: format!(
                    "the fast-path site at {start:#x} records calls, and a probe there or in \
                     its bytes needs the trap: place this probe first, or put both on the trap \
                     (--mechanism trap)"
                ),
            });
        }
        let addr = RuntimeAddr(start);
        slot.ledger.take_fast_site(start);
        // The last placed first: a jump chained on another (its original
        // bytes are the earlier jump) is taken out before the one it
        // chains on, so each puts back what it found and the file's bytes
        // are there at the end.
        for (id, _) in probes.into_iter().rev() {
            let (mut cx, mechs) = slot.parts();
            let probe = cx.agent.take_handler(id).unwrap_or_default();
            cx.agent
                .change(cx.engine, cx.target, cx.inbox, id, |fp, pt, c| {
                    fp.remove_probe(pt, c).map(|_| ())
                })?;
            if let Some(f) = mechs.fast.as_mut() {
                f.mark_removed(id);
            }
            mechs.trap.take_over(&mut cx, id, addr, probe)?;
            slot.owner.insert(id, MechKind::Trap);
        }
        slot.sync_ledger();
        let who = slot.target.as_target().describe();
        slot.notice(format!(
            "{who}: the fast-path site at {start:#x} was handed to the trap for a probe at \
             {at}, which serves both (their counts go on)"
        ));
        Ok(())
    }
}

impl Slot {
    /// Whether the code at `addr` starts with a `jmp rel32` (`e9`): a
    /// fast-path site there is a jump, not a patch's `call` (`e8`).
    fn jump_at(&mut self, addr: u64) -> bool {
        let mut b = [0u8; 1];
        self.target
            .read_memory(RuntimeAddr(addr), &mut b)
            .is_ok_and(|()| b[0] == 0xe9)
    }
}
