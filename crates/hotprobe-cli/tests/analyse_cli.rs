//! The questions asked of a trace after recording, against a program that
//! logs its own calls (tests/programs/calls.c: tree, arguments, and
//! durations measured inside each call): `replay`/`report` filters (-F, -N,
//! -D, -t, --tid, --since/--until; the exports' too), `report` sorting,
//! avg/min/max, --task, --diff, --hist, --flame and --json, `info`, `count
//! --hist`, `--json` and argument conditions, and usage errors. The
//! exports' own checks are in export_cli.rs.

mod common;

use common::calls_log::*;
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A query, applied to the program's own log by [`expected`].
#[derive(Clone, Default)]
struct Q {
    filter: Vec<&'static str>,
    notrace: Vec<&'static str>,
    depth: Option<usize>,
    min_ns: Option<u64>,
    tids: Vec<u32>,
    since: Option<u64>,
    until: Option<u64>,
}

impl Q {
    /// The command line flags.
    fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for f in &self.filter {
            a.extend(["-F".to_string(), f.to_string()]);
        }
        for f in &self.notrace {
            a.extend(["-N".to_string(), f.to_string()]);
        }
        if let Some(d) = self.depth {
            a.extend(["-D".into(), d.to_string()]);
        }
        if let Some(t) = self.min_ns {
            a.extend(["-t".into(), format!("{t}ns")]);
        }
        for t in &self.tids {
            a.extend(["--tid".into(), t.to_string()]);
        }
        if let Some(s) = self.since {
            a.extend(["--since".into(), format!("{s}ns")]);
        }
        if let Some(u) = self.until {
            a.extend(["--until".into(), format!("{u}ns")]);
        }
        a
    }
}

/// `*` globs.
fn glob(p: &str, s: &str) -> bool {
    match p.split_once('*') {
        None => p == s,
        Some((head, rest)) => {
            s.starts_with(head)
                && (0..=s.len() - head.len()).any(|i| glob(rest, &s[head.len() + i..]))
        }
    }
}

/// Per thread, (depth, name) of the calls kept, in entry order.
type Tree = BTreeMap<u32, Vec<(usize, String)>>;

/// uftrace's filter semantics over the program's log: what `replay` with
/// `q` must print.
fn expected(calls: &[Call], q: &Q) -> Tree {
    let start = calls.iter().map(|c| c.t0).min().unwrap();
    let mut out = Tree::new();
    // (blocked, in_filter, depth, candidate) of the open calls.
    let mut stack: Vec<(bool, bool, usize, bool)> = Vec::new();
    let mut tid = None;
    for c in calls {
        if tid != Some(c.tid) {
            tid = Some(c.tid);
            stack.clear();
        }
        stack.truncate(c.depth);
        let p = stack.last().copied();
        let blocked = p.is_some_and(|p| p.0) || q.notrace.iter().any(|g| glob(g, &c.name));
        let in_filter = p.is_some_and(|p| p.1) || q.filter.iter().any(|g| glob(g, &c.name));
        let depth = p.map_or(0, |p| p.2 + usize::from(p.3));
        let rel = c.t0 - start;
        let candidate = !blocked
            && (q.filter.is_empty() || in_filter)
            && q.depth.is_none_or(|d| depth < d)
            && (q.tids.is_empty() || q.tids.contains(&c.tid))
            && q.since.is_none_or(|s| rel >= s)
            && q.until.is_none_or(|u| rel < u);
        if candidate && q.min_ns.is_none_or(|m| c.dur() >= m) {
            out.entry(c.tid).or_default().push((depth, c.name.clone()));
        }
        stack.push((blocked, in_filter, depth, candidate));
    }
    out
}

fn replayed(run: &Run, q: &Q) -> Tree {
    let mut args = vec!["replay".to_string(), run.d().to_string()];
    args.extend(q.args());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut t = Tree::new();
    for (tid, depth, name) in call_tree(&ok(&a)) {
        t.entry(tid).or_default().push((depth, name));
    }
    t
}

