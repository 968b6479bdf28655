//! True timings (issue 23): `record` calibrates each mechanism's cost per
//! hit and writes it to the trace (costs.tsv); `report`, `replay`,
//! `export` and `info` take it out of the times, say so (`report --json`:
//! `probe_costs`, `on_traps`), and name the functions that went through
//! a trap. tests/programs/true_times.c spins
//! in busy_a and busy_b for durations it measures itself, with ten calls
//! of a 4-byte function (only a trap takes it: the in-process trap)
//! between spins. The measured times (`--raw-times`) hold the traps'
//! costs: more than the corrected ones. How close the corrected times
//! come to what the program measured (the bounds) is a timing,
//! measured by `hotprobe-bench truetimes` (docs/PERFORMANCE.md), not
//! asserted here: a bound here failed on a loaded machine.

use std::path::{Path, PathBuf};

mod common;
use common::{gcc, hotprobe, text};

fn program(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/true_times.c");
    // No alignment padding between functions: the 4-byte s1 and s2 then
    // have none after them for a jump, and only a trap takes them.
    gcc(
        &src,
        &dir.join("true_times"),
        &["-O2", "-falign-functions=1"],
    )
}

/// `report --json` rows: name → (calls, self ns, avg ns), and the whole
/// JSON.
type Rows = std::collections::HashMap<String, (u64, u64, u64)>;

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
    for f in ["busy_a", "busy_b", "s1", "s2"] {
        assert!(
            raw[f].1 > rows[f].1,
            "{f}: raw {:?}, corrected {:?}",
            raw[f],
            rows[f]
        );
    }

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
}
