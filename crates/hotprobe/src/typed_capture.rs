//! Typed capture for the bindings: [`TypedCapture::place`] records the
//! calls of the functions a spec names with their parameters and return
//! values typed from DWARF (what the command line's `trace -a` and
//! `trace 'f(a, b)'` show), and its [`TypedCapture::sink`] collects each
//! call's values as text while a run drains the events.

use crate::typed::{split_spec, RegisterTyped, TypedError, TypedShapes, Typing};
use crate::{
    Action, Added, EngineError, EventSink, Placement, ProbeId, RecordedEvent, Session, SinkError,
    TargetId, KIND_EXIT,
};
use std::rc::Rc;

/// Why a typed capture could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum TypedCaptureError {
    /// The spec's argument expressions, or the function's DWARF.
    #[error(transparent)]
    Typed(#[from] TypedError),
    /// The spec did not resolve or could not be probed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Typed values in integer registers come from the recorded ones:
    /// the session must record all six.
    #[error(
        "a typed capture needs the six argument registers recorded (the session records {recorded})"
    )]
    TooFewArgs {
        /// What the session's `record_args` is.
        recorded: u8,
    },
    /// No such target (or not a process: DWARF is read from its modules).
    #[error("target {0} is no process")]
    NoProcess(usize),
    /// A `%return` spec: the capture takes entries and returns itself.
    #[error(
        "{spec}: a typed capture records entries and returns: give the function without %return"
    )]
    Return {
        /// The spec as given.
        spec: String,
    },
}

/// One recorded call boundary of a typed probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypedEvent {
    /// The probe.
    pub probe: ProbeId,
    /// The thread.
    pub tid: u32,
    /// `false`: the entry (the parameters); `true`: the return (the
    /// return value).
    pub exit: bool,
    /// The values as the command line's `trace` shows them: every
    /// parameter's in order (or `EXPR=value` for each expression given) at
    /// an entry, the return value at a return; empty for a return the
    /// program unwound past (longjmp, exception).
    pub values: Vec<String>,
}

/// The typed probes of one session and the values they recorded.
#[derive(Default)]
pub struct TypedCapture {
    /// One plan per [`TypedCapture::place`] (two specs on one function
    /// capture different values: their shapes are kept apart), with the
    /// probes it placed.
    typings: Vec<(Rc<Typing>, Vec<Placement>)>,
    events: Vec<TypedEvent>,
}

impl TypedCapture {
    /// No probes yet.
    pub fn new() -> TypedCapture {
        TypedCapture::default()
    }

    /// Records the calls of every function `spec` names on process `t`
    /// with typed values: `greet` (every parameter and the return value)
    /// or `greet(name, n)` / `greet name n:string p->len` (those). A
    /// function without DWARF is recorded with no values when no names are
    /// given, refused when some are.
    pub fn place(
        &mut self,
        session: &mut Session,
        t: TargetId,
        spec: &str,
    ) -> Result<Added, TypedCaptureError> {
        let recorded = session.config().fast_path.record_args;
        if recorded < 6 {
            return Err(TypedCaptureError::TooFewArgs { recorded });
        }
        let (func, exprs) = split_spec(spec)?;
        if func.ends_with("%return") {
            return Err(TypedCaptureError::Return {
                spec: spec.to_string(),
            });
        }
        let pid = session.pid(t).ok_or(TypedCaptureError::NoProcess(t.0))?;
        let typing = Rc::new(Typing::new(pid));
        let auto = exprs.is_empty();
        session.set_xmm_layout(typing.xmm_chooser_for(exprs.clone(), auto));
        session.set_fast_capture(typing.fast_chooser_for(exprs.clone(), auto));
        session.set_capture(typing.chooser_for(exprs, auto));
        let added = session.add(t, &func, Action::Record);
        session.set_capture(None);
        session.set_xmm_layout(None);
        session.set_fast_capture(None);
        let added = added?;
        typing.check()?;
        self.typings.push((typing, added.placements.clone()));
        Ok(added)
    }

    /// The functions placed so far that have no DWARF (recorded without
    /// values).
    pub fn untyped(&self) -> Vec<String> {
        self.typings.iter().flat_map(|(t, _)| t.untyped()).collect()
    }

