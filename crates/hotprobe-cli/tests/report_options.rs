//! Issue 24, "nothing silently ignored": every option of `report`,
//! `replay` and `export` either acts in each of their modes or is refused
//! (exit 2, one line naming both; the table is in docs/ANALYSIS.md).
//! `report --hist FUNC -s KEY` orders the histograms as the report table
//! orders their functions; `--marker` with a mode without phases,
//! `--flame` with `-s` or `--json`, `--raw-times` where nothing shown or
//! filtered is a time, and `export --calls`/`--per-thread` with formats
//! that are no stacks are refused, and write nothing. `--color always`
//! reaches every text of `report` (the phase tables, `--hist`, `--diff`,
//! `--callers`, `--graph`), the same text once its colours are taken out.
//! stack_paths.c calls path_a 3 times, path_b 5 times, path_c (and under
//! it path_c_inner) 7 times: orders are checked against these counts and
//! against the report's own rows (no duration is assumed).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::record::{record, trace_dir};
use common::{gcc, hotprobe_within, text};

const LIMIT: Duration = Duration::from_secs(120);

const PROBES: [&str; 4] = ["libc:malloc", "main", "path_*", "alloc_leaf"];

/// `record [--stacks] PROBES -- stack_paths` into a fresh trace `tag`.
fn record_paths(tag: &str, stacks: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_paths.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_options");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(&src, &dir.join(format!("stack_paths_{tag}")), &["-O2"]);
    let trace = trace_dir(tag);
    let mut probes: Vec<&str> = stacks.then_some("--stacks").into_iter().collect();
    probes.extend_from_slice(&PROBES);
    let (out, _) = record(&trace, &probes, &[bin.to_str().unwrap()], LIMIT);
    assert_eq!(out, "allocated 15\n");
    trace
}

/// The trace without stacks (folded from the call tree, in times).
fn plain() -> &'static str {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| record_paths("report-options", false))
        .to_str()
        .unwrap()
}

/// The trace with captured stacks (`record --stacks`: folded in calls).
fn with_stacks() -> &'static str {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| record_paths("report-options-stacks", true))
        .to_str()
        .unwrap()
}

