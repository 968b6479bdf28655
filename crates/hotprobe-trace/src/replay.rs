//! `replay`: the call tree of a recorded trace, like `uftrace replay`,
//! with uftrace's output fields (`-f time,delta,elapsed,duration,tid`)
//! and optional colours (function names, long durations, lost events).

use std::collections::{HashMap, VecDeque};
use std::io::Write;

use crate::analysis::{fmt_duration, merged, Progress, Step};
use crate::error::{Result, TraceError};
use crate::event::Args;
use crate::event::Record;
use crate::kernel::KernelEvent;
use crate::query::{CompiledQuery, QueryStack};
use crate::reader::TraceReader;

/// A column `replay` prints before the function (uftrace's `-f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayField {
    /// The line's time stamp (the trace's clock, seconds.nanoseconds).
    Time,
    /// Time since the previous line of any thread.
    Delta,
    /// Time since the trace's first record.
    Elapsed,
    /// A finished call's duration.
    Duration,
    /// The thread.
    Tid,
}

impl ReplayField {
    /// Every field, by the name `-f` takes.
    pub const NAMES: [(&'static str, ReplayField); 5] = [
        ("time", ReplayField::Time),
        ("delta", ReplayField::Delta),
        ("elapsed", ReplayField::Elapsed),
        ("duration", ReplayField::Duration),
        ("tid", ReplayField::Tid),
    ];

    /// `time,duration,tid` (or `none`) as fields; an unknown name is an
    /// error naming the known ones.
    pub fn parse_list(text: &str) -> std::result::Result<Vec<ReplayField>, String> {
        if text.trim() == "none" {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for name in text.split(',').map(str::trim) {
            let f = Self::NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| *f)
                .ok_or_else(|| {
                    let known: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                    format!(
                        "unknown field {name:?}: the fields are {}, or none",
                        known.join(", ")
                    )
                })?;
            if !out.contains(&f) {
                out.push(f);
            }
        }
        Ok(out)
    }

    fn header(self) -> &'static str {
        match self {
            ReplayField::Time => "    TIMESTAMP    ",
            ReplayField::Delta => "  DELTA   ",
            ReplayField::Elapsed => " ELAPSED  ",
            ReplayField::Duration => " DURATION  ",
            ReplayField::Tid => "   TID   ",
        }
    }
}

/// How `replay` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The columns before the function, in order (default: duration, tid).
    pub fields: Vec<ReplayField>,
    /// ANSI colours: function names bold, durations of at least
    /// `slow_ns` yellow and of 1,000 times that red, lost events red.
    pub color: bool,
    /// What a long call is (default 1 ms, as `count`'s table colours it).
    pub slow_ns: u64,
    /// The stack of each recorded call (`call_stacks.tsv`): an entry line
    /// ends with it (` /* <- caller <- … */`).
    pub call_stacks: Option<crate::call_stacks::CallStacks>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            fields: vec![ReplayField::Duration, ReplayField::Tid],
            color: false,
            slow_ns: 1_000_000,
            call_stacks: None,
        }
    }
}

const BOLD: &str = "\x1b[1m";
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

fn fmt_args(args: &Args) -> String {
    let v: Vec<String> = args
        .as_slice()
        .iter()
        .map(|&a| {
            let s = a as i64;
            if (-1_000_000..1_000_000).contains(&s) {
                s.to_string()
            } else {
                format!("{a:#x}")
            }
        })
        .collect();
    v.join(", ")
}

fn fmt_ret(ret: Option<u64>) -> String {
    match ret {
        Some(r) => format!(" = {}", fmt_args(&Args::from_slice(&[r]))),
        None => String::new(),
    }
}

/// Argument and return values as replay prints them: typed probes' from
/// their captured records (format version 2), others' registers.
pub(crate) struct TypedText<'r> {
    reader: &'r TraceReader,
    /// Per thread: its values file, read when first needed.
    values: std::cell::RefCell<HashMap<u32, crate::ThreadValues>>,
}

