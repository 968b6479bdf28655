//! Flame graphs: the folded stacks ([`folded_stacks`]) drawn by inferno as
//! an SVG, or that SVG inline in an HTML page.
//!
//! inferno's SVG is already interactive in a browser (click to zoom,
//! Ctrl-F to search; its script runs from the `<svg onload>`), so the HTML
//! page only wraps it: the same SVG without its XML prologue, inline in the
//! body, full window width.

use std::collections::BTreeMap;
use std::io::Write;

use inferno::flamegraph::{self, Options};

use crate::analysis::Progress;
use crate::error::{Result, TraceError};
use crate::export::folded::{folded_stacks, FoldedOptions, FoldedValue};
use crate::query::CompiledQuery;
use crate::reader::TraceReader;

/// What [`export_flamegraph`] draws.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlameOptions {
    /// The title (default: `hotprobe: TARGET`).
    pub title: Option<String>,
    /// Widths: self time (default) or calls.
    pub folded: FoldedOptions,
    /// An HTML page around the SVG instead of the bare SVG.
    pub html: bool,
}

/// What [`export_flamegraph`] drew.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlameStats {
    /// Distinct stacks.
    pub stacks: u64,
    /// Sum of their values (ns or calls).
    pub total: u64,
}

/// Draws the calls `query` keeps as a flame graph (SVG, or HTML with
/// `opts.html`). A trace with no kept call is an error (there is nothing
/// to draw).
pub fn export_flamegraph(
    reader: &TraceReader,
    query: &CompiledQuery,
    opts: &FlameOptions,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<FlameStats> {
    let stacks = folded_stacks(reader, query, opts.folded, progress)?;
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| format!("hotprobe: {}", reader.info().target));
    let count_name = match opts.folded.value {
        FoldedValue::SelfNs => "ns",
        FoldedValue::Calls => "calls",
    };
    // Under the title: what the times are, and the functions on a trap.
    let subtitle = crate::reader::times_line(reader);
    draw_flamegraph_with(
        &stacks,
        (&title, subtitle.as_deref()),
        count_name,
        opts.html,
        out,
    )
}

/// Draws folded `stacks` (stack `a;b;c` → value, as [`folded_stacks`]
/// gives them) as a flame graph titled `title`, values in `count_name`
/// (SVG, or HTML with `html`). No stack is an error (there is nothing to
/// draw).
pub fn draw_flamegraph(
    stacks: &BTreeMap<String, u64>,
    title: &str,
    count_name: &str,
    html: bool,
    out: &mut impl Write,
) -> Result<FlameStats> {
    draw_flamegraph_with(stacks, (title, None), count_name, html, out)
}

/// [`draw_flamegraph`] with a subtitle under the title.
fn draw_flamegraph_with(
    stacks: &BTreeMap<String, u64>,
    (title, subtitle): (&str, Option<&str>),
    count_name: &str,
    html: bool,
    out: &mut impl Write,
) -> Result<FlameStats> {
    let io = |e: std::io::Error| TraceError::io("<flame graph output>", e);
    if stacks.is_empty() {
        return Err(TraceError::Invalid(
            "no calls to draw (nothing recorded, or the filters kept nothing)".into(),
        ));
    }
    let lines: Vec<String> = stacks.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let mut o = Options::default();
    o.title = title.to_string();
    o.subtitle = subtitle.map(str::to_string);
    o.count_name = count_name.to_string();
    o.name_type = "Function:".into();
    // Colours from the names: the same function has the same colour in
    // every graph.
    o.hash = true;
    o.deterministic = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), &mut svg).map_err(io)?;
    if html {
        let svg = String::from_utf8_lossy(&svg);
        let body = svg.find("<svg").map_or(&*svg, |i| &svg[i..]);
        write!(
            out,
            "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n\
             <style>body {{ margin: 0; }} svg {{ width: 100%; }}</style>\n</head>\n<body>\n{}\n</body>\n</html>\n",
            html_escape(&o.title),
            body.trim_end()
        )
        .map_err(io)?;
    } else {
        out.write_all(&svg).map_err(io)?;
    }
    out.flush().map_err(io)?;
    Ok(FlameStats {
        stacks: stacks.len() as u64,
        total: stacks.values().sum(),
    })
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_and_html() {
        let dir = tempfile::tempdir().unwrap();
        let r = crate::query::tests::trace(dir.path());
        let mut svg = Vec::new();
        let st = export_flamegraph(
            &r,
            &CompiledQuery::all(),
            &FlameOptions::default(),
            &mut svg,
            None,
        )
        .unwrap();
        assert_eq!(st.total, 300, "self times add up to main's duration");
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(
            svg.contains(">main<") || svg.contains("main ("),
            "no main frame"
        );
        let mut html = Vec::new();
        let opts = FlameOptions {
            html: true,
            ..FlameOptions::default()
        };
        export_flamegraph(&r, &CompiledQuery::all(), &opts, &mut html, None).unwrap();
        let html = String::from_utf8(html).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg ") && html.contains("function init(evt)"));
        assert!(!html.contains("<?xml"));
        assert!(html.trim_end().ends_with("</html>"));
    }
}
