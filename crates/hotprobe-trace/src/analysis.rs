//! Analyses of a recorded trace: `report` (per function calls, total and
//! self time) and phases; `replay` (the call tree) is in `replay.rs`.

pub(crate) use crate::replay::TypedText;
pub use crate::replay::{replay, replay_filtered, replay_with, ReplayField, ReplayOptions};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::Serialize;

use crate::error::Result;
use crate::event::{Args, Record};
use crate::hist::Histogram;
use crate::query::{CompiledQuery, QueryStack};
use crate::reader::{ThreadStream, TraceReader};
use crate::report::Acc;
pub use crate::report::{Report, ReportRow, SortKey};
use crate::symbols::{ProbeKind, SymbolTable};

/// A progress callback: `(bytes done, bytes total)` of the input streams.
pub type Progress<'a> = Option<&'a mut dyn FnMut(u64, u64)>;

/// What [`CallStack`] reports for each record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A function entered (its exit comes later).
    Enter {
        /// Probe.
        probe: u32,
        /// Entry time.
        ts: u64,
        /// Nesting depth (0 = outermost recorded).
        depth: usize,
        /// Recorded arguments.
        args: Args,
    },
    /// A call finished.
    Leave {
        /// Probe.
        probe: u32,
        /// Entry time.
        start: u64,
        /// Exit time.
        end: u64,
        /// Nesting depth.
        depth: usize,
        /// Duration minus the recorded children's durations.
        self_ns: u64,
        /// Recorded arguments (for leaves; entries print theirs at `Enter`).
        args: Args,
        /// Return value.
        ret: Option<u64>,
        /// From a call record (no `Enter` was reported).
        leaf: bool,
        /// No other call of the same function is open below (recursion):
        /// only such calls add to a function's total time.
        outermost: bool,
        /// Closed without its exit (end of stream or an exit further out).
        unfinished: bool,
    },
    /// A mid-function hit.
    Hit {
        /// Probe.
        probe: u32,
        /// Time.
        ts: u64,
        /// Depth.
        depth: usize,
        /// Arguments.
        args: Args,
    },
    /// Events lost.
    Lost {
        /// Time.
        ts: u64,
        /// Count.
        count: u64,
    },
    /// An exit without an open entry (skipped).
    Orphan {
        /// Probe.
        probe: u32,
        /// Time.
        ts: u64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Open {
    probe: u32,
    start: u64,
    child: u64,
}

/// Rebuilds the call tree of one thread from its records.
#[derive(Debug, Default)]
pub struct CallStack {
    open: Vec<Open>,
    active: HashMap<u32, u32>,
    last_ts: u64,
}

impl CallStack {
    /// An empty stack.
    pub fn new() -> CallStack {
        CallStack::default()
    }

    /// Current depth.
    pub fn depth(&self) -> usize {
        self.open.len()
    }

    /// Time of the last record seen.
    pub fn last_ts(&self) -> u64 {
        self.last_ts
    }

    fn close(&mut self, end: u64, ret: Option<u64>, unfinished: bool, f: &mut impl FnMut(Step)) {
        let Some(o) = self.open.pop() else { return };
        let dur = end.saturating_sub(o.start);
        let a = self.active.entry(o.probe).or_insert(1);
        *a = a.saturating_sub(1);
        let outermost = *a == 0;
        if let Some(p) = self.open.last_mut() {
            p.child = p.child.saturating_add(dur);
        }
        f(Step::Leave {
            probe: o.probe,
            start: o.start,
            end,
            depth: self.open.len(),
            self_ns: dur.saturating_sub(o.child),
            args: Args::EMPTY,
            ret,
            leaf: false,
            outermost,
            unfinished,
        });
    }

    /// Feeds one record.
    pub fn feed(&mut self, r: &Record, mut f: impl FnMut(Step)) {
        self.last_ts = self.last_ts.max(r.ts());
        match *r {
            Record::Entry { ts, probe, args } => {
                f(Step::Enter {
                    probe,
                    ts,
                    depth: self.open.len(),
                    args,
                });
                self.open.push(Open {
                    probe,
                    start: ts,
                    child: 0,
                });
                *self.active.entry(probe).or_insert(0) += 1;
            }
            Record::Exit { ts, probe, ret, .. } => {
                match self.open.iter().rposition(|o| o.probe == probe) {
                    Some(pos) => {
                        while self.open.len() > pos + 1 {
                            self.close(ts, None, true, &mut f);
                        }
                        self.close(ts, ret, false, &mut f);
                    }
                    None => f(Step::Orphan { probe, ts }),
                }
            }
            Record::Call {
                ts,
                dur,
                probe,
                args,
                ret,
            } => {
                let end = ts.saturating_add(dur);
                self.last_ts = self.last_ts.max(end);
                if let Some(p) = self.open.last_mut() {
                    p.child = p.child.saturating_add(dur);
                }
                let outermost = self.active.get(&probe).copied().unwrap_or(0) == 0;
                f(Step::Leave {
                    probe,
                    start: ts,
                    end,
                    depth: self.open.len(),
                    self_ns: dur,
                    args,
                    ret,
                    leaf: true,
                    outermost,
                    unfinished: false,
                });
            }
            Record::Hit { ts, probe, args } => f(Step::Hit {
                probe,
                ts,
                depth: self.open.len(),
                args,
            }),
            Record::Lost { ts, count } => f(Step::Lost { ts, count }),
        }
    }

    /// Closes the calls still open at the last time seen.
    pub fn finish(&mut self, mut f: impl FnMut(Step)) {
        let end = self.last_ts;
        while !self.open.is_empty() {
            self.close(end, None, true, &mut f);
        }
    }
}

/// Visits the records of all threads merged in time order (ties: lower tid
/// first, then stream order).
pub fn merged(
    reader: &TraceReader,
    mut progress: Progress<'_>,
    mut f: impl FnMut(u32, &Record) -> Result<()>,
) -> Result<()> {
    let total = reader.total_bytes();
    let mut streams: Vec<ThreadStream> = reader.threads()?;
    let mut heap = BinaryHeap::new();
    let mut heads: Vec<Option<Record>> = vec![None; streams.len()];
    let mut consumed: Vec<u64> = vec![0; streams.len()];
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(r) = s.next().transpose()? {
            heap.push(Reverse((r.ts(), s.tid(), i)));
            heads[i] = Some(r);
        }
    }
    let mut n = 0u64;
    while let Some(Reverse((_, tid, i))) = heap.pop() {
        let Some(r) = heads[i].take() else { continue };
        f(tid, &r)?;
        if let Some(nr) = streams[i].next().transpose()? {
            heap.push(Reverse((nr.ts(), tid, i)));
            heads[i] = Some(nr);
        }
        n += 1;
        if n & 4095 == 0 {
            if let Some(p) = progress.as_mut() {
                consumed[i] = streams[i].offset();
                p(consumed.iter().sum(), total);
            }
        }
    }
    if let Some(p) = progress.as_mut() {
        p(total, total);
    }
    Ok(())
}

