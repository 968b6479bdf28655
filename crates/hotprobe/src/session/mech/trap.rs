//! The trap mechanism: the trap engine ([`crate::Engine`]), an `int3`
//! per site handled through ptrace, or, on a guest, a breakpoint through
//! QEMU's GDB stub (the guest stub is this mechanism over the guest's
//! target). Besides the engine's probes it keeps what the session adds
//! around them: the publication of every `int3` in the agent's trap table
//! (with guards), the publisher probes of return probes, the probes a
//! followed child gets again, the probes it took over from the agent's
//! mechanisms, and the events of `Record` probes.

use super::super::ledger::CodeLedger;
use super::trap_event::{captured, trap_event};
use super::*;
use crate::handler::{Probe, RetProbe};
use crate::session::agent::Agent;
use crate::session::Mechanism;
use hotprobe_fastpath::{FastPathConfig, TrapTable};
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

mod table;

/// The trap mechanism's state beside the engine (see the module docs).
#[derive(Default)]
pub(crate) struct TrapMech {
    /// The `int3`s published in the agent's trap table (address →
    /// original byte), for the agent to undo if we die.
    published: HashMap<u64, u8>,
    /// `int3`s the trap table had no room for (past its
    /// [`hotprobe_fastpath::TRAP_SLOTS`]): they work (ptrace), but an agent
    /// whose tracer died cannot undo them. Not retried.
    pub(crate) overflow: HashSet<u64>,
    /// Guard `int3`s (address → the breakpoint they guard, one byte before).
    guards: HashMap<u64, u64>,
    /// Trap return probes → the plain probe, at the same address and just
    /// before them, that publishes each call in the trap table before the
    /// return address is swapped ([`publisher`]).
    pub(crate) publishers: HashMap<ProbeId, ProbeId>,
    /// Trap `Count`/`Record` probes a followed child gets too: (probe,
    /// address, `%return`, record, returns hooked).
    pub(crate) followable: Vec<(ProbeId, RuntimeAddr, bool, bool, bool)>,
    /// Probes of the agent's mechanisms handed over to the engine (a trap
    /// probe came to the same address, or into a jump's bytes: see
    /// `plan.rs`): probe → the engine probe that counts on for it.
    pub(crate) handed: HashMap<ProbeId, ProbeId>,
    /// Record probes push their events here, each entry with the id of
    /// the stack the tracer walked at it (`--stacks`; 0: none).
    events: Rc<RefCell<Vec<(RecordedEvent, u32)>>>,
    /// Bytes captured with the events: an event whose `reserved2` is
    /// `n > 0` carries entry `n - 1` (see [`Capture`]).
    data: Rc<RefCell<Vec<Vec<u8>>>>,
}

impl TrapMech {
    /// Puts a plain probe at `addr` (the caller handed over what another
    /// mechanism had there: `Session::before_trap_at`).
    pub(crate) fn add_probe(
        &mut self,
        cx: &mut Cx<'_>,
        addr: RuntimeAddr,
        probe: Probe,
        config: &FastPathConfig,
    ) -> Result<ProbeId, EngineError> {
        self.agent_for_traps(cx, config);
        self.prepublish(cx, addr);
        self.change(cx, |e, t, ids| {
            ids.place(|id| e.add_probe_as(t, id, addr, probe))
        })
    }

    /// Puts a return probe on the function entered at `addr`, after the
    /// probe that publishes each call in the trap table (the caller
    /// checked that the function returns once: `nonlocal`).
    pub(crate) fn add_retprobe(
        &mut self,
        cx: &mut Cx<'_>,
        addr: RuntimeAddr,
        rp: RetProbe,
        config: &FastPathConfig,
    ) -> Result<ProbeId, EngineError> {
        self.agent_for_traps(cx, config);
        let table = cx.agent.trap_table();
        self.prepublish(cx, addr);
        let (id, publishing) = self.change(cx, |e, t, ids| {
            let publishing = match table {
                Some(table) => Some(ids.place(|id| e.add_probe_as(t, id, addr, publisher(table)))?),
                None => None,
            };
            match ids.place(|id| e.add_retprobe_as(t, id, addr, rp)) {
                Ok(id) => Ok((id, publishing)),
                Err(err) => {
                    if let Some(p) = publishing {
                        let _ = e.remove_probe(t, p);
                    }
                    Err(err)
                }
            }
        })?;
        if let Some(p) = publishing {
            cx.engine.mark_internal(p);
            self.publishers.insert(id, p);
        }
        if let Some(pid) = cx.target.process().map(|p| p.pid()) {
            crate::nonlocal::sync_unwind_hooks(cx.engine, cx.target, pid, cx.inbox);
        }
        Ok(id)
    }

