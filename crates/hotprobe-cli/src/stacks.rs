//! `--stacks`: prints the stacks the session counted at each probe
//! (`count --stacks FUNC`), most frequent first, symbolized. The stacks
//! are captured and symbolized by the library (`Session::stacks`); this
//! module only prints.

use crate::caller_times::{CallTimes, GroupTimes};
use crate::cli::{ReportArgs, SortArg};
use crate::out::{errln, outln, paint, NAME};
use hotprobe::trace::call_stacks::CallStacks;
use hotprobe::trace::fmt_duration;
use hotprobe::trace::stacks::Callers;
use hotprobe::trace::stacks::CapturedStack;
use hotprobe::trace::{CompiledQuery, TraceReader};
use hotprobe::{EventSink, Placement, RecordedEvent, Session, SinkError};
use std::collections::BTreeMap;
use std::collections::HashMap;

/// Prints each probe's stacks: a block per stack, its count, then its
/// frames (the probed function's caller first), `[truncated]` where the
/// walk stopped early; and on stderr what could not be captured.
pub fn print_stacks(session: &Session, placed: &[Placement]) {
    for p in placed {
        let Some((stacks, totals)) = session.stacks(p.id) else {
            errln!(
                "hotprobe: --stacks: no stacks for {} ({}: only probes at a function's entry capture them, on the patch, jump or trap mechanism)",
                p.label,
                p.mechanism
            );
            continue;
        };
        if stacks.is_empty() && session.stats(p.id).is_some_and(|s| s.hits > 0) {
            errln!(
                "hotprobe: --stacks: no stacks for {} ({}: only sites at a function's first instruction capture them)",
                p.label,
                p.mechanism
            );
        }
        outln!();
        outln!("stacks of {} (most frequent first):", p.label);
        for s in &stacks {
            outln!("  {:>10}", s.count);
            for f in &s.frames {
                outln!("      {f}");
            }
            if s.truncated {
                outln!("      [truncated]");
            }
        }
        let lost = totals.torn + totals.table_full;
        if lost > 0 {
            errln!(
                "hotprobe: --stacks: {lost} stacks not counted ({} walked while the tables changed, {} with the stack table full)",
                totals.torn,
                totals.table_full
            );
        }
        say_unwalked(&totals);
    }
}

/// Says on stderr how many trap hits had a stack the tracer could not read.
fn say_unwalked(totals: &hotprobe::stacks::StackTotals) {
    if totals.unwalked > 0 {
        errln!(
            "hotprobe: --stacks: {} stacks on a trap could not be read (the stack pointer's memory was unreadable): counted as empty, truncated stacks ([unknown] callers)",
            totals.unwalked
        );
    }
}

/// `record --stacks`: in front of the trace's sink, notes the stack of
/// each recorded entry that carries one (the agent walked it, or the tracer at a trap stop) as the
/// `n`-th entry of its thread, for `call_stacks.tsv`.
pub struct CallStackSink<'a> {
    inner: &'a mut dyn EventSink,
    names: Option<hotprobe::stacks::StackNames>,
    /// Probe id → the function it probes (as the trace's symbols name it).
    functions: HashMap<u32, String>,
    /// Entries seen per thread.
    entries: HashMap<u32, u64>,
    /// (function, callers, truncated) → stack id.
    ids: HashMap<(String, Vec<String>, bool), u32>,
    calls: CallStacks,
}