/// Formats a duration like uftrace (`  1.234 us`, 10 characters).
pub fn fmt_duration(ns: u64) -> String {
    let (v, unit) = if ns < 1_000_000 {
        (ns as f64 / 1e3, "us")
    } else if ns < 1_000_000_000 {
        (ns as f64 / 1e6, "ms")
    } else {
        (ns as f64 / 1e9, " s")
    };
    format!("{v:7.3} {unit}")
}

/// Per-function calls, total and self time over all threads.
pub fn report(reader: &TraceReader, progress: Progress<'_>) -> Result<Report> {
    report_filtered(reader, &CompiledQuery::all(), progress)
}

/// Visits the filtered steps of every kept thread, a thread at a time
/// (tid order), calling `f(tid, step)`.
pub fn visit_threads(
    reader: &TraceReader,
    query: &CompiledQuery,
    mut progress: Progress<'_>,
    mut f: impl FnMut(u32, Step),
) -> Result<()> {
    let total = reader.total_bytes();
    let mut done = 0;
    for s in reader.streams() {
        done += s.bytes;
        if query.keeps_thread(s.tid) {
            let st = reader.thread(s.tid)?;
            let mut qs = QueryStack::new(query);
            for r in st {
                qs.feed(&r?, |step| f(s.tid, step));
            }
            qs.finish(|step| f(s.tid, step));
        }
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    Ok(())
}

/// [`report`] of the calls a query keeps; self times count the time of
/// left-out callees as the caller's own.
pub fn report_filtered(
    reader: &TraceReader,
    query: &CompiledQuery,
    progress: Progress<'_>,
) -> Result<Report> {
    let mut acc = Acc::for_trace(reader)?;
    visit_threads(reader, query, progress, |tid, s| acc.leave_on(tid, &s))?;
    Ok(acc.into_report(reader))
}

/// One thread's [`Report`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThreadReport {
    /// Thread id.
    pub tid: u32,
    /// Its functions.
    #[serde(flatten)]
    pub report: Report,
}