    /// An unarmed probe (a pending one: armed by [`TrapMech::arm`]), with
    /// its publisher if it is a return probe.
    pub(crate) fn add_unarmed(
        &mut self,
        cx: &mut Cx<'_>,
        probe: Option<Probe>,
        rp: Option<RetProbe>,
    ) -> ProbeId {
        self.add_unarmed_as(cx, None, probe, rp)
    }

    /// [`TrapMech::add_unarmed`], under probe id `id` if given (a probe of
    /// another mechanism made pending when its module was unloaded).
    pub(crate) fn add_unarmed_as(
        &mut self,
        cx: &mut Cx<'_>,
        id: Option<ProbeId>,
        probe: Option<Probe>,
        rp: Option<RetProbe>,
    ) -> ProbeId {
        let publishing = match (&rp, cx.agent.trap_table()) {
            (Some(_), Some(table)) => {
                let p = cx.ids.take();
                Some(cx.engine.add_unarmed(p, Some(publisher(table)), None))
            }
            _ => None,
        };
        let id = id.unwrap_or_else(|| cx.ids.take());
        let id = cx.engine.add_unarmed(id, probe, rp);
        if let Some(p) = publishing {
            cx.engine.mark_internal(p);
            self.publishers.insert(id, p);
        }
        id
    }

    /// Arms unarmed probe `id` (and its publisher) at `addr`.
    pub(crate) fn arm(
        &mut self,
        cx: &mut Cx<'_>,
        id: ProbeId,
        addr: RuntimeAddr,
        config: &FastPathConfig,
    ) -> Result<(), EngineError> {
        if let Some(pid) = cx.target.process().map(|p| p.pid()) {
            if cx.engine.is_return_probe(id) {
                crate::nonlocal::check_return_probe(pid, addr)?;
            }
        }
        let publishing = self.publishers.get(&id).copied();
        self.agent_for_traps(cx, config);
        self.prepublish(cx, addr);
        self.change(cx, |e, t, _| {
            if let Some(p) = publishing {
                e.arm_at(t, p, addr)?;
            }
            e.arm_at(t, id, addr)
        })
    }

    /// A probe at `addr` that counts on for probe `id` of another
    /// mechanism (its handler `probe`, if it had one), which handed its
    /// site over.
    pub(crate) fn take_over(
        &mut self,
        cx: &mut Cx<'_>,
        id: ProbeId,
        addr: RuntimeAddr,
        probe: Probe,
    ) -> Result<(), EngineError> {
        self.prepublish(cx, addr);
        let x = self.change(cx, |e, t, ids| {
            ids.place(|id| e.add_probe_as(t, id, addr, probe))
        })?;
        self.handed.insert(id, x);
        Ok(())
    }

    /// The trap form of a `Count` (`%return`: a return probe) or `Record`
    /// action: a return probe whose handlers queue time-stamped entry and
    /// exit events for the drain (`exits` false: entries only).
    pub(crate) fn form(
        &self,
        is_return: bool,
        record: bool,
        capture: Option<Capture>,
        exits: bool,
        (maxactive, nargs): (usize, usize),
    ) -> (Option<Probe>, Option<RetProbe>) {
        self.form_at(is_return, record, capture, exits, false, (maxactive, nargs))
    }

