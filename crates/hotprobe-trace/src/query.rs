//! Questions asked of a recorded trace after the fact: which calls an
//! analysis (replay, report, histograms, flame graphs, exports) looks at.
//!
//! The semantics follow uftrace's replay and report filters:
//!
//! * `filter` (`-F GLOB`): keep the calls of matching functions **and
//!   their callees**; nothing outside such a call is kept.
//! * `notrace` (`-N GLOB`): drop the calls of matching functions and their
//!   callees (wins over `filter`).
//! * `max_depth` (`-D N`): keep calls nested less than N deep in what is
//!   kept (the outermost kept call is at depth 0, so `-D 1` keeps only
//!   the outermost ones; with `-F` the depth counts from the matching call).
//! * `min_duration_ns` (`-t DUR`): keep calls lasting at least that long.
//! * `tids` (`--tid`): keep these threads only (empty: all).
//! * `since_ns` / `until_ns` (`--since`, `--until`): keep calls that
//!   *start* in `[trace start + since, trace start + until)`, the trace
//!   start being the earliest record of any thread.
//!
//! [`QueryStack`] applies a [`CompiledQuery`] to one thread's records and
//! reports the kept calls as [`Step`]s of the *filtered* call tree: depths
//! count kept calls only, a call's self time is its duration minus that of
//! its kept callees (time of the callees left out counts as the caller's
//! own), and a call whose callees were all left out is reported as a leaf.
//! Hits are kept inside kept calls (and at the top level when there is no
//! `filter`); lost-event notes always.

use serde::{Deserialize, Serialize};

use crate::analysis::{CallStack, Step};
use crate::error::{Result, TraceError};
use crate::event::{Args, Record};
use crate::filter::glob_match;
use crate::reader::TraceReader;

/// What to keep (see the module documentation). The default keeps
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Query {
    /// Keep calls of functions matching one of these globs and their callees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<String>,
    /// Drop calls of functions matching one of these globs and their callees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notrace: Vec<String>,
    /// Keep calls nested less than this deep (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// Keep calls lasting at least this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_duration_ns: Option<u64>,
    /// Keep these threads (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tids: Vec<u32>,
    /// Keep calls starting at least this long after the trace start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ns: Option<u64>,
    /// Keep calls starting less than this long after the trace start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ns: Option<u64>,
}

impl Query {
    /// Keeps everything.
    pub fn all() -> Query {
        Query::default()
    }

    /// True when nothing is filtered.
    pub fn is_empty(&self) -> bool {
        *self == Query::default()
    }

    /// Binds the query to a trace: patterns matched once per probe, the
    /// time range made absolute (reads the first record of every stream).
    pub fn compile(&self, reader: &TraceReader) -> Result<CompiledQuery> {
        if self.max_depth == Some(0) {
            return Err(TraceError::Invalid("maximum depth 0 keeps nothing".into()));
        }
        for (what, pats) in [("filter", &self.filter), ("notrace", &self.notrace)] {
            for p in pats {
                if p.is_empty() {
                    return Err(TraceError::Invalid(format!(
                        "empty {what} pattern (it would match nothing)"
                    )));
                }
                if let Err(e) = hotprobe_symbols::NamePattern::new(p) {
                    return Err(TraceError::Invalid(format!("{what} pattern: {e}")));
                }
            }
        }
        if let (Some(s), Some(u)) = (self.since_ns, self.until_ns) {
            if u <= s {
                return Err(TraceError::Invalid(format!(
                    "the time range ends ({u} ns) before it starts ({s} ns)"
                )));
            }
        }
        let syms = reader.symbols();
        let by = |pats: &[String]| -> Vec<bool> {
            (0..syms.id_bound())
                .map(|id| {
                    let name = syms.name(id);
                    pats.iter().any(|p| glob_match(p, &name))
                })
                .collect()
        };
        let (lo, hi) = if self.since_ns.is_some() || self.until_ns.is_some() {
            let t0 = trace_start(reader)?.unwrap_or(0);
            (
                t0.saturating_add(self.since_ns.unwrap_or(0)),
                self.until_ns.map_or(u64::MAX, |u| t0.saturating_add(u)),
            )
        } else {
            (0, u64::MAX)
        };
        Ok(CompiledQuery {
            filter: by(&self.filter),
            notrace: by(&self.notrace),
            has_filter: !self.filter.is_empty(),
            max_depth: self.max_depth.map_or(usize::MAX, |d| d as usize),
            min_ns: self.min_duration_ns.unwrap_or(0),
            tids: self.tids.clone(),
            lo,
            hi,
        })
    }
}