/// A [`report_filtered`] per thread (tid order; threads with no kept call
/// are left out).
pub fn report_by_thread(
    reader: &TraceReader,
    query: &CompiledQuery,
    progress: Progress<'_>,
) -> Result<Vec<ThreadReport>> {
    let mut accs: Vec<(u32, Acc)> = Vec::new();
    visit_threads(reader, query, progress, |tid, s| {
        if !matches!(s, Step::Leave { .. }) {
            return;
        }
        if accs.last().is_none_or(|a| a.0 != tid) {
            accs.push((tid, Acc::default()));
        }
        if let Some(a) = accs.last_mut() {
            a.1.leave(&s);
        }
    })?;
    Ok(accs
        .into_iter()
        .map(|(tid, a)| ThreadReport {
            tid,
            report: a.into_report(reader),
        })
        .collect())
}

/// The durations of the kept calls of every function whose name matches
/// the glob `pattern`, one [`Histogram`] per function (sorted by name).
pub fn histograms(
    reader: &TraceReader,
    query: &CompiledQuery,
    pattern: &str,
    progress: Progress<'_>,
) -> Result<Vec<(String, Histogram)>> {
    let syms = reader.symbols();
    let wanted: Vec<bool> = (0..syms.id_bound())
        .map(|id| crate::filter::glob_match(pattern, &syms.name(id)))
        .collect();
    let mut by: std::collections::BTreeMap<String, Histogram> = Default::default();
    for (id, w) in wanted.iter().enumerate() {
        if *w {
            by.entry(syms.name(id as u32).into_owned()).or_default();
        }
    }
    visit_threads(reader, query, progress, |_, s| {
        if let Step::Leave {
            probe,
            start,
            end,
            unfinished,
            ..
        } = s
        {
            if wanted.get(probe as usize).copied().unwrap_or(false) {
                let h = by.entry(syms.name(probe).into_owned()).or_default();
                // A call whose exit was lost has no known duration.
                match unfinished {
                    true => h.add_no_exit(),
                    false => h.add(end - start),
                }
            }
        }
    })?;
    Ok(by.into_iter().collect())
}

/// One function in a [`ReportDiff`]: its numbers in trace A and trace B
/// (0 where it has no calls). JSON field names as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiffRow {
    /// Function name.
    pub function: String,
    /// Calls in A.
    pub calls_a: u64,
    /// Calls in B.
    pub calls_b: u64,
    /// Total time in A.
    pub total_ns_a: u64,
    /// Total time in B.
    pub total_ns_b: u64,
    /// Self time in A.
    pub self_ns_a: u64,
    /// Self time in B.
    pub self_ns_b: u64,
    /// Average call in A.
    pub avg_ns_a: u64,
    /// Average call in B.
    pub avg_ns_b: u64,
    /// Longest call in A.
    pub max_ns_a: u64,
    /// Longest call in B.
    pub max_ns_b: u64,
}