impl<'r> TypedText<'r> {
    pub(crate) fn new(reader: &'r TraceReader) -> Result<TypedText<'r>> {
        Ok(TypedText {
            reader,
            values: Default::default(),
        })
    }

    /// Record `index` of thread `tid`, as text for probe `probe`.
    fn record(&self, tid: u32, probe: u32, exit: bool, index: u64) -> Vec<String> {
        let mut values = self.values.borrow_mut();
        let v = values.entry(tid).or_insert_with(|| {
            // An unreadable file shows as missing records, per value.
            self.reader.thread_values(tid).unwrap_or_default()
        });
        match v.get(index) {
            Some(data) => self
                .reader
                .value_types()
                .format(probe, exit, data)
                .unwrap_or_default(),
            None => vec![format!("<no captured values #{index}>")],
        }
    }

    /// A typed probe's argument values as text; `None` for other probes.
    pub(crate) fn typed_args(&self, tid: u32, probe: u32, args: &Args) -> Option<Vec<String>> {
        let &i = args.as_slice().first()?;
        self.reader
            .value_types()
            .is_typed(probe)
            .then(|| self.record(tid, probe, false, i))
    }

    /// A typed probe's return value as text; `None` for other probes (and
    /// a typed void function's).
    pub(crate) fn typed_ret(&self, tid: u32, probe: u32, ret: u64) -> Option<String> {
        if !self.reader.value_types().is_typed(probe) {
            return None;
        }
        self.record(tid, probe, true, ret).into_iter().next()
    }

    /// Whether `probe`'s arguments and return value are record indices.
    pub(crate) fn is_typed(&self, probe: u32) -> bool {
        self.reader.value_types().is_typed(probe)
    }

    fn args(&self, tid: u32, probe: u32, args: &Args) -> String {
        match args.as_slice().first() {
            Some(&i) if self.reader.value_types().is_typed(probe) => {
                self.record(tid, probe, false, i).join(", ")
            }
            _ => fmt_args(args),
        }
    }

    fn ret(&self, tid: u32, probe: u32, ret: Option<u64>) -> String {
        match ret {
            Some(i) if self.reader.value_types().is_typed(probe) => self
                .record(tid, probe, true, i)
                .first()
                .map_or(String::new(), |v| format!(" = {v}")),
            r => fmt_ret(r),
        }
    }
}

/// Writes the call tree of all threads in time order, like `uftrace replay`:
///
/// ```text
/// # DURATION     TID     FUNCTION
///             [  1234] | main() {
///    0.120 us [  1234] |   leaf();
///    2.000 us [  1234] | }; /* main */
/// ```
///
/// The lines of a function probed through a trap (the trace's
/// `costs.tsv`) have `*` in their first column, as `report` marks its row,
/// and the same legend line ends the output:
///
/// ```text
/// *  0.950 us [  1234] |   leaf();
/// # * on a trap (in-process trap: µs a hit, taken out of these times as calibrated)
/// ```
pub fn replay(reader: &TraceReader, out: &mut impl Write, progress: Progress<'_>) -> Result<()> {
    replay_filtered(reader, &CompiledQuery::all(), out, progress)
}

/// [`replay`] of the calls a query keeps ([`crate::query`]): depths are
/// those of the filtered tree, and a call whose callees were all left out
/// shows as a leaf (`name();`).
pub fn replay_filtered(
    reader: &TraceReader,
    query: &CompiledQuery,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<()> {
    replay_with(reader, query, &ReplayOptions::default(), out, progress)
}

/// [`replay_filtered`] with the columns and colours of `opts`.
pub fn replay_with(
    reader: &TraceReader,
    query: &CompiledQuery,
    opts: &ReplayOptions,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<()> {
    let syms = reader.symbols();
    let mut stacks: HashMap<u32, QueryStack<'_>> = HashMap::new();
    let io = |e| TraceError::io("<output>", e);
    let typed = TypedText::new(reader)?;
    let fmt_args = |tid: u32, probe: u32, args: &Args| typed.args(tid, probe, args);
    let fmt_ret = |tid: u32, probe: u32, ret: Option<u64>| typed.ret(tid, probe, ret);
    let mut header = String::from("#");
    for f in &opts.fields {
        header.push_str(f.header());
    }
    writeln!(out, "{header}  FUNCTION").map_err(io)?;
    let start = crate::query::trace_start(reader)?.unwrap_or(0);
    let mut last_ts: Option<u64> = None;
    let paint = |text: String, code: &str| {
        if opts.color {
            format!("{code}{text}{RESET}")
        } else {
            text
        }
    };
    let name = |probe: u32| paint(syms.name(probe).to_string(), BOLD);
    let duration = |ns: u64| {
        let d = fmt_duration(ns);
        if !opts.color {
            d
        } else if ns >= opts.slow_ns.saturating_mul(1000) {
            paint(d, RED)
        } else if ns >= opts.slow_ns {
            paint(d, YELLOW)
        } else {
            d
        }
    };
    // The columns of a line at `ts` (`dur` for a finished call).
    let mut columns = |tid: u32, ts: u64, dur: Option<u64>| -> String {
        let mut c = String::new();
        for f in &opts.fields {
            match f {
                ReplayField::Time => c.push_str(&format!(
                    " {:>6}.{:09} ",
                    ts / 1_000_000_000,
                    ts % 1_000_000_000
                )),
                ReplayField::Delta => {
                    let d = last_ts.map_or(0, |l| ts.saturating_sub(l));
                    c.push_str(&format!(" {}", fmt_duration(d)));
                }
                ReplayField::Elapsed => {
                    c.push_str(&format!(" {}", fmt_duration(ts.saturating_sub(start))))
                }
                ReplayField::Duration => match dur {
                    Some(ns) => c.push_str(&format!(" {}", duration(ns))),
                    None => c.push_str(&" ".repeat(11)),
                },
                ReplayField::Tid => c.push_str(&format!(" [{tid:>6}]")),
            }
        }
        last_ts = Some(ts);
        c
    };
    // The trap mechanisms of the lines marked, for the legend at the end.
    let marks: std::cell::RefCell<crate::TrapMarks> = Default::default();
    // A line's start up to its `| `: the columns, `*` in place of their
    // first space for a line of a function on a trap, as `report` marks
    // its row (the columns, when any, start with a space).
    let lead = |columns: String, probe: Option<u32>| -> String {
        let mut s = columns;
        s.push(' ');
        let on_trap = probe.and_then(|p| reader.trap_of(p));
        marks.borrow_mut().mark(&mut s, on_trap);
        s
    };
    // The host kernel's syscalls per thread (`record --kernel`), printed
    // inside the call tree where they happened: those outside every kept
    // call only when the query keeps everything.
    let mut syscalls: HashMap<u32, VecDeque<KernelEvent>> = HashMap::new();
    if let Some(k) = reader.kernel_info() {
        for t in k.threads.iter().filter(|t| query.keeps_thread(t.tid)) {
            let ev = reader.kernel_events(t.tid)?;
            syscalls.insert(t.tid, ev.into_iter().filter(|e| e.is_syscall()).collect());
        }
    }
    let outside = query.keeps_all();
    let kernel_tids: Vec<u32> = syscalls.keys().copied().collect();
    // Each call's stack (`call_stacks.tsv`), by thread and entry time
    // (a step names its entry by its time): noted as the entry's record
    // is read, taken by its line.
    let pending: std::cell::RefCell<HashMap<u32, HashMap<u64, VecDeque<String>>>> =
        Default::default();
    let from = |tid: u32, ts: u64| -> String {
        let mut p = pending.borrow_mut();
        let Some(by) = p.get_mut(&tid) else {
            return String::new();
        };
        let s = by.get_mut(&ts).and_then(VecDeque::pop_front);
        if by.get(&ts).is_some_and(VecDeque::is_empty) {
            by.remove(&ts);
        }
        s.unwrap_or_default()
    };
    let mut line = |out: &mut dyn Write, tid: u32, s: Option<Step>| -> std::io::Result<()> {
        let ind = |d: usize| "  ".repeat(d);
        let queue = syscalls.get_mut(&tid);
        let mut empty = VecDeque::new();
        let queue = queue.unwrap_or(&mut empty);
        // Prints the syscalls that started before `ts`, at `depth`.
        let flush = |out: &mut dyn Write,
                     queue: &mut VecDeque<KernelEvent>,
                     columns: &mut dyn FnMut(u32, u64, Option<u64>) -> String,
                     ts: u64,
                     depth: usize|
         -> std::io::Result<()> {
            while queue.front().is_some_and(|e| e.start < ts) {
                let Some(e) = queue.pop_front() else { break };
                if depth == 0 && !outside {
                    continue;
                }
                writeln!(
                    out,
                    "{}| {}{}() = {};",
                    lead(columns(tid, e.start, Some(e.dur())), None),
                    ind(depth),
                    paint(format!("syscall:{}", e.name()), CYAN),
                    e.ret_text()
                )?;
            }
            Ok(())
        };
        let Some(s) = s else {
            return flush(out, queue, &mut columns, u64::MAX, 0);
        };
        match s {
            Step::Enter { ts, depth, .. } | Step::Hit { ts, depth, .. } => {
                flush(out, queue, &mut columns, ts, depth)?
            }
            Step::Leave {
                start,
                end,
                depth,
                leaf,
                unfinished: false,
                ..
            } => {
                if leaf {
                    flush(out, queue, &mut columns, start, depth)?;
                } else {
                    flush(out, queue, &mut columns, end, depth + 1)?;
                }
            }
            _ => {}
        }
        // A leaf call with syscalls inside: opened and closed around them.
        if let Step::Leave {
            probe,
            start,
            end,
            depth,
            args,
            ret,
            leaf: true,
            unfinished: false,
            ..
        } = s
        {
            if queue.front().is_some_and(|e| e.start < end) {
                writeln!(
                    out,
                    "{}| {}{}({}) {{{}",
                    lead(columns(tid, start, None), Some(probe)),
                    ind(depth),
                    name(probe),
                    fmt_args(tid, probe, &args),
                    from(tid, start)
                )?;
                flush(out, queue, &mut columns, end, depth + 1)?;
                return writeln!(
                    out,
                    "{}| {}}}{}; /* {} */",
                    lead(columns(tid, end, Some(end - start)), Some(probe)),
                    ind(depth),
                    fmt_ret(tid, probe, ret),
                    syms.name(probe)
                );
            }
        }
        match s {
            Step::Enter {
                probe,
                ts,
                depth,
                args,
            } => writeln!(
                out,
                "{}| {}{}({}) {{{}",
                lead(columns(tid, ts, None), Some(probe)),
                ind(depth),
                name(probe),
                fmt_args(tid, probe, &args),
                from(tid, ts)
            ),
            Step::Leave {
                probe,
                start,
                end,
                depth,
                args,
                ret,
                leaf,
                unfinished,
                ..
            } => {
                if unfinished {
                    return Ok(());
                }
                if leaf {
                    writeln!(
                        out,
                        "{}| {}{}({}){};{}",
                        lead(columns(tid, start, Some(end - start)), Some(probe)),
                        ind(depth),
                        name(probe),
                        fmt_args(tid, probe, &args),
                        fmt_ret(tid, probe, ret),
                        from(tid, start)
                    )
                } else {
                    writeln!(
                        out,
                        "{}| {}}}{}; /* {} */",
                        lead(columns(tid, end, Some(end - start)), Some(probe)),
                        ind(depth),
                        fmt_ret(tid, probe, ret),
                        syms.name(probe)
                    )
                }
            }
            Step::Hit {
                probe,
                ts,
                depth,
                args,
            } => writeln!(
                out,
                "{}| {}/* {} hit ({}) */",
                lead(columns(tid, ts, None), Some(probe)),
                ind(depth),
                name(probe),
                fmt_args(tid, probe, &args)
            ),
            Step::Lost { ts, count } => writeln!(
                out,
                "{}| {}",
                lead(columns(tid, ts, None), None),
                paint(format!("/* lost {count} events */"), RED)
            ),
            Step::Orphan { .. } => Ok(()),
        }
    };
    let mut entries: HashMap<u32, u64> = HashMap::new();
    merged(reader, progress, |tid, r| {
        if !query.keeps_thread(tid) {
            return Ok(());
        }
        if let (Some(cs), Record::Entry { ts, .. } | Record::Call { ts, .. }) =
            (&opts.call_stacks, r)
        {
            let n = entries.entry(tid).or_default();
            *n += 1;
            if let Some((_, callers, truncated)) = cs.of_call(tid, *n) {
                let more = if *truncated { " <- [truncated]" } else { "" };
                let text = format!(" /* <- {}{more} */", callers.join(" <- "));
                let mut p = pending.borrow_mut();
                p.entry(tid)
                    .or_default()
                    .entry(*ts)
                    .or_default()
                    .push_back(text);
            }
        }
        let st = stacks.entry(tid).or_insert_with(|| QueryStack::new(query));
        let mut res = Ok(());
        st.feed(r, |s| {
            if res.is_ok() {
                res = line(out, tid, Some(s));
            }
        });
        res.map_err(io)
    })?;
    // Calls still open at the end of their thread: their entries; then
    // the syscalls after the thread's last call.
    let mut tids: Vec<u32> = stacks.keys().copied().chain(kernel_tids).collect();
    tids.sort_unstable();
    tids.dedup();
    for tid in tids {
        let mut res = Ok(());
        if let Some(st) = stacks.get_mut(&tid) {
            st.finish(|s| {
                if res.is_ok() {
                    res = line(out, tid, Some(s));
                }
            });
        }
        res.and_then(|()| line(out, tid, None)).map_err(io)?;
    }
    // The lines marked `*`: what they mean, as under `report`'s table.
    if let Some(legend) = marks.borrow().legend(&reader.corrected_mechanisms()) {
        writeln!(out, "{legend}").map_err(io)?;
    }
    Ok(())
}
