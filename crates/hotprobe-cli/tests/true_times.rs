//! True timings (issue 23): `record` calibrates each mechanism's cost per
//! hit and writes it to the trace (costs.tsv); `report`, `replay`,
//! `export` and `info` take it out of the times, say so (`report --json`:
//! `probe_costs`, `on_traps`), and name the functions that went through
//! a trap (`report`'s rows and `replay`'s lines marked `*` with a legend,
//! the folded stacks' frames `name [in-process trap]`).
//! tests/programs/true_times.c spins
//! in busy_a and busy_b for durations it measures itself, with ten calls
//! of a 3- or 1-byte function (only a trap takes it: the in-process trap)
//! between spins. The measured times (`--raw-times`) hold the traps'
//! costs: more than the corrected ones. How close the corrected times
//! come to what the program measured (the bounds) is a timing,
//! measured by `hotprobe-bench truetimes` (docs/PERFORMANCE.md), not
//! asserted here: a bound here failed on a loaded machine.
//!
//! A calibration too high for what was measured (one made on a loaded
//! machine) leaves no call at 0: a call loses at most the shortest call
//! measured on its mechanism, a gap the costs would take below zero is
//! held at zero without the excess carried on, and one warning line on
//! stderr gives the count and --raw-times. The tests below make it so by
//! rewriting the recorded trace's costs.tsv, so that nothing depends on
//! this machine's timing.

use std::path::{Path, PathBuf};

mod common;
use common::{gcc, hotprobe, text};

fn program(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/true_times.c");
    // No alignment padding between functions: the 3-byte s1 and 1-byte s2
    // then have none after them for a jump, too few bytes for a punned
    // one, and only a trap takes them.
    gcc(
        &src,
        &dir.join("true_times"),
        &["-O2", "-falign-functions=1"],
    )
}

/// `report --json` rows: name → (calls, self ns, avg ns, min ns), and the
/// whole JSON.
type Rows = std::collections::HashMap<String, (u64, u64, u64, u64)>;