impl DiffRow {
    /// B − A of a key.
    pub fn change(&self, key: SortKey) -> i128 {
        let (a, b) = match key {
            SortKey::Total => (self.total_ns_a, self.total_ns_b),
            SortKey::SelfTime => (self.self_ns_a, self.self_ns_b),
            SortKey::Calls => (self.calls_a, self.calls_b),
            SortKey::Avg => (self.avg_ns_a, self.avg_ns_b),
            SortKey::Max => (self.max_ns_a, self.max_ns_b),
        };
        b as i128 - a as i128
    }
}

/// Two reports side by side, per function name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReportDiff {
    /// The rows, largest change of the sort key first.
    pub rows: Vec<DiffRow>,
}

fn fmt_change(d: i128) -> String {
    let sign = if d < 0 { '-' } else { '+' };
    let t = fmt_duration(d.unsigned_abs().min(u64::MAX as u128) as u64);
    format!("{sign}{}", t.trim_start())
}

impl ReportDiff {
    /// Matches the rows of `a` and `b` by function name; sorted by the
    /// absolute change of `key` (descending; ties by name).
    pub fn new(a: &Report, b: &Report, key: SortKey) -> ReportDiff {
        let mut by: std::collections::BTreeMap<&str, DiffRow> = Default::default();
        for r in &a.rows {
            let d = by.entry(&r.name).or_default();
            d.calls_a += r.calls;
            d.total_ns_a += r.total_ns;
            d.self_ns_a += r.self_ns;
            d.avg_ns_a = r.avg_ns;
            d.max_ns_a = d.max_ns_a.max(r.max_ns);
        }
        for r in &b.rows {
            let d = by.entry(&r.name).or_default();
            d.calls_b += r.calls;
            d.total_ns_b += r.total_ns;
            d.self_ns_b += r.self_ns;
            d.avg_ns_b = r.avg_ns;
            d.max_ns_b = d.max_ns_b.max(r.max_ns);
        }
        let mut rows: Vec<DiffRow> = by
            .into_iter()
            .map(|(name, mut d)| {
                d.function = name.to_string();
                d
            })
            .collect();
        rows.sort_by(|x, y| {
            y.change(key)
                .unsigned_abs()
                .cmp(&x.change(key).unsigned_abs())
                .then(x.function.cmp(&y.function))
        });
        ReportDiff { rows }
    }

    /// The table as text: calls, total and self time of A and B and the
    /// change (B − A; total also in percent).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push_str(
            "   Calls A    Calls B    Change     Total A     Total B       Change       %      Self A      Self B       Change  Function\n",
        );
        s.push_str(
            "  ========  ========  ========  ==========  ==========  ===========  ======  ==========  ==========  ===========  ====================\n",
        );
        for r in &self.rows {
            let pct = if r.total_ns_a > 0 {
                format!(
                    "{:+.1}",
                    r.change(SortKey::Total) as f64 * 100.0 / r.total_ns_a as f64
                )
            } else {
                "new".to_string()
            };
            s.push_str(&format!(
                "  {:>8}  {:>8}  {:>+8}  {}  {}  {:>11}  {:>6}  {}  {}  {:>11}  {}\n",
                r.calls_a,
                r.calls_b,
                r.change(SortKey::Calls),
                fmt_duration(r.total_ns_a),
                fmt_duration(r.total_ns_b),
                fmt_change(r.change(SortKey::Total)),
                pct,
                fmt_duration(r.self_ns_a),
                fmt_duration(r.self_ns_b),
                fmt_change(r.change(SortKey::SelfTime)),
                r.function
            ));
        }
        s
    }
}

/// Which probes split the run into phases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseSpec {
    /// Function names that are markers.
    pub names: Vec<String>,
    /// Also every probe of kind [`ProbeKind::Marker`].
    pub marker_kind: bool,
    /// Each thread's markers split only that thread's run (default: a
    /// marker on any thread starts the next phase for all threads, as boot
    /// levels split a kernel boot).
    pub per_thread: bool,
}

