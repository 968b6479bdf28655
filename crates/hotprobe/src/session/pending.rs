//! Probes on modules that are not loaded: pending, armed at the dynamic
//! loader's rendezvous when the module is mapped, before its constructors
//! run; disarmed (nothing written: the memory is gone) when it is
//! unmapped.

use super::resolve::{not_an_entry, not_loaded};
use super::*;

/// A probe whose module was not loaded when it was added (or was
/// unloaded since): armed at the dynamic loader's rendezvous when the
/// module is mapped, before its constructors run; disarmed (nothing
/// written: the memory is gone) when it is unmapped.
pub(super) struct Pending {
    /// The spec, resolved again at each change of the loaded modules.
    spec: String,
    /// What the user sees: the spec, or, for a probe placed while its
    /// module was loaded, its placement's label.
    pub(super) label: String,
    /// The probe (an unarmed engine probe with the trap form of its action).
    pub(super) id: ProbeId,
    /// `Count` or `Record`: the fast path may take it.
    fast_ok: bool,
    /// It was on the in-process trap before its module went: where the
    /// plan says trap, an in-process trap is tried first when it is armed
    /// again.
    inproc_first: bool,
    record: bool,
    is_return: bool,
    /// A probe with handlers ([`Action::Handler`]): placed when armed as
    /// one placed at once is (`Session::place_handler_probe`).
    handler: bool,
    /// The mechanism asked when it was added (the session's, or the
    /// spec's: [`Session::add_using`]): planned with it when armed.
    choice: MechanismChoice,
    /// Where it is armed now (disarmed by the walk of the ledger when its
    /// module goes: `unmapped.rs`).
    pub(super) armed: Option<RuntimeAddr>,
    /// Whether it was ever armed (its module loaded at some point).
    ever_armed: bool,
    /// The typed-value choosers the session had when it was added (a
    /// `Record` entry probe's): consulted when it is armed, as at a
    /// placement (`Session::add_filtered`).
    typing: PendingTyping,
}

/// The session's typed-value choosers ([`Session::set_xmm_layout`],
/// [`Session::set_fast_capture`], [`Session::set_capture`]) as they were
/// when a pending probe was added.
#[derive(Clone, Default)]
struct PendingTyping {
    xmm: Option<XmmChooser>,
    fast: Option<FastCaptureChooser>,
    capture: Option<CaptureChooser>,
}

/// What a pending `Record` probe's typed values are read with once armed:
/// the fast path's xmm layout or copy program, or a capture at the trap.
type TypedPick = (
    Option<u8>,
    Option<hotprobe_abi::capture::CapturePrograms>,
    Option<Capture>,
);

/// A probe placed while its module was loaded, as it was asked
/// (`Session::placed_spec`): made pending again, under its id, with its
/// mechanism choice and typed values, if the program unloads the module
/// (`Slot::pend_again`), so that it is armed again when the module comes
/// back, its counts going on.
pub(super) struct PlacedSpec {
    /// `module:function[+offset][%return]`, resolved again at each change
    /// of the loaded modules; `None`: not one to arm again (an address, a
    /// USDT marker).
    spec: Option<String>,
    /// What the user sees (its placement's label).
    pub(super) label: String,
    choice: MechanismChoice,
    /// `Count` or `Record` (else a probe with handlers).
    counting: bool,
    record: bool,
    is_return: bool,
    typing: PendingTyping,
    /// `maxactive` and the argument registers of its trap form.
    limits: (usize, usize),
    /// In a module the program loaded at run time (`dlopen`): it may
    /// unload it.
    pub(super) unloadable: bool,
}

/// A pending probe armed in a module the program loaded (its `dlopen`),
/// as an [`crate::EventSink`] is told of it
/// ([`crate::EventSink::pending_armed`]) before any of its events: what a
/// sink keeps per placed probe (a condition naming parameters, say) is
/// made for it here, from the module's file. Armed again after the
/// module was unloaded and loaded again, it is told again.
#[derive(Clone, Debug)]
pub struct ArmedPending {
    /// The process.
    pub pid: i32,
    /// The probe as armed: the pending probe's id and label, the address,
    /// function, module and mechanism it has in the loaded module.
    pub placement: Placement,
    /// What its spec resolved to in the module.
    pub resolved: ResolvedProbe,
    /// The module's file (its DWARF names the function's parameters).
    pub path: PathBuf,
}

