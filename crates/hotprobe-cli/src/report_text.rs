//! What `report --hist`, `--phases`, `--diff` and `--graph` print: the
//! histograms (in the `-s` order, as text or JSON), the phase tables, the
//! comparison and the call graphs, with colours under `--color` as the
//! report's table has them (function names bold; in the phase tables long
//! times yellow or red too).

use crate::analyse::{print, print_json};
use crate::cli::SortArg;
use crate::out::{paint, NAME};
use anyhow::Result;
use hotprobe::trace::graph::GraphNode;
use hotprobe::trace::{fmt_duration, Histogram, PhaseReport, Query, Report, ReportDiff, SortKey};
use serde::Serialize;
use std::path::Path;

/// `report --hist FUNC -s KEY`: orders the histograms as the report
/// table's rows of their functions (`report` is that table, sorted by
/// KEY: ties by calls, then name); without `-s` (`None`), by name as they
/// come.
pub fn order_histograms(hs: &mut [(String, Histogram)], report: Option<Report>, sort: SortArg) {
    let Some(mut rep) = report else { return };
    rep.sort(SortKey::from(sort));
    let rank = |f: &str| {
        rep.rows
            .iter()
            .position(|r| r.name == f)
            .unwrap_or(usize::MAX)
    };
    // Stable: functions without a row keep their order, last.
    hs.sort_by_cached_key(|(f, _)| rank(f));
}

/// `report --hist`: the histograms `hs` of the trace in `dir` as text,
/// or as JSON (with the filters `query` and the `-s` key `sort`).
pub fn print_hist(
    dir: &Path,
    query: Query,
    sort: Option<&'static str>,
    hs: &[(String, Histogram)],
    json: bool,
) -> Result<()> {
    if json {
        #[derive(Serialize)]
        struct H<'a> {
            function: &'a str,
            #[serde(flatten)]
            hist: &'a Histogram,
        }
        #[derive(Serialize)]
        struct Hs<'a> {
            trace: &'a Path,
            query: Query,
            #[serde(skip_serializing_if = "Option::is_none")]
            sort: Option<&'static str>,
            histograms: Vec<H<'a>>,
        }
        return print_json(&Hs {
            trace: dir,
            query,
            sort,
            histograms: hs
                .iter()
                .map(|(f, h)| H {
                    function: f,
                    hist: h,
                })
                .collect(),
        });
    }
    let mut s = String::new();
    for (i, (f, h)) in hs.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&format!(
            "# {}: {} calls, avg {}, min {}, max {}\n",
            paint(NAME, f),
            h.count(),
            fmt_duration(h.avg_ns()).trim(),
            fmt_duration(h.min_ns()).trim(),
            fmt_duration(h.max_ns()).trim()
        ));
        if h.no_exit() > 0 {
            s.push_str(&format!(
                "# {}: {} calls without their exit (lost): not in the histogram\n",
                paint(NAME, f),
                h.no_exit()
            ));
        }
        s.push_str(&h.to_text());
    }
    print(&s)
}

/// `report --phases`: a table per phase, each with its name, duration and
/// calls (as [`PhaseReport::to_text`]), coloured when `color`.
pub fn phases_text(rep: &PhaseReport, color: bool) -> String {
    if rep.phases.is_empty() {
        return "# no calls recorded\n".to_string();
    }
    let mut s = String::new();
    for (i, p) in rep.phases.iter().enumerate() {
        s.push_str(&format!(
            "# phase {}: {}  duration {}  calls {}\n",
            i + 1,
            p.name,
            fmt_duration(p.end_ns.saturating_sub(p.start_ns)).trim(),
            p.calls()
        ));
        s.push_str(&p.report.to_text_colored(color));
        s.push('\n');
    }
    s
}

/// `line` with the `name` at byte `at` bold.
fn bold_at(line: &str, at: usize, name: &str) -> String {
    let end = at + name.len();
    format!("{}{}{}", &line[..at], paint(NAME, name), &line[end..])
}

/// `report --diff`'s table ([`ReportDiff::to_text`]), the function names
/// bold when `color`.
pub fn diff_text(d: &ReportDiff, color: bool) -> String {
    let text = d.to_text();
    if !color {
        return text;
    }
    let mut lines = text.lines();
    let mut s: String = lines.by_ref().take(2).map(|l| format!("{l}\n")).collect();
    for (line, r) in lines.zip(&d.rows) {
        let at = line.len() - r.function.len();
        match line.ends_with(r.function.as_str()) {
            true => s.push_str(&bold_at(line, at, &r.function)),
            false => s.push_str(line),
        }
        s.push('\n');
    }
    s
}

/// `report --graph`'s text of `g` ([`GraphNode::to_text`]), the function
/// names bold when `color`.
pub fn graph_text(g: &GraphNode, color: bool) -> String {
    fn names<'a>(n: &'a GraphNode, out: &mut Vec<&'a str>) {
        out.push(&n.function);
        for c in &n.children {
            names(c, out);
        }
    }
    let text = g.to_text();
    if !color {
        return text;
    }
    let mut order = Vec::new();
    names(g, &mut order);
    let mut lines = text.lines();
    // The title, then a line per node in the same (depth-first) order:
    // `TIME : PREFIX(CALLS) NAME`.
    let mut s: String = lines.by_ref().take(1).map(|l| format!("{l}\n")).collect();
    for (line, name) in lines.zip(order) {
        let mark = format!(") {name}");
        let at = line
            .find(" : ")
            .and_then(|i| line[i..].find(&mark).map(|j| i + j + 2));
        match at {
            Some(at) => s.push_str(&bold_at(line, at, name)),
            None => s.push_str(line),
        }
        s.push('\n');
    }
    s
}
