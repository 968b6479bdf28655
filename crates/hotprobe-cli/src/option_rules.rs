//! Which options each mode of `report`, `replay` and `export` takes
//! (issue 24: nothing silently ignored). An option a mode has no use for
//! is refused with a usage error (exit 2) naming both (`report --hist`
//! takes `-s`: [`crate::report_text::order_histograms`]). The table of every mode against every
//! option is in docs/ANALYSIS.md ("Which options each mode takes").
//! `--callers` and `--graph` have their own checks
//! ([`crate::stacks::refuse_unused`]).

use crate::cli::{ExportFormat, QueryArgs, ReportArgs};
use anyhow::{bail, Result};
use hotprobe::trace::ReplayField;
use std::path::Path;

/// Whether the filters compare times (`-t`, `--since`, `--until`): then
/// `--raw-times` changes which calls are kept, whatever is shown.
fn time_filtered(q: &QueryArgs) -> bool {
    q.min_duration.is_some() || q.since.is_some() || q.until.is_some()
}

/// Whether the trace in `dir` has captured stacks (`record --stacks`):
/// `report --flame` and `export --format folded|svg|html` then count
/// calls, not times.
fn has_captured_stacks(dir: &Path) -> bool {
    dir.join(hotprobe::trace::stacks::STACKS_FILE).exists()
        || dir
            .join(hotprobe::trace::call_stacks::CALL_STACKS_FILE)
            .exists()
}

/// `report` (besides `--callers` and `--graph`): refuses `--marker` with a
/// mode that has no phases, and `-s`, `--json` and (on captured stacks,
/// which count calls) `--raw-times` with `--flame`.
pub fn refuse_report(o: &ReportArgs, markers: &[String], dir: &Path) -> Result<()> {
    let mode = if o.flame {
        "--flame"
    } else if o.hist.is_some() {
        "--hist"
    } else if o.diff.is_some() {
        "--diff"
    } else if o.task {
        "--task"
    } else {
        return Ok(());
    };
    if !markers.is_empty() {
        bail!(crate::UsageError(format!(
            "--marker splits the tables into phases; {mode} has none: give one of them"
        )));
    }
    if !o.flame {
        return Ok(());
    }
    if let Some(s) = o.sort {
        bail!(crate::UsageError(format!(
            "--flame -s {}: a flame graph orders its frames by name, not by a column: \
             leave -s out",
            crate::analyse::sort_name(s)
        )));
    }
    if o.json {
        bail!(crate::UsageError(
            "--flame --json: --flame writes an SVG file, not a table: give one of them".into()
        ));
    }
    if o.query.raw_times && !time_filtered(&o.query) && has_captured_stacks(dir) {
        bail!(crate::UsageError(format!(
            "--flame --raw-times: {} has captured stacks, so the flame graph counts calls \
             and the probes' costs change only times: give a time filter (-t, --since, \
             --until) or leave --raw-times out",
            dir.display()
        )));
    }
    Ok(())
}

/// `replay -f FIELDS --raw-times`: refused when no field shows a time and
/// no filter compares times (the output would be the same).
pub fn refuse_replay(q: &QueryArgs, fields: &[ReplayField], spelled: &str) -> Result<()> {
    if q.raw_times && !time_filtered(q) && fields.iter().all(|f| *f == ReplayField::Tid) {
        bail!(crate::UsageError(format!(
            "-f {spelled} --raw-times: no column shows a time and no filter compares \
             times (-t, --since, --until): add a time column or leave --raw-times out"
        )));
    }
    Ok(())
}

/// The `--format` name of `f`.
fn format_name(f: ExportFormat) -> &'static str {
    match f {
        ExportFormat::Chrome => "chrome",
        ExportFormat::Ctf => "ctf",
        ExportFormat::Folded => "folded",
        ExportFormat::Svg => "svg",
        ExportFormat::Html => "html",
        ExportFormat::Otlp => "otlp",
        ExportFormat::Parquet => "parquet",
    }
}

/// `export`: refuses `--calls` and `--per-thread` with the formats that are
/// no stacks, and `--raw-times` where the stacks count calls (`--calls`,
/// or captured stacks) and no filter compares times.
pub fn refuse_export(
    format: ExportFormat,
    calls: bool,
    per_thread: bool,
    q: &QueryArgs,
    dir: &Path,
) -> Result<()> {
    let stacks = matches!(
        format,
        ExportFormat::Folded | ExportFormat::Svg | ExportFormat::Html
    );
    let name = format_name(format);
    if !stacks {
        for (set, flag) in [(calls, "--calls"), (per_thread, "--per-thread")] {
            if set {
                bail!(crate::UsageError(format!(
                    "--format {name} {flag}: {flag} goes with --format folded, svg or html \
                     (stacks); --format {name} writes each call with its thread and times"
                )));
            }
        }
        return Ok(());
    }
    if q.raw_times && !time_filtered(q) {
        if calls {
            bail!(crate::UsageError(format!(
                "--format {name} --calls --raw-times: the stacks count calls and the \
                 probes' costs change only times: give a time filter (-t, --since, \
                 --until) or leave --raw-times out"
            )));
        }
        if has_captured_stacks(dir) {
            bail!(crate::UsageError(format!(
                "--format {name} --raw-times: {} has captured stacks, so the stacks count \
                 calls and the probes' costs change only times: give a time filter (-t, \
                 --since, --until) or leave --raw-times out",
                dir.display()
            )));
        }
    }
    Ok(())
}
