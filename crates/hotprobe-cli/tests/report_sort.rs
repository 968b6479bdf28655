//! Issue 24, `report -s KEY` with `--callers` and `--graph`: the key
//! sorts those views instead of being ignored. `--callers` sorts callers
//! and their paths by calls (its default), or by the times of the calls
//! each made (total, self, avg, max: each call found by its own stack);
//! `--graph` sorts each node's callees (total, self, calls, avg; by
//! default in order of first call). What those views would ignore is an
//! error naming it: `--graph -s max`, `--marker`, `--callers --raw-times`
//! with nothing timed, a time key on a trace with only counted stacks.
//! stack_paths.c calls malloc through alloc_leaf from path_a 3 times,
//! path_b 5 times and path_c_inner (under path_c) 7 times, then from
//! printf once. Orders are checked against these counts and against the
//! times the same output prints (no duration is assumed).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::record::trace_dir;
use common::{gcc, hotprobe_within, text};

const LIMIT: Duration = Duration::from_secs(120);

const PROBES: [&str; 4] = ["libc:malloc", "main", "path_*", "alloc_leaf"];

/// `record --stacks EXTRA PROBES -- stack_paths` into a fresh trace `tag`.
fn record(tag: &str, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_paths.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_sort");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(
        &src,
        &dir.join("stack_paths"),
        &["-O2", "-fomit-frame-pointer"],
    );
    let trace = trace_dir(tag);
    let mut a = vec!["record", "-o", trace.to_str().unwrap(), "--stacks"];
    a.extend_from_slice(extra);
    a.extend_from_slice(&PROBES);
    a.extend(["--", bin.to_str().unwrap()]);
    let o = hotprobe_within(&a, LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "allocated 15\n");
    trace
}

/// The trace with each call's stack, recorded once.
fn trace() -> &'static str {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| record("report-sort", &[]))
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

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&run(args)).unwrap()
}

/// `hotprobe ARGS`: asserts a usage error (exit 2); its stderr.
fn refused(args: &[&str]) -> String {
    common::usage_refused(args, LIMIT)
}

/// The caller rows of `report --callers` text (`N [TIME] CALLER -> F`):
/// (calls, caller), in order.
fn caller_rows(out: &str) -> Vec<(u64, String)> {
    out.lines()
        .filter_map(|l| {
            let (left, _) = l.split_once(" -> ")?;
            let mut w = left.split_whitespace();
            let calls = w.next()?.parse().ok()?;
            Some((calls, w.last()?.to_string()))
        })
        .collect()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The value `key` sorts by, from a `times` object.
fn time_key(t: &Value, key: &str) -> u64 {
    match key {
        "total" => n(t, "total_ns"),
        "self" => n(t, "self_ns"),
        "max" => n(t, "max_ns"),
        "avg" => n(t, "total_ns").checked_div(n(t, "finished")).unwrap_or(0),
        _ => unreachable!("{key}"),
    }
}

fn non_increasing(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] >= w[1])
}

