//! `hotprobe replay`, `report`, `info` and `export`: what is done with a
//! trace directory written by `hotprobe record` (analyses and exporters of
//! `hotprobe-trace`), with a progress bar on stderr for long runs.
//!
//! `replay` and `report` take uftrace's filters ([`QueryArgs`]); `report`
//! sorts, compares two traces, draws histograms and flame graphs; tables
//! have `--json` (docs/JSON.md).

use crate::cli::{ExportFormat, QueryArgs, ReportArgs, SortArg};
use crate::out::errln;
use anyhow::{bail, Context, Result};
use hotprobe::trace::{
    draw_flamegraph, export_chrome_filtered, export_ctf_filtered, export_flamegraph,
    export_folded_filtered, export_otlp, export_parquet, histograms, replay_with, report_by_thread,
    report_filtered, report_phases_filtered, summarize, CompiledQuery, FlameOptions, FoldedOptions,
    FoldedValue, OtlpEndpoint, OtlpOptions, PhaseSpec, Query, ReplayField, ReplayOptions,
    ReportDiff, SortKey, TraceError, TraceReader,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

impl QueryArgs {
    /// The library's query.
    pub fn query(&self) -> Query {
        Query {
            filter: self.filter.clone(),
            notrace: self.notrace.clone(),
            max_depth: self.depth,
            min_duration_ns: self.min_duration,
            tids: self.tid.clone(),
            since_ns: self.since,
            until_ns: self.until,
        }
    }

    fn compile(&self, r: &TraceReader) -> Result<CompiledQuery> {
        if let (Some(s), Some(u)) = (self.since, self.until) {
            if u <= s {
                bail!(crate::UsageError(
                    "--until must be later than --since".into()
                ));
            }
        }
        match self.query().compile(r) {
            // A bad pattern is the command line's fault.
            Err(TraceError::Invalid(what)) => bail!(crate::UsageError(what)),
            c => c.with_context(|| format!("cannot filter {}", r.dir().display())),
        }
    }

    /// Says so on stderr, and true, when the `-F` patterns match no
    /// function of the trace (the output would be empty).
    fn matches_nothing(&self, c: &CompiledQuery) -> bool {
        if !c.filter_matches_nothing() {
            return false;
        }
        let fs: Vec<String> = self.filter.iter().map(|f| format!("-F {f}")).collect();
        errln!("hotprobe: no call matches {}", fs.join(" "));
        true
    }
}

impl From<SortArg> for SortKey {
    fn from(s: SortArg) -> SortKey {
        match s {
            SortArg::Total => SortKey::Total,
            SortArg::SelfTime => SortKey::SelfTime,
            SortArg::Calls => SortKey::Calls,
            SortArg::Avg => SortKey::Avg,
            SortArg::Max => SortKey::Max,
        }
    }
}

fn open(dir: &Path) -> Result<TraceReader> {
    TraceReader::open(dir).with_context(|| format!("cannot read the trace in {}", dir.display()))
}

/// [`open`] for replay, report and export: times with or without the
/// probes' costs (`--raw-times`).
fn open_timed(dir: &Path, q: &QueryArgs) -> Result<TraceReader> {
    let mut r = open(dir)?;
    r.set_overhead_correction(!q.raw_times);
    Ok(r)
}

/// Says on stderr, after a replay, a report or an export with stdout at
/// a terminal, whether its times leave the probes' costs out, and which
/// functions went through a trap. A pipe gets the data alone, with the
/// stderr of `| head` left empty: the report's table marks those
/// functions `*` with a legend line, and the JSON forms, `info` and the
/// exports' metadata carry the same (`probe_costs`, `on_traps`).
fn say_times(r: &TraceReader) {
    use std::io::IsTerminal;
    if READER_GONE.load(std::sync::atomic::Ordering::Relaxed) || !std::io::stdout().is_terminal() {
        return;
    }
    if let Some(note) = r.overhead_note() {
        errln!("hotprobe: {note}");
        let traps = r.trap_functions();
        if !traps.is_empty() {
            let names: Vec<String> = traps.iter().map(|(f, m)| format!("{f} ({m})")).collect();
            errln!("hotprobe: on a trap: {}", names.join(", "));
        }
    }
}

/// Says on stderr, whatever the output, when the probes' calibrated costs
/// look too high for the calls read (docs/ANALYSIS.md, "Probe costs").
fn warn_corrected(r: &TraceReader) {
    if !READER_GONE.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(w) = r.correction_warning() {
            errln!("hotprobe: {w}");
        }
    }
}