/// The kept calls of a Chrome export with `q`: per thread, (depth, name)
/// in entry order (`B` opens a call, `E` closes it, `X` is a call with
/// nothing kept inside).
fn chrome_tree(run: &Run, q: &Q) -> Tree {
    let mut args = vec!["export".to_string(), run.d().to_string()];
    args.extend(["--format".into(), "chrome".into()]);
    args.extend(q.args());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let v: Value = serde_json::from_str(&ok(&a)).unwrap();
    let mut t = Tree::new();
    let mut open: BTreeMap<u32, usize> = BTreeMap::new();
    for e in v["traceEvents"].as_array().unwrap() {
        let tid = e["tid"].as_u64().unwrap() as u32;
        let name = e["name"].as_str().unwrap().to_string();
        let depth = open.entry(tid).or_default();
        match e["ph"].as_str().unwrap() {
            "B" => {
                t.entry(tid).or_default().push((*depth, name));
                *depth += 1;
            }
            "E" => *depth -= 1,
            "X" => t.entry(tid).or_default().push((*depth, name)),
            _ => {}
        }
    }
    t
}

/// Calls in a folded export (`--calls`) and events in a CTF export with
/// `q`.
fn folded_calls_and_ctf_events(run: &Run, q: &Q) -> (u64, u64) {
    let run_export = |format: &str, extra: &[&str]| {
        let mut args = vec!["export".to_string(), run.d().to_string()];
        args.extend(["--format".into(), format.into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(q.args());
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        hotprobe(&a)
    };
    let folded = run_export("folded", &["--calls"]);
    assert!(folded.status.success(), "{}", text(&folded.stderr));
    let calls = text(&folded.stdout)
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let dir = tmp().join(format!("ctf-{}", q.args().join("_").replace('/', "_")));
    let ctf = run_export("ctf", &["-o", dir.to_str().unwrap()]);
    let err = text(&ctf.stderr);
    assert!(ctf.status.success(), "{err}");
    // "hotprobe: N events in P packets, S streams: DIR"
    let events = err
        .split("hotprobe: ")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    (calls, events)
}

/// `report --json` rows by function.
fn report_rows(run: &Run, extra: &[&str]) -> (Value, BTreeMap<String, Value>) {
    let mut a = vec!["report", run.d(), "--json"];
    a.extend_from_slice(extra);
    let v = json(&a);
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["function"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    (v, rows)
}

fn calls_by_function(t: &Tree) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (_, n) in t.values().flatten() {
        *m.entry(n.clone()).or_default() += 1;
    }
    m
}

/// Two boundaries in the two widest gaps (≥ 5 ms) between call starts,
/// relative to the trace start: (since, until), since < until.
fn quiet_points(run: &Run) -> (u64, u64) {
    let start = run.calls.iter().map(|c| c.t0).min().unwrap();
    let mut s: Vec<u64> = run.calls.iter().map(|c| c.t0 - start).collect();
    s.sort_unstable();
    let mut gaps: Vec<(u64, u64)> = s.windows(2).map(|w| (w[1] - w[0], w[0])).collect();
    gaps.sort_unstable_by(|a, b| b.cmp(a));
    assert!(gaps[1].0 >= 5_000_000, "no two quiet gaps: {gaps:?}");
    let mut m = [gaps[0].1 + gaps[0].0 / 2, gaps[1].1 + gaps[1].0 / 2];
    m.sort_unstable();
    (m[0], m[1])
}

#[test]
fn replay_and_report_filters_keep_what_the_program_logged() {
    let run = run3();
    assert_eq!(run.tids().len(), 3);
    let w = run.tids()[2];
    let (since, until) = quiet_points(run);
    let queries: Vec<(&str, Q)> = vec![
        ("none", Q::default()),
        (
            "-F middle",
            Q {
                filter: vec!["middle"],
                ..Q::default()
            },
        ),
        (
            "-F 'mid*' -F rec",
            Q {
                filter: vec!["mid*", "rec"],
                ..Q::default()
            },
        ),
        (
            "-N middle",
            Q {
                notrace: vec!["middle"],
                ..Q::default()
            },
        ),
        (
            "-F outer -N slow -D 2",
            Q {
                filter: vec!["outer"],
                notrace: vec!["slow"],
                depth: Some(2),
                ..Q::default()
            },
        ),
        (
            "-D 2",
            Q {
                depth: Some(2),
                ..Q::default()
            },
        ),
        (
            "-t 5ms",
            Q {
                min_ns: Some(5_000_000),
                ..Q::default()
            },
        ),
        (
            "--tid",
            Q {
                tids: vec![w],
                ..Q::default()
            },
        ),
        (
            "--since",
            Q {
                since: Some(since),
                ..Q::default()
            },
        ),
        (
            "--until",
            Q {
                until: Some(until),
                ..Q::default()
            },
        ),
        (
            "--since --until",
            Q {
                since: Some(since),
                until: Some(until),
                ..Q::default()
            },
        ),
    ];
    for (what, q) in &queries {
        let want = expected(&run.calls, q);
        assert_eq!(replayed(run, q), want, "replay {what}");
        // The exports take the same filters (issue 24).
        assert_eq!(chrome_tree(run, q), want, "export chrome {what}");
        let kept: u64 = want.values().map(|t| t.len() as u64).sum();
        assert_eq!(
            folded_calls_and_ctf_events(run, q),
            (kept, 2 * kept),
            "export folded and ctf {what}"
        );
        // The report counts the same calls.
        let args = q.args();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (v, rows) = report_rows(run, &a);
        let got: BTreeMap<String, u64> = rows
            .iter()
            .map(|(k, r)| (k.clone(), r["calls"].as_u64().unwrap()))
            .collect();
        assert_eq!(got, calls_by_function(&want), "report {what}");
        assert_eq!(
            v["calls"].as_u64().unwrap(),
            want.values().map(|t| t.len() as u64).sum::<u64>()
        );
    }
    // The window filters matter: each keeps some calls and leaves some.
    let all: usize = run.calls.len();
    for q in &queries[8..] {
        let n: usize = expected(&run.calls, &q.1).values().map(Vec::len).sum();
        assert!(n > 0 && n < all, "{}: {n} of {all}", q.0);
    }
}

#[test]
fn report_columns_sorting_and_threads() {
    let run = run3();
    // --raw-times: the program's clock counts the probes' costs (issue 23).
    let (_, rows) = report_rows(run, &["--raw-times"]);
    // min/max/avg against the program's own durations, taken inside each
    // call (so never longer than the recorded ones but for the error of
    // the recorder's TSC calibration: 50 ms, two clock pairs; allow 2 %).
    for (name, r) in &rows {
        let durs: Vec<u64> = run
            .calls
            .iter()
            .filter(|c| &c.name == name)
            .map(Call::dur)
            .collect();
        let (min, max, avg) = (
            r["min_ns"].as_u64().unwrap(),
            r["max_ns"].as_u64().unwrap(),
            r["avg_ns"].as_u64().unwrap(),
        );
        let low = |v: u64| v as f64 * 0.98;
        assert!(
            min as f64 >= low(*durs.iter().min().unwrap()),
            "{name}: {r}"
        );
        assert!(
            max as f64 >= low(*durs.iter().max().unwrap()),
            "{name}: {r}"
        );
        assert!(min <= avg && avg <= max, "{name}: {r}");
        assert_eq!(
            r["module"].as_str().unwrap(),
            calls_program().to_str().unwrap()
        );
    }
    assert!(rows["slow"]["min_ns"].as_u64().unwrap() >= 19_600_000);
    // Self times add up to the outermost calls' durations.
    let selfs: u64 = rows.values().map(|r| r["self_ns"].as_u64().unwrap()).sum();
    let roots =
        rows["main"]["total_ns"].as_u64().unwrap() + rows["worker"]["total_ns"].as_u64().unwrap();
    assert_eq!(selfs, roots);
    // rec recurses: its total counts the outermost calls only.
    assert!(
        rows["rec"]["total_ns"].as_u64().unwrap() < rows["rec"]["avg_ns"].as_u64().unwrap() * 7
    );
    for (key, field) in [
        ("total", "total_ns"),
        ("self", "self_ns"),
        ("calls", "calls"),
        ("avg", "avg_ns"),
        ("max", "max_ns"),
    ] {
        let v = json(&["report", run.d(), "-s", key, "--json"]);
        assert_eq!(v["sort"], key);
        let vals: Vec<u64> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[field].as_u64().unwrap())
            .collect();
        assert!(vals.windows(2).all(|w| w[0] >= w[1]), "-s {key}: {vals:?}");
        assert_eq!(vals.len(), rows.len());
    }
    // The text table: the sort key's column is decreasing too, calls
    // before the name.
    let t = ok(&["report", run.d(), "-s", "calls"]);
    assert!(
        t.starts_with(
            "  Total time   Self time     Average     Minimum     Maximum       Calls  Function"
        ),
        "{t}"
    );
    let calls: Vec<u64> = t
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().rev().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(calls.windows(2).all(|w| w[0] >= w[1]), "{t}");
    // --task: one table per thread, the program's per-thread counts.
    let v = json(&["report", run.d(), "--task", "--json"]);
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 3);
    for t in threads {
        let tid = t["tid"].as_u64().unwrap() as u32;
        for r in t["rows"].as_array().unwrap() {
            let name = r["function"].as_str().unwrap();
            assert_eq!(
                r["calls"].as_u64().unwrap(),
                run.count(|c| c.tid == tid && c.name == name),
                "{tid} {name}"
            );
        }
    }
    let text = ok(&["report", run.d(), "--task"]);
    for tid in run.tids() {
        assert!(text.contains(&format!("# thread {tid}: ")), "{text}");
    }
    // --phases with a filter and JSON.
    let v = json(&["report", run.d(), "--phases", "--marker", "late", "--json"]);
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{v}");
    assert_eq!(phases[1]["name"], "late");
}

