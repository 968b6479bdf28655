//! Bounds on what one handler call may ask of the target.

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

/// The most bytes one `Context.read` or `Context.read_cstr` copies (1 MiB).
pub(crate) const MAX_READ: usize = 1 << 20;

/// `n`, when one read may copy that much; a `ValueError` naming the limit
/// otherwise (nothing allocated, nothing read).
pub(crate) fn read_len(n: usize) -> PyResult<usize> {
    if n > MAX_READ {
        return Err(PyValueError::new_err(format!(
            "read of {n} bytes: at most {MAX_READ} (1 MiB) per read"
        )));
    }
    Ok(n)
}
