//! Massive probe counts (issue 14): a generated C program with 20,000
//! distinct functions, each called a known number of times, probed whole
//! on the fast path — patch on a `-fpatchable-function-entry=5` build,
//! forced jump on a plain build — with every count exact, the program's
//! output unchanged, and `record` holding one call per call made. Also:
//! globs (`'*'`, `'f_*'`) over more than 1,024 patchable functions put
//! every one on the patch mechanism (the fast path's table is not capped
//! at 1,024 or 16,384 sites any more).
//!
//! The program is generated and compiled once per test binary (-O1, small
//! functions, so the two builds take seconds, not minutes).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::{gcc, hotprobe_within, program_output, text, CountTable};

/// Functions in the generated program.
const N: usize = 20_000;

/// Calls the program makes to `f_i`.
fn calls_of(i: usize) -> u64 {
    (i % 3) as u64 + 1
}

/// Generous: arming, running and detaching 20,000 probes takes about a
/// second; a loaded CI machine may take many times that.
const LIMIT: Duration = Duration::from_secs(240);

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scale");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The program's source: `f_0 … f_{N-1}`, each adding to a volatile sink,
/// called through a table `calls_of(i)` times; it prints the number of
/// calls and the sink.
fn source() -> String {
    let mut s = String::from(
        "#include <stdio.h>\nvolatile unsigned long sink;\ntypedef void (*fn)(unsigned long);\n",
    );
    for i in 0..N {
        s.push_str(&format!(
            "__attribute__((noinline)) void f_{i}(unsigned long x) {{ sink += x ^ {i}u; }}\n"
        ));
    }
    s.push_str("static fn const table[] = {\n");
    for i in 0..N {
        s.push_str(&format!("f_{i},\n"));
    }
    s.push_str(&format!(
        "}};\nint main(void) {{\n  unsigned long calls = 0;\n  for (unsigned long i = 0; i < {N}; i++)\n    for (unsigned long j = 0; j <= i % 3; j++) {{ table[i](j); calls++; }}\n  printf(\"calls %lu sink %lu\\n\", calls, sink);\n  return 0;\n}}\n"
    ));
    s
}

/// The two builds: (patchable, plain), compiled once.
fn programs() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let d = dir();
        let src = d.join(format!("many{N}.c"));
        let body = source();
        if std::fs::read_to_string(&src).ok().as_deref() != Some(&body) {
            std::fs::write(&src, &body).unwrap();
        }
        let pfe = d.join(format!("many{N}-pfe"));
        let plain = d.join(format!("many{N}-plain"));
        let src2 = src.clone();
        let (pfe2, plain2) = (pfe.clone(), plain.clone());
        // Two compilations side by side. `-g1`: line tables only (gcc adds
        // `-g`; the later flag wins), no type information for 20,000
        // functions.
        let a = std::thread::spawn(move || {
            gcc(
                &src2,
                &pfe2,
                &["-O1", "-fpatchable-function-entry=5", "-g1"],
            )
        });
        gcc(&src, &plain2, &["-O1", "-g1"]);
        a.join().unwrap();
        (pfe, plain)
    })
}

/// The program's own output, run natively.
fn native_output(prog: &Path) -> String {
    let o = std::process::Command::new(prog).output().unwrap();
    assert!(o.status.success());
    let out = text(&o.stdout);
    let total: u64 = (0..N).map(calls_of).sum();
    assert!(out.starts_with(&format!("calls {total} ")), "{out}");
    out
}

/// `hotprobe ARGS`, asserted successful and the target exited 0:
/// (stdout, stderr).
fn run(args: &[&str]) -> (String, String) {
    let o = hotprobe_within(args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success(),
        "hotprobe {:?} failed:\n{err}",
        &args[..3]
    );
    assert!(err.contains("exited with code 0"), "{err}");
    (out, err)
}

/// Function name → (hits, execution) of every row of a count table.
fn rows(t: &CountTable) -> HashMap<String, (u64, String)> {
    let (h, e) = (t.col("HITS"), t.col("EXECUTION"));
    t.rows
        .iter()
        .map(|r| {
            let hits = r[h].parse().unwrap_or_else(|_| panic!("HITS of {r:?}"));
            (r[0].clone(), (hits, r[e].clone()))
        })
        .collect()
}

/// Every `f_i` has a row with `calls_of(i)` hits on `mechanism`.
fn assert_every_function(rows: &HashMap<String, (u64, String)>, mechanism: &str, what: &str) {
    let mut wrong = Vec::new();
    for i in 0..N {
        let name = format!("f_{i}");
        match rows.get(&name) {
            Some((hits, m)) if *hits == calls_of(i) && m == mechanism => {}
            other => wrong.push(format!("{name}: {other:?}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} of {N} functions not counted exactly on {mechanism}, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

#[test]
fn every_function_of_a_patchable_build_is_counted_exactly_on_patch() {
    let (pfe, _) = programs();
    let native = native_output(pfe);
    let (out, err) = run(&["count", "--no-pager", "f_*", "--", pfe.to_str().unwrap()]);
    assert_eq!(program_output(&out), native, "program output changed");
    assert!(
        err.contains(&format!("{N} probes (patch {N})")),
        "not all on patch:\n{}",
        &err[..err.len().min(2000)]
    );
    let t = CountTable::parse(&out, &err);
    let rows = rows(&t);
    assert_eq!(rows.len(), N, "one row per function");
    assert_every_function(&rows, "patch", "count 'f_*' (patchable build)");
}

#[test]
fn every_function_is_counted_exactly_on_forced_jump() {
    let (_, plain) = programs();
    let native = native_output(plain);
    let (out, err) = run(&[
        "count",
        "--no-pager",
        "--mechanism",
        "jump",
        "f_*",
        "--",
        plain.to_str().unwrap(),
    ]);
    assert_eq!(program_output(&out), native, "program output changed");
    let t = CountTable::parse(&out, &err);
    let rows = rows(&t);
    assert_eq!(rows.len(), N, "one row per function");
    assert_every_function(&rows, "jump", "count --mechanism jump (plain build)");
}

#[test]
fn record_of_every_function_has_one_call_per_call_made() {
    let (pfe, _) = programs();
    let native = native_output(pfe);
    let trace = dir().join("record.d");
    let _ = std::fs::remove_dir_all(&trace);
    let (out, _) = run(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        pfe.to_str().unwrap(),
    ]);
    assert_eq!(out, native, "program output changed");
    let o = hotprobe_within(
        &["report", "--no-pager", trace.to_str().unwrap(), "--json"],
        LIMIT,
    );
    assert!(o.status.success(), "report: {}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("report --json");
    let calls: HashMap<&str, u64> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["function"].as_str().unwrap(),
                r["calls"].as_u64().unwrap(),
            )
        })
        .collect();
    let wrong: Vec<_> = (0..N)
        .filter(|&i| calls.get(&*format!("f_{i}")) != Some(&calls_of(i)))
        .map(|i| (i, calls.get(&*format!("f_{i}")).copied()))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {N} functions recorded with the wrong number of calls, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(calls.get("main"), Some(&1), "main recorded once");
}

#[test]
fn star_glob_puts_every_patchable_function_on_patch() {
    let (pfe, _) = programs();
    let native = native_output(pfe);
    let (out, err) = run(&["count", "--no-pager", "*", "--", pfe.to_str().unwrap()]);
    assert_eq!(program_output(&out), native, "program output changed");
    let t = CountTable::parse(&out, &err);
    let rows = rows(&t);
    assert_every_function(&rows, "patch", "count '*' (patchable build)");
}