/// The earliest record time of the trace (ns), `None` without records.
pub fn trace_start(reader: &TraceReader) -> Result<Option<u64>> {
    let mut t0: Option<u64> = None;
    for mut st in reader.threads()? {
        if let Some(r) = st.next().transpose()? {
            t0 = Some(t0.map_or(r.ts(), |t| t.min(r.ts())));
        }
    }
    Ok(t0)
}

/// A [`Query`] bound to a trace ([`Query::compile`]).
#[derive(Clone, Debug)]
pub struct CompiledQuery {
    filter: Vec<bool>,
    notrace: Vec<bool>,
    has_filter: bool,
    max_depth: usize,
    min_ns: u64,
    tids: Vec<u32>,
    lo: u64,
    hi: u64,
}

impl Default for CompiledQuery {
    fn default() -> Self {
        CompiledQuery::all()
    }
}

impl CompiledQuery {
    /// Keeps everything (no trace needed).
    pub fn all() -> CompiledQuery {
        CompiledQuery {
            filter: Vec::new(),
            notrace: Vec::new(),
            has_filter: false,
            max_depth: usize::MAX,
            min_ns: 0,
            tids: Vec::new(),
            lo: 0,
            hi: u64::MAX,
        }
    }

    /// Whether it keeps every call of every thread (then the raw
    /// [`CallStack`] gives the same calls, with entries and exits as
    /// recorded).
    pub fn keeps_all(&self) -> bool {
        !self.has_filter
            && !self.notrace.contains(&true)
            && self.max_depth == usize::MAX
            && self.min_ns == 0
            && self.tids.is_empty()
            && self.lo == 0
            && self.hi == u64::MAX
    }

    /// Whether the query has `filter` patterns and none of them matches a
    /// probe of the trace (so that it keeps no call at all).
    pub fn filter_matches_nothing(&self) -> bool {
        self.has_filter && !self.filter.contains(&true)
    }

    /// Whether thread `tid` is kept at all.
    pub fn keeps_thread(&self, tid: u32) -> bool {
        self.tids.is_empty() || self.tids.contains(&tid)
    }

    fn filter(&self, probe: u32) -> bool {
        self.filter.get(probe as usize).copied().unwrap_or(false)
    }

    fn notrace(&self, probe: u32) -> bool {
        self.notrace.get(probe as usize).copied().unwrap_or(false)
    }

    fn in_range(&self, ts: u64) -> bool {
        (self.lo..self.hi).contains(&ts)
    }
}

/// One open call of the raw tree.
#[derive(Debug)]
struct Frame {
    probe: u32,
    start: u64,
    args: Args,
    /// Kept unless shorter than the minimum duration.
    candidate: bool,
    /// Its callees cannot be kept (notrace).
    blocked: bool,
    /// It or a caller matched `filter`.
    in_filter: bool,
    /// Depth it has in the kept tree (its candidate callers).
    depth: usize,
    /// Its `Enter` was reported.
    emitted: bool,
    /// Durations of its kept callees.
    child_ns: u64,
    /// Hits inside it while it is pending (reported with it).
    hits: Vec<Step>,
}

/// Applies a [`CompiledQuery`] to the records of one thread: a
/// [`CallStack`] whose steps are those of the filtered call tree.
///
/// Differences with the raw [`CallStack`]: an `Enter` is reported only
/// once something inside the call is (a kept callee or hit), before it;
/// a call with nothing kept inside is reported by a single `Leave` with
/// `leaf: true`. Every `Leave` carries the call's arguments.
#[derive(Debug)]
pub struct QueryStack<'q> {
    q: &'q CompiledQuery,
    cs: CallStack,
    state: State,
}

