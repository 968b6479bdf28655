//! [`RegisterTyped`]: the values of typed functions recorded in registers
//! (by whatever mechanism took them) turned into captured bytes as they
//! are drained; and what a pending probe armed in a module loaded later
//! adds to it and to [`TypedShapes`] ([`crate::EventSink::pending_armed`]).

use super::{EntryExit, TypedShapes, Typing};
use crate::{EventSink, Mechanism, RecordedEvent, SinkError, KIND_EXIT};
use hotprobe_dwarf::{capture, Machine, Source};
use hotprobe_fastpath::{EVENT_XMM, EXIT_UNWOUND};
use std::collections::HashMap;

/// An [`EventSink`] in front of another: events of typed functions whose
/// values are all integer registers (recorded by whatever mechanism took
/// them: the agent's rings, a trap) get those values as captured bytes,
/// as if read at the hit. A pending probe armed later
/// ([`crate::EventSink::pending_armed`]) gets its plan then.
pub struct RegisterTyped<'a> {
    inner: &'a mut dyn EventSink,
    /// What planned the probes (asked again for pending probes as they
    /// are armed).
    typing: &'a Typing,
    /// The plans by probe id, with the xmm layout's integer count for
    /// probes the fast path records with it.
    plans: HashMap<u32, (EntryExit, Option<u8>)>,
}

/// The register plan of probe `p` (see [`RegisterTyped`]), if `typing`
/// made one for its address.
fn register_plan(typing: &Typing, p: &crate::Placement) -> Option<(EntryExit, Option<u8>)> {
    let plans = typing.register_plans.borrow();
    let xmm = typing.xmm_plans.borrow();
    let fast = typing.fast_plans.borrow();
    let on_fast = matches!(p.mechanism, Mechanism::Patch(_) | Mechanism::Jump);
    let at = &p.addr.0;
    match (xmm.get(at), fast.get(at), plans.get(at)) {
        (Some((plan, k)), _, _) if on_fast => Some((plan.clone(), Some(*k))),
        // Entries come with the bytes the agent copied (`event_data`,
        // passed on); exits are typed here.
        (_, Some(plan), _) if on_fast => Some((plan.clone(), None)),
        (_, _, Some(plan)) => Some((plan.clone(), None)),
        _ => None,
    }
}

impl<'a> RegisterTyped<'a> {
    /// For the probes `placed` that `typing` planned on registers, and
    /// the pending ones among them as they are armed.
    pub fn new(
        inner: &'a mut dyn EventSink,
        typing: &'a Typing,
        placed: &[crate::Placement],
    ) -> RegisterTyped<'a> {
        RegisterTyped {
            inner,
            typing,
            plans: placed
                .iter()
                .filter_map(|p| Some((p.id.0, register_plan(typing, p)?)))
                .collect(),
        }
    }
}

impl EventSink for RegisterTyped<'_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        let exit = ev.kind == KIND_EXIT;
        match self.plans.get(&ev.probe_id) {
            Some(_) if exit && ev.reserved & EXIT_UNWOUND != 0 => self.inner.event(ev),
            Some(((entry, exit_plan), xmm)) => {
                let plan = if exit { exit_plan } else { entry };
                let mut data = Vec::new();
                capture(plan, &mut Recorded(ev, *xmm), &mut data);
                self.inner.event_data(ev, &data)
            }
            None => self.inner.event(ev),
        }
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        self.inner.event_data(ev, data)
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.inner.lost(tid, ts, count)
    }

    fn idle(&mut self) {
        self.inner.idle();
    }

    fn exec_image(&mut self, image: &crate::ExecImage) -> Result<(), SinkError> {
        self.inner.exec_image(image)
    }

    fn pending_armed(&mut self, armed: &crate::ArmedPending) -> Result<(), SinkError> {
        // Planned when it was armed (the choosers the session kept for
        // it): typed from its registers from now on, as one placed at
        // start. Armed again elsewhere (unloaded, loaded again), the plan
        // of the new address replaces the old.
        let id = armed.placement.id.0;
        match register_plan(self.typing, &armed.placement) {
            Some(plan) => {
                self.plans.insert(id, plan);
            }
            None => {
                self.plans.remove(&id);
            }
        }
        self.inner.pending_armed(armed)
    }
}

impl TypedShapes {
    /// A pending probe was armed ([`crate::EventSink::pending_armed`]):
    /// its shapes, if `typing` typed it at its address, are printed from
    /// now on. Returns whether it is typed.
    pub fn note_armed(&mut self, typing: &Typing, armed: &crate::ArmedPending) -> bool {
        let id = armed.placement.id.0;
        match typing.shapes.borrow().get(&armed.placement.addr.0) {
            Some(s) => {
                self.by_probe.insert(id, s.clone());
                true
            }
            None => {
                self.by_probe.remove(&id);
                false
            }
        }
    }
}

/// A recorded event's registers: the argument registers of an entry, rax
/// (and rdx) of an exit; with the xmm layout (`Some(k)`, and the event
/// says it has it: `EVENT_XMM`), an entry's first `k` integer registers
/// then xmm0, xmm1, … and an exit's xmm0 as its third value.
struct Recorded<'a>(&'a RecordedEvent, Option<u8>);

impl Machine for Recorded<'_> {
    fn reg(&mut self, s: Source) -> Option<u64> {
        let ev = self.0;
        let n = usize::from(ev.nargs).min(ev.args.len());
        let k = match self.1 {
            Some(k) if ev.reserved & EVENT_XMM != 0 => Some(usize::from(k)),
            _ => None,
        };
        let at = |i: usize| (i < n).then(|| ev.args[i]);
        match (s, ev.kind == KIND_EXIT, k) {
            (Source::IntArg(i), false, None) => at(usize::from(i)),
            (Source::IntArg(i), false, Some(k)) if usize::from(i) < k => at(usize::from(i)),
            (Source::Xmm(j), false, Some(k)) => at(k + usize::from(j)),
            (Source::Rax, true, _) => at(0),
            (Source::Xmm(0), true, Some(_)) => at(2),
            _ => None,
        }
    }

    fn read(&mut self, _addr: u64, _buf: &mut [u8]) -> bool {
        false
    }
}
