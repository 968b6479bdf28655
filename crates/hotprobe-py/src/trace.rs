//! `hotprobe.read_trace`: the rows of a trace directory.

use crate::HotprobeError;
use hotprobe::dwarf::Value;
use hotprobe_trace::{Record, ThreadValues, TraceReader};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

/// One row: `(tid, kind, function, ts_ns, dur_ns, args, ret, lost)`.
type Row = (
    u32,
    &'static str,
    Option<String>,
    u64,
    Option<u64>,
    Vec<PyObject>,
    Option<PyObject>,
    u64,
);

/// The rows of a trace directory written by `hotprobe record`: one tuple
/// per record, `(tid, kind, function, ts_ns, dur_ns, args, ret, lost)`,
/// kind one of "call" (an entry and its exit), "entry", "exit", "hit",
/// "lost"; threads one after the other, each in time order. Times leave
/// the probes' calibrated costs out where the trace has them (as `report`
/// does). A typed probe's (`record -a`, or named arguments) `args` and
/// `ret` are its values: int, float, bool, str (a string, a char, an
/// enumerator's name; a string cut at 128 bytes ends with "..."), None (a
/// null pointer, or a value not available at the hit); a pointer is an
/// int. Other probes' are the raw registers, as ints.
#[pyfunction]
pub(crate) fn read_trace(py: Python<'_>, dir: &str) -> PyResult<Vec<Row>> {
    let terr = |e: hotprobe_trace::TraceError| HotprobeError::new_err(format!("{dir}: {e}"));
    let r = TraceReader::open(dir).map_err(terr)?;
    let name = |p: u32| Some(r.symbols().name(p).into_owned());
    let types = r.value_types();
    let mut rows = Vec::new();
    for th in r.threads().map_err(terr)? {
        let tid = th.tid();
        let values = if types.is_empty() {
            ThreadValues::default()
        } else {
            r.thread_values(tid).map_err(terr)?
        };
        // A typed probe's entry argument (exit value) is the index of its
        // record in the thread's values file.
        let typed =
            |probe: u32, exit: bool, index: Option<u64>| -> PyResult<Option<Vec<PyObject>>> {
                if !types.is_typed(probe) {
                    return Ok(None);
                }
                let decoded = index
                    .and_then(|i| values.get(i))
                    .and_then(|data| types.decode(probe, exit, data));
                match decoded {
                    Some(Ok(vs)) => vs
                        .into_iter()
                        .map(|(_, v)| to_python(py, v))
                        .collect::<PyResult<Vec<_>>>()
                        .map(Some),
                    // A record that is missing or does not match its shapes.
                    _ => Ok(Some(Vec::new())),
                }
            };
        let raw_args = |args: &hotprobe_trace::Args| -> PyResult<Vec<PyObject>> {
            args.as_slice().iter().map(|a| a.into_py_any(py)).collect()
        };
        let entry_args = |probe: u32, args: &hotprobe_trace::Args| -> PyResult<Vec<PyObject>> {
            match typed(probe, false, args.as_slice().first().copied())? {
                Some(v) => Ok(v),
                None => raw_args(args),
            }
        };
        let exit_value = |probe: u32, ret: Option<u64>| -> PyResult<Option<PyObject>> {
            match typed(probe, true, ret)? {
                Some(mut v) => Ok(if v.is_empty() {
                    None
                } else {
                    Some(v.remove(0))
                }),
                None => ret.map(|v| v.into_py_any(py)).transpose(),
            }
        };
        for rec in th {
            let rec = rec.map_err(terr)?;
            rows.push(match rec {
                Record::Call {
                    ts,
                    dur,
                    probe,
                    args,
                    ret,
                } => (
                    tid,
                    "call",
                    name(probe),
                    ts,
                    Some(dur),
                    entry_args(probe, &args)?,
                    exit_value(probe, ret)?,
                    0,
                ),
                Record::Entry { ts, probe, args } => (
                    tid,
                    "entry",
                    name(probe),
                    ts,
                    None,
                    entry_args(probe, &args)?,
                    None,
                    0,
                ),
                Record::Exit { ts, probe, ret, .. } => (
                    tid,
                    "exit",
                    name(probe),
                    ts,
                    None,
                    Vec::new(),
                    exit_value(probe, ret)?,
                    0,
                ),
                Record::Hit { ts, probe, args } => (
                    tid,
                    "hit",
                    name(probe),
                    ts,
                    None,
                    entry_args(probe, &args)?,
                    None,
                    0,
                ),
                Record::Lost { ts, count } => {
                    (tid, "lost", None, ts, None, Vec::new(), None, count)
                }
            });
        }
    }
    Ok(rows)
}

/// A decoded value as the Python object `read_trace` gives.
fn to_python(py: Python<'_>, v: Value) -> PyResult<PyObject> {
    match v {
        Value::Int(i) => i.into_py_any(py),
        Value::UInt(u) | Value::Ptr(u) => u.into_py_any(py),
        Value::Bool(b) => b.into_py_any(py),
        Value::Char(c) => char::from(c).to_string().into_py_any(py),
        Value::F32(f) => f64::from(f).into_py_any(py),
        Value::F64(f) => f.into_py_any(py),
        Value::Enum(name) => name.into_py_any(py),
        Value::Str(bytes, cut) => {
            let mut s = String::from_utf8_lossy(&bytes).into_owned();
            if cut {
                s.push_str("...");
            }
            s.into_py_any(py)
        }
        Value::Null | Value::Unreadable(_) | Value::Unavailable(_) => Ok(py.None()),
    }
}