    /// [`TrapMech::form`], `hit` true for a site that is no function's
    /// entry (a USDT marker, an instruction inside a function): its record
    /// is one hit event, and no return is hooked (`[rsp]` there is no
    /// return address).
    fn form_at(
        &self,
        is_return: bool,
        record: bool,
        capture: Option<Capture>,
        exits: bool,
        hit: bool,
        (maxactive, nargs): (usize, usize),
    ) -> (Option<Probe>, Option<RetProbe>) {
        if record && (!exits || hit) {
            // Entries only (the function does not return to `[rsp]`), or
            // hits.
            let events = self.events.clone();
            let data = self.data.clone();
            let kind = if hit {
                hotprobe_fastpath::KIND_HIT
            } else {
                hotprobe_fastpath::KIND_ENTRY
            };
            let probe = Probe::new().pre(move |ctx| {
                let mut ev = trap_event(ctx, kind);
                ev.nargs = nargs as u8;
                for (i, a) in ev.args.iter_mut().take(nargs).enumerate() {
                    *a = ctx.arg(i).unwrap_or(0);
                }
                if let Some(c) = &capture {
                    ev.reserved2 = captured(ctx, c, false, &data);
                }
                let stack = ctx.stack_id().filter(|_| !hit).unwrap_or(0);
                events.borrow_mut().push((ev, stack));
            });
            (Some(probe), None)
        } else if record {
            let events = self.events.clone();
            let exits = events.clone();
            let data = self.data.clone();
            let exit_data = data.clone();
            let exit_capture = capture.clone();
            let rp = RetProbe::new(maxactive)
                .entry(move |ctx| {
                    let mut ev = trap_event(ctx, hotprobe_fastpath::KIND_ENTRY);
                    ev.nargs = nargs as u8;
                    for (i, a) in ev.args.iter_mut().take(nargs).enumerate() {
                        *a = ctx.arg(i).unwrap_or(0);
                    }
                    if let Some(c) = &capture {
                        ev.reserved2 = captured(ctx, c, false, &data);
                    }
                    let stack = ctx.stack_id().unwrap_or(0);
                    events.borrow_mut().push((ev, stack));
                })
                .ret(move |ctx| {
                    let mut ev = trap_event(ctx, hotprobe_fastpath::KIND_EXIT);
                    if nargs > 0 {
                        ev.nargs = 2;
                        ev.args[0] = ctx.regs().rax;
                        ev.args[1] = ctx.regs().rdx;
                    }
                    if let Some(c) = &exit_capture {
                        ev.reserved2 = captured(ctx, c, true, &exit_data);
                    }
                    exits.borrow_mut().push((ev, 0));
                });
            (None, Some(rp))
        } else if is_return {
            (None, Some(RetProbe::new(maxactive)))
        } else {
            (Some(Probe::new()), None)
        }
    }

    /// Drops the queued events (nobody to hand them to: the counts stay
    /// in the stats).
    pub(crate) fn discard_events(&self) {
        self.events.borrow_mut().clear();
        self.data.borrow_mut().clear();
    }

    /// The placement of trap probe `id`, as a table shows it.
    pub(crate) fn placement(
        &self,
        engine: &Engine,
        process: bool,
        (id, label): (ProbeId, String),
        r: &ResolvedProbe,
        reason: Option<String>,
    ) -> Placement {
        let mechanism = if process {
            Mechanism::Trap
        } else {
            Mechanism::Stub
        };
        let execution = match engine.execution_of(r.addr) {
            Some(e) => format!("{mechanism} ({e})"),
            None => mechanism.to_string(),
        };
        let mut reason = reason.unwrap_or_else(|| "handlers run in hotprobe".into());
        if self.overflow.contains(&r.addr.0) {
            reason.push_str(&format!(
                "; not in the agent's trap table (full: {} slots), so a hotprobe killed \
                 with SIGKILL leaves this int3 in",
                hotprobe_fastpath::TRAP_SLOTS
            ));
        }
        Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism,
            reason,
            execution,
            entry_only: None,
        }
    }
}

impl ProbeMechanism for TrapMech {
    fn kind(&self) -> MechKind {
        MechKind::Trap
    }

    /// The trap takes any site: the reason is why the mechanisms before
    /// it passed (`before`), or, on a guest, the stub's.
    fn plan(
        &mut self,
        cx: &mut Cx<'_>,
        _ask: &SiteAsk<'_>,
        before: Option<String>,
    ) -> Result<Verdict, EngineError> {
        Ok(Verdict::Take(Plan::Trap(before.unwrap_or_else(
            || match cx.target.process() {
                Some(_) => "no other mechanism".into(),
                None => "guest probes use the GDB stub".into(),
            },
        ))))
    }