impl Slot {
    /// Pending probe `id` removed (`Session::remove_probe`): its spec is
    /// no longer armed when its module is loaded (nor made pending again
    /// when its module goes).
    pub(super) fn drop_pending(&mut self, id: ProbeId) {
        self.pending.retain(|p| p.id != id);
        self.placed_specs.remove(&id);
    }

    /// Probe `id`, placed while its module was loaded, whose site went
    /// with the module: pending again (armed again when the module is
    /// loaded again, under its id, with the mechanism asked), its label
    /// returned; `Err` with its label or `None`, if it is not one to arm
    /// again (it counts nothing from now on).
    pub(super) fn pend_again(&mut self, id: ProbeId) -> Result<String, Option<String>> {
        let Some(placed) = self.placed_specs.remove(&id) else {
            return Err(None);
        };
        let Some(spec) = placed.spec else {
            return Err(Some(placed.label));
        };
        let on_trap = self.owner(id) == MechKind::Trap;
        let inproc_first = self.owner(id) == MechKind::InProcess;
        if placed.counting && !on_trap {
            // The trap form of its action, unarmed, for a plan that puts
            // it on the trap when it is armed again (as a pending probe
            // is held from the start).
            let (maxactive, nargs) = placed.limits;
            let form = self.mechs.trap.form(
                placed.is_return,
                placed.record,
                None,
                true,
                (maxactive, nargs),
            );
            let (mut cx, mechs) = self.parts();
            mechs.trap.add_unarmed_as(&mut cx, Some(id), form.0, form.1);
            self.owner.remove(&id);
        }
        self.pending.push(Pending {
            spec,
            label: placed.label.clone(),
            id,
            fast_ok: placed.counting,
            inproc_first,
            record: placed.record,
            is_return: placed.is_return,
            handler: !placed.counting,
            choice: placed.choice,
            armed: None,
            ever_armed: true,
            typing: placed.typing,
        });
        Ok(placed.label)
    }
}

impl Session {
    /// The pending probes armed so far as their modules were loaded, in
    /// the order they were armed (one armed again after an unload is
    /// listed again), as sinks are told of them
    /// ([`crate::EventSink::pending_armed`]).
    pub fn armed_pending(&self) -> &[ArmedPending] {
        &self.armed_pending
    }

    /// `placed` with each pending probe's placement replaced by where it
    /// was last armed ([`Session::armed_pending`]): the rows of a table
    /// printed after the run. One never armed stays as it was.
    pub fn as_armed(&self, mut placed: Vec<Placement>) -> Vec<Placement> {
        for p in placed
            .iter_mut()
            .filter(|p| p.mechanism == Mechanism::Pending)
        {
            if let Some(a) = self
                .armed_pending
                .iter()
                .rev()
                .find(|a| a.placement.id == p.id)
            {
                *p = a.placement.clone();
            }
        }
        placed
    }

    /// Whether probe `id` is a pending one whose module was never loaded
    /// (so it was never armed: a pattern over a library the program does
    /// not use). False for every other probe.
    pub fn never_armed(&self, id: ProbeId) -> bool {
        self.slots.iter().any(|s| {
            s.pending
                .iter()
                .any(|p| p.id == id && !p.ever_armed && p.armed.is_none())
        })
    }