/// A byte-progress bar over the trace's streams, hidden when stderr is not
/// a terminal or the input is small.
fn bytes_bar(reader: &TraceReader, what: &str) -> ProgressBar {
    let total = reader.total_bytes();
    let bar = if total < 4 << 20 {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} {{bytes}}/{{total_bytes}} {{bar:30}} {{eta}}"
    )) {
        bar.set_style(style);
    }
    bar
}

/// Runs `f` with a progress callback driving `bar`.
fn with_bar<T>(
    bar: &ProgressBar,
    f: impl FnOnce(&mut dyn FnMut(u64, u64)) -> hotprobe::trace::Result<T>,
) -> hotprobe::trace::Result<T> {
    let mut cb = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let r = f(&mut cb);
    bar.finish_and_clear();
    r
}

/// Says so on stderr when the recorder did not finish (killed): the
/// reader takes each stream up to its last whole block, and says how much
/// of each stream that is.
fn warn_incomplete(r: &TraceReader) {
    if !r.info().complete {
        errln!(
            "hotprobe: warning: {} was not finished by its recorder (killed?): \
             cut short, read up to the last whole block of each stream",
            r.dir().display()
        );
        for c in r.cut_short() {
            errln!(
                "hotprobe: warning: thread {}: {}: read {} records, {} of its {} bytes",
                c.tid,
                c.what,
                c.records,
                c.bytes_read,
                c.file_bytes
            );
        }
    }
}

/// A reader of our stdout went away (`hotprobe replay DIR | head`): not an
/// error, the output is simply no longer wanted.
fn broken_pipe(e: &TraceError) -> bool {
    matches!(e, TraceError::Io { source, .. } if source.kind() == ErrorKind::BrokenPipe)
}

/// Writes `text` to stdout; a closed pipe is not an error.
/// Set when stdout's reader went away (`replay | head`): the run then ends
/// quietly, without its notes on stderr.
static READER_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn reader_gone() {
    READER_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A writer that notes (`READER_GONE`) when its reader went away, for
/// writers that hide the error's kind (Parquet's).
struct NotePipe<W>(W);

impl<W: Write> Write for NotePipe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.0.write(buf);
        if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::BrokenPipe) {
            reader_gone();
        }
        r
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let r = self.0.flush();
        if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::BrokenPipe) {
            reader_gone();
        }
        r
    }
}

pub(crate) fn print(text: &str) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {
            reader_gone();
            Ok(())
        }
        r => r.context("cannot write the output"),
    }
}

/// One line of JSON.
pub(crate) fn print_json(v: &impl Serialize) -> Result<()> {
    let mut s = serde_json::to_string(v).context("cannot encode JSON")?;
    s.push('\n');
    print(&s)
}

/// `hotprobe replay DIR [filters] [-f FIELDS]`: the call tree on stdout.
pub fn replay_cmd(dir: &Path, q: &QueryArgs, fields: &str) -> Result<()> {
    let fields_spelled = fields;
    let fields = ReplayField::parse_list(fields)
        .map_err(|e| crate::UsageError(format!("-f {fields}: {e}")))?;
    crate::option_rules::refuse_replay(q, &fields, fields_spelled)?;
    let r = open_timed(dir, q)?;
    replay_of(&r, dir, q, fields)?;
    warn_corrected(&r);
    // Unless nothing was shown ("no call matches").
    if !q.compile(&r)?.filter_matches_nothing() {
        say_times(&r);
    }
    Ok(())
}

