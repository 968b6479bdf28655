//! Typed capture from Python: `Session.record(t, "work", typed=True)`
//! records each call of `work` with its parameters and return value typed
//! from the program's DWARF (`"work(i, s)"`: those parameters; the command
//! line's `trace -a` and `trace 'work(i, s)'`), and returns a
//! [`TypedRecording`] whose `calls` fill while the session runs.
//!
//! The library's [`hotprobe::typed_capture::TypedCapture`] plans and
//! collects (the C API's `hotprobe_record_typed` uses it too); values in
//! registers come from the recorded events on any mechanism, anything
//! else (strings, fields) through a trap.

use crate::err;
use crate::probe::{placed, PyProbe};
use crate::session::{target_id, Session};
use hotprobe::typed_capture::TypedCaptureError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;

/// Places the probes of `Session.record(target, spec, typed=True)`.
pub(crate) fn record_typed(
    slf: &Bound<'_, Session>,
    target: usize,
    spec: &str,
) -> PyResult<PyObject> {
    let me = slf.borrow();
    let added = {
        let mut session = me.session()?;
        me.typed
            .borrow_mut()
            .place(&mut session, target_id(target), spec)
            .map_err(|e| match e {
                TypedCaptureError::Engine(e) => err(e),
                e => PyValueError::new_err(e.to_string()),
            })?
    };
    let rec = TypedRecording {
        session: slf.clone().unbind(),
        probes: placed(slf, &added),
        labels: added
            .placements
            .iter()
            .map(|p| {
                let name = p.function.clone().unwrap_or_else(|| p.label.clone());
                (p.id.0, name)
            })
            .collect(),
    };
    Ok(Py::new(slf.py(), rec)?.into_any())
}

/// One call boundary as Python sees it: (function, "entry" | "return",
/// tid, values).
type Call = (String, &'static str, u32, Vec<String>);

/// The values are being collected (asked from a handler during the run).
fn running() -> PyErr {
    PyRuntimeError::new_err("the session is running: read the calls after run()")
}

/// What a `Session.record(..., typed=True)` placed, and the calls
/// recorded so far with their typed values.
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct TypedRecording {
    session: Py<Session>,
    probes: Vec<PyProbe>,
    labels: HashMap<u32, String>,
}

#[pymethods]
impl TypedRecording {
    /// The entries and returns of these probes recorded so far, in the
    /// order drained (per thread, the program's order): tuples
    /// `(function, "entry" | "return", tid, values)`. `values` are text as
    /// the command line's `trace` shows them: every parameter's in order
    /// (or `"EXPR=value"` for each expression the spec gave) at an entry,
    /// the return value at a return; empty for a return the program
    /// unwound past, and for a function without DWARF.
    #[getter]
    fn calls(&self, py: Python<'_>) -> PyResult<Vec<Call>> {
        let s = self.session.borrow(py);
        let typed = s.typed.try_borrow().map_err(|_| running())?;
        Ok(typed
            .events()
            .iter()
            .filter_map(|e| {
                let function = self.labels.get(&e.probe.0)?.clone();
                let kind = if e.exit { "return" } else { "entry" };
                Some((function, kind, e.tid, e.values.clone()))
            })
            .collect())
    }

    /// The functions placed without DWARF (recorded without values), for
    /// every typed recording of the session.
    #[getter]
    fn untyped(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let s = self.session.borrow(py);
        let typed = s.typed.try_borrow().map_err(|_| running())?;
        Ok(typed.untyped())
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