    /// A probe on a module that is not loaded: pending, armed when the
    /// program maps the module (see [`Pending`]). `why` is the resolver's
    /// refusal, for targets that cannot follow their loader. `handler`: a
    /// probe with handlers (held unarmed on the trap until then).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_pending(
        &mut self,
        t: TargetId,
        spec: &str,
        probe: Option<Probe>,
        rp: Option<RetProbe>,
        (fast_ok, handler): (bool, bool),
        is_return: bool,
        why: EngineError,
    ) -> Result<Added, EngineError> {
        let record = fast_ok && rp.as_ref().is_some_and(|r| r.entry.is_some());
        let choice = self.config.mechanism;
        let slot = self.slot(t)?;
        if !slot.is_process() {
            return Err(why);
        }
        // Pending only for a library that exists: a misspelt name is an
        // error now, not a probe that waits forever.
        let module = match &why {
            EngineError::Symbol(hotprobe_symbols::SymbolError::ModuleNotFound { name, .. }) => {
                name.clone()
            }
            _ => return Err(why),
        };
        let program_dir = Slot::process(&mut slot.target)
            .and_then(|pt| pt.program().parent().map(Path::to_path_buf));
        if hotprobe_symbols::find_library(&module, program_dir.as_deref()).is_none() {
            return Err(why);
        }
        let typing = match record && !is_return {
            true => PendingTyping {
                xmm: self.xmm_layout.clone(),
                fast: self.fast_capture.clone(),
                capture: self.capture.clone(),
            },
            false => PendingTyping::default(),
        };
        let slot = self.slot(t)?;
        let (mut cx, mechs) = slot.parts();
        let id = mechs.trap.add_unarmed(&mut cx, probe, rp);
        slot.pending.push(Pending {
            spec: spec.to_string(),
            label: spec.to_string(),
            id,
            fast_ok,
            inproc_first: false,
            record,
            is_return,
            handler,
            choice,
            armed: None,
            ever_armed: false,
            typing,
        });
        if record {
            slot.recording = true;
        }
        Ok(Added {
            placements: vec![Placement {
                id,
                label: spec.to_string(),
                addr: RuntimeAddr(0),
                function: None,
                reason: format!("{module} is not loaded: armed when the program loads it"),
                module,
                is_return,
                mechanism: Mechanism::Pending,
                execution: "pending".into(),
                entry_only: None,
            }],
            ..Added::default()
        })
    }

    /// After the loaded modules changed (the loader's rendezvous, the
    /// thread stopped there, before any new constructor runs): the sites
    /// whose module went are forgotten in one walk of the ledger, their
    /// probes made pending (`unmapped.rs`); then pending probes whose
    /// module is now mapped are armed. What fails is said in a notice;
    /// the run goes on.
    pub(super) fn refresh_pending(&mut self, i: usize) {
        let t = TargetId(i);
        self.slots[i].forget_unmapped_sites();
        let Some(pid) = self.slots[i].pid else { return };
        if self.slots[i].pending.iter().all(|p| p.armed.is_some()) {
            return;
        }
        let syms = match hotprobe_symbols::ProcessSymbols::for_pid(pid as u32) {
            Ok(s) => s,
            Err(e) => {
                self.slots[i].notice(format!("pid {pid}: cannot read its modules: {e}"));
                return;
            }
        };
        for k in 0..self.slots[i].pending.len() {
            if self.slots[i].pending[k].armed.is_some() {
                continue;
            }
            let label = self.slots[i].pending[k].label.clone();
            match self.arm_pending(t, k, &syms) {
                Ok(()) => {}
                Err(e) if not_loaded(&e) => {}
                Err(e) => self.slots[i].notice(format!("pid {pid}: cannot arm {label}: {e}")),
            }
        }
        let (mut cx, mechs) = self.slots[i].parts();
        mechs.trap.publish(&mut cx);
    }

    /// How probe `ask` is made pending again if its module goes (see
    /// [`PlacedSpec`]): what was asked, and the session's typed-value
    /// choosers now (a `Record` entry probe's). `None` in a module the
    /// program cannot unload (the program, a library its loader mapped at
    /// the start): nothing to remember.
    pub(super) fn placed_spec(
        &mut self,
        t: TargetId,
        ask: &mech::SiteAsk<'_>,
    ) -> Option<PlacedSpec> {
        let r = ask.r;
        // Unknown (no modules read): remembered, without keeping the
        // process traced for it.
        let unloadable = self
            .slots
            .get_mut(t.0)
            .and_then(|slot| slot.unloadable_at(r.addr, ask.symbols));
        if unloadable == Some(false) {
            return None;
        }
        let spec = match (&r.function, r.usdt) {
            (Some(f), false) => {
                let offset = match r.offset {
                    0 => String::new(),
                    o => format!("+{o:#x}"),
                };
                let ret = if ask.is_return { "%return" } else { "" };
                Some(format!("{}:{f}{offset}{ret}", r.module))
            }
            _ => None,
        };
        let counting = ask.handler.is_none();
        let typing = match counting && ask.record && !ask.is_return {
            true => PendingTyping {
                xmm: self.xmm_layout.clone(),
                fast: self.fast_capture.clone(),
                capture: self.capture.clone(),
            },
            false => PendingTyping::default(),
        };
        Some(PlacedSpec {
            spec,
            unloadable: unloadable.unwrap_or(false),
            label: ask.label.clone(),
            choice: ask.choice,
            counting,
            record: counting && ask.record,
            is_return: counting && ask.is_return,
            typing,
            limits: (ask.maxactive, ask.nargs),
        })
    }

    /// Arms pending probe `k` of target `t` in the module that now maps
    /// its spec: a `Count` or `Record` as the plan says (the fast path
    /// where it takes it, else the trap), a probe with handlers as one
    /// placed at once is (`Session::place_handler_probe`); told to the
    /// sink as an [`ArmedPending`].
    pub(super) fn arm_pending(
        &mut self,
        t: TargetId,
        k: usize,
        syms: &hotprobe_symbols::ProcessSymbols,
    ) -> Result<(), EngineError> {
        let choice = self.slot(t)?.pending[k].choice;
        // Planned with the mechanism asked when it was added.
        let session = std::mem::replace(&mut self.config.mechanism, choice);
        let armed = self.arm_pending_as_asked(t, k, syms);
        self.config.mechanism = session;
        armed
    }

    fn arm_pending_as_asked(
        &mut self,
        t: TargetId,
        k: usize,
        syms: &hotprobe_symbols::ProcessSymbols,
    ) -> Result<(), EngineError> {
        let p = &self.slot(t)?.pending[k];
        let (spec, label, id) = (p.spec.clone(), p.label.clone(), p.id);
        let (fast_ok, record, is_return) = (p.fast_ok, p.record, p.is_return);
        let (handler, ever_armed, inproc_first) = (p.handler, p.ever_armed, p.inproc_first);
        let typing = self.slot(t)?.pending[k].typing.clone();
        let r = self.resolve_one(t, &spec)?;
        if (is_return || record) && !r.is_entry() {
            return Err(not_an_entry(&spec, &r));
        }
        let Some(m) = syms.modules().iter().find(|m| m.contains(r.addr)) else {
            return Err(EngineError::RefusedSpec {
                spec,
                reason: "no module maps its address".into(),
            });
        };
        let path = m.path.clone();
        let mut placement = if handler {
            self.arm_handler(t, id, &r, &label, ever_armed)?
        } else {
            let flags = (fast_ok, record, is_return, inproc_first);
            self.arm_counting(t, id, &r, &label, flags, syms, &typing)?
        };
        placement.reason = format!(
            "armed when the program loaded {}: {}",
            r.module, placement.reason
        );
        if let Some(at) = r.semaphore {
            // A USDT marker in a library loaded now: its semaphore is
            // raised as at a placement, so the program reaches it.
            self.raise_semaphore(t, at)?;
        }
        let slot = self.slot(t)?;
        slot.pending[k].ever_armed = true;
        slot.pending[k].armed = Some(r.addr);
        let pid = slot.pid.unwrap_or(0);
        self.armed_pending.push(ArmedPending {
            pid,
            placement,
            resolved: r,
            path,
        });
        Ok(())
    }

    /// Arms pending `Count` or `Record` probe `id` at `r`: on the fast
    /// path where the plan takes it (not in an image after an exec),
    /// else on the trap. A `Record` added with typed values asked
    /// (`typing`) gets them as a probe placed at once does: the xmm layout
    /// or a copy program on the fast path, else a capture at the trap.
    #[allow(clippy::too_many_arguments)]
    fn arm_counting(
        &mut self,
        t: TargetId,
        id: ProbeId,
        r: &ResolvedProbe,
        spec: &str,
        (fast_ok, record, is_return, inproc_first): (bool, bool, bool, bool),
        syms: &hotprobe_symbols::ProcessSymbols,
        typing: &PendingTyping,
    ) -> Result<Placement, EngineError> {
        // An image a followed process executed has no agent (the one the
        // session still holds is the old image's): traps only there, as
        // for the probes placed at its exec (a jump into the old agent's
        // trampolines killed the program with SIGSEGV).
        let fast_ok = fast_ok && !self.slot(t)?.execd;
        let mut plan = if fast_ok {
            self.plan_resolved(t, r, is_return, record, Some(syms))?
        } else {
            Plan::Trap("an image after an exec: traps (no agent in it)".into())
        };
        // A site another probe armed or placed there already is joined
        // or handed to the trap, never written over (`plan.rs`).
        plan = self.fit_to_ledger(t, r, plan, record || !is_return)?;
        let (xmm, program, mut capture) = self.typed_pick(t, r, &plan, typing);
        if capture.is_some() && matches!(plan, Plan::Fast { .. }) {
            plan = Plan::Trap("typed values read at the hit (DWARF)".into());
        }
        // Typed values read at the hit need the ptrace trap, as for a
        // probe placed at once (`Session::add_filtered`).
        let no_trap =
            (record && !self.config.record_traps && capture.is_none()) || self.config.no_traps;
        if let (Plan::Trap(why) | Plan::Join(why), true) = (&plan, no_trap) {
            return Err(EngineError::RefusedSpec {
                spec: spec.to_string(),
                reason: format!("needs the trap mechanism ({why})"),
            });
        }
        let why = match plan {
            fast @ Plan::Fast { .. } => {
                let plan = super::add::typed_reason(fast, xmm, program.is_some());
                let placed = self.place_fast(
                    t,
                    r,
                    plan,
                    record,
                    (xmm, program),
                    spec.to_string(),
                    Some(id),
                );
                match (placed, &typing.capture) {
                    // The fast path refused the xmm layout or the copy in
                    // the target: the values are read at the hit instead.
                    (Err(EngineError::FastPath(why)), Some(choose))
                        if (xmm.is_some() || program.is_some()) && !self.config.no_traps =>
                    {
                        capture = choose(r);
                        format!("typed values read at the hit (DWARF); fast path: {why}")
                    }
                    (placed, _) => {
                        let placed = placed?;
                        self.slot(t)?.sync_ledger();
                        return Ok(placed);
                    }
                }
            }
            Plan::Trap(why) | Plan::Join(why) | Plan::Plugin(why) => why,
        };
        if inproc_first && fast_ok && capture.is_none() && !is_return {
            if let Some(placed) = self.arm_inproc(t, id, r, spec, record, &why)? {
                return Ok(placed);
            }
        }
        if let Some(c) = capture {
            // Held with the trap form of its action since it was added:
            // given the capture its typed values are read with.
            self.give_capture(t, id, is_return, record, c)?;
        }
        self.before_trap_at(t, r.addr)?;
        let config = self.config.fast_path;
        let (mut cx, mechs) = self.slot(t)?.parts();
        mechs.trap.arm(&mut cx, id, r.addr, &config)?;
        // `--stacks`: its hits walk in the tracer, as a trap
        // placed at once does (a spec placed again after an exec
        // on a library the new image loads later is one).
        self.trap_stacks_placed(t, id, r.is_entry());
        Ok(self.placement(t, id, spec.to_string(), r, Some(why)))
    }

    /// Arms probe `id` at `r` on an in-process trap, where it was before
    /// its module went; `None` when the site cannot take one now (it goes
    /// on the trap, `why` saying why not the fast path).
    fn arm_inproc(
        &mut self,
        t: TargetId,
        id: ProbeId,
        r: &ResolvedProbe,
        spec: &str,
        record: bool,
        why: &str,
    ) -> Result<Option<Placement>, EngineError> {
        if self.config.fast_path.stacks {
            // The in-process trap walks no stacks (`Session::place_inproc`).
            return Ok(None);
        }
        let mut ask = self.ask(r, spec.to_string(), (false, record), None);
        ask.existing = Some(id);
        let placed = self.place_on(t, MechKind::InProcess, ask, Plan::Trap(why.into()))?;
        Ok(placed.ok())
    }

    /// The typed values a pending `Record` probe at `r` gets under `plan`,
    /// chosen as `Session::add_filtered` chooses them for a probe placed
    /// at once: the xmm layout or a copy program where the fast path takes
    /// it (64-byte slots, no fast site there yet), else a capture at the
    /// hit. Nothing for a probe added without typed values.
    fn typed_pick(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        plan: &Plan,
        typing: &PendingTyping,
    ) -> TypedPick {
        let fast = matches!(plan, Plan::Fast { .. }) && self.config.fast_path.record_args > 2;
        let xmm = match &typing.xmm {
            Some(choose) if fast => choose(r),
            _ => None,
        };
        let program = match &typing.fast {
            Some(choose) if fast && xmm.is_none() => choose(r),
            _ => None,
        };
        // A second return hook on a fast site would be taken for a tail
        // call (see `Session::add_filtered`).
        let program = program.filter(|_| !self.fast_site_at(t, r.addr));
        let capture = match &typing.capture {
            Some(choose) if xmm.is_none() && program.is_none() => choose(r),
            _ => None,
        };
        (xmm, program, capture)
    }

    /// Gives unarmed pending probe `id` the trap form of its action with
    /// `capture` (what its entries and returns read at the hit), in place
    /// of the form it was added with.
    fn give_capture(
        &mut self,
        t: TargetId,
        id: ProbeId,
        is_return: bool,
        record: bool,
        capture: Capture,
    ) -> Result<(), EngineError> {
        let (probe, rp) = self.trap_form(t, is_return, record, Some(capture), true)?;
        let slot = self.slot(t)?;
        let Some(entry) = slot.engine.probes.get_mut(&id) else {
            return Err(EngineError::NoSuchProbe(id));
        };
        use crate::engine::ProbeKind;
        match (&mut entry.kind, probe, rp) {
            (ProbeKind::Ret { entry, ret, .. }, _, Some(rp)) => {
                *entry = rp.entry;
                *ret = rp.ret;
            }
            (ProbeKind::Plain { pre, post }, Some(p), None) => {
                *pre = p.pre;
                *post = p.post;
            }
            _ => {}
        }
        Ok(())
    }

    /// Arms pending handler probe `id` at `r` as a handler probe placed
    /// at once is: planned and placed through the mechanisms
    /// (`Session::place_handler_probe`: a shared-memory handler at a
    /// patch or jump site or an in-process trap where one fits, else the
    /// trap), under its own id. One armed before on the trap (its module
    /// unloaded since) is armed there again, its counts going on.
    fn arm_handler(
        &mut self,
        t: TargetId,
        id: ProbeId,
        r: &ResolvedProbe,
        spec: &str,
        ever_armed: bool,
    ) -> Result<Placement, EngineError> {
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        let probe = match slot.agent.take_handler(id) {
            // Served through shared memory before its module went.
            Some(p) => p,
            None if ever_armed => {
                let (mut cx, mechs) = slot.parts();
                mechs.trap.arm(&mut cx, id, r.addr, &config)?;
                let why = "handlers run in hotprobe".to_string();
                return Ok(self.placement(t, id, spec.to_string(), r, Some(why)));
            }
            // Held unarmed on the trap since it was added: taken out, to
            // be placed where the plan says (the trap gives it back).
            None => match slot.engine.probes.remove(&id).map(|p| p.kind) {
                Some(crate::engine::ProbeKind::Plain { pre, post }) => Probe { pre, post },
                _ => return Err(EngineError::NoSuchProbe(id)),
            },
        };
        slot.owner.remove(&id);
        let handler = self.handler_ask(probe);
        let placed = self.place_handler_ask(t, r, &handler, spec.to_string(), Some(id));
        if let (Err(_), Some(probe)) = (&placed, handler.take()) {
            // Not placed: held unarmed again, for the next load.
            let slot = self.slot(t)?;
            slot.engine.add_unarmed(id, Some(probe), None);
        }
        placed
    }
}