fn replay_of(r: &TraceReader, dir: &Path, q: &QueryArgs, fields: Vec<ReplayField>) -> Result<()> {
    warn_incomplete(r);
    let query = q.compile(r)?;
    if q.matches_nothing(&query) {
        return Ok(());
    }
    let bar = bytes_bar(r, "replaying");
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let opts = ReplayOptions {
        fields,
        color: crate::out::colors_on(),
        // `record --stacks`: each call's stack ends its line.
        call_stacks: hotprobe::trace::call_stacks::read_call_stacks(dir)?,
        ..ReplayOptions::default()
    };
    match with_bar(&bar, |cb| replay_with(r, &query, &opts, &mut out, Some(cb))) {
        Err(e) if broken_pipe(&e) => {
            reader_gone();
            return Ok(());
        }
        r => r.with_context(|| format!("cannot replay {}", dir.display()))?,
    }
    match out.flush() {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {
            reader_gone();
            Ok(())
        }
        r => r.context("cannot write the output"),
    }
}

/// `report --json` of one table.
#[derive(Serialize)]
struct ReportJson<'a> {
    trace: &'a Path,
    query: Query,
    sort: &'static str,
    calls: u64,
    rows: &'a [hotprobe::trace::ReportRow],
    /// Whether the times leave the probes' costs out, and those costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    probe_costs: Option<String>,
    /// The functions probed through a trap, with the mechanism.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    on_traps: Vec<OnTrap>,
}

/// A function probed through a trap (`report --json`'s `on_traps`).
#[derive(Serialize)]
struct OnTrap {
    function: String,
    mechanism: String,
}

/// The name `-s` takes for sort key `s`.
pub fn sort_name(s: SortArg) -> &'static str {
    match s {
        SortArg::Total => "total",
        SortArg::SelfTime => "self",
        SortArg::Calls => "calls",
        SortArg::Avg => "avg",
        SortArg::Max => "max",
    }
}

/// `hotprobe report DIR [--phases] [filters] [-s KEY] [--task | --diff DIR2
/// | --hist FUNC | --flame] [--json]`.
pub fn report_cmd(dir: &Path, phases: bool, markers: &[String], o: &ReportArgs) -> Result<()> {
    if let Some(m) = markers.iter().find(|m| m.is_empty()) {
        bail!(crate::UsageError(format!(
            "--marker {m:?}: give a function name"
        )));
    }
    if o.callers.is_none() && o.graph.is_none() {
        crate::option_rules::refuse_report(o, markers, dir)?;
    }
    let r = open_timed(dir, &o.query)?;
    report_of(&r, dir, phases, markers, o)?;
    warn_corrected(&r);
    // Unless nothing was shown ("no call matches").
    if !o.query.compile(&r)?.filter_matches_nothing() {
        say_times(&r);
    }
    Ok(())
}

