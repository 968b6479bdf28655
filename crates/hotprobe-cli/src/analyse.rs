//! `hotprobe replay`, `report` and `export`: what is done with a trace
//! directory written by `hotprobe record` (analyses and exporters of
//! `hotprobe-trace`), with a progress bar on stderr for long runs.

use anyhow::{Context, Result};
use hotprobe_trace::{
    export_chrome, export_ctf, export_folded, replay, report, report_phases, FoldedOptions,
    FoldedValue, PhaseSpec, TraceError, TraceReader,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// `--format` of `export`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// Chrome Trace Event JSON (Perfetto UI, chrome://tracing).
    Chrome,
    /// CTF 1.8 (babeltrace2, Trace Compass): a directory.
    Ctf,
    /// Folded stacks (flamegraph.pl, inferno).
    Folded,
}

fn open(dir: &Path) -> Result<TraceReader> {
    TraceReader::open(dir).with_context(|| format!("cannot read the trace in {}", dir.display()))
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
    f: impl FnOnce(&mut dyn FnMut(u64, u64)) -> hotprobe_trace::Result<T>,
) -> hotprobe_trace::Result<T> {
    let mut cb = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let r = f(&mut cb);
    bar.finish_and_clear();
    r
}

/// Says so on stderr when the recorder did not finish (the reader then
/// refuses the streams it cannot trust).
fn warn_incomplete(r: &TraceReader) {
    if !r.info().complete {
        eprintln!(
            "hotprobe: warning: {} was not finished by its recorder",
            r.dir().display()
        );
    }
}

/// A reader of our stdout went away (`hotprobe replay DIR | head`): not an
/// error, the output is simply no longer wanted.
fn broken_pipe(e: &TraceError) -> bool {
    matches!(e, TraceError::Io { source, .. } if source.kind() == ErrorKind::BrokenPipe)
}

/// `hotprobe replay DIR`: the call tree on stdout.
pub fn replay_cmd(dir: &Path) -> Result<()> {
    let r = open(dir)?;
    warn_incomplete(&r);
    let bar = bytes_bar(&r, "replaying");
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match with_bar(&bar, |cb| replay(&r, &mut out, Some(cb))) {
        Err(e) if broken_pipe(&e) => return Ok(()),
        r => r.with_context(|| format!("cannot replay {}", dir.display()))?,
    }
    match out.flush() {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write the output"),
    }
}

/// `hotprobe report DIR [--phases]`: per-function calls, total and self
/// time; with `phases`, one table per phase (markers: the trace's own plus
/// `markers`).
pub fn report_cmd(dir: &Path, phases: bool, markers: &[String]) -> Result<()> {
    let r = open(dir)?;
    warn_incomplete(&r);
    let bar = bytes_bar(&r, "reading");
    let text = if phases || !markers.is_empty() {
        let mut spec = PhaseSpec::from_trace(&r);
        spec.names.extend(markers.iter().cloned());
        let rep = with_bar(&bar, |cb| report_phases(&r, &spec, Some(cb)))
            .with_context(|| format!("cannot report {}", dir.display()))?;
        if rep.phases.is_empty() {
            "# no calls recorded\n".to_string()
        } else {
            rep.to_text()
        }
    } else {
        with_bar(&bar, |cb| report(&r, Some(cb)))
            .with_context(|| format!("cannot report {}", dir.display()))?
            .to_text()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .context("cannot write the output")
}

/// What `export` needs from the command line.
pub struct ExportOptions<'a> {
    /// The trace directory.
    pub dir: &'a Path,
    /// The format.
    pub format: ExportFormat,
    /// Output file (chrome, folded; default stdout) or directory (ctf;
    /// default DIR/ctf).
    pub out: Option<&'a Path>,
    /// Folded: count calls instead of self time.
    pub calls: bool,
    /// Folded: prefix each stack with its thread.
    pub per_thread: bool,
}

/// `hotprobe export DIR --format chrome|ctf|folded [-o OUT]`.
pub fn export_cmd(o: &ExportOptions<'_>) -> Result<()> {
    let r = open(o.dir)?;
    warn_incomplete(&r);
    let bar = bytes_bar(&r, "exporting");
    let ctx = || format!("cannot export {}", o.dir.display());
    match o.format {
        ExportFormat::Ctf => {
            let out: PathBuf = o.out.map_or_else(|| o.dir.join("ctf"), Path::to_path_buf);
            let s = with_bar(&bar, |cb| export_ctf(&r, &out, Some(cb))).with_context(ctx)?;
            eprintln!(
                "hotprobe: {} events in {} packets, {} streams: {}",
                s.events,
                s.packets,
                s.streams,
                out.display()
            );
        }
        ExportFormat::Chrome | ExportFormat::Folded => {
            let mut sink: Box<dyn Write> = match o.out {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("cannot create {}", p.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            if o.format == ExportFormat::Chrome {
                let s = with_bar(&bar, |cb| export_chrome(&r, &mut sink, Some(cb)))
                    .with_context(ctx)?;
                sink.flush().context("cannot write the output")?;
                if let Some(p) = o.out {
                    eprintln!(
                        "hotprobe: {} B/E, {} X, {} instant events: {}",
                        s.begins + s.ends,
                        s.completes,
                        s.instants,
                        p.display()
                    );
                }
            } else {
                let opts = FoldedOptions {
                    value: if o.calls {
                        FoldedValue::Calls
                    } else {
                        FoldedValue::SelfNs
                    },
                    per_thread: o.per_thread,
                };
                let n = with_bar(&bar, |cb| export_folded(&r, &mut sink, opts, Some(cb)))
                    .with_context(ctx)?;
                sink.flush().context("cannot write the output")?;
                if let Some(p) = o.out {
                    eprintln!("hotprobe: {n} stacks: {}", p.display());
                }
            }
        }
    }
    Ok(())
}