impl PhaseSpec {
    /// The markers named in `info.json` plus the probes of kind marker.
    pub fn from_trace(reader: &TraceReader) -> PhaseSpec {
        PhaseSpec {
            names: reader.info().phase_markers.clone(),
            marker_kind: true,
            per_thread: false,
        }
    }

    fn markers(&self, syms: &SymbolTable) -> Vec<bool> {
        (0..syms.id_bound())
            .map(|id| {
                syms.get(id).is_some_and(|s| {
                    (self.marker_kind && s.kind == ProbeKind::Marker)
                        || self.names.contains(&s.name)
                })
            })
            .collect()
    }
}

/// One phase of a [`PhaseReport`] (JSON: `name`, `start_ns`, `end_ns`,
/// `rows`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Phase {
    /// Marker name (`name#2` for its second occurrence; `(start)` before
    /// the first marker).
    pub name: String,
    /// Start time (ns) — the marker's time.
    pub start_ns: u64,
    /// End time (ns): the next marker, or the end of the trace.
    pub end_ns: u64,
    /// Calls started in the phase, per function.
    #[serde(flatten)]
    pub report: Report,
}

impl Phase {
    /// Calls started in the phase, all functions.
    pub fn calls(&self) -> u64 {
        self.report.rows.iter().map(|r| r.calls).sum()
    }
}

/// Counts and time per phase per function.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseReport {
    /// Phases in time order (the `(start)` phase only when it has calls).
    pub phases: Vec<Phase>,
}

impl PhaseReport {
    /// A phase by name.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// Text: a report table per phase.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.phases.iter().enumerate() {
            s.push_str(&format!(
                "# phase {}: {}  duration {}  calls {}\n",
                i + 1,
                p.name,
                fmt_duration(p.end_ns.saturating_sub(p.start_ns)).trim(),
                p.calls()
            ));
            s.push_str(&p.report.to_text());
            s.push('\n');
        }
        s
    }
}

/// Splits the run at the marker probes and reports each phase. A call
/// belongs to the phase in which it started (a marker's own call starts its
/// phase).
pub fn report_phases(
    reader: &TraceReader,
    spec: &PhaseSpec,
    progress: Progress<'_>,
) -> Result<PhaseReport> {
    report_phases_filtered(reader, spec, &CompiledQuery::all(), progress)
}