fn report_of(
    r: &TraceReader,
    dir: &Path,
    phases: bool,
    markers: &[String],
    o: &ReportArgs,
) -> Result<()> {
    warn_incomplete(r);
    let query = o.query.compile(r)?;
    if o.query.matches_nothing(&query) {
        return Ok(());
    }
    if let Some(func) = &o.callers {
        if !markers.is_empty() {
            bail!(crate::UsageError(
                "--marker splits the tables into phases; --callers has none: give one of them"
                    .into()
            ));
        }
        crate::stacks::refuse_unused(o, markers)?;
        let opts = crate::stacks::CallersOptions {
            func,
            per_thread: o.task,
            json: o.json,
            query: o.query.query(),
            sort: o.sort,
        };
        return crate::stacks::print_callers(r, dir, &query, &opts);
    }
    if let Some(func) = &o.graph {
        crate::stacks::refuse_unused(o, markers)?;
        let json = o.json.then(|| o.query.query());
        return crate::stacks::print_graph(r, &query, func, json.as_ref(), o.sort);
    }
    for m in markers {
        let syms = r.symbols();
        if !(0..syms.id_bound()).any(|id| syms.name(id) == m.as_str()) {
            errln!("hotprobe: no call matches --marker {m}");
        }
    }
    let sort = o.sort.unwrap_or_default();
    let key: SortKey = sort.into();
    let bar = bytes_bar(r, "reading");
    let ctx = || format!("cannot report {}", dir.display());
    if o.flame {
        let path = dir.join("flame.svg");
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        );
        match crate::stacks::captured_folded(r, dir, &query, false, "--flame")? {
            // `record --stacks`: the captured stacks, as export draws them.
            Some(stacks) => {
                let title = format!("hotprobe: {}", r.info().target);
                draw_flamegraph(&stacks, &title, "calls", false, &mut f).with_context(ctx)?;
            }
            None => {
                with_bar(&bar, |cb| {
                    export_flamegraph(r, &query, &FlameOptions::default(), &mut f, Some(cb))
                })
                .with_context(ctx)?;
            }
        }
        f.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
        return print(&format!("{}\n", path.display()));
    }
    if let Some(pattern) = &o.hist {
        let mut hs =
            with_bar(&bar, |cb| histograms(r, &query, pattern, Some(cb))).with_context(ctx)?;
        let rep = o.sort.map(|_| report_filtered(r, &query, None)).transpose();
        crate::report_text::order_histograms(&mut hs, rep.with_context(ctx)?, sort);
        if hs.is_empty() {
            bail!("no function matching `{pattern}` in {}", dir.display());
        }
        let sort = o.sort.map(sort_name);
        return crate::report_text::print_hist(dir, o.query.query(), sort, &hs, o.json);
    }
    if let Some(dir2) = &o.diff {
        let mut r2 = open(dir2)?;
        r2.set_overhead_correction(!o.query.raw_times);
        warn_incomplete(&r2);
        let q2 = o.query.compile(&r2)?;
        let a = with_bar(&bar, |cb| report_filtered(r, &query, Some(cb))).with_context(ctx)?;
        let b = report_filtered(&r2, &q2, None)
            .with_context(|| format!("cannot report {}", dir2.display()))?;
        let d = ReportDiff::new(&a, &b, key);
        if o.json {
            #[derive(Serialize)]
            struct D<'a> {
                a: &'a Path,
                b: &'a Path,
                query: Query,
                sort: &'static str,
                rows: &'a [hotprobe::trace::DiffRow],
            }
            return print_json(&D {
                a: dir,
                b: dir2,
                query: o.query.query(),
                sort: sort_name(sort),
                rows: &d.rows,
            });
        }
        return print(&format!(
            "# A: {}\n# B: {}\n{}",
            dir.display(),
            dir2.display(),
            crate::report_text::diff_text(&d, crate::out::colors_on())
        ));
    }
    if o.task {
        let mut ts =
            with_bar(&bar, |cb| report_by_thread(r, &query, Some(cb))).with_context(ctx)?;
        for t in &mut ts {
            t.report.sort(key);
        }
        if o.json {
            #[derive(Serialize)]
            struct T<'a> {
                trace: &'a Path,
                query: Query,
                sort: &'static str,
                threads: &'a [hotprobe::trace::ThreadReport],
            }
            return print_json(&T {
                trace: dir,
                query: o.query.query(),
                sort: sort_name(sort),
                threads: &ts,
            });
        }
        let mut s = String::new();
        if ts.is_empty() {
            s.push_str("# no calls recorded\n");
        }
        for (i, t) in ts.iter().enumerate() {
            if i > 0 {
                s.push('\n');
            }
            s.push_str(&format!(
                "# thread {}: {} calls\n{}",
                t.tid,
                t.report.calls(),
                t.report.to_text_colored(crate::out::colors_on())
            ));
        }
        return print(&s);
    }
    if phases || !markers.is_empty() {
        let mut spec = PhaseSpec::from_trace(r);
        spec.names.extend(markers.iter().cloned());
        let mut rep = with_bar(&bar, |cb| {
            report_phases_filtered(r, &spec, &query, Some(cb))
        })
        .with_context(ctx)?;
        for p in &mut rep.phases {
            p.report.sort(key);
        }
        if o.json {
            #[derive(Serialize)]
            struct P<'a> {
                trace: &'a Path,
                query: Query,
                sort: &'static str,
                phases: &'a [hotprobe::trace::Phase],
            }
            return print_json(&P {
                trace: dir,
                query: o.query.query(),
                sort: sort_name(sort),
                phases: &rep.phases,
            });
        }
        return print(&crate::report_text::phases_text(
            &rep,
            crate::out::colors_on(),
        ));
    }
    let mut rep = with_bar(&bar, |cb| report_filtered(r, &query, Some(cb))).with_context(ctx)?;
    rep.sort(key);
    if o.json {
        return print_json(&ReportJson {
            trace: dir,
            query: o.query.query(),
            sort: sort_name(sort),
            calls: rep.calls(),
            rows: &rep.rows,
            probe_costs: r.overhead_note(),
            on_traps: r
                .trap_functions()
                .into_iter()
                .map(|(function, mechanism)| OnTrap {
                    function,
                    mechanism,
                })
                .collect(),
        });
    }
    print(&rep.to_text_colored(crate::out::colors_on()))
}