    /// Whether probe `id` is a typed capture's.
    pub fn follows(&self, id: ProbeId) -> bool {
        self.typings
            .iter()
            .any(|(_, placed)| placed.iter().any(|p| p.id == id))
    }

    /// Runs `f` with the sink to drain into: the typed probes' events are
    /// kept (their values as text), every other event goes to `inner`.
    pub fn with_sink<R>(
        &mut self,
        inner: Option<&mut dyn EventSink>,
        f: impl FnOnce(&mut dyn EventSink) -> R,
    ) -> R {
        let mut keep = Keep {
            shapes: self
                .typings
                .iter()
                .map(|(typing, placed)| {
                    let ids = placed.iter().map(|p| p.id).collect();
                    (ids, TypedShapes::new(typing, placed), typing.clone())
                })
                .collect(),
            events: &mut self.events,
            inner,
        };
        // One RegisterTyped per plan: each types its own probes' events
        // and passes the others on down the chain.
        chain(&self.typings, &mut keep, f)
    }

    /// The typed events collected so far (kept until taken).
    pub fn events(&self) -> &[TypedEvent] {
        &self.events
    }

    /// The typed events collected so far, taken.
    pub fn take_events(&mut self) -> Vec<TypedEvent> {
        std::mem::take(&mut self.events)
    }
}

/// `f` with `sink` behind one [`RegisterTyped`] per `(typing, placed)`.
fn chain<R>(
    typings: &[(Rc<Typing>, Vec<Placement>)],
    sink: &mut dyn EventSink,
    f: impl FnOnce(&mut dyn EventSink) -> R,
) -> R {
    match typings.split_first() {
        None => f(sink),
        Some(((typing, placed), rest)) => {
            let mut typed = RegisterTyped::new(sink, typing, placed);
            chain(rest, &mut typed, f)
        }
    }
}

/// Keeps the typed probes' events as text, passes the others on.
struct Keep<'a, 'b> {
    /// The typed probes of each target and their shapes.
    /// (A pending one's shapes join at its arming, from its typing.)
    shapes: Vec<(Vec<ProbeId>, TypedShapes, Rc<Typing>)>,
    events: &'a mut Vec<TypedEvent>,
    inner: Option<&'a mut (dyn EventSink + 'b)>,
}

impl Keep<'_, '_> {
    fn shapes_of(&self, id: u32) -> Option<&TypedShapes> {
        self.shapes
            .iter()
            .find(|(ids, _, _)| ids.iter().any(|p| p.0 == id))
            .map(|(_, s, _)| s)
    }
}

impl EventSink for Keep<'_, '_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        if self.shapes_of(ev.probe_id).is_some() {
            // No values: a return unwound past, or a function without
            // DWARF.
            self.events.push(TypedEvent {
                probe: ProbeId(ev.probe_id),
                tid: ev.tid,
                exit: ev.kind == KIND_EXIT,
                values: Vec::new(),
            });
            return Ok(());
        }
        match self.inner.as_deref_mut() {
            Some(s) => s.event(ev),
            None => Ok(()),
        }
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let exit = ev.kind == KIND_EXIT;
        match self
            .shapes_of(ev.probe_id)
            .and_then(|s| s.format(ev.probe_id, exit, data))
        {
            Some(values) => {
                self.events.push(TypedEvent {
                    probe: ProbeId(ev.probe_id),
                    tid: ev.tid,
                    exit,
                    values,
                });
                Ok(())
            }
            None => match self.inner.as_deref_mut() {
                Some(s) => s.event_data(ev, data),
                None => Ok(()),
            },
        }
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        match self.inner.as_deref_mut() {
            Some(s) => s.lost(tid, ts, count),
            None => Ok(()),
        }
    }

    fn idle(&mut self) {
        if let Some(s) = self.inner.as_deref_mut() {
            s.idle();
        }
    }

    fn pending_armed(&mut self, armed: &crate::ArmedPending) -> Result<(), SinkError> {
        for (ids, shapes, typing) in &mut self.shapes {
            if ids.contains(&armed.placement.id) {
                shapes.note_armed(typing, armed);
            }
        }
        match self.inner.as_deref_mut() {
            Some(s) => s.pending_armed(armed),
            None => Ok(()),
        }
    }
}