impl<'a> CallStackSink<'a> {
    /// In front of `inner`, naming stacks with `names` (`None`: notes
    /// nothing) for the probes `placed`.
    pub fn new(
        inner: &'a mut dyn EventSink,
        names: Option<hotprobe::stacks::StackNames>,
        placed: &[Placement],
    ) -> CallStackSink<'a> {
        let mut s = CallStackSink {
            inner,
            names,
            functions: HashMap::new(),
            entries: HashMap::new(),
            ids: HashMap::new(),
            calls: CallStacks::default(),
        };
        s.learn(placed);
        s
    }

    fn learn(&mut self, placed: &[Placement]) {
        for p in placed {
            // As the trace names the probe's calls (a pending probe of a
            // program a followed process executed: its spec's function).
            self.functions.insert(p.id.0, crate::record::trace_name(p));
        }
    }

    fn note(&mut self, ev: &RecordedEvent) {
        if ev.kind != hotprobe::KIND_ENTRY {
            return;
        }
        let n = self.entries.entry(ev.tid).or_default();
        *n += 1;
        let n = *n;
        let Some(cs) = self.names.as_ref().and_then(|names| names.of_event(ev)) else {
            return;
        };
        let function = self
            .functions
            .get(&ev.probe_id)
            .cloned()
            .unwrap_or_else(|| format!("probe {}", ev.probe_id));
        let next = self.ids.len() as u32 + 1;
        let key = (function, cs.frames, cs.truncated);
        let id = *self.ids.entry(key.clone()).or_insert(next);
        self.calls.stacks.entry(id).or_insert(key);
        self.calls.calls.insert((ev.tid, n), id);
    }

    /// The calls' stacks noted.
    pub fn finish(self) -> CallStacks {
        self.calls
    }
}

impl EventSink for CallStackSink<'_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.note(ev);
        self.inner.event(ev)
    }
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        self.note(ev);
        self.inner.event_data(ev, data)
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.inner.lost(tid, ts, count)
    }
    fn idle(&mut self) {
        self.inner.idle()
    }
    fn exec_image(&mut self, image: &hotprobe::ExecImage) -> Result<(), SinkError> {
        self.learn(&image.placements);
        self.inner.exec_image(image)
    }
    fn pending_armed(&mut self, armed: &hotprobe::ArmedPending) -> Result<(), SinkError> {
        self.inner.pending_armed(armed)
    }
}

/// `record --stacks`: writes the stacks the session captured into the
/// trace in `dir` (stacks.tsv) and each recorded call's (`calls`, into
/// call_stacks.tsv, unless the writer's filters left entries out: the
/// calls would not line up), and says on stderr what was not captured.
pub fn write_trace_stacks(
    session: &Session,
    placed: &[Placement],
    dir: &std::path::Path,
    calls: &CallStacks,
    written: &hotprobe::trace::WriteStats,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let (stacks, totals) = session.captured_stacks(placed);
    hotprobe::trace::stacks::write_stacks(dir, &stacks).context("cannot write the stacks")?;
    if written.filtered.removed() > 0 || written.dropped > 0 {
        errln!("hotprobe: --stacks: the trace leaves calls out (filters, a failed write): no stack per call, only the counted stacks");
    } else if !calls.calls.is_empty() {
        hotprobe::trace::call_stacks::write_call_stacks(dir, calls)
            .context("cannot write the calls' stacks")?;
    }
    let lost = totals.torn + totals.table_full;
    if lost > 0 {
        errln!(
            "hotprobe: --stacks: {lost} stacks not captured ({} walked while the tables changed, {} with the stack table full)",
            totals.torn,
            totals.table_full
        );
    }
    say_unwalked(&totals);
    Ok(())
}

/// `report --callers` and `--graph`: refuses the options they would
/// otherwise ignore, naming them (`markers`: `--marker`).
pub fn refuse_unused(o: &ReportArgs, markers: &[String]) -> anyhow::Result<()> {
    let mode = if o.callers.is_some() {
        "--callers"
    } else {
        "--graph"
    };
    if !markers.is_empty() {
        anyhow::bail!(crate::UsageError(format!(
            "--marker splits the tables into phases; {mode} has none: give one of them"
        )));
    }
    if o.graph.is_some() && o.sort == Some(SortArg::Max) {
        anyhow::bail!(crate::UsageError(
            "--graph -s max: a graph node sums the calls along its path and keeps no \
             longest call; sort it by total, self, calls or avg"
                .into()
        ));
    }
    let q = &o.query;
    let timed = q.min_duration.is_some()
        || q.since.is_some()
        || q.until.is_some()
        || o.sort.is_some_and(|s| s != SortArg::Calls);
    if o.callers.is_some() && q.raw_times && !timed {
        anyhow::bail!(crate::UsageError(
            "--callers --raw-times: --callers counts calls, and the probes' costs change \
             only times: give it with a time key (-s total, self, avg, max) or a time \
             filter (-t, --since, --until), or leave it out"
                .into()
        ));
    }
    Ok(())
}