/// `hotprobe info DIR [--json]`: the trace's metadata and contents.
pub fn info_cmd(dir: &Path, json: bool) -> Result<()> {
    let r = open(dir)?;
    warn_incomplete(&r);
    let bar = bytes_bar(&r, "reading");
    let s = with_bar(&bar, |cb| summarize(&r, Some(cb)))
        .with_context(|| format!("cannot read {}", dir.display()))?;
    if json {
        print_json(&s)
    } else {
        print(&format!(
            "# {:<14} {}\n{}",
            "trace:",
            dir.display(),
            s.to_text()
        ))
    }
}

/// What `export` needs from the command line.
pub struct ExportOptions<'a> {
    /// The trace directory.
    pub dir: &'a Path,
    /// The format.
    pub format: ExportFormat,
    /// Output file (chrome, folded, svg, html; default stdout; parquet:
    /// required) or directory (ctf; default DIR/ctf).
    pub out: Option<&'a Path>,
    /// Folded, svg, html: count calls instead of self time.
    pub calls: bool,
    /// Folded, svg, html: prefix each stack with its thread.
    pub per_thread: bool,
    /// Otlp: the receiver's base URL (`http://HOST:PORT`).
    pub endpoint: Option<&'a str>,
    /// Which calls go out.
    pub query: &'a QueryArgs,
}

