//! Chrome Trace Event JSON (loads in Perfetto UI and chrome://tracing).

use std::io::Write;

use serde_json::json;

use crate::analysis::{Progress, Step};
use crate::error::{Result, TraceError};
use crate::query::{CompiledQuery, StepStack};
use crate::reader::TraceReader;

/// Counts of what [`export_chrome`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChromeStats {
    /// `B` events.
    pub begins: u64,
    /// `E` events (one per `B`: calls still open at the end of a thread are
    /// closed at its last timestamp).
    pub ends: u64,
    /// `X` (complete) events, one per aggregated call.
    pub completes: u64,
    /// `i` (instant) events: hits and lost-event notes.
    pub instants: u64,
    /// `X` events of the host kernel (`record --kernel`): syscalls
    /// (category `syscall`) and off-CPU intervals (`off-cpu`).
    pub kernel: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A 64-bit register value as a JSON string (JavaScript numbers lose
/// integers above 2^53): signed decimal when |value| < 2^32 as a signed
/// integer (`"-1"`, `"42"`), else the 64 bits in hex (`"0x7ffd12345678"`).
pub fn value_string(v: u64) -> String {
    let s = v as i64;
    if s.unsigned_abs() < (1 << 32) {
        s.to_string()
    } else {
        format!("{v:#x}")
    }
}

fn values(args: &[u64]) -> serde_json::Value {
    args.iter().map(|&a| value_string(a)).collect()
}

/// Writes the trace as Trace Event JSON: an object with `traceEvents`
/// (`B`/`E` for entries and exits, `X` with `dur` for aggregated calls, `i`
/// for hits, `M` for process and thread names), times in µs. `otherData`
/// says whether the times leave the probes' costs out (`probe_costs`) and
/// lists the functions probed through a trap (`on_traps`); their `B` and
/// `X` events have the trap mechanism as their category (`cat`).
pub fn export_chrome(
    reader: &TraceReader,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<ChromeStats> {
    export_chrome_filtered(reader, &CompiledQuery::all(), out, progress)
}

/// [`export_chrome`] of the calls `query` keeps ([`crate::query`]): a call
/// with nothing kept inside is one `X` event; threads the query leaves
/// out have no track.
pub fn export_chrome_filtered(
    reader: &TraceReader,
    query: &CompiledQuery,
    out: &mut impl Write,
    mut progress: Progress<'_>,
) -> Result<ChromeStats> {
    let io = |e: std::io::Error| TraceError::io("<chrome output>", e);
    let js = |e: serde_json::Error| TraceError::io("<chrome output>", e.into());
    let syms = reader.symbols();
    let info = reader.info();
    let pid = info.pid.unwrap_or(1);
    let mut stats = ChromeStats::default();
    let total = reader.total_bytes();
    let mut done = 0;
    let on_traps: Vec<serde_json::Value> = reader
        .trap_functions()
        .into_iter()
        .map(|(f, m)| json!({"function": f, "mechanism": m}))
        .collect();
    writeln!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{},\"traceEvents\":[",
        json!({"tracer": "hotprobe", "target": info.target, "version": info.version,
               "probe_costs": reader.overhead_note(), "on_traps": on_traps})
    )
    .map_err(io)?;
    // A function on a trap: its mechanism, the category of its events.
    let trap_of = |probe: u32| {
        let (label, _) = reader.probe_costs()?.label_of(probe)?;
        label.contains("trap").then_some(label)
    };
    serde_json::to_writer(
        &mut *out,
        &json!({"ph":"M","name":"process_name","pid":pid,"tid":0,"args":{"name":info.target}}),
    )
    .map_err(js)?;
    let typed = crate::analysis::TypedText::new(reader)?;
    for st in reader.threads()? {
        let tid = st.tid();
        let path = st.path().to_path_buf();
        if !query.keeps_thread(tid) {
            done += std::fs::metadata(&path).map_or(0, |m| m.len());
            continue;
        }
        out.write_all(b",\n").map_err(io)?;
        serde_json::to_writer(
            &mut *out,
            &json!({"ph":"M","name":"thread_name","pid":pid,"tid":tid,"args":{"name":format!("tid {tid}")}}),
        )
        .map_err(js)?;
        let mut cs = StepStack::new(query);
        let mut err: Option<TraceError> = None;
        // Typed probes (format version 2): their values as text.
        let arg_values = |probe: u32, args: &crate::Args| match typed.typed_args(tid, probe, args) {
            Some(v) => json!(v),
            None => values(args.as_slice()),
        };
        let ret_value = |probe: u32, r: u64| {
            if typed.is_typed(probe) {
                typed.typed_ret(tid, probe, r).map(|v| json!(v))
            } else {
                Some(json!(value_string(r)))
            }
        };
        let mut emit = |s: Step| {
            if err.is_some() {
                return;
            }
            let ev = match s {
                Step::Enter {
                    probe, ts, args, ..
                } => {
                    stats.begins += 1;
                    let mut e =
                        json!({"ph":"B","name":syms.name(probe),"pid":pid,"tid":tid,"ts":us(ts)});
                    if let Some(m) = trap_of(probe) {
                        e["cat"] = m.into();
                    }
                    if !args.is_empty() {
                        e["args"] = json!({"args": arg_values(probe, &args)});
                    }
                    e
                }
                Step::Leave {
                    probe,
                    start,
                    end,
                    args,
                    ret,
                    leaf,
                    ..
                } => {
                    let mut e = if leaf {
                        stats.completes += 1;
                        let mut e = json!({"ph":"X","name":syms.name(probe),"pid":pid,"tid":tid,"ts":us(start),"dur":us(end - start)});
                        if let Some(m) = trap_of(probe) {
                            e["cat"] = m.into();
                        }
                        e
                    } else {
                        stats.ends += 1;
                        json!({"ph":"E","name":syms.name(probe),"pid":pid,"tid":tid,"ts":us(end)})
                    };
                    let mut a = serde_json::Map::new();
                    if !args.is_empty() {
                        a.insert("args".into(), arg_values(probe, &args));
                    }
                    if let Some(r) = ret.and_then(|r| ret_value(probe, r)) {
                        a.insert("retval".into(), r);
                    }
                    if !a.is_empty() {
                        e["args"] = a.into();
                    }
                    e
                }
                Step::Hit {
                    probe, ts, args, ..
                } => {
                    stats.instants += 1;
                    json!({"ph":"i","s":"t","name":syms.name(probe),"pid":pid,"tid":tid,"ts":us(ts),"args":{"args":arg_values(probe, &args)}})
                }
                Step::Lost { ts, count } => {
                    stats.instants += 1;
                    json!({"ph":"i","s":"t","name":"lost events","pid":pid,"tid":tid,"ts":us(ts),"args":{"count":count}})
                }
                Step::Orphan { .. } => return,
            };
            let r = out
                .write_all(b",\n")
                .map_err(io)
                .and_then(|_| serde_json::to_writer(&mut *out, &ev).map_err(js));
            if let Err(e) = r {
                err = Some(e);
            }
        };
        for r in st {
            cs.feed(&r?, &mut emit);
        }
        cs.finish(&mut emit);
        if let Some(e) = err {
            return Err(e);
        }
        // The host kernel's events (`record --kernel`) on the same track.
        for k in reader.kernel_events(tid)? {
            stats.kernel += 1;
            let mut e = json!({"ph":"X","name":k.name(),"pid":pid,"tid":tid,"ts":us(k.start),"dur":us(k.dur())});
            e["cat"] = match k.kind {
                crate::kernel::KernelKind::Syscall { .. } => {
                    e["args"] = json!({"retval": k.ret_text()});
                    "syscall".into()
                }
                crate::kernel::KernelKind::OffCpu { preempted } => {
                    e["args"] = json!({"preempted": preempted});
                    "off-cpu".into()
                }
            };
            out.write_all(b",\n").map_err(io)?;
            serde_json::to_writer(&mut *out, &e).map_err(js)?;
        }
        done += std::fs::metadata(&path).map_or(0, |m| m.len());
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    out.write_all(b"\n]}\n").map_err(io)?;
    out.flush().map_err(io)?;
    Ok(stats)
}
