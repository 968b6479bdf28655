//! What `Session.record` returns (`Recording`) and its events (`Event`).

use crate::probe::PyProbe;
use crate::session::Session;
use hotprobe::{KIND_ENTRY, KIND_EXIT, KIND_HIT};
use pyo3::prelude::*;
use std::collections::HashMap;

/// One recorded event.
#[pyclass(frozen, get_all, module = "hotprobe")]
#[derive(Clone)]
pub(crate) struct Event {
    /// "entry", "exit" or "hit".
    kind: &'static str,
    /// The function (or probe label).
    function: String,
    /// The probe id.
    probe: u32,
    /// The thread.
    tid: u32,
    /// The mechanism's timestamp (TSC ticks on the fast path).
    ts: u64,
    /// Argument registers (entry, hit).
    args: Vec<u64>,
    /// The return value (exit).
    ret: Option<u64>,
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        format!(
            "Event(kind={:?}, function={:?}, tid={}, args={:?}, ret={:?})",
            self.kind, self.function, self.tid, self.args, self.ret
        )
    }
}

/// What a `Session.record` placed, and the events recorded so far.
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct Recording {
    /// The session they are placed in.
    pub(crate) session: Py<Session>,
    /// The probes placed.
    pub(crate) probes: Vec<PyProbe>,
    /// The function (or label) of each probe, by probe id.
    pub(crate) labels: HashMap<u32, String>,
}

#[pymethods]
impl Recording {
    /// The events of these probes recorded so far, in the order drained
    /// (per thread in time order).
    #[getter]
    fn events(&self, py: Python<'_>) -> Vec<Event> {
        let s = self.session.borrow(py);
        let ev = s.events.borrow();
        ev.events
            .iter()
            .filter_map(|e| {
                let function = self.labels.get(&e.probe_id)?.clone();
                let n = (e.nargs as usize).min(e.args.len());
                let (kind, args, ret) = match e.kind {
                    KIND_ENTRY => ("entry", e.args[..n].to_vec(), None),
                    KIND_HIT => ("hit", e.args[..n].to_vec(), None),
                    KIND_EXIT => ("exit", Vec::new(), (n > 0).then(|| e.args[0])),
                    _ => return None,
                };
                Some(Event {
                    kind,
                    function,
                    probe: e.probe_id,
                    tid: e.tid,
                    ts: e.tsc,
                    args,
                    ret,
                })
            })
            .collect()
    }

    /// Events lost in full rings (all recordings of the session).
    #[getter]
    fn lost(&self, py: Python<'_>) -> u64 {
        self.session.borrow(py).events.borrow().lost
    }

    /// The probes placed.
    #[getter]
    fn probes(&self, py: Python<'_>) -> Vec<PyProbe> {
        self.probes
            .iter()
            .map(|p| PyProbe {
                session: p.session.clone_ref(py),
                id: p.id,
                label: p.label.clone(),
                mechanism: p.mechanism.clone(),
            })
            .collect()
    }
}