    fn place(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        let (Plan::Trap(reason) | Plan::Join(reason)) = plan else {
            return Ok(Err("not a trap site".into()));
        };
        let r = ask.r;
        if let Some(handler) = ask.handler {
            // Its handlers run at each stop of the target. Not placed
            // again in a followed child: its handlers are the caller's.
            let Some(probe) = handler.take() else {
                return Ok(Err("no handler probe left to place".into()));
            };
            let id = match ask.existing {
                // A pending probe's, armed under the id it was given.
                Some(id) => {
                    cx.engine.add_unarmed(id, Some(probe), None);
                    self.arm(cx, id, r.addr, &ask.fast_path)?;
                    id
                }
                None => self.add_probe(cx, r.addr, probe, &ask.fast_path)?,
            };
            let process = cx.target.process().is_some();
            return Ok(Ok(self.placement(
                cx.engine,
                process,
                (id, ask.label),
                r,
                Some(reason),
            )));
        }
        let entry_only = r.no_return.clone().filter(|_| ask.record);
        let form = self.form_at(
            ask.is_return,
            ask.record,
            ask.capture,
            entry_only.is_none(),
            !ask.is_return && !r.is_entry(),
            (ask.maxactive, ask.nargs),
        );
        let id = match form {
            (_, Some(rp)) => self.add_retprobe(cx, r.addr, rp, &ask.fast_path)?,
            (p, None) => self.add_probe(cx, r.addr, p.unwrap_or_default(), &ask.fast_path)?,
        };
        self.followable
            .push((id, r.addr, ask.is_return, ask.record, entry_only.is_none()));
        let process = cx.target.process().is_some();
        let mut placed = self.placement(cx.engine, process, (id, ask.label), r, Some(reason));
        placed.entry_only = entry_only;
        Ok(Ok(placed))
    }

    fn set_enabled(&mut self, cx: &mut Cx<'_>, id: ProbeId, on: bool) -> Result<(), EngineError> {
        let id = self.handed.get(&id).copied().unwrap_or(id);
        cx.engine.set_enabled(id, on)
    }

    fn remove(&mut self, cx: &mut Cx<'_>, id: ProbeId) -> Result<(), EngineError> {
        if let Some(x) = self.handed.remove(&id) {
            return self.change(cx, |e, t, _| e.remove_probe(t, x));
        }
        let publishing = self.publishers.remove(&id);
        self.change(cx, |e, t, _| {
            e.remove_probe(t, id)?;
            match publishing {
                Some(p) => e.remove_probe(t, p),
                None => Ok(()),
            }
        })
    }

    fn stats(&self, engine: &Engine, id: ProbeId, me: i32, by: &mut ByProcess) -> bool {
        let mut found = false;
        if let Some(s) = engine.stats(id) {
            by.add_stats(me, &s);
            found = true;
        }
        // A vfork child's hits are its own (its pid's row).
        for x in std::iter::once(id).chain(self.handed.get(&id).copied()) {
            for (pid, n) in engine.vfork_hits(x) {
                by.add(*pid, |st| st.hits += n);
            }
            for (pid, n) in engine.vfork_returns(x) {
                by.add(*pid, |st| st.returns += n);
            }
        }
        if let Some(h) = self.handed.get(&id).and_then(|x| engine.stats(*x)) {
            // Handed over to the engine: its hits since then.
            by.add(me, |st| {
                st.hits += h.hits;
                st.nmissed += h.nmissed;
            });
        }
        found
    }

    fn drain(
        &mut self,
        _sink: &mut dyn EventSink,
        queued: &mut Vec<(RecordedEvent, Option<Vec<u8>>)>,
    ) -> Result<(u64, u64), SinkError> {
        // Merged with the agent's rings by the session: trap events were
        // taken at ptrace stops, after every event their thread had
        // written into its ring.
        let events: Vec<(RecordedEvent, u32)> = self.events.borrow_mut().drain(..).collect();
        let mut data: Vec<Option<Vec<u8>>> = self.data.borrow_mut().drain(..).map(Some).collect();
        for (ev, stack) in events {
            let bytes = ev
                .reserved2
                .checked_sub(1)
                .and_then(|i| data.get_mut(i as usize))
                .and_then(Option::take);
            // From here on `reserved2` is the entry's stack id (0: none),
            // as the agent's events carry it.
            let mut plain = ev;
            plain.reserved2 = stack;
            queued.push((plain, bytes));
        }
        Ok((0, 0))
    }