/// Stacks of one thread (`Some(tid)`) or of all (`None`), counted.
type StackGroup = (Option<u32>, Vec<CapturedStack>);

/// A trace's captured stacks, as it holds them.
enum TraceStacks {
    /// Each recorded call's (`call_stacks.tsv`): the filters apply.
    Calls(hotprobe::trace::call_stacks::CallStacks),
    /// Only as the target counted them (`stacks.tsv`: a trace recorded
    /// with writer filters, or before trace format 5).
    Counted(Vec<CapturedStack>),
}

/// The captured stacks of the trace in `dir`; `None` without stacks.
fn read_trace_stacks(dir: &std::path::Path) -> anyhow::Result<Option<TraceStacks>> {
    use anyhow::Context;
    let ctx = || format!("cannot read the stacks of {}", dir.display());
    if let Some(calls) = hotprobe::trace::call_stacks::read_call_stacks(dir).with_context(ctx)? {
        return Ok(Some(TraceStacks::Calls(calls)));
    }
    Ok(hotprobe::trace::stacks::read_stacks(dir)
        .with_context(ctx)?
        .map(TraceStacks::Counted))
}

/// The captured stacks of the calls `query` keeps, counted in calls: over
/// all threads (one group, tid `None`) or per thread (`per_thread`);
/// `None` when the trace in `dir` has no captured stacks. A trace with
/// only the target's counts (`stacks.tsv`) is refused with filters or
/// per thread: its stacks cannot be told apart by call or by thread.
fn kept_stacks(
    r: &TraceReader,
    dir: &std::path::Path,
    query: &CompiledQuery,
    per_thread: bool,
    what: &str,
) -> anyhow::Result<Option<Vec<StackGroup>>> {
    Ok(kept_call_stacks(r, dir, query, per_thread, what)?.map(|(g, _)| g))
}

/// [`kept_stacks`], with the kept calls' own stacks when the trace has
/// them (call_stacks.tsv).
fn kept_call_stacks(
    r: &TraceReader,
    dir: &std::path::Path,
    query: &CompiledQuery,
    per_thread: bool,
    what: &str,
) -> anyhow::Result<Option<(Vec<StackGroup>, Option<CallStacks>)>> {
    use anyhow::Context;
    match read_trace_stacks(dir)? {
        None => Ok(None),
        Some(TraceStacks::Calls(calls)) => {
            let kept = calls
                .kept(r, query, None)
                .with_context(|| format!("cannot filter the stacks of {}", dir.display()))?;
            let groups = if per_thread {
                kept.counted_by_thread()
                    .into_iter()
                    .map(|(tid, s)| (Some(tid), s))
                    .collect()
            } else {
                vec![(None, kept.counted())]
            };
            Ok(Some((groups, Some(kept))))
        }
        Some(TraceStacks::Counted(stacks)) => {
            let only = "has only the stacks the target counted (stacks.tsv), not each \
                        call's (call_stacks.tsv: not written when the recorder's filters \
                        left calls out, nor before trace format 5)";
            if !query.keeps_all() {
                anyhow::bail!(crate::UsageError(format!(
                    "{what}: {} {only}: -F, -N, -D, -t, --tid, --since and --until cannot \
                     apply to them; leave the filters out",
                    dir.display()
                )));
            }
            if per_thread {
                anyhow::bail!(crate::UsageError(format!(
                    "{what}: {} {only}: they are not split by thread; leave out \
                     --per-thread",
                    dir.display()
                )));
            }
            Ok(Some((vec![(None, stacks)], None)))
        }
    }
}

/// `report --callers FUNC --json`: one group of callers.
#[derive(serde::Serialize)]
struct CallersJson {
    /// The thread (per thread only).
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u32>,
    callers: Vec<CallerJson>,
}

#[derive(serde::Serialize)]
struct CallerJson {
    function: String,
    caller: String,
    calls: u64,
    /// With a time key (-s total, self, avg, max).
    #[serde(skip_serializing_if = "Option::is_none")]
    times: Option<CallTimes>,
    paths: Vec<PathJson>,
}

#[derive(serde::Serialize)]
struct PathJson {
    /// Innermost first.
    callers: Vec<String>,
    truncated: bool,
    calls: u64,
    /// With a time key.
    #[serde(skip_serializing_if = "Option::is_none")]
    times: Option<CallTimes>,
}