/// [`report_phases`] of the calls a query keeps (the markers split the run
/// whatever the query keeps).
pub fn report_phases_filtered(
    reader: &TraceReader,
    spec: &PhaseSpec,
    query: &CompiledQuery,
    mut progress: Progress<'_>,
) -> Result<PhaseReport> {
    let syms = reader.symbols();
    let is_marker = spec.markers(syms);
    let marker = |p: u32| is_marker.get(p as usize).copied().unwrap_or(false);
    // Pass 1: marker times per thread, and each thread's end.
    // (tid, its markers (time, probe), its last time)
    type ThreadMarkers = (u32, Vec<(u64, u32)>, u64);
    let mut per_thread: Vec<ThreadMarkers> = Vec::new();
    let mut trace_start = u64::MAX;
    for st in reader.threads()? {
        let tid = st.tid();
        let mut ms = Vec::new();
        let mut end = 0u64;
        for r in st {
            let r = r?;
            trace_start = trace_start.min(r.ts());
            end = end.max(match r {
                Record::Call { ts, dur, .. } => ts.saturating_add(dur),
                _ => r.ts(),
            });
            match r {
                Record::Entry { ts, probe, .. }
                | Record::Call { ts, probe, .. }
                | Record::Hit { ts, probe, .. }
                    if marker(probe) =>
                {
                    ms.push((ts, probe))
                }
                _ => {}
            }
        }
        per_thread.push((tid, ms, end));
    }
    let trace_end = per_thread.iter().map(|t| t.2).max().unwrap_or(0);
    // Every thread's markers in time order (a thread's own in its order):
    // (time, tid, its number in the thread, probe).
    let mut ordered: Vec<(u64, u32, usize, u32)> = per_thread
        .iter()
        .flat_map(|(tid, ms, _)| ms.iter().enumerate().map(|(j, m)| (m.0, *tid, j, m.1)))
        .collect();
    ordered.sort_unstable();
    let global: Vec<(u64, u32)> = ordered.iter().map(|m| (m.0, m.3)).collect();
    // (tid, its marker j) → the phase it starts among all (1-based).
    let global_phase: HashMap<(u32, usize), usize> = ordered
        .iter()
        .enumerate()
        .map(|(g, m)| ((m.1, m.2), g + 1))
        .collect();
    let global_names = crate::phase_order::phase_names(&global, syms);

    // Phase order and bounds.
    let mut order: Vec<String> = vec!["(start)".into()];
    let mut bounds: HashMap<String, (u64, u64)> = HashMap::new();
    let mut add_bounds = |order: &mut Vec<String>, names: &[(String, u64)], end: u64| {
        for (i, (n, ts)) in names.iter().enumerate() {
            let e = names.get(i + 1).map_or(end, |x| x.1);
            let b = bounds.entry(n.clone()).or_insert_with(|| {
                order.push(n.clone());
                (*ts, e)
            });
            b.0 = b.0.min(*ts);
            b.1 = b.1.max(e);
        }
    };
    if spec.per_thread {
        for (_, ms, end) in &per_thread {
            add_bounds(&mut order, &crate::phase_order::phase_names(ms, syms), *end);
        }
    } else {
        add_bounds(&mut order, &global_names, trace_end);
    }
    let first = if spec.per_thread {
        per_thread
            .iter()
            .filter_map(|t| t.1.first())
            .map(|m| m.0)
            .min()
    } else {
        global.first().map(|m| m.0)
    };
    let start_end = first.unwrap_or(trace_end);

    // Pass 2: attribute calls.
    let mut accs: HashMap<String, Acc> = HashMap::new();
    let total = reader.total_bytes();
    let mut done = 0;
    for (tid, ms, _) in &per_thread {
        if !query.keeps_thread(*tid) {
            continue;
        }
        let names = if spec.per_thread {
            crate::phase_order::phase_names(ms, syms)
        } else {
            global_names.clone()
        };
        let st = reader.thread(*tid)?;
        let path = st.path().to_path_buf();
        let mut cs = QueryStack::new(query);
        // A call's phase: the thread's markers seen when it started, by
        // record order (`phase_order`: time stamps may tie); among all
        // threads', also every marker strictly before it in time.
        let mut order = crate::phase_order::PhaseOrder::default();
        let mut visit = |s: Step, order: &mut crate::phase_order::PhaseOrder| {
            if let Step::Leave {
                start, probe, leaf, ..
            } = s
            {
                let own = order.of_leave(probe, leaf);
                let i = if spec.per_thread {
                    own
                } else {
                    let own = own
                        .checked_sub(1)
                        .and_then(|j| global_phase.get(&(*tid, j)).copied())
                        .unwrap_or(0);
                    own.max(names.partition_point(|(_, ts)| *ts < start))
                };
                let key = match i.checked_sub(1).and_then(|i| names.get(i)) {
                    Some(n) => n.0.as_str(),
                    None => "(start)",
                };
                accs.entry(key.to_string()).or_default().leave(&s);
            }
        };
        for r in st {
            let r = r?;
            order.before(&r, marker);
            cs.feed(&r, |s| visit(s, &mut order));
        }
        order.finish();
        cs.finish(|s| visit(s, &mut order));
        done += std::fs::metadata(&path).map_or(0, |m| m.len());
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    let mut phases = Vec::new();
    for name in order {
        let acc = accs.remove(&name).unwrap_or_default();
        let (start_ns, end_ns) = if name == "(start)" {
            if acc.by_probe.is_empty() {
                continue;
            }
            (trace_start.min(start_end), start_end)
        } else {
            bounds.get(&name).copied().unwrap_or_default()
        };
        phases.push(Phase {
            name,
            start_ns,
            end_ns,
            report: acc.into_report(reader),
        });
    }
    Ok(PhaseReport { phases })
}