    /// Exec, exit: nothing here; the engine handles those events itself
    /// (`Engine::handle_holding`) and the trap table is published again
    /// after (`Session::poll_slot`). A fork: nothing here either; the
    /// engine handled it (it reported the child with the return addresses
    /// to put back) and the session's walk of the ledger puts the `int3`s'
    /// original bytes back into a child not followed. A module mapped:
    /// the unwinder hooks are placed or updated, the unwinder (`libgcc_s`)
    /// may be what was loaded (see [`crate::nonlocal`]).
    fn on_change(&mut self, cx: &mut Cx<'_>, change: &TargetChange) {
        if let TargetChange::ModuleMapped = change {
            if let Some(pid) = cx.target.process().map(|p| p.pid()) {
                crate::nonlocal::sync_unwind_hooks(cx.engine, cx.target, pid, cx.inbox);
            }
        }
    }

    /// The engine forgets its `int3`s there (`Engine::forget_sites`): their
    /// probes stay, unarmed, with their counts (the session publishes the
    /// trap table again after: their guards go).
    fn forget_sites(&mut self, cx: &mut Cx<'_>, gone: &[GoneSite]) -> Vec<ProbeId> {
        let trap = |s: &&GoneSite| s.owner == crate::session::ledger::CodeOwner::Trap;
        let addrs: Vec<u64> = gone.iter().filter(trap).map(|s| s.addr).collect();
        let probes = cx.engine.forget_sites(cx.target, &addrs);
        let gone: HashSet<ProbeId> = probes.iter().copied().collect();
        self.followable.retain(|(id, ..)| !gone.contains(id));
        probes
    }

    /// What the target reported meanwhile finished without handlers,
    /// threads moved out of the scratch slots, live return addresses put
    /// back (`Engine::prepare_detach`); the `int3`s stay for the walk.
    fn prepare_detach(&mut self, cx: &mut Cx<'_>) -> Result<DetachReady, EngineError> {
        match cx.engine.prepare_detach(cx.target) {
            Ok(true) => Ok(DetachReady::Ready),
            Ok(false) | Err(EngineError::Target(hotprobe_target::TargetError::Gone { .. })) => {
                Ok(DetachReady::Gone)
            }
            Err(e) => Err(e),
        }
    }

    /// The target detached (any `int3` the walk did not take out goes
    /// then, scratch memory is freed, the threads let go), the trap table
    /// emptied. An `int3` another writer changed is left quietly.
    fn finish_detach(&mut self, cx: &mut Cx<'_>, walked: Walked) -> Result<(), EngineError> {
        if matches!(walked, Walked::Gone | Walked::Skipped) {
            return Ok(());
        }
        match cx.engine.finish_detach(cx.target) {
            Ok(()) => {
                self.unpublish(cx.agent);
                Ok(())
            }
            // Gone meanwhile: nothing left to restore.
            Err(EngineError::Target(hotprobe_target::TargetError::Gone { .. })) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn detach(&mut self, cx: &mut Cx<'_>, gone: bool) -> Result<(), EngineError> {
        if gone {
            return Ok(());
        }
        match cx.engine.detach(cx.target) {
            Ok(()) => {
                self.unpublish(cx.agent);
                Ok(())
            }
            // Gone meanwhile: nothing left to restore.
            Err(EngineError::Target(hotprobe_target::TargetError::Gone { .. })) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The plain probe placed just before a trap return probe, at the same
/// address (so that its handler runs first at each hit): it publishes the
/// call (thread, stack slot, real return address) in `table` before the
/// return probe swaps the return address for the engine's trampoline; an
/// agent whose tracer died anywhere between that swap and the thread's
/// return completes the return (see [`TrapTable`]). Entries stay: the next
/// call with the same slot replaces them.
fn publisher(table: TrapTable) -> Probe {
    Probe::new().pre(move |ctx| {
        let rsp = ctx.regs().rsp;
        let tid = ctx.thread().0 as u32;
        if let Ok(real) = ctx.read_u64(rsp) {
            // Swapped already by another return probe on this function.
            if !table.is_return_trampoline(real) {
                table.publish_return(tid, rsp, real);
            }
        }
    })
}