#[test]
fn report_diff_hist_and_flame() {
    let (a, b) = (run3(), run5());
    let v = json(&["report", a.d(), "--diff", b.d(), "--json"]);
    let (fa, fb) = (a.per_function(), b.per_function());
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), fa.len());
    for r in rows {
        let f = r["function"].as_str().unwrap();
        assert_eq!(r["calls_a"].as_u64().unwrap(), fa[f], "{f}");
        assert_eq!(r["calls_b"].as_u64().unwrap(), fb[f], "{f}");
        assert!(r["total_ns_b"].as_u64().is_some() && r["self_ns_a"].as_u64().is_some());
    }
    // Sorted by the change of total time: N=5 has 2 more slow calls per
    // thread... the largest changes come first.
    let ch: Vec<u64> = rows
        .iter()
        .map(|r| {
            r["total_ns_b"]
                .as_u64()
                .unwrap()
                .abs_diff(r["total_ns_a"].as_u64().unwrap())
        })
        .collect();
    assert!(ch.windows(2).all(|w| w[0] >= w[1]), "{ch:?}");
    let text = ok(&["report", a.d(), "--diff", b.d(), "-s", "calls"]);
    let leaf = text
        .lines()
        .find(|l| l.ends_with(" leaf"))
        .expect("leaf row");
    let f: Vec<&str> = leaf.split_whitespace().collect();
    assert_eq!(
        f[..3],
        [
            fa["leaf"].to_string(),
            fb["leaf"].to_string(),
            format!("+{}", fb["leaf"] - fa["leaf"])
        ]
    );

    // --hist: the calls of slow, in log2 buckets.
    let v = json(&["report", a.d(), "--hist", "slow", "--json"]);
    let h = &v["histograms"][0];
    assert_eq!(h["function"], "slow");
    let n = a.count(|c| c.name == "slow");
    assert_eq!(h["count"].as_u64().unwrap(), n);
    let buckets = h["buckets"].as_array().unwrap();
    let sum: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(sum, n);
    let (min, max) = (h["min_ns"].as_u64().unwrap(), h["max_ns"].as_u64().unwrap());
    for b in buckets.iter().filter(|b| b["count"].as_u64() > Some(0)) {
        let (lo, hi) = (b["lo_ns"].as_u64().unwrap(), b["hi_ns"].as_u64().unwrap());
        assert!(lo <= max && hi > min, "{b} outside [{min}, {max}]");
    }
    let text = ok(&["report", a.d(), "--hist", "*f", "-N", "late"]);
    assert!(text.starts_with("# leaf: "), "{text}");
    for l in text.lines().filter(|l| l.starts_with('[')) {
        let (label, bar) = l.split_once(" |").unwrap();
        assert!(label.contains(", ") && label.contains(')'), "{l}");
        assert!(bar.ends_with('|') && bar.len() == 53, "{l}");
    }
    let o = hotprobe(&["report", a.d(), "--hist", "nosuch"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text_of(&o.stderr).contains("no function matching `nosuch`"));

    // --flame: DIR/flame.svg, which renders and names the hottest function.
    let out = ok(&["report", a.d(), "--flame"]);
    let svg = PathBuf::from(out.trim());
    assert_eq!(svg, a.dir.join("flame.svg"));
    let (_, rows) = report_rows(a, &["-s", "self"]);
    let hottest = rows
        .iter()
        .max_by_key(|(_, r)| r["self_ns"].as_u64().unwrap())
        .unwrap()
        .0;
    check_svg(&svg, &[hottest, "slow", "middle"]);
}

