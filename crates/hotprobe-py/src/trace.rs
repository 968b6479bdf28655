//! `hotprobe.read_trace`: the rows of a trace directory.

use crate::HotprobeError;
use pyo3::prelude::*;

/// The rows of a trace directory written by `hotprobe record`: one tuple
/// per record, `(tid, kind, function, ts_ns, dur_ns, args, ret, lost)`,
/// kind one of "call" (an entry and its exit), "entry", "exit", "hit",
/// "lost"; threads one after the other, each in time order.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn read_trace(
    dir: &str,
) -> PyResult<
    Vec<(
        u32,
        &'static str,
        Option<String>,
        u64,
        Option<u64>,
        Vec<u64>,
        Option<u64>,
        u64,
    )>,
> {
    use hotprobe_trace::Record;
    let terr = |e: hotprobe_trace::TraceError| HotprobeError::new_err(format!("{dir}: {e}"));
    let r = hotprobe_trace::TraceReader::open(dir).map_err(terr)?;
    let tb = r.time_base();
    let name = |p: u32| Some(r.symbols().name(p).into_owned());
    let mut rows = Vec::new();
    for th in r.threads().map_err(terr)? {
        let tid = th.tid();
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
                    tb.to_ns(ts),
                    Some(tb.to_ns(ts + dur).saturating_sub(tb.to_ns(ts))),
                    args.as_slice().to_vec(),
                    ret,
                    0,
                ),
                Record::Entry { ts, probe, args } => (
                    tid,
                    "entry",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    args.as_slice().to_vec(),
                    None,
                    0,
                ),
                Record::Exit { ts, probe, ret, .. } => (
                    tid,
                    "exit",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    Vec::new(),
                    ret,
                    0,
                ),
                Record::Hit { ts, probe, args } => (
                    tid,
                    "hit",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    args.as_slice().to_vec(),
                    None,
                    0,
                ),
                Record::Lost { ts, count } => (
                    tid,
                    "lost",
                    None,
                    tb.to_ns(ts),
                    None,
                    Vec::new(),
                    None,
                    count,
                ),
            });
        }
    }
    Ok(rows)
}
