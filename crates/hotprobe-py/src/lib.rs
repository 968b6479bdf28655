//! The native part of the Python package `hotprobe` (`hotprobe._native`):
//! a [`hotprobe::Session`] with Python callables as handlers.
//!
//! Handlers go through the session's handler actions (`Action::Handler`,
//! `Action::Return`), so a faster handler path in the session serves them
//! too. [`Session::run`] releases the GIL while the targets run and takes
//! it for each hit whose handler is Python. A handler that raises stops
//! the run, and `run()` raises that exception.

mod cond_count;
mod context;
mod limits;
mod probe;
mod recording;
mod session;
mod sigint;
mod sink;
mod trace;
mod typed;

use context::Context;
use hotprobe::EngineError;
use probe::{Count, PyProbe, Stats};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use recording::{Event, Recording};
use session::Session;
use trace::read_trace;

create_exception!(
    _native,
    HotprobeError,
    PyException,
    "A hotprobe operation failed (a missing symbol, a refused address, a dead target, ...)."
);

/// A session's failure as a `HotprobeError`.
fn err(e: EngineError) -> PyErr {
    HotprobeError::new_err(e.to_string())
}

/// The native module of the `hotprobe` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Session>()?;
    m.add_class::<PyProbe>()?;
    m.add_class::<Count>()?;
    m.add_class::<cond_count::ConditionalCount>()?;
    m.add_class::<Recording>()?;
    m.add_class::<typed::TypedRecording>()?;
    m.add_class::<Event>()?;
    m.add_class::<Stats>()?;
    m.add_class::<Context>()?;
    m.add("HotprobeError", m.py().get_type::<HotprobeError>())?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    Ok(())
}
