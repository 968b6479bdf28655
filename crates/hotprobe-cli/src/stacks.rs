//! `--stacks`: prints the stacks the session counted at each probe
//! (`count --stacks FUNC`), most frequent first, symbolized. The stacks
//! are captured and symbolized by the library (`Session::stacks`); this
//! module only prints.

use crate::out::{errln, outln};
use hotprobe::trace::call_stacks::CallStacks;
use hotprobe::{EventSink, Placement, RecordedEvent, Session, SinkError};
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
    }
}

/// `record --stacks`: in front of the trace's sink, notes the stack of
/// each recorded entry that carries one (the agent walked it) as the
/// `n`-th entry of its thread, for `call_stacks.tsv`.
pub struct CallStackSink<'a> {
    inner: &'a mut dyn EventSink,
    names: Option<hotprobe::stacks::StackNames>,
    /// Probe id → the function it probes (as stacks.tsv names it).
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
            let f = p.function.clone().unwrap_or_else(|| p.label.clone());
            self.functions.insert(p.id.0, f);
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
    Ok(())
}

/// The captured stacks of the trace in `dir`, counted in recorded calls
/// where it has each call's (`call_stacks.tsv`), else as the target
/// counted them (`stacks.tsv`); `None` without stacks.
fn trace_stacks(
    dir: &std::path::Path,
) -> anyhow::Result<Option<Vec<hotprobe::trace::stacks::CapturedStack>>> {
    use anyhow::Context;
    let read =
        |e| anyhow::Error::from(e).context(format!("cannot read the stacks of {}", dir.display()));
    if let Some(calls) = hotprobe::trace::call_stacks::read_call_stacks(dir).map_err(read)? {
        return Ok(Some(calls.counted()));
    }
    hotprobe::trace::stacks::read_stacks(dir)
        .with_context(|| format!("cannot read the stacks of {}", dir.display()))
}

/// `report --callers FUNC`: the direct callers of the functions matching
/// the glob `func` in the stacks the trace in `dir` captured, most calls
/// first, each with the full stacks through it.
pub fn print_callers(dir: &std::path::Path, func: &str) -> anyhow::Result<()> {
    let stacks = trace_stacks(dir)?;
    let Some(stacks) = stacks else {
        anyhow::bail!(
            "{} has no captured stacks: record with --stacks",
            dir.display()
        );
    };
    let callers = hotprobe::trace::stacks::callers_of(&stacks, |f| {
        hotprobe::symbols::pattern::matches(func, f)
    });
    if callers.is_empty() {
        outln!("no call matches --callers {func}");
        return Ok(());
    }
    outln!("{:>10}  CALLER -> FUNCTION", "CALLS");
    for c in &callers {
        outln!("{:>10}  {} -> {}", c.count, c.caller, c.function);
        for (path, truncated, n) in &c.paths {
            let more = if *truncated { " <- [truncated]" } else { "" };
            outln!("{:>10}      {}{more}", n, path.join(" <- "));
        }
    }
    Ok(())
}

/// `export --format folded` of a trace with captured stacks (`record
/// --stacks`): the stacks in folded form, counted in calls; `None` when
/// the trace has none (the call tree is folded then).
pub fn captured_folded(dir: &std::path::Path, per_thread: bool) -> anyhow::Result<Option<String>> {
    let Some(stacks) = trace_stacks(dir)? else {
        return Ok(None);
    };
    if per_thread {
        errln!("hotprobe: --per-thread: captured stacks are counted over all threads; folding the call tree");
        return Ok(None);
    }
    errln!("hotprobe: folded from the captured stacks (record --stacks), in calls");
    Ok(Some(hotprobe::trace::stacks::folded_stacks(&stacks)))
}

/// `report --graph FUNC`: the call graph below the functions matching the
/// glob `func`, from the recorded call tree.
pub fn print_graph(
    r: &hotprobe::trace::TraceReader,
    query: &hotprobe::trace::CompiledQuery,
    func: &str,
) -> anyhow::Result<()> {
    let roots = hotprobe::trace::graph::call_graph(
        r,
        query,
        |f| hotprobe::symbols::pattern::matches(func, f),
        None,
    )?;
    if roots.is_empty() {
        outln!("no call matches --graph {func}");
        return Ok(());
    }
    for g in &roots {
        outln!("# call graph of {}", g.function);
        for line in g.to_text().lines() {
            outln!("{line}");
        }
    }
    Ok(())
}