fn text_of(b: &[u8]) -> String {
    text(b)
}

#[test]
fn info_describes_the_trace() {
    let run = run3();
    let v = json(&["info", run.d(), "--json"]);
    let main_tid = run.calls[0].tid;
    assert_eq!(v["format"], "hotprobe-trace");
    assert_eq!(v["version"], hotprobe_trace::FORMAT_VERSION);
    assert_eq!(v["pid"].as_u64(), Some(main_tid as u64));
    assert_eq!(
        v["target"].as_str().unwrap(),
        calls_program().to_str().unwrap()
    );
    assert_eq!(v["command"][1], "3");
    assert_eq!(v["calls"].as_u64().unwrap(), run.calls.len() as u64);
    assert_eq!(v["events"].as_u64().unwrap(), 2 * run.calls.len() as u64);
    assert_eq!(v["lost"], 0);
    assert!(v["complete"].as_bool().unwrap());
    assert_eq!(v["time_base"]["unit"], "tsc");
    assert_eq!(v["filter"]["exclude"][0], "note_*");
    let tids: Vec<u32> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tid"].as_u64().unwrap() as u32)
        .collect();
    let mut want = run.tids();
    want.sort_unstable();
    assert_eq!(tids, want);
    let main = &run.calls[0];
    assert_eq!(main.name, "main");
    assert!(v["duration_ns"].as_u64().unwrap() as f64 >= main.dur() as f64 * 0.98);
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(run.dir.join("info.json")).unwrap()).unwrap();
    assert_eq!(v["symbols"], info["symbols"]);
    assert_eq!(v["start_unix_ns"], info["start_unix_ns"]);
    let start = v["start_time"].as_str().unwrap();
    assert!(start.len() == 30 && start.ends_with('Z'), "{start}");
    let text = ok(&["info", run.d()]);
    for want in [
        format!(
            "# format:        hotprobe-trace version {}\n",
            hotprobe_trace::FORMAT_VERSION
        ),
        format!("# pid:           {main_tid}\n"),
        format!(
            "# events:        {} function events, {} calls",
            2 * run.calls.len(),
            run.calls.len()
        ),
        "# filters:       exclude note_*\n".into(),
        "# threads:       3 (".into(),
        "# time base:     TSC at ".into(),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
}

