//! Placed probes (`Probe`), their counters (`Stats`), and what
//! `Session.count` returns (`Count`).

use crate::session::Session;
use crate::{err, HotprobeError};
use hotprobe::ProbeId;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn placed(slf: &Bound<'_, Session>, added: &hotprobe::Added) -> Vec<PyProbe> {
    added
        .placements
        .iter()
        .map(|p| PyProbe {
            session: slf.clone().unbind(),
            id: p.id.0,
            label: p.label.clone(),
            mechanism: p.mechanism.to_string(),
        })
        .collect()
}

/// The probe placed first of `added` (a handler or return probe on one
/// address), or an error naming `spec`.
pub(crate) fn first_placed(
    slf: &Bound<'_, Session>,
    added: &hotprobe::Added,
    spec: &str,
) -> PyResult<PyProbe> {
    placed(slf, added)
        .into_iter()
        .next()
        .ok_or_else(|| HotprobeError::new_err(format!("{spec}: not placed")))
}

/// A probe's counters.
#[pyclass(frozen, get_all, module = "hotprobe")]
#[derive(Clone, Copy)]
pub(crate) struct Stats {
    /// Hits with the probe enabled.
    hits: u64,
    /// Hits not handled, calls beyond `maxactive`.
    nmissed: u64,
    /// Return handler runs (return probes), returns counted.
    returns: u64,
    /// Followed calls left without a return.
    abandoned: u64,
}

#[pymethods]
impl Stats {
    fn __repr__(&self) -> String {
        format!(
            "Stats(hits={}, nmissed={}, returns={}, abandoned={})",
            self.hits, self.nmissed, self.returns, self.abandoned
        )
    }
}

pub(crate) fn stats_of(session: &Py<Session>, py: Python<'_>, id: u32) -> PyResult<Stats> {
    let s = session.borrow(py);
    let st = s
        .session()?
        .stats(ProbeId(id))
        .ok_or_else(|| HotprobeError::new_err(format!("no probe with id {id}")))?;
    Ok(Stats {
        hits: st.hits,
        nmissed: st.nmissed,
        returns: st.returns,
        abandoned: st.abandoned,
    })
}

/// A placed probe: its id, label and mechanism, counters, enable/disable.
#[pyclass(unsendable, name = "Probe", module = "hotprobe")]
pub(crate) struct PyProbe {
    /// The session it is placed in.
    pub(crate) session: Py<Session>,
    /// The session's probe id.
    #[pyo3(get)]
    pub(crate) id: u32,
    /// What it probes (the spec, or the function for a pattern).
    #[pyo3(get)]
    pub(crate) label: String,
    /// How hits execute (patch, jump, trap, stub, ...).
    #[pyo3(get)]
    pub(crate) mechanism: String,
}

#[pymethods]
impl PyProbe {
    /// The probe's counters now.
    #[getter]
    fn stats(&self, py: Python<'_>) -> PyResult<Stats> {
        stats_of(&self.session, py, self.id)
    }

    /// Hits so far.
    #[getter]
    fn hits(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.stats(py)?.hits)
    }

    /// Enable the probe.
    fn enable(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.set_enabled(ProbeId(self.id), true);
        r.map_err(err)
    }

    /// Disable the probe: its handlers do not run, its hits are not counted.
    fn disable(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.set_enabled(ProbeId(self.id), false);
        r.map_err(err)
    }

    /// Remove the probe (its original code is restored).
    fn remove(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.remove_probe(ProbeId(self.id));
        r.map_err(err)
    }

    fn __repr__(&self) -> String {
        format!(
            "Probe(id={}, label={:?}, mechanism={:?})",
            self.id, self.label, self.mechanism
        )
    }
}

/// The probes a `Session.count` placed, and their counts.
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct Count {
    /// The session they are placed in.
    pub(crate) session: Py<Session>,
    /// The probes placed.
    pub(crate) probes: Vec<PyProbe>,
    /// Matches that could not be probed: (label, reason).
    #[pyo3(get)]
    pub(crate) skipped: Vec<(String, String)>,
}

#[pymethods]
impl Count {
    /// Hits of every probe, summed.
    #[getter]
    fn hits(&self, py: Python<'_>) -> PyResult<u64> {
        let mut n = 0;
        for p in &self.probes {
            n += stats_of(&self.session, py, p.id)?.hits;
        }
        Ok(n)
    }

    /// Counters per probe: {label: Stats}.
    fn by_label<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in &self.probes {
            d.set_item(&p.label, stats_of(&self.session, py, p.id)?)?;
        }
        Ok(d)
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