#[test]
fn callers_sort_by_calls_and_by_the_times_of_their_calls() {
    let d = trace();
    // By calls: the recorded counts, most first; the default too.
    let by_calls = run(&["report", d, "--callers", "alloc_leaf", "-s", "calls"]);
    let want: Vec<(u64, String)> = [(7, "path_c_inner"), (5, "path_b"), (3, "path_a")]
        .map(|(n, c)| (n, c.to_string()))
        .into();
    assert_eq!(caller_rows(&by_calls), want, "{by_calls}");
    assert_eq!(run(&["report", d, "--callers", "alloc_leaf"]), by_calls);

    // The report's own row of malloc: what its callers' times add up to.
    let rep = json(&["report", d, "--json"]);
    let row = rep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == "malloc")
        .unwrap_or_else(|| panic!("{rep}"))
        .clone();
    assert_eq!(n(&row, "calls"), 16, "{row}");

    for key in ["total", "self", "avg", "max"] {
        for func in ["malloc", "alloc_leaf"] {
            let j = json(&["report", d, "--callers", func, "-s", key, "--json"]);
            assert_eq!(j["sort"], key, "{j}");
            let callers = j["callers"].as_array().unwrap();
            // The same callers and calls as by calls.
            let mut got: Vec<(u64, String)> = callers
                .iter()
                .map(|c| (n(c, "calls"), c["caller"].as_str().unwrap().to_string()))
                .collect();
            let by_calls = run(&["report", d, "--callers", func, "-s", "calls"]);
            let mut want = caller_rows(&by_calls);
            got.sort();
            want.sort();
            assert_eq!(got, want, "{key} {func}: {j}");
            // Sorted by the key, callers and each one's paths; a caller's
            // times are its paths'.
            let keys: Vec<u64> = callers.iter().map(|c| time_key(&c["times"], key)).collect();
            assert!(non_increasing(&keys), "{key} {func}: {keys:?} {j}");
            for c in callers {
                let paths = c["paths"].as_array().unwrap();
                let pk: Vec<u64> = paths.iter().map(|p| time_key(&p["times"], key)).collect();
                assert!(non_increasing(&pk), "{key}: {pk:?} {c}");
                let t = &c["times"];
                for f in ["finished", "total_ns", "self_ns"] {
                    let sum: u64 = paths.iter().map(|p| n(&p["times"], f)).sum();
                    assert_eq!(n(t, f), sum, "{f}: {c}");
                }
                let max = paths.iter().map(|p| n(&p["times"], "max_ns")).max();
                assert_eq!(Some(n(t, "max_ns")), max, "{c}");
                assert_eq!(n(t, "finished"), n(c, "calls"), "every call exited: {c}");
            }
            if func == "malloc" {
                // Every call of malloc has a stack: its callers' times
                // are the report's.
                let sum = |f: &str| -> u64 { callers.iter().map(|c| n(&c["times"], f)).sum() };
                assert_eq!(sum("total_ns"), n(&row, "total_ns"), "{j}\n{row}");
                assert_eq!(sum("self_ns"), n(&row, "self_ns"), "{j}\n{row}");
                let max = callers.iter().map(|c| n(&c["times"], "max_ns")).max();
                assert_eq!(max, Some(n(&row, "max_ns")), "{j}\n{row}");
            }
            // The table: the key's column, the same order as the JSON.
            let out = run(&["report", d, "--callers", func, "-s", key]);
            let title = out.lines().next().unwrap();
            assert!(
                title.split_whitespace().collect::<Vec<_>>()
                    == ["CALLS", &key.to_uppercase(), "CALLER", "->", "FUNCTION"],
                "{out}"
            );
            let order: Vec<String> = caller_rows(&out).into_iter().map(|r| r.1).collect();
            let json_order: Vec<&str> = callers
                .iter()
                .map(|c| c["caller"].as_str().unwrap())
                .collect();
            assert_eq!(order, json_order, "{out}");
        }
    }
}

/// caller_costs.c recorded with its callers' stacks: leaf called twice by
/// slow_caller with much work, twenty times by fast_caller with little.
fn costs_trace() -> &'static str {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/caller_costs.c");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report_sort");
        std::fs::create_dir_all(&dir).unwrap();
        let bin = gcc(&src, &dir.join("caller_costs"), &["-O2"]);
        let trace = trace_dir("report-sort-costs");
        let o = hotprobe_within(
            &[
                "record",
                "-o",
                trace.to_str().unwrap(),
                "--stacks",
                "leaf",
                "*_caller",
                "--",
                bin.to_str().unwrap(),
            ],
            LIMIT,
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert_eq!(text(&o.stdout), "leaf calls 22\n");
        trace
    })
    .to_str()
    .unwrap()
}

/// A workload whose order by calls is not its order by time: `-s calls`
/// puts fast_caller (20 calls) first, every time key slow_caller (2 calls
/// of 100,000 times the work each), in the table and in JSON.
#[test]
fn callers_by_time_are_not_callers_by_calls() {
    let d = costs_trace();
    let by_calls = caller_rows(&run(&["report", d, "--callers", "leaf", "-s", "calls"]));
    assert_eq!(
        by_calls,
        [
            (20, "fast_caller".to_string()),
            (2, "slow_caller".to_string())
        ],
    );
    for key in ["total", "self", "avg", "max"] {
        let out = run(&["report", d, "--callers", "leaf", "-s", key]);
        assert_eq!(
            caller_rows(&out),
            [
                (2, "slow_caller".to_string()),
                (20, "fast_caller".to_string())
            ],
            "-s {key}:\n{out}"
        );
        let j = json(&["report", d, "--callers", "leaf", "-s", key, "--json"]);
        let callers: Vec<&str> = j["callers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["caller"].as_str().unwrap())
            .collect();
        assert_eq!(callers, ["slow_caller", "fast_caller"], "-s {key}: {j}");
    }
}

/// Each level's node names of `report --graph main` text, as printed.
fn graph_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_once(" : ").map(|(_, t)| t.trim_end().to_string()))
        .collect()
}