#[derive(Debug, Default)]
struct State {
    frames: Vec<Frame>,
}

impl<'q> QueryStack<'q> {
    /// A stack for one thread.
    pub fn new(q: &'q CompiledQuery) -> QueryStack<'q> {
        QueryStack {
            q,
            cs: CallStack::new(),
            state: State::default(),
        }
    }

    /// Time of the last record seen.
    pub fn last_ts(&self) -> u64 {
        self.cs.last_ts()
    }

    /// Feeds one record.
    pub fn feed(&mut self, r: &Record, mut f: impl FnMut(Step)) {
        let (q, st) = (self.q, &mut self.state);
        self.cs.feed(r, |s| st.step(q, s, &mut f));
    }

    /// Closes the calls still open at the last time seen.
    pub fn finish(&mut self, mut f: impl FnMut(Step)) {
        let (q, st) = (self.q, &mut self.state);
        self.cs.finish(|s| st.step(q, s, &mut f));
    }
}

/// One thread's steps for an exporter: the raw [`CallStack`] when the
/// query keeps everything (so an unfiltered export is what it always was),
/// the [`QueryStack`] otherwise.
#[derive(Debug)]
pub enum StepStack<'q> {
    /// Every record, as recorded.
    Raw(CallStack),
    /// The calls a query keeps.
    Filtered(QueryStack<'q>),
}

impl<'q> StepStack<'q> {
    /// The stack `q` calls for.
    pub fn new(q: &'q CompiledQuery) -> StepStack<'q> {
        if q.keeps_all() {
            StepStack::Raw(CallStack::new())
        } else {
            StepStack::Filtered(QueryStack::new(q))
        }
    }

    /// Feeds one record.
    pub fn feed(&mut self, r: &Record, f: impl FnMut(Step)) {
        match self {
            StepStack::Raw(c) => c.feed(r, f),
            StepStack::Filtered(q) => q.feed(r, f),
        }
    }

    /// Closes the calls still open at the last time seen.
    pub fn finish(&mut self, f: impl FnMut(Step)) {
        match self {
            StepStack::Raw(c) => c.finish(f),
            StepStack::Filtered(q) => q.finish(f),
        }
    }
}

impl State {
    /// The decision for a call of `probe` starting at `start` under the
    /// current frames: (candidate, blocked, in_filter, depth).
    fn decide(&self, q: &CompiledQuery, probe: u32, start: u64) -> (bool, bool, bool, usize) {
        let parent = self.frames.last();
        let blocked = parent.is_some_and(|p| p.blocked) || q.notrace(probe);
        let in_filter = parent.is_some_and(|p| p.in_filter) || q.filter(probe);
        let depth = self.kept_depth();
        let candidate =
            !blocked && (!q.has_filter || in_filter) && depth < q.max_depth && q.in_range(start);
        (candidate, blocked, in_filter, depth)
    }

    /// Candidate frames open (the depth of a call starting now).
    fn kept_depth(&self) -> usize {
        self.frames
            .last()
            .map_or(0, |p| p.depth + usize::from(p.candidate))
    }

    /// Reports the `Enter` of every pending candidate frame, outermost first.
    fn flush(&mut self, f: &mut impl FnMut(Step)) {
        let first = self
            .frames
            .iter()
            .rposition(|fr| fr.candidate && fr.emitted)
            .map_or(0, |i| i + 1);
        for fr in &mut self.frames[first..] {
            if fr.candidate && !fr.emitted {
                fr.emitted = true;
                f(Step::Enter {
                    probe: fr.probe,
                    ts: fr.start,
                    depth: fr.depth,
                    args: fr.args,
                });
                for h in fr.hits.drain(..) {
                    f(h);
                }
            }
        }
    }