/// What `report --callers` prints.
pub struct CallersOptions<'a> {
    /// The glob of the called functions.
    pub func: &'a str,
    /// One table per thread.
    pub per_thread: bool,
    /// JSON instead of the table.
    pub json: bool,
    /// The filters, as given (for the JSON).
    pub query: hotprobe::trace::Query,
    /// `-s`: calls (the default), or a time of the calls' (from each
    /// call's stack and duration).
    pub sort: Option<SortArg>,
}

/// `report --callers FUNC`: the direct callers of the functions matching
/// the glob `func` in the stacks the trace in `dir` captured, most calls
/// first, each with the full stacks through it; of the calls `query`
/// keeps, per thread or not, as a table or JSON.
pub fn print_callers(
    r: &TraceReader,
    dir: &std::path::Path,
    query: &CompiledQuery,
    o: &CallersOptions<'_>,
) -> anyhow::Result<()> {
    let Some((groups, kept)) = kept_call_stacks(r, dir, query, o.per_thread, "--callers")? else {
        anyhow::bail!(
            "{} has no captured stacks: record with --stacks",
            dir.display()
        );
    };
    let time_key = o.sort.filter(|s| *s != SortArg::Calls);
    let times = match (time_key, &kept) {
        (None, _) => None,
        (Some(_), Some(kept)) => Some(crate::caller_times::stack_times(r, kept)?),
        (Some(key), None) => anyhow::bail!(crate::UsageError(format!(
            "--callers -s {}: {} has only the stacks the target counted (stacks.tsv), \
             not each call's (call_stacks.tsv): the times of a caller's calls are not \
             known; sort by calls (-s calls, the default)",
            crate::analyse::sort_name(key),
            dir.display()
        ))),
    };
    let func = o.func;
    let groups: Vec<(Option<u32>, Vec<Callers>, Option<GroupTimes>)> = groups
        .into_iter()
        .map(|(tid, stacks)| {
            let mut c = hotprobe::trace::stacks::callers_of(&stacks, |f| {
                hotprobe::symbols::pattern::matches(func, f)
            });
            let t = times.as_ref().map(|t| GroupTimes::of(t, tid));
            if let (Some(t), Some(key)) = (&t, time_key) {
                t.sort(&mut c, key);
            }
            (tid, c, t)
        })
        .filter(|(tid, c, _)| tid.is_none() || !c.is_empty())
        .collect();
    if o.json {
        let groups: Vec<CallersJson> = groups
            .into_iter()
            .map(|(tid, callers, t)| CallersJson {
                tid,
                callers: callers
                    .into_iter()
                    .map(|c| CallerJson {
                        times: t.as_ref().map(|t| t.caller(&c)),
                        paths: c
                            .paths
                            .iter()
                            .map(|p| PathJson {
                                callers: p.0.clone(),
                                truncated: p.1,
                                calls: p.2,
                                times: t.as_ref().map(|t| t.path(&c.function, p)),
                            })
                            .collect(),
                        function: c.function,
                        caller: c.caller,
                        calls: c.count,
                    })
                    .collect(),
            })
            .collect();
        #[derive(serde::Serialize)]
        struct J<'a> {
            trace: &'a std::path::Path,
            query: hotprobe::trace::Query,
            callers_of: &'a str,
            /// `-s`, when given.
            #[serde(skip_serializing_if = "Option::is_none")]
            sort: Option<&'static str>,
            /// Without per thread: the one group's callers.
            #[serde(skip_serializing_if = "Option::is_none")]
            callers: Option<Vec<CallerJson>>,
            /// Per thread.
            #[serde(skip_serializing_if = "Option::is_none")]
            threads: Option<Vec<CallersJson>>,
        }
        let (callers, threads) = if o.per_thread {
            (None, Some(groups))
        } else {
            let one = groups.into_iter().next().map(|g| g.callers);
            (Some(one.unwrap_or_default()), None)
        };
        let s = serde_json::to_string(&J {
            trace: dir,
            query: o.query.clone(),
            callers_of: func,
            sort: o.sort.map(crate::analyse::sort_name),
            callers,
            threads,
        })?;
        outln!("{s}");
        return Ok(());
    }
    if groups.iter().all(|(_, c, _)| c.is_empty()) {
        outln!("no call matches --callers {func}");
        return Ok(());
    }
    for (i, (tid, callers, t)) in groups.iter().enumerate() {
        if let Some(tid) = tid {
            if i > 0 {
                outln!();
            }
            let calls: u64 = callers.iter().map(|c| c.count).sum();
            outln!("# thread {tid}: {calls} calls");
        }
        // With a time key, its column after the calls.
        let column = |v: Option<CallTimes>| match (v, time_key) {
            (Some(v), Some(key)) => format!("  {:>11}", fmt_duration(v.key(key)).trim()),
            _ => String::new(),
        };
        let title = match time_key {
            Some(key) => format!("  {:>11}", crate::caller_times::key_title(key)),
            None => String::new(),
        };
        outln!("{:>10}{title}  CALLER -> FUNCTION", "CALLS");
        for c in callers {
            let ct = column(t.as_ref().map(|t| t.caller(c)));
            let (caller, function) = (paint(NAME, &c.caller), paint(NAME, &c.function));
            outln!("{:>10}{ct}  {caller} -> {function}", c.count);
            for p in &c.paths {
                let (path, truncated, n) = p;
                let more = if *truncated { " <- [truncated]" } else { "" };
                let pt = column(t.as_ref().map(|t| t.path(&c.function, p)));
                let path: Vec<String> = path.iter().map(|f| paint(NAME, f)).collect();
                outln!("{:>10}{pt}      {}{more}", n, path.join(" <- "));
            }
        }
    }
    Ok(())
}

