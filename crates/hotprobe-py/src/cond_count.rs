//! Conditional counts from Python: `Session.count(t, "take", cond="arg0 >
//! 256")` returns a [`ConditionalCount`] whose `hits` are the calls whose
//! arguments satisfied the condition.
//!
//! The probes record entry events; the session's [`hotprobe::CountSink`]
//! (the one the command line's `count 'SPEC if COND'` and the C API's
//! `hotprobe_count_if` use) evaluates the condition on each while the run
//! drains them. The grammar is the library's ([`hotprobe::cond`]):
//! `arg0`…`arg5` compared as signed 64-bit integers, the names of the
//! function's parameters from its DWARF (`cond="size > 256"`, compared
//! with their own size and signedness), numbers, `== != < <= > >=`,
//! `&&`, `||`, `!`, parentheses.

use crate::err;
use crate::probe::{placed, PyProbe};
use crate::session::{target_id, Session};
use hotprobe::{CountError, ProbeId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Places the probes of `Session.count(target, spec, cond=cond)`.
pub(crate) fn count_if(
    slf: &Bound<'_, Session>,
    target: usize,
    spec: &str,
    cond: &str,
) -> PyResult<PyObject> {
    let me = slf.borrow();
    let added = {
        let mut session = me.session()?;
        me.counts
            .borrow_mut()
            .place(&mut session, target_id(target), spec, Some(cond))
            .map_err(|e| match e {
                CountError::Engine(e) => err(e),
                e => PyValueError::new_err(e.to_string()),
            })?
    };
    let count = ConditionalCount {
        session: slf.clone().unbind(),
        probes: placed(slf, &added),
        cond: cond.to_string(),
        skipped: added
            .skipped
            .iter()
            .map(|s| (s.label.clone(), s.reason.clone()))
            .collect(),
    };
    Ok(Py::new(slf.py(), count)?.into_any())
}

/// The probes a `Session.count(..., cond=...)` placed, and the calls they
/// counted: those whose arguments satisfied the condition.
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct ConditionalCount {
    session: Py<Session>,
    probes: Vec<PyProbe>,
    /// The condition, as given.
    #[pyo3(get)]
    cond: String,
    /// Matches that could not be probed: (label, reason).
    #[pyo3(get)]
    skipped: Vec<(String, String)>,
}

impl ConditionalCount {
    /// Probe `id`'s count; a `ValueError` saying why for one on a library
    /// loaded later whose condition did not compile there (its hits are
    /// not counted).
    fn hits_of(&self, py: Python<'_>, id: u32) -> PyResult<u64> {
        let s = self.session.borrow(py);
        let counts = s.counts.borrow();
        if let Some(why) = counts.not_compiled(ProbeId(id)) {
            return Err(PyValueError::new_err(why.to_string()));
        }
        Ok(counts.hits(ProbeId(id)).unwrap_or(0))
    }
}

#[pymethods]
impl ConditionalCount {
    /// Calls counted (the condition held) by every probe, summed. A
    /// `ValueError` when the condition of a probe on a library loaded
    /// later did not compile there (the message says why).
    #[getter]
    fn hits(&self, py: Python<'_>) -> PyResult<u64> {
        self.probes.iter().map(|p| self.hits_of(py, p.id)).sum()
    }

    /// Calls counted per probe: {label: hits}.
    fn by_label<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in &self.probes {
            d.set_item(&p.label, self.hits_of(py, p.id)?)?;
        }
        Ok(d)
    }

    /// Events lost in full rings (all conditional counts of the session):
    /// the counts are low by up to this many.
    #[getter]
    fn lost(&self, py: Python<'_>) -> u64 {
        self.session.borrow(py).counts.borrow().lost_events()
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

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ConditionalCount(cond={:?}, hits={}, probes={})",
            self.cond,
            self.hits(py)
                .map_or_else(|_| "not counted".to_string(), |n| n.to_string()),
            self.probes.len()
        )
    }
}