/// `count` runs the program: its log, then the table.
fn count(args: &[&str]) -> (Vec<Call>, String, String) {
    let prog = calls_program();
    let mut a = vec!["count"];
    a.extend_from_slice(args);
    a.extend(["--", prog.to_str().unwrap()]);
    let o = hotprobe_within(&a, std::time::Duration::from_secs(60));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{a:?}: {err}");
    let log: String = program_output(&out)
        .lines()
        .filter(|l| l.split_whitespace().count() == 6 && !l.starts_with('['))
        .map(|l| format!("{l}\n"))
        .collect();
    (parse_calls(&log), out, err)
}

#[test]
fn count_hist_conditions_and_json() {
    let (calls, out, err) = count(&["slow", "leaf", "--hist"]);
    let t = CountTable::parse(&out, &err);
    let n = |f: &str| calls.iter().filter(|c| c.name == f).count() as u64;
    assert_eq!(t.hits("slow"), n("slow"));
    assert_eq!(t.hits("leaf"), n("leaf"));
    assert!(
        out.contains(&format!("# slow: {} calls, avg ", n("slow"))),
        "{out}"
    );
    assert!(out.contains("[16ms, 32ms)"), "{out}");

    let (calls, out, err) = count(&[
        "leaf if arg0 > 1 && arg0 < 100",
        "middle if arg0 == 1",
        "slow",
        "--hist",
        "--json",
    ]);
    let last = out.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let rows = v.as_array().unwrap();
    let row = |p: &str| {
        rows.iter()
            .find(|r| r["probe"] == p)
            .unwrap_or_else(|| panic!("no {p}: {v}"))
    };
    let want_leaf = calls
        .iter()
        .filter(|c| c.name == "leaf" && c.arg > 1 && c.arg < 100)
        .count() as u64;
    assert!(want_leaf > 0);
    assert_eq!(row("leaf")["hits"].as_u64().unwrap(), want_leaf);
    assert_eq!(row("leaf")["condition"], "arg0 > 1 && arg0 < 100");
    assert_eq!(
        row("leaf")["histogram"]["count"].as_u64().unwrap(),
        want_leaf
    );
    let want_mid = calls
        .iter()
        .filter(|c| c.name == "middle" && c.arg == 1)
        .count() as u64;
    assert_eq!(row("middle")["hits"].as_u64().unwrap(), want_mid);
    let slow = &row("slow")["histogram"];
    let slows: Vec<u64> = calls
        .iter()
        .filter(|c| c.name == "slow")
        .map(Call::dur)
        .collect();
    assert_eq!(slow["count"].as_u64().unwrap(), slows.len() as u64);
    // Durations from the TSC (rate measured over 10 ms): within 1 %.
    let min = *slows.iter().min().unwrap() as f64;
    assert!(
        slow["min_ns"].as_f64().unwrap() >= min * 0.99,
        "{slow} vs {min}"
    );
    for k in ["address", "execution", "why"] {
        assert!(row("slow")[k].is_string(), "{k}");
    }
    assert!(row("slow")["nmissed"].is_null());

    // Plain count --json: the session's own counts.
    let (calls, out, _) = count(&["middle", "rec", "--json"]);
    let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    for r in v.as_array().unwrap() {
        let p = r["probe"].as_str().unwrap();
        assert_eq!(
            r["hits"].as_u64().unwrap(),
            calls.iter().filter(|c| c.name == p).count() as u64
        );
        assert!(r.get("histogram").is_none());
    }

    // Conditions that do not parse: a usage error naming the column.
    let prog = calls_program();
    let o = hotprobe(&["count", "leaf if arg9 > 1", "--", prog.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(e.contains("column 1: arg9 does not exist"), "{e}");
    let o = hotprobe(&["count", "leaf if arg0 >", "--", prog.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("found the end of the condition"));
}

#[test]
fn usage_errors() {
    let run = run3();
    for (args, code) in [
        (
            vec!["replay", run.d(), "--since", "20ms", "--until", "10ms"],
            2,
        ),
        (vec!["replay", run.d(), "-D", "0"], 2),
        (vec!["report", run.d(), "-t", "10 parsecs"], 2),
        (vec!["report", run.d(), "--task", "--phases"], 2),
        (vec!["report", run.d(), "--diff", "/nonexistent"], 1),
        (vec!["export", run.d(), "--format", "otlp"], 2),
        (
            vec![
                "export",
                run.d(),
                "--format",
                "otlp",
                "--endpoint",
                "https://x:1",
            ],
            2,
        ),
        (
            vec![
                "export",
                run.d(),
                "--format",
                "svg",
                "--endpoint",
                "http://x:1",
            ],
            2,
        ),
        (vec!["info", "/nonexistent"], 1),
    ] {
        let o = hotprobe(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("hotprobe: error: "), "{err}");
    }
}