/// The folded stacks (and what they count) that `export --format folded`,
/// svg and html and `report --flame` draw from a trace with captured
/// stacks (`record --stacks`): the stacks of the calls `query` keeps, in
/// calls, each starting with `tid-N` per thread; `None` when the trace has
/// none (the call tree is folded then).
pub fn captured_folded(
    r: &TraceReader,
    dir: &std::path::Path,
    query: &CompiledQuery,
    per_thread: bool,
    what: &str,
) -> anyhow::Result<Option<BTreeMap<String, u64>>> {
    let Some(groups) = kept_stacks(r, dir, query, per_thread, what)? else {
        return Ok(None);
    };
    errln!("hotprobe: {what}: from the captured stacks (record --stacks), in calls");
    let mut all = BTreeMap::new();
    for (tid, stacks) in groups {
        let prefix = tid.map(|t| format!("tid-{t}"));
        for (k, n) in hotprobe::trace::stacks::folded_map(&stacks, prefix.as_deref()) {
            *all.entry(k).or_default() += n;
        }
    }
    Ok(Some(all))
}

/// `report --graph FUNC`: the call graph below the functions matching the
/// glob `func`, from the recorded call tree, each node's callees in order
/// of first call or by `sort`; as JSON (with the filters `json` gives)
/// when asked.
pub fn print_graph(
    r: &hotprobe::trace::TraceReader,
    query: &hotprobe::trace::CompiledQuery,
    func: &str,
    json: Option<&hotprobe::trace::Query>,
    sort: Option<SortArg>,
) -> anyhow::Result<()> {
    let mut roots = hotprobe::trace::graph::call_graph(
        r,
        query,
        |f| hotprobe::symbols::pattern::matches(func, f),
        None,
    )?;
    if let Some(key) = sort {
        crate::caller_times::sort_graph(&mut roots, key);
    }
    if let Some(q) = json {
        #[derive(serde::Serialize)]
        struct J<'a> {
            trace: &'a std::path::Path,
            query: &'a hotprobe::trace::Query,
            graph_of: &'a str,
            graphs: &'a [hotprobe::trace::graph::GraphNode],
        }
        let s = serde_json::to_string(&J {
            trace: r.dir(),
            query: q,
            graph_of: func,
            graphs: &roots,
        })?;
        outln!("{s}");
        return Ok(());
    }
    if roots.is_empty() {
        outln!("no call matches --graph {func}");
        return Ok(());
    }
    for g in &roots {
        outln!("# call graph of {}", g.function);
        for line in crate::report_text::graph_text(g, crate::out::colors_on()).lines() {
            outln!("{line}");
        }
    }
    Ok(())
}