/// `hotprobe ARGS`: asserts success; stdout.
fn run(args: &[&str]) -> String {
    let o = hotprobe_within(args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{args:?}: {out}\n{err}");
    out
}

/// `hotprobe ARGS`: asserts exit 2, nothing on stdout and `line` (with
/// the `(see hotprobe CMD --help)` tail) as the whole of stderr.
fn refused(args: &[&str], line: &str) {
    let o = hotprobe_within(args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{args:?}: {out}\n{err}");
    assert_eq!(out, "", "{args:?}");
    let want = format!(
        "hotprobe: error: {line} (see hotprobe {} --help)\n",
        args[0]
    );
    assert_eq!(err, want, "{args:?}");
}

/// The histograms' headers of `report --hist` text (`# F: N calls, ...`):
/// (function, calls), in order.
fn hist_rows(out: &str) -> Vec<(String, u64)> {
    out.lines()
        .filter_map(|l| {
            let (f, rest) = l.strip_prefix("# ")?.split_once(": ")?;
            let n = rest
                .strip_suffix(" calls")
                .or(rest.split_once(" calls,").map(|p| p.0))?;
            Some((f.to_string(), n.parse().ok()?))
        })
        .collect()
}

fn rows(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(f, n)| (f.to_string(), *n)).collect()
}

#[test]
fn hist_orders_its_functions_by_the_sort_key() {
    let d = plain();
    // Without -s: by name, as before.
    let by_name = run(&["report", d, "--hist", "path_*"]);
    assert_eq!(
        hist_rows(&by_name),
        rows(&[
            ("path_a", 3),
            ("path_b", 5),
            ("path_c", 7),
            ("path_c_inner", 7)
        ]),
        "{by_name}"
    );
    // -s calls: the recorded counts, most first (a tie by name, as the
    // report table breaks it).
    let by_calls = run(&["report", d, "--hist", "path_*", "-s", "calls"]);
    assert_eq!(
        hist_rows(&by_calls),
        rows(&[
            ("path_c", 7),
            ("path_c_inner", 7),
            ("path_b", 5),
            ("path_a", 3)
        ]),
        "{by_calls}"
    );
    // Every key: the order of the report's own rows of those functions,
    // text and JSON alike; the histograms themselves unchanged.
    for key in ["total", "self", "calls", "avg", "max"] {
        let rep: Value = serde_json::from_str(&run(&["report", d, "-s", key, "--json"])).unwrap();
        let want: Vec<String> = rep["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["function"].as_str().unwrap().to_string())
            .filter(|f| f.starts_with("path_"))
            .collect();
        let out = run(&["report", d, "--hist", "path_*", "-s", key]);
        let got: Vec<String> = hist_rows(&out).into_iter().map(|r| r.0).collect();
        assert_eq!(got, want, "-s {key}: {out}\n{rep}");
        let mut sorted: Vec<&str> = out.split("\n\n").map(str::trim_end).collect();
        let mut plain: Vec<&str> = by_name.split("\n\n").map(str::trim_end).collect();
        sorted.sort();
        plain.sort();
        assert_eq!(sorted, plain, "-s {key}: the same histograms");

        let j: Value = serde_json::from_str(&run(&[
            "report", d, "--hist", "path_*", "-s", key, "--json",
        ]))
        .unwrap();
        assert_eq!(j["sort"], key, "{j}");
        let got: Vec<&str> = j["histograms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["function"].as_str().unwrap())
            .collect();
        assert_eq!(got, want, "-s {key} --json: {j}");
    }
    // Without -s the JSON names no sort.
    let j: Value =
        serde_json::from_str(&run(&["report", d, "--hist", "path_*", "--json"])).unwrap();
    assert!(j.get("sort").is_none(), "{j}");
}

#[test]
fn report_modes_refuse_what_they_would_ignore() {
    let d = plain();
    let phases = "--marker splits the tables into phases";
    for (mode, extra) in [
        ("--hist", &["--hist", "path_*"][..]),
        ("--flame", &["--flame"]),
        ("--diff", &["--diff", d]),
        ("--task", &["--task"]),
        ("--task", &["--per-thread"]),
    ] {
        let mut a = vec!["report", d, "--marker", "path_a"];
        a.extend_from_slice(extra);
        refused(&a, &format!("{phases}; {mode} has none: give one of them"));
    }
    refused(
        &["report", d, "--flame", "-s", "calls"],
        "--flame -s calls: a flame graph orders its frames by name, not by a column: \
         leave -s out",
    );
    refused(
        &["report", d, "--flame", "--json"],
        "--flame --json: --flame writes an SVG file, not a table: give one of them",
    );
    assert!(!Path::new(d).join("flame.svg").exists(), "written anyway");

    // --flame on captured stacks counts calls: --raw-times needs a time
    // filter there; on a trace without stacks it weighs self times.
    let s = with_stacks();
    refused(
        &["report", s, "--flame", "--raw-times"],
        &format!(
            "--flame --raw-times: {s} has captured stacks, so the flame graph counts calls \
             and the probes' costs change only times: give a time filter (-t, --since, \
             --until) or leave --raw-times out"
        ),
    );
    assert!(!Path::new(s).join("flame.svg").exists(), "written anyway");
    for (t, extra) in [(s, &["-t", "1ns"][..]), (d, &[])] {
        let mut a = vec!["report", t, "--flame", "--raw-times"];
        a.extend_from_slice(extra);
        let svg = Path::new(t).join("flame.svg");
        assert_eq!(run(&a), format!("{}\n", svg.display()));
        let body = std::fs::read_to_string(&svg).unwrap();
        assert!(body.contains("path_c_inner"), "{a:?}");
    }
}

#[test]
fn replay_raw_times_needs_something_timed() {
    let d = plain();
    for f in ["tid", "none"] {
        refused(
            &["replay", d, "-f", f, "--raw-times"],
            &format!(
                "-f {f} --raw-times: no column shows a time and no filter compares times \
                 (-t, --since, --until): add a time column or leave --raw-times out"
            ),
        );
    }
    // With a time column or a time filter it is taken: the same calls.
    let tree = run(&["replay", d, "-f", "tid"]);
    let calls = |out: &str| out.lines().filter(|l| l.contains("path_c_inner(")).count();
    assert_eq!(calls(&tree), 7, "{tree}");
    let timed = run(&["replay", d, "-f", "duration", "--raw-times"]);
    assert_eq!(calls(&timed), 7, "{timed}");
    let filtered = run(&["replay", d, "-f", "tid", "--raw-times", "--since", "0"]);
    assert_eq!(filtered, tree);
}

#[test]
fn export_refuses_stack_options_on_other_formats() {
    let d = plain();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_options_out");
    let _ = std::fs::remove_file(&out);
    let o = out.to_str().unwrap();
    for format in ["chrome", "ctf", "parquet"] {
        for flag in ["--calls", "--per-thread"] {
            refused(
                &["export", d, "--format", format, flag, "-o", o],
                &format!(
                    "--format {format} {flag}: {flag} goes with --format folded, svg or html \
                     (stacks); --format {format} writes each call with its thread and times"
                ),
            );
            assert!(!out.exists(), "{format} {flag}: written anyway");
        }
    }
    refused(
        &[
            "export",
            d,
            "--format",
            "otlp",
            "--calls",
            "--endpoint",
            "http://127.0.0.1:9",
        ],
        "--format otlp --calls: --calls goes with --format folded, svg or html (stacks); \
         --format otlp writes each call with its thread and times",
    );
    // Folded in calls: --raw-times changes nothing without a time filter.
    refused(
        &[
            "export",
            d,
            "--format",
            "folded",
            "--calls",
            "--raw-times",
            "-o",
            o,
        ],
        "--format folded --calls --raw-times: the stacks count calls and the probes' costs \
         change only times: give a time filter (-t, --since, --until) or leave --raw-times out",
    );
    let s = with_stacks();
    for format in ["folded", "svg", "html"] {
        refused(
            &["export", s, "--format", format, "--raw-times", "-o", o],
            &format!(
                "--format {format} --raw-times: {s} has captured stacks, so the stacks count \
                 calls and the probes' costs change only times: give a time filter (-t, \
                 --since, --until) or leave --raw-times out"
            ),
        );
    }
    assert!(!out.exists(), "written anyway");
    // Taken where it acts: self times of the call tree, or a time filter
    // on captured stacks (counted in calls: the recorded paths).
    let folded = run(&["export", d, "--format", "folded", "--raw-times"]);
    let folded_ns: u64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let rep: Value = serde_json::from_str(&run(&["report", d, "--raw-times", "--json"])).unwrap();
    let self_ns: u64 = rep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["self_ns"].as_u64().unwrap())
        .sum();
    assert_eq!(
        folded_ns, self_ns,
        "the measured self times: {folded}\n{rep}"
    );
    let captured = run(&[
        "export",
        s,
        "--format",
        "folded",
        "--raw-times",
        "--since",
        "0",
    ]);
    let count = |stack: &str| -> u64 {
        captured
            .lines()
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(k, _)| k.ends_with(stack))
            .map(|(_, n)| n.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(count("path_a;alloc_leaf"), 3, "{captured}");
    assert_eq!(count("path_b;alloc_leaf"), 5, "{captured}");
    assert_eq!(count("path_c_inner;alloc_leaf"), 7, "{captured}");
}

/// `s` without its SGR sequences (`ESC [ ... m`).
fn strip_sgr(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("\x1b[") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after.find('m').expect("an SGR sequence ends in m");
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

#[test]
fn color_always_reaches_every_report_text() {
    let (d, s) = (plain(), with_stacks());
    for args in [
        &["report", d, "--marker", "path_b"][..],
        &["report", d, "--hist", "path_*", "-s", "calls"],
        &["report", d, "--diff", d],
        &["report", s, "--callers", "alloc_leaf"],
        &["report", s, "--graph", "main"],
    ] {
        let plain_out = run(args);
        let mut a = vec!["--color", "always"];
        a.extend_from_slice(args);
        let colored = run(&a);
        assert_ne!(colored, plain_out, "{args:?}: no colour");
        assert_eq!(strip_sgr(&colored), plain_out, "{args:?}");
        // Every function name printed is bold.
        for f in ["path_a", "path_b", "path_c_inner"] {
            assert!(
                colored.contains(&format!("\x1b[1m{f}\x1b[0m")),
                "{args:?}: {f} not bold: {colored}"
            );
        }
    }
    // A phase from each of path_b's 5 calls, after the start's: path_a's
    // 3 calls in the first, one call of path_b in each other; in measured
    // times and in times with the probes' costs taken out, where calls
    // close together share a time stamp (phases 3 to 5 were empty, their
    // calls all in phase 6, until phases went by record order).
    for raw in [true, false] {
        let mut a = vec!["report", d, "--marker", "path_b"];
        if raw {
            a.push("--raw-times");
        }
        let phases = run(&a);
        let tables: Vec<&str> = phases.split("# phase").skip(1).collect();
        assert_eq!(tables.len(), 6, "{phases}");
        let calls_of = |t: &str, f: &str| -> Option<u64> {
            t.lines()
                .find(|l| l.split_whitespace().last() == Some(f))
                .map(|l| l.split_whitespace().rev().nth(1).unwrap().parse().unwrap())
        };
        assert_eq!(calls_of(tables[0], "path_a"), Some(3), "{phases}");
        assert_eq!(calls_of(tables[0], "path_b"), None, "{phases}");
        for t in &tables[1..] {
            assert_eq!(calls_of(t, "path_b"), Some(1), "{phases}");
        }
    }
}