/// The in-process trap's cost a hit in the trace's costs.tsv (ns).
fn trap_ns_per_hit(trace: &Path) -> f64 {
    let costs = std::fs::read_to_string(trace.join("costs.tsv")).unwrap();
    costs
        .lines()
        .find_map(|l| l.strip_prefix("mechanism\tin-process trap\t"))
        .and_then(|l| l.split('\t').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no in-process trap cost in {costs}"))
}

fn report(trace: &Path, raw: bool) -> (Rows, serde_json::Value) {
    let mut args = vec!["report", "--json", trace.to_str().unwrap()];
    if raw {
        args.push("--raw-times");
    }
    let o = hotprobe(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["function"].as_str().unwrap().to_string(),
                (
                    r["calls"].as_u64().unwrap(),
                    r["self_ns"].as_u64().unwrap(),
                    r["avg_ns"].as_u64().unwrap(),
                    r["min_ns"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    (rows, v)
}

#[test]
fn report_takes_the_probes_costs_out_of_the_times() {
    let dir = hotprobe_testkit::TempDir::new("true-times");
    let prog = program(dir.path());
    let trace = dir.path().join("t.d");
    let t = trace.to_str().unwrap();
    let rec = hotprobe(&["record", "--force", "-o", t, "--", prog.to_str().unwrap()]);
    assert!(rec.status.success(), "{}", text(&rec.stderr));
    // The calibration is in the trace: one line per mechanism used, one
    // per probe.
    let costs = std::fs::read_to_string(trace.join("costs.tsv")).unwrap();
    let mechanisms: Vec<&str> = costs
        .lines()
        .filter_map(|l| l.strip_prefix("mechanism\t"))
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert!(mechanisms.contains(&"in-process trap"), "{costs}");
    assert!(mechanisms.contains(&"jump"), "{costs}");
    let (rows, v) = report(&trace, false);
    for (busy, short) in [("busy_a", "s1"), ("busy_b", "s2")] {
        assert_eq!(rows[busy].0, 20, "{rows:?}");
        assert_eq!(rows[short].0, 1000, "{rows:?}");
    }
    assert!(
        v["probe_costs"]
            .as_str()
            .unwrap()
            .starts_with("times without the probes' costs (a hit: "),
        "{v}"
    );
    assert_eq!(
        v["on_traps"],
        serde_json::json!([
            {"function": "s1", "mechanism": "in-process trap"},
            {"function": "s2", "mechanism": "in-process trap"}
        ]),
        "{v}"
    );

    // As measured, the traps' costs are in the busy functions' self
    // times and in the short functions' durations.
    let (raw, v) = report(&trace, true);
    assert!(
        v["probe_costs"]
            .as_str()
            .unwrap()
            .starts_with("times as measured, the probes' costs in them"),
        "{v}"
    );
    // What the correction must give, from the calibrated cost a hit `h`
    // of the trap (costs.tsv, rounded to ns as the reader takes it):
    // - s1 and s2 are leaves on the trap: each call loses what lies
    //   between its own two stamps, `h` capped at the shortest call
    //   measured on the trap, exactly, whatever the machine's load;
    // - busy_a and busy_b hold the trap calls: their self times lose the
    //   rest of each trap call's two hits (held at zero where a gap is
    //   shorter), so they go down by something when `h` is not 0, and
    //   never up. A function whose callees cost nothing is not corrected
    //   beyond its own hits.
    let h = trap_ns_per_hit(&trace).round() as u64;
    let cap = h.min(raw["s1"].3.min(raw["s2"].3));
    for f in ["s1", "s2"] {
        assert_eq!(
            rows[f].1,
            raw[f].1 - raw[f].0 * cap,
            "{f}: a hit {h} ns, capped at {cap}: raw {:?}, corrected {:?}",
            raw[f],
            rows[f]
        );
    }
    for f in ["busy_a", "busy_b", "main"] {
        assert!(
            rows[f].1 <= raw[f].1,
            "{f}: raw {:?}, corrected {:?}",
            raw[f],
            rows[f]
        );
    }
    if h > 0 {
        for f in ["busy_a", "busy_b"] {
            assert!(
                rows[f].1 < raw[f].1,
                "{f}: a trap hit {h} ns: raw {:?}, corrected {:?}",
                raw[f],
                rows[f]
            );
        }
    }

    // The text report, piped as here: s1 and s2 marked `*` in the first
    // column, the legend after the table (stderr says the same only at a
    // terminal: a pipe gets the data alone).
    let o = hotprobe(&["report", t]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let table = text(&o.stdout);
    let marked: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("* "))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    let mut sorted = marked.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["s1", "s2"], "{table}");
    let legend =
        "# * on a trap (in-process trap: µs a hit, taken out of these times as calibrated)";
    assert_eq!(table.lines().last(), Some(legend), "{table}");

    // replay, piped, marks the lines of s1 and s2 the same way (`*` in
    // the first column, where its header has `#`) and ends with the same
    // legend: each of their 2000 calls a leaf under busy_a or busy_b.
    let o = hotprobe(&["replay", t]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let tree = text(&o.stdout);
    fn body(l: &str) -> &str {
        l.split_once("] | ").map_or("", |(_, b)| b)
    }
    let (marked, unmarked): (Vec<&str>, Vec<&str>) = tree
        .lines()
        .filter(|l| !l.starts_with('#'))
        .partition(|l| l.starts_with('*'));
    assert_eq!(marked.len(), 2000, "{tree}");
    assert!(
        marked
            .iter()
            .all(|l| ["    s1();", "    s2();"].contains(&body(l))),
        "{tree}"
    );
    assert!(
        unmarked
            .iter()
            .all(|l| l.starts_with(' ') && !body(l).contains("s1") && !body(l).contains("s2")),
        "{tree}"
    );
    assert_eq!(tree.lines().last(), Some(legend), "{tree}");
    // Without the duration column: the exact lines, in the thread's
    // column the pid of the program (one thread).
    let o = hotprobe(&["replay", "-f", "tid", t]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let tree = text(&o.stdout);
    let tid = tree_tid(&tree);
    let want = |f: &str| format!("*[{tid:>6}] |     {f}();");
    for f in ["s1", "s2"] {
        assert_eq!(
            tree.lines().filter(|l| *l == want(f)).count(),
            1000,
            "{f}: {}\n{tree}",
            want(f)
        );
    }
    assert_eq!(tree.lines().filter(|l| l.starts_with('*')).count(), 2000);
    assert_eq!(tree.lines().last(), Some(legend), "{tree}");
    // Folded stacks (in calls): the mechanism after the name, one line
    // per stack.
    let o = hotprobe(&["export", t, "--format", "folded", "--calls"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "main 1\n\
         main;busy_a 20\n\
         main;busy_a;s1 [in-process trap] 1000\n\
         main;busy_b 20\n\
         main;busy_b;s2 [in-process trap] 1000\n"
    );

    // info and the Chrome export say what the times are.
    let info = hotprobe(&["info", t]);
    assert!(
        text(&info.stdout)
            .lines()
            .any(|l| l.starts_with("# probe costs:   times without the probes' costs")),
        "{}",
        text(&info.stdout)
    );
    let chrome = dir.path().join("t.json");
    let ex = hotprobe(&[
        "export",
        t,
        "--format",
        "chrome",
        "-o",
        chrome.to_str().unwrap(),
    ]);
    assert!(ex.status.success(), "{}", text(&ex.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&chrome).unwrap()).unwrap();
    assert!(
        v["otherData"]["probe_costs"]
            .as_str()
            .unwrap()
            .starts_with("times without the probes' costs"),
        "{}",
        v["otherData"]
    );
    // The functions on a trap: listed, and the category of their events.
    assert_eq!(
        v["otherData"]["on_traps"],
        serde_json::json!([
            {"function": "s1", "mechanism": "in-process trap"},
            {"function": "s2", "mechanism": "in-process trap"}
        ])
    );
    let events = v["traceEvents"].as_array().unwrap();
    for f in ["s1", "s2", "busy_a"] {
        let cats: std::collections::BTreeSet<&str> = events
            .iter()
            .filter(|e| e["name"] == f && (e["ph"] == "X" || e["ph"] == "B"))
            .map(|e| e["cat"].as_str().unwrap_or("none"))
            .collect();
        let want = if f == "busy_a" {
            "none"
        } else {
            "in-process trap"
        };
        assert_eq!(cats.into_iter().collect::<Vec<_>>(), [want], "{f}");
    }
}

/// The thread of a one-thread `replay -f tid` tree: main's entry line
/// (` [  TID] | main() {`).
fn tree_tid(tree: &str) -> u32 {
    tree.lines()
        .find_map(|l| l.strip_suffix("] | main() {")?.strip_prefix(" ["))
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no main() entry in\n{tree}"))
}

/// Records the program once and returns the trace.
fn recorded(dir: &Path) -> PathBuf {
    let prog = program(dir);
    let trace = dir.join("t.d");
    let rec = hotprobe(&[
        "record",
        "--force",
        "-o",
        trace.to_str().unwrap(),
        "--",
        prog.to_str().unwrap(),
    ]);
    assert!(rec.status.success(), "{}", text(&rec.stderr));
    trace
}

/// Rewrites costs.tsv's figure of each mechanism: `ns(label)`.
fn set_costs(trace: &Path, ns: impl Fn(&str) -> &'static str) {
    let p = trace.join("costs.tsv");
    let old = std::fs::read_to_string(&p).unwrap();
    let new: String = old
        .lines()
        .map(|l| match l.split('\t').collect::<Vec<_>>()[..] {
            ["mechanism", label, _, how] => format!("mechanism\t{label}\t{}\t{how}\n", ns(label)),
            _ => format!("{l}\n"),
        })
        .collect();
    assert_ne!(old, new, "costs.tsv has mechanisms");
    std::fs::write(&p, new).unwrap();
}

/// The warning lines of a run's stderr.
fn warnings(o: &std::process::Output) -> Vec<String> {
    text(&o.stderr)
        .lines()
        .filter(|l| l.starts_with("hotprobe: warning:"))
        .map(str::to_string)
        .collect()
}

/// `report --json` rows by name, with the run.
fn report_rows(trace: &Path, raw: bool) -> (serde_json::Value, std::process::Output) {
    let mut args = vec!["report", "--json", trace.to_str().unwrap()];
    if raw {
        args.push("--raw-times");
    }
    let o = hotprobe(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["function"].as_str().unwrap().to_string(), r.clone()))
        .collect::<serde_json::Map<_, _>>();
    (serde_json::Value::Object(rows), o)
}

/// The other analyses of the trace: replay, report --task -s total,
/// and the Chrome export, each run's stderr warnings.
fn other_warnings(trace: &Path) -> Vec<Vec<String>> {
    let t = trace.to_str().unwrap();
    let out = trace.join("t.json");
    [
        vec!["replay", t],
        vec!["report", t, "--task", "-s", "total"],
        vec![
            "export",
            t,
            "--format",
            "chrome",
            "-o",
            out.to_str().unwrap(),
        ],
    ]
    .iter()
    .map(|args| {
        let o = hotprobe(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        warnings(&o)
    })
    .collect()
}

#[test]
fn a_calibration_too_high_is_capped_at_the_shortest_call_and_said() {
    let dir = hotprobe_testkit::TempDir::new("true-times-high");
    let trace = recorded(dir.path());
    // Half a second a trap hit: far more than any of the 2000 trap calls
    // measured, whatever this machine's load.
    set_costs(&trace, |label| {
        if label == "in-process trap" {
            "500000000.000"
        } else {
            "0.000"
        }
    });
    let (raw, o) = report_rows(&trace, true);
    assert_eq!(
        warnings(&o),
        Vec::<String>::new(),
        "--raw-times: as measured"
    );
    let (rows, o) = report_rows(&trace, false);
    // The cap: the shortest trap call measured (s1 and s2 are the trap's
    // leaves, and its only functions).
    let n = |v: &serde_json::Value, f: &str, k: &str| v[f][k].as_u64().unwrap();
    let cap = n(&raw, "s1", "min_ns").min(n(&raw, "s2", "min_ns"));
    for f in ["s1", "s2"] {
        assert_eq!(n(&rows, f, "calls"), 1000);
        // Each call loses the cap, never more: not all of them at 0.
        assert_eq!(
            n(&rows, f, "total_ns"),
            n(&raw, f, "total_ns") - 1000 * cap,
            "{f}: raw {}, corrected {}",
            raw[f],
            rows[f]
        );
        assert!(n(&rows, f, "total_ns") > 0, "{}", rows[f]);
    }
    // The busy functions' gaps before a trap call are held at 0, not the
    // rest of their self time; main's hold no trap call (the jump's cost
    // is set to 0 here: as measured).
    for f in ["busy_a", "busy_b", "main"] {
        assert!(n(&rows, f, "total_ns") > 0, "{f}: {}", rows[f]);
        assert!(n(&rows, f, "self_ns") > 0, "{f}: {}", rows[f]);
    }
    for f in ["busy_a", "busy_b"] {
        assert!(n(&rows, f, "self_ns") < n(&raw, f, "self_ns"), "{f}");
    }
    assert_eq!(n(&rows, "main", "self_ns"), n(&raw, "main", "self_ns"));
    // Held: the gap before each trap call (its entry), no other hit.
    let hits: u64 = raw
        .as_object()
        .unwrap()
        .values()
        .map(|r| 2 * r["calls"].as_u64().unwrap())
        .sum();
    let held = format!(
        "hotprobe: warning: 2000 of {hits} probe hits came sooner after the record before them \
         than the probes' calibrated costs allow (that time held at zero); in-process trap: \
         500000.00 µs a hit, its shortest call "
    );
    let w = warnings(&o);
    assert_eq!(w.len(), 1, "{}", text(&o.stderr));
    assert!(
        w[0].starts_with(&held) && w[0].ends_with("--raw-times gives the times as measured"),
        "{}",
        w[0]
    );
    for (i, w) in other_warnings(&trace).iter().enumerate() {
        assert_eq!(w.len(), 1, "analysis {i}: {w:?}");
        assert!(w[0].starts_with(&held), "{w:?}");
    }
}

#[test]
fn a_calibration_that_fits_gives_no_warning() {
    let dir = hotprobe_testkit::TempDir::new("true-times-fits");
    let trace = recorded(dir.path());
    // 1 ns a hit: less than any call or gap measured.
    set_costs(&trace, |_| "1.000");
    let (raw, _) = report_rows(&trace, true);
    let (rows, o) = report_rows(&trace, false);
    assert_eq!(warnings(&o), Vec::<String>::new(), "{}", text(&o.stderr));
    let n = |v: &serde_json::Value, f: &str, k: &str| v[f][k].as_u64().unwrap();
    for f in ["s1", "s2"] {
        // Each call loses its two halves: 1 ns.
        assert_eq!(
            n(&rows, f, "total_ns"),
            n(&raw, f, "total_ns") - 1000,
            "{f}"
        );
    }
    for w in other_warnings(&trace) {
        assert_eq!(w, Vec::<String>::new());
    }
}