    /// No candidate frame of `probe` is open.
    fn outermost(&self, probe: u32) -> bool {
        !self
            .frames
            .iter()
            .any(|fr| fr.candidate && fr.probe == probe)
    }

    fn add_child(&mut self, dur: u64) {
        if let Some(p) = self.frames.iter_mut().rev().find(|fr| fr.candidate) {
            p.child_ns = p.child_ns.saturating_add(dur);
        }
    }

    fn step(&mut self, q: &CompiledQuery, s: Step, f: &mut impl FnMut(Step)) {
        match s {
            Step::Enter {
                probe, ts, args, ..
            } => {
                let (candidate, blocked, in_filter, depth) = self.decide(q, probe, ts);
                self.frames.push(Frame {
                    probe,
                    start: ts,
                    args,
                    candidate,
                    blocked,
                    in_filter,
                    depth,
                    emitted: false,
                    child_ns: 0,
                    hits: Vec::new(),
                });
            }
            Step::Leave {
                probe,
                start,
                end,
                args,
                ret,
                leaf: true,
                ..
            } => {
                let (candidate, ..) = self.decide(q, probe, start);
                let dur = end.saturating_sub(start);
                if !candidate || dur < q.min_ns {
                    return;
                }
                self.flush(f);
                f(Step::Leave {
                    probe,
                    start,
                    end,
                    depth: self.kept_depth(),
                    self_ns: dur,
                    args,
                    ret,
                    leaf: true,
                    outermost: self.outermost(probe),
                    unfinished: false,
                });
                self.add_child(dur);
            }
            Step::Leave {
                end,
                ret,
                unfinished,
                ..
            } => {
                let Some(fr) = self.frames.pop() else { return };
                let dur = end.saturating_sub(fr.start);
                if !fr.candidate || dur < q.min_ns {
                    return;
                }
                if !fr.emitted && (unfinished || !fr.hits.is_empty()) {
                    // Its entry is shown (with the hits inside; the exit of
                    // an unfinished call is not).
                    self.frames.push(fr);
                    self.flush(f);
                    let Some(fr) = self.frames.pop() else { return };
                    self.leave(fr, end, dur, ret, false, unfinished, f);
                } else {
                    self.flush(f);
                    let leaf = !fr.emitted;
                    self.leave(fr, end, dur, ret, leaf, unfinished, f);
                }
            }
            Step::Hit {
                probe, ts, args, ..
            } => {
                let parent = self.frames.last();
                if parent.is_some_and(|p| p.blocked)
                    || (q.has_filter && !parent.is_some_and(|p| p.in_filter))
                    || !q.in_range(ts)
                {
                    return;
                }
                let depth = self.kept_depth();
                if depth >= q.max_depth {
                    return;
                }
                let hit = Step::Hit {
                    probe,
                    ts,
                    depth,
                    args,
                };
                match self.frames.iter_mut().rev().find(|fr| fr.candidate) {
                    Some(p) if !p.emitted => p.hits.push(hit),
                    _ => f(hit),
                }
            }
            Step::Lost { .. } | Step::Orphan { .. } => f(s),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn leave(
        &mut self,
        fr: Frame,
        end: u64,
        dur: u64,
        ret: Option<u64>,
        leaf: bool,
        unfinished: bool,
        f: &mut impl FnMut(Step),
    ) {
        f(Step::Leave {
            probe: fr.probe,
            start: fr.start,
            end,
            depth: fr.depth,
            self_ns: dur.saturating_sub(fr.child_ns),
            args: fr.args,
            ret,
            leaf,
            outermost: self.outermost(fr.probe),
            unfinished,
        });
        self.add_child(dur);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::TraceEvent;
    use crate::symbols::Symbol;
    use crate::writer::{TraceMeta, TraceWriter};

    /// main{ a{ leaf } b{ leaf leaf } leaf }, ns times, one thread (tid 1),
    /// leaf keeping one argument and its return value.
    pub(crate) fn trace(dir: &std::path::Path) -> TraceReader {
        let syms = ["main", "a", "b", "leaf"]
            .iter()
            .enumerate()
            .map(|(i, n)| Symbol {
                nargs: u8::from(i == 3),
                retval: i == 3,
                module: "/bin/t".into(),
                ..Symbol::function(i as u32, *n)
            })
            .collect();
        let mut w = TraceWriter::create(dir, TraceMeta::new("t", syms)).unwrap();
        let evs = [
            TraceEvent::entry(0, 1, 0),
            TraceEvent::entry(10, 1, 1),
            TraceEvent::entry(11, 1, 3),
            TraceEvent::exit(15, 1, 3),
            TraceEvent::exit(100, 1, 1),
            TraceEvent::entry(110, 1, 2),
            TraceEvent::entry(111, 1, 3).with_args(&[u64::MAX]),
            TraceEvent::exit(112, 1, 3).with_ret(7),
            TraceEvent::entry(113, 1, 3),
            TraceEvent::exit(200, 1, 3),
            TraceEvent::exit(210, 1, 2),
            TraceEvent::entry(220, 1, 3),
            TraceEvent::exit(221, 1, 3),
            TraceEvent::exit(300, 1, 0),
        ];
        for e in evs {
            w.write_event(&e).unwrap();
        }
        w.finish().unwrap();
        TraceReader::open(dir).unwrap()
    }

    /// (depth, name, leaf, self) of the kept calls in entry order.
    fn kept(r: &TraceReader, q: Query) -> Vec<(usize, String, bool, u64)> {
        let cq = q.compile(r).unwrap();
        let mut out: Vec<(u64, usize, String, bool, u64)> = Vec::new();
        let mut qs = QueryStack::new(&cq);
        let mut visit = |s: Step| {
            if let Step::Leave {
                probe,
                start,
                depth,
                leaf,
                self_ns,
                ..
            } = s
            {
                out.push((start, depth, r.symbols().name(probe).into(), leaf, self_ns))
            }
        };
        for rec in r.thread(1).unwrap() {
            qs.feed(&rec.unwrap(), &mut visit);
        }
        qs.finish(&mut visit);
        out.sort();
        out.into_iter()
            .map(|(_, d, n, l, s)| (d, n, l, s))
            .collect()
    }

    #[test]
    fn filters_follow_uftrace() {
        let dir = tempfile::tempdir().unwrap();
        let r = trace(dir.path());
        let names = |v: Vec<(usize, String, bool, u64)>| {
            v.into_iter()
                .map(|(d, n, ..)| format!("{d}{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            names(kept(&r, Query::all())),
            "0main 1a 2leaf 1b 2leaf 2leaf 1leaf"
        );
        let f = |p: &str| Query {
            filter: vec![p.into()],
            ..Query::all()
        };
        assert_eq!(names(kept(&r, f("b"))), "0b 1leaf 1leaf");
        let n = Query {
            notrace: vec!["a".into()],
            ..Query::all()
        };
        assert_eq!(names(kept(&r, n)), "0main 1b 2leaf 2leaf 1leaf");
        let d = Query {
            max_depth: Some(2),
            ..Query::all()
        };
        let v = kept(&r, d);
        assert_eq!(names(v.clone()), "0main 1a 1b 1leaf");
        // a and b lost their callees: leaves, all their time their own.
        assert_eq!(v[1], (1, "a".into(), true, 90));
        assert_eq!(v[0].3, 300 - 90 - 100 - 1);
        let t = Query {
            min_duration_ns: Some(80),
            ..Query::all()
        };
        assert_eq!(names(kept(&r, t)), "0main 1a 1b 2leaf");
        let since = Query {
            since_ns: Some(105),
            until_ns: Some(150),
            ..Query::all()
        };
        assert_eq!(names(kept(&r, since)), "0b 1leaf 1leaf");
        let fd = Query {
            filter: vec!["b".into()],
            max_depth: Some(1),
            ..Query::all()
        };
        assert_eq!(kept(&r, fd), vec![(0, "b".into(), true, 100)]);
    }
}