/// Checks that every node's children are in non-increasing `key` order.
fn check_sorted(node: &Value, key: &str) {
    let kids = node["children"].as_array().unwrap();
    let value = |c: &Value| -> u64 {
        let total = n(c, "total_ns");
        match key {
            "total" => total,
            "calls" => n(c, "calls"),
            "avg" => total / (n(c, "calls") - n(c, "unfinished")).max(1),
            "self" => {
                let below: u64 = c["children"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| n(k, "total_ns"))
                    .sum();
                total.saturating_sub(below)
            }
            _ => unreachable!(),
        }
    };
    let v: Vec<u64> = kids.iter().map(value).collect();
    assert!(
        non_increasing(&v),
        "{key}: {v:?} under {}",
        node["function"]
    );
    for k in kids {
        check_sorted(k, key);
    }
}

/// Every (path, calls) of a graph, sorted: the nodes whatever their order.
fn nodes(node: &Value, prefix: &str, out: &mut Vec<(String, u64)>) {
    let path = format!("{prefix}/{}", node["function"].as_str().unwrap());
    out.push((path.clone(), n(node, "calls")));
    for k in node["children"].as_array().unwrap() {
        nodes(k, &path, out);
    }
}

#[test]
fn graph_sorts_each_nodes_callees() {
    let d = trace();
    // By default in order of first call: path_a, path_b, path_c, printf's
    // malloc.
    let first = graph_lines(&run(&["report", d, "--graph", "main"]));
    let top = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.starts_with(" +-("))
            .cloned()
            .collect()
    };
    assert_eq!(
        top(&first),
        [
            " +-(3) path_a",
            " +-(5) path_b",
            " +-(7) path_c",
            " +-(1) malloc"
        ],
        "{first:#?}"
    );
    // By calls: the recorded counts, most first.
    let by_calls = graph_lines(&run(&["report", d, "--graph", "main", "-s", "calls"]));
    assert_eq!(
        top(&by_calls),
        [
            " +-(7) path_c",
            " +-(5) path_b",
            " +-(3) path_a",
            " +-(1) malloc"
        ],
        "{by_calls:#?}"
    );
    let mut all = Vec::new();
    nodes(
        &json(&["report", d, "--graph", "main", "--json"])["graphs"][0],
        "",
        &mut all,
    );
    all.sort();
    for key in ["total", "self", "calls", "avg"] {
        let j = json(&["report", d, "--graph", "main", "-s", key, "--json"]);
        let root = &j["graphs"][0];
        check_sorted(root, key);
        let mut these = Vec::new();
        nodes(root, "", &mut these);
        these.sort();
        assert_eq!(these, all, "{key}: the same nodes");
    }
}

#[test]
fn options_the_views_would_ignore_are_refused() {
    let d = trace();
    let err = refused(&["report", d, "--graph", "main", "-s", "max"]);
    assert!(
        err.contains("--graph -s max") && err.contains("total, self, calls or avg"),
        "{err}"
    );
    let err = refused(&["report", d, "--graph", "main", "--marker", "path_a"]);
    assert!(
        err.contains("--marker") && err.contains("--graph has none"),
        "{err}"
    );
    let err = refused(&["report", d, "--callers", "malloc", "--marker", "path_a"]);
    assert!(
        err.contains("--marker") && err.contains("--callers has none"),
        "{err}"
    );
    let err = refused(&["report", d, "--callers", "malloc", "--raw-times"]);
    assert!(
        err.contains("--callers --raw-times") && err.contains("-s total"),
        "{err}"
    );
    // With something timed, --raw-times is used.
    for extra in [&["-s", "total"][..], &["-t", "1ns"]] {
        let mut a = vec!["report", d, "--callers", "malloc", "--raw-times"];
        a.extend_from_slice(extra);
        let rows = caller_rows(&run(&a));
        assert!(rows.contains(&(15, "alloc_leaf".into())), "{a:?}: {rows:?}");
    }

    // A trace with only the stacks the target counted (the writer's
    // filters left calls out): calls sort, times cannot.
    let counted = record("report-sort-counted", &["--max-depth", "2"]);
    let c = counted.to_str().unwrap();
    assert!(!counted.join("call_stacks.tsv").exists());
    let rows = caller_rows(&run(&["report", c, "--callers", "malloc", "-s", "calls"]));
    assert_eq!(rows.first(), Some(&(15, "alloc_leaf".into())), "{rows:?}");
    for key in ["total", "self", "avg", "max"] {
        let err = refused(&["report", c, "--callers", "malloc", "-s", key]);
        assert!(
            err.contains(&format!("--callers -s {key}")) && err.contains("call_stacks.tsv"),
            "{err}"
        );
    }
}