/// `hotprobe export DIR --format chrome|ctf|folded|svg|html|otlp|parquet
/// [-o OUT] [--endpoint URL] [filters]`.
pub fn export_cmd(o: &ExportOptions<'_>) -> Result<()> {
    let (q, dir) = (o.query, o.dir);
    crate::option_rules::refuse_export(o.format, o.calls, o.per_thread, q, dir)?;
    if o.format == ExportFormat::Parquet && o.out.is_none() {
        bail!(crate::UsageError(
            "--format parquet writes a file: give -o FILE".into()
        ));
    }
    if o.format == ExportFormat::Otlp && o.endpoint.is_none() {
        bail!(crate::UsageError(
            "--format otlp sends to a receiver: give --endpoint http://HOST:PORT".into()
        ));
    }
    // `-o -`: standard output, for the formats written as one stream.
    let stdout_out = o.out.is_some_and(|p| p == Path::new("-"));
    match o.format {
        ExportFormat::Otlp if o.out.is_some() => bail!(crate::UsageError(
            "--format otlp sends to --endpoint: -o goes with the other formats".into()
        )),
        ExportFormat::Ctf if stdout_out => bail!(crate::UsageError(
            "--format ctf writes a directory: give -o DIR (default DIR/ctf), not -o -".into()
        )),
        _ => {}
    }
    if o.endpoint.is_some() && o.format != ExportFormat::Otlp {
        bail!(crate::UsageError(
            "--endpoint goes with --format otlp".into()
        ));
    }
    let endpoint = o
        .endpoint
        .map(|url| {
            OtlpEndpoint::parse(url)
                .map_err(|e| crate::UsageError(format!("--endpoint {url}: {e}")))
        })
        .transpose()?;
    let r = open_timed(o.dir, o.query)?;
    warn_incomplete(&r);
    let query = o.query.compile(&r)?;
    if o.query.matches_nothing(&query) {
        return Ok(());
    }
    let bar = bytes_bar(&r, "exporting");
    let ctx = || format!("cannot export {}", o.dir.display());
    let folded = FoldedOptions {
        value: if o.calls {
            FoldedValue::Calls
        } else {
            FoldedValue::SelfNs
        },
        per_thread: o.per_thread,
    };
    match o.format {
        ExportFormat::Ctf => {
            let out: PathBuf = o.out.map_or_else(|| o.dir.join("ctf"), Path::to_path_buf);
            let s = with_bar(&bar, |cb| export_ctf_filtered(&r, &query, &out, Some(cb)))
                .with_context(ctx)?;
            errln!(
                "hotprobe: {} events in {} packets, {} streams: {}",
                s.events,
                s.packets,
                s.streams,
                out.display()
            );
        }
        ExportFormat::Parquet => {
            let p = o.out.unwrap_or(Path::new("calls.parquet"));
            let sink: Box<dyn Write + Send> = if stdout_out {
                Box::new(NotePipe(std::io::stdout()))
            } else {
                Box::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("cannot create {}", p.display()))?,
                )
            };
            let s = with_bar(&bar, |cb| {
                export_parquet(&r, &query, std::io::BufWriter::new(sink), Some(cb))
            });
            let s = match s {
                // The Parquet writer wraps the error: NotePipe noted it.
                Err(_) if READER_GONE.load(std::sync::atomic::Ordering::Relaxed) => return Ok(()),
                s => s.with_context(ctx)?,
            };
            errln!(
                "hotprobe: {} calls in {} row groups ({} argument columns): {}",
                s.rows,
                s.row_groups,
                s.arg_columns,
                if stdout_out {
                    "standard output".into()
                } else {
                    p.display().to_string()
                }
            );
        }
        ExportFormat::Otlp => {
            let ep = endpoint.context("no endpoint")?;
            let opts = OtlpOptions::default();
            let s = with_bar(&bar, |cb| {
                export_otlp(&r, &query, &opts, |sig, body| ep.post(sig, &body), Some(cb))
            })
            .with_context(ctx)?;
            errln!(
                "hotprobe: {} spans, {} metric points in {} requests ({} bytes) to {}",
                s.spans,
                s.points,
                s.requests,
                s.bytes,
                ep.url()
            );
        }
        ExportFormat::Chrome | ExportFormat::Folded | ExportFormat::Svg | ExportFormat::Html => {
            let mut sink: Box<dyn Write> = match o.out.filter(|_| !stdout_out) {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("cannot create {}", p.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            let res = match o.format {
                ExportFormat::Chrome => with_bar(&bar, |cb| {
                    export_chrome_filtered(&r, &query, &mut sink, Some(cb))
                })
                .map(|s| {
                    format!(
                        "{} B/E, {} X, {} instant events",
                        s.begins + s.ends,
                        s.completes,
                        s.instants
                    )
                }),
                ExportFormat::Folded => {
                    match crate::stacks::captured_folded(&r, o.dir, &query, o.per_thread, "folded")?
                    {
                        // `record --stacks`: the captured stacks, in calls.
                        Some(stacks) => {
                            let text: String =
                                stacks.iter().map(|(k, n)| format!("{k} {n}\n")).collect();
                            sink.write_all(text.as_bytes())
                                .map(|()| format!("{} captured stacks", stacks.len()))
                                .map_err(|source| TraceError::Io {
                                    path: PathBuf::from("-"),
                                    source,
                                })
                        }
                        None => with_bar(&bar, |cb| {
                            export_folded_filtered(&r, &query, &mut sink, folded, Some(cb))
                        })
                        .map(|n| format!("{n} stacks")),
                    }
                }
                _ => {
                    let html = o.format == ExportFormat::Html;
                    let what = if html { "html" } else { "svg" };
                    match crate::stacks::captured_folded(&r, o.dir, &query, o.per_thread, what)? {
                        // `record --stacks`: the same stacks and counts as
                        // `--format folded`.
                        Some(stacks) => {
                            let title = format!("hotprobe: {}", r.info().target);
                            draw_flamegraph(&stacks, &title, "calls", html, &mut sink)
                        }
                        None => {
                            let opts = FlameOptions {
                                title: None,
                                folded,
                                html,
                            };
                            with_bar(&bar, |cb| {
                                export_flamegraph(&r, &query, &opts, &mut sink, Some(cb))
                            })
                        }
                    }
                    .map(|s| format!("{} stacks", s.stacks))
                }
            };
            let what = match res {
                Err(e) if broken_pipe(&e) => return Ok(()),
                r => r.with_context(ctx)?,
            };
            match sink.flush() {
                Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
                r => r.context("cannot write the output")?,
            }
            if let Some(p) = o.out.filter(|_| !stdout_out) {
                errln!("hotprobe: {what}: {}", p.display());
            }
        }
    }
    warn_corrected(&r);
    say_times(&r);
    Ok(())
}
