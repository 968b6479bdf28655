//! Aggregations (issue 24): `count --hist=VALUE`, `--lhist`, `--by KEY`
//! and `--top N` on libc's `malloc`, compared with what the programs
//! logged about their own calls: the sizes they asked for, their threads'
//! calls, their children's names and calls. On the fast path (malloc's
//! entry takes a jump here) the tables are computed in the target.

mod common;

use common::{gcc, hotprobe, program_output, text, CountTable};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Compiles `tests/programs/NAME.c` at -O0 (gcc removes a `free(malloc(n))`
/// pair at -O1 and above).
fn program(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("aggregations/{name}"));
    gcc(&src, &out, &["-O0", "-pthread"])
}

/// `hotprobe ARGS`, which must succeed: its stdout and stderr.
fn succeeds(args: &[&str]) -> (String, String) {
    let o = hotprobe(args);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{args:?}: {stdout}\n{stderr}");
    (stdout, stderr)
}

/// Runs `hotprobe ARGS`; checks it and the program succeeded and that
/// malloc was taken by the fast path (the in-target tables).
fn run_ok(args: &[&str]) -> (String, String) {
    let o: Output = hotprobe(args);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let table = CountTable::parse(&stdout, &stderr);
    let col = table.col("EXECUTION");
    let probe = args
        .iter()
        .find(|a| a.starts_with("libc:malloc"))
        .expect("a malloc probe");
    let rows = table.rows_of(probe);
    assert!(!rows.is_empty(), "{stdout}");
    for row in rows {
        let exec = &row[col];
        assert!(
            exec == "jump" || exec == "patch",
            "malloc not on the fast path ({exec}):\n{stdout}\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("not aggregated"),
        "calls were not aggregated:\n{stderr}"
    );
    (stdout, stderr)
}

/// The lines of the aggregation printed under the table: after the line
/// `@WHAT libc:malloc:`, up to the end.
fn agg_lines(stdout: &str) -> Vec<String> {
    let at = stdout
        .lines()
        .position(|l| l.starts_with('@') && l.ends_with(" libc:malloc:"))
        .unwrap_or_else(|| panic!("no aggregation in:\n{stdout}"));
    stdout
        .lines()
        .skip(at + 1)
        .take_while(|l| !l.trim().is_empty())
        .map(String::from)
        .collect()
}

/// A bucket bound as printed: `512`, `1K`, `64K`, `...` (None).
fn bound(s: &str) -> Option<i128> {
    let s = s.trim();
    if s == "..." {
        return None;
    }
    let (digits, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1i128 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Some(digits.parse::<i128>().expect("a number") * mul)
}

/// One histogram row: its values `[lo, hi)` (open ends as None) and count.
#[derive(Debug)]
struct Row {
    lo: Option<i128>,
    hi: Option<i128>,
    count: u64,
}

/// Parses rows `[lo, hi)   COUNT |@@@|`, `[0]`, `(..., hi)`, `[lo, ...)`.
fn hist_rows(lines: &[String]) -> Vec<Row> {
    lines
        .iter()
        .map(|l| {
            let close = l.find([')', ']']).expect("a bucket label");
            let label = &l[..=close];
            let count: u64 = l[close + 1..]
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("no count in {l:?}"));
            assert!(l.trim_end().ends_with('|'), "no bar in {l:?}");
            let inner = &label[1..label.len() - 1];
            let (lo, hi) = match inner.split_once(',') {
                Some((a, b)) => (bound(a), bound(b)),
                // `[N]`: the one value N.
                None => {
                    let v = bound(inner);
                    (v, v.map(|v| v + 1))
                }
            };
            Row { lo, hi, count }
        })
        .collect()
}

/// The values the program logged with `TAG`: the second word of each
/// `TAG ...` line of its output.
fn logged(stdout: &str, tag: &str) -> Vec<String> {
    program_output(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(tag).map(|r| r.trim().to_string()))
        .collect()
}

/// Each logged size falls in exactly one row, and each row holds exactly
/// the logged sizes in its range; rows follow one another.
fn assert_rows_match(rows: &[Row], sizes: &[i128]) {
    assert!(!rows.is_empty());
    for w in rows.windows(2) {
        assert_eq!(w[0].hi, w[1].lo, "rows not contiguous: {rows:?}");
    }
    let inside = |r: &Row, v: i128| r.lo.is_none_or(|lo| v >= lo) && r.hi.is_none_or(|hi| v < hi);
    for r in rows {
        let expected = sizes.iter().filter(|&&v| inside(r, v)).count() as u64;
        assert_eq!(r.count, expected, "row {r:?}: sizes {sizes:?}");
    }
    let total: u64 = rows.iter().map(|r| r.count).sum();
    assert_eq!(total, sizes.len() as u64, "{rows:?}");
}

#[test]
fn hist_of_malloc_sizes_equals_the_programs_log() {
    let prog = program("agg_sizes");
    let (stdout, _) = run_ok(&[
        "count",
        "libc:malloc",
        "--hist=arg0",
        "--",
        prog.to_str().unwrap(),
        "300",
    ]);
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(sizes.len(), 300);
    let table = CountTable::parse(&stdout, "");
    // calloc is another function: the program's mallocs are its sizes.
    assert_eq!(table.hits("libc:malloc"), 300, "{stdout}");
    let rows = hist_rows(&agg_lines(&stdout));
    // log2 buckets: [0], [1], then [2^k, 2^(k+1)).
    for r in &rows {
        match (r.lo, r.hi) {
            (Some(lo), Some(hi)) if lo >= 2 => assert_eq!(hi, 2 * lo, "{r:?}"),
            (Some(lo), Some(hi)) => assert_eq!(hi, lo + 1, "{r:?}"),
            _ => panic!("open bucket with no negative size: {r:?}"),
        }
    }
    assert_rows_match(&rows, &sizes);
}

#[test]
fn the_trap_mechanism_aggregates_in_the_tracer_alike() {
    // `--mechanism trap`: no agent table; the entries reach the tracer
    // with their registers and are aggregated there.
    let prog = program("agg_sizes");
    let (stdout, stderr) = succeeds(&[
        "count",
        "libc:malloc",
        "--mechanism",
        "trap",
        "--lhist=arg0:0:4096:512",
        "--",
        prog.to_str().unwrap(),
        "40",
    ]);
    let table = CountTable::parse(&stdout, &stderr);
    assert!(
        table.execution("libc:malloc").starts_with("trap"),
        "{stdout}"
    );
    assert_eq!(table.hits("libc:malloc"), 40, "{stdout}");
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_rows_match(&hist_rows(&agg_lines(&stdout)), &sizes);
}

#[test]
fn a_named_int_parameter_is_read_at_its_width_with_its_sign() {
    // take(int n) gets negative values: read as the whole register they
    // would be large positive numbers (the caller zero-extends).
    let prog = program("agg_sizes");
    let (stdout, _) = succeeds(&[
        "count",
        "take",
        "--hist=n",
        "--",
        prog.to_str().unwrap(),
        "60",
    ]);
    let values: Vec<i128> = logged(&stdout, "TAKE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(values.iter().any(|&v| v < 0), "{values:?}");
    let at = stdout
        .lines()
        .position(|l| l == "@hist(n) take:")
        .unwrap_or_else(|| panic!("{stdout}"));
    let lines: Vec<String> = stdout
        .lines()
        .skip(at + 1)
        .take_while(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    let rows = hist_rows(&lines);
    // The negative bucket first: (..., 0).
    assert_eq!((rows[0].lo, rows[0].hi), (None, Some(0)), "{stdout}");
    assert_rows_match(&rows, &values);
}

#[test]
fn an_in_process_trap_aggregates_from_its_recorded_entries() {
    // tiny() is too short for a jump: the agent's SIGTRAP handler takes
    // its hits and records them; hotprobe aggregates the entries.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/agg_tiny.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("aggregations/agg_tiny");
    let prog = gcc(&src, &out, &["-O2"]);
    let (stdout, stderr) = succeeds(&[
        "count",
        "tiny",
        "--lhist=arg0:0:400:100",
        "--",
        prog.to_str().unwrap(),
        "120",
    ]);
    let table = CountTable::parse(&stdout, &stderr);
    assert!(
        table.execution("tiny").starts_with("in-process"),
        "{stdout}"
    );
    let values: Vec<i128> = logged(&stdout, "VALUE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 120);
    assert!(values.iter().any(|&v| v >= 400), "no overflow value");
    let at = stdout
        .lines()
        .position(|l| l == "@lhist(arg0, 0, 400, 100) tiny:")
        .unwrap_or_else(|| panic!("{stdout}"));
    let lines: Vec<String> = stdout
        .lines()
        .skip(at + 1)
        .take_while(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    assert_rows_match(&hist_rows(&lines), &values);
}

#[test]
fn hist_by_parameter_name_reads_the_same_register() {
    // malloc's parameter through libc's DWARF where the system has it
    // (Debian's libc6-dbg): the same histogram as arg0.
    let prog = program("agg_sizes");
    let o = hotprobe(&[
        "count",
        "libc:malloc",
        "--hist=bytes",
        "--",
        prog.to_str().unwrap(),
        "50",
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    if stderr.contains("has no DWARF") {
        // No debug information for libc: the name is refused, clearly.
        assert_eq!(o.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("use arg0..arg5"), "{stderr}");
        return;
    }
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_rows_match(&hist_rows(&agg_lines(&stdout)), &sizes);
}

#[test]
fn lhist_of_malloc_sizes_equals_the_programs_log() {
    let prog = program("agg_sizes");
    let (stdout, _) = run_ok(&[
        "count",
        "libc:malloc",
        "--lhist=arg0:0:4096:256",
        "--",
        prog.to_str().unwrap(),
        "300",
    ]);
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let rows = hist_rows(&agg_lines(&stdout));
    for r in &rows {
        match (r.lo, r.hi) {
            (Some(lo), Some(hi)) => {
                assert_eq!(hi - lo, 256, "{r:?}");
                assert_eq!(lo % 256, 0, "{r:?}");
            }
            // The overflow bucket: 4096 and above.
            (Some(lo), None) => assert_eq!(lo, 4096),
            _ => panic!("an underflow bucket with no size below 0: {r:?}"),
        }
    }
    // The sequence has sizes past 4096: the overflow bucket is there.
    assert!(sizes.iter().any(|&s| s >= 4096));
    assert_eq!(rows.last().unwrap().hi, None);
    assert_rows_match(&rows, &sizes);
}

/// `@[KEY]: COUNT` rows.
fn key_rows(lines: &[String]) -> Vec<(String, u64)> {
    lines
        .iter()
        .filter(|l| l.starts_with("@["))
        .map(|l| {
            let (k, n) = l[2..].split_once("]:").expect("@[KEY]: COUNT");
            (k.to_string(), n.trim().parse().expect("a count"))
        })
        .collect()
}

/// `NAME COUNT` pairs the program logged under `tag`.
fn logged_counts(stdout: &str, tag: &str) -> BTreeMap<String, u64> {
    logged(stdout, tag)
        .iter()
        .map(|l| {
            let (k, n) = l.split_once(' ').expect("KEY COUNT");
            (k.to_string(), n.parse().unwrap())
        })
        .collect()
}

#[test]
fn by_tid_gives_one_row_per_thread_and_top_limits_them() {
    let prog = program("agg_threads");
    let (stdout, _) = run_ok(&[
        "count",
        "libc:malloc",
        "--by",
        "tid",
        "--",
        prog.to_str().unwrap(),
        "5",
    ]);
    let expected = logged_counts(&stdout, "TID ");
    assert_eq!(expected.len(), 6, "{stdout}");
    let rows = key_rows(&agg_lines(&stdout));
    let got: BTreeMap<String, u64> = rows.iter().cloned().collect();
    assert_eq!(got, expected, "{stdout}");
    assert_eq!(rows.len(), expected.len(), "a thread twice: {stdout}");
    // Most calls first.
    assert!(rows.windows(2).all(|w| w[0].1 >= w[1].1), "{rows:?}");

    let (stdout, _) = run_ok(&[
        "count",
        "libc:malloc",
        "--by",
        "tid",
        "--top",
        "2",
        "--",
        prog.to_str().unwrap(),
        "5",
    ]);
    let mut expected: Vec<(String, u64)> = logged_counts(&stdout, "TID ").into_iter().collect();
    expected.sort_by_key(|e| std::cmp::Reverse(e.1));
    let lines = agg_lines(&stdout);
    assert_eq!(key_rows(&lines), expected[..2].to_vec(), "{stdout}");
    assert!(lines.contains(&"(4 more keys)".to_string()), "{stdout}");
}

#[test]
fn by_comm_under_f_gives_one_row_per_command_name() {
    let prog = program("agg_comm");
    let (stdout, stderr) = run_ok(&[
        "count",
        "-f",
        "libc:malloc",
        "--by",
        "comm",
        "--",
        prog.to_str().unwrap(),
        "3",
    ]);
    let expected = logged_counts(&stdout, "COMM ");
    // The parent and its three renamed children.
    assert_eq!(expected.len(), 4, "{stdout}");
    assert_eq!(stderr.matches("followed").count(), 3, "{stderr}");
    let rows = key_rows(&agg_lines(&stdout));
    let got: BTreeMap<String, u64> = rows.iter().cloned().collect();
    assert_eq!(got, expected, "{stdout}");
    assert_eq!(rows.len(), 4, "{stdout}");
}

#[test]
fn bad_aggregation_specs_are_refused_with_exit_2() {
    let prog = program("agg_sizes");
    for (args, line) in [
        (
            &["--lhist=arg0:10:0:1"][..],
            "hotprobe: error: --lhist: arg0:10:0:1: MIN must be below MAX, STEP positive, and at \
             most 4096 buckets (see hotprobe count --help)",
        ),
        (
            &["--hist=arg9"][..],
            "hotprobe: error: --hist: arg9: only arg0..arg5 (the six integer argument registers) \
             can be read (see hotprobe count --help)",
        ),
        (
            &["--lhist=arg0:0:100"][..],
            "hotprobe: error: --lhist: arg0:0:100: --lhist takes VALUE:MIN:MAX:STEP (see \
             hotprobe count --help)",
        ),
        (
            &["--hist=retval"][..],
            "hotprobe: error: libc:malloc: hist(retval) needs a %return probe (see hotprobe \
             count --help)",
        ),
        (
            &["--by", "comm", "--hist=arg0"][..],
            "hotprobe: error: the argument '--by <KEY>' cannot be used with '--hist[=<VALUE>]' \
             (see hotprobe count --help)",
        ),
    ] {
        let mut a = vec!["count", "libc:malloc"];
        a.extend_from_slice(args);
        a.extend(["--", prog.to_str().unwrap(), "3"]);
        let o = hotprobe(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stderr), format!("{line}\n"), "{args:?}");
        // The program never ran.
        assert_eq!(text(&o.stdout), "", "{args:?}");
    }
}

#[test]
fn keys_past_the_table_are_counted_as_not_aggregated() {
    // 100,001 distinct values of take's argument: more than the target's
    // key table holds (65,536 slots). Every call is in a row or in the
    // count of calls not aggregated, which is said.
    let prog = program("agg_sizes");
    let o = hotprobe(&[
        "count",
        "take",
        "--by",
        "arg0",
        "--",
        prog.to_str().unwrap(),
        "1",
        "100000",
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    let table = CountTable::parse(&stdout, &stderr);
    assert_eq!(table.hits("take"), 100_001, "{stderr}");
    let at = stdout
        .lines()
        .position(|l| l == "@count by arg0 take:")
        .unwrap_or_else(|| panic!("{stderr}"));
    let lines: Vec<String> = stdout.lines().skip(at + 1).map(String::from).collect();
    let rows = key_rows(&lines);
    let aggregated: u64 = rows.iter().map(|r| r.1).sum();
    let line = stderr
        .lines()
        .find(|l| l.starts_with("hotprobe: take: ") && l.contains("calls not aggregated"))
        .unwrap_or_else(|| panic!("no word of the calls not aggregated:\n{stderr}"));
    let missed: u64 = line["hotprobe: take: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(missed > 0 && rows.len() <= 65_536, "{line}");
    assert_eq!(aggregated + missed, 100_001, "{line}");
}

#[test]
fn return_values_of_malloc_by_retval_are_the_pointers_it_returned() {
    // Every pointer is kept until the end: each one comes back once.
    let prog = program("agg_sizes");
    let (stdout, _) = run_ok(&[
        "count",
        "libc:malloc%return",
        "--by",
        "retval",
        "--",
        prog.to_str().unwrap(),
        "100",
    ]);
    let ptrs: BTreeMap<String, u64> = logged(&stdout, "PTR ")
        .iter()
        .map(|p| (p.parse::<i64>().unwrap() as u64).to_string())
        .map(|p| (p, 1))
        .collect();
    assert_eq!(ptrs.len(), 100, "{stdout}");
    let table = CountTable::parse(&stdout, "");
    // The returns, counted from the aggregation.
    assert_eq!(table.hits("libc:malloc%return"), 100, "{stdout}");
    let at = stdout
        .lines()
        .position(|l| l == "@count by retval libc:malloc%return:")
        .unwrap_or_else(|| panic!("{stdout}"));
    let lines: Vec<String> = stdout.lines().skip(at + 1).map(String::from).collect();
    let got: BTreeMap<String, u64> = key_rows(&lines).into_iter().collect();
    assert_eq!(got, ptrs);
}

#[test]
fn return_value_histograms_on_the_fast_path_and_on_a_trap_agree_with_the_log() {
    // tiny(v) returns v: at -O0 its entry takes a jump and its return is
    // hooked by the agent; at -O2 it is 3 bytes and a ptrace trap takes it.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/agg_tiny.c");
    for (opt, mechanism) in [("-O0", "jump"), ("-O2", "trap")] {
        let out =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("aggregations/agg_tiny{opt}"));
        let prog = gcc(&src, &out, &[opt]);
        let o = hotprobe(&[
            "count",
            "tiny%return",
            "--lhist=retval:0:400:50",
            "--",
            prog.to_str().unwrap(),
            "90",
        ]);
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{stdout}\n{stderr}");
        let table = CountTable::parse(&stdout, &stderr);
        assert!(
            table.execution("tiny%return").starts_with(mechanism),
            "{stdout}"
        );
        assert_eq!(table.hits("tiny%return"), 90, "{stdout}");
        let values: Vec<i128> = logged(&stdout, "VALUE ")
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let at = stdout
            .lines()
            .position(|l| l == "@lhist(retval, 0, 400, 50) tiny%return:")
            .unwrap_or_else(|| panic!("{stdout}"));
        let lines: Vec<String> = stdout
            .lines()
            .skip(at + 1)
            .take_while(|l| !l.trim().is_empty())
            .map(String::from)
            .collect();
        assert_rows_match(&hist_rows(&lines), &values);
    }
}

/// `hotprobe ARGS` with `--json`: its stdout and the JSON line ending it.
fn run_json(args: &[&str]) -> (String, serde_json::Value) {
    let o = hotprobe(args);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("not aggregated"), "{stderr}");
    let json = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (stdout, json)
}

#[test]
fn json_carries_the_aggregation() {
    let prog = program("agg_threads");
    let (stdout, json) = run_json(&[
        "count",
        "libc:malloc",
        "--by",
        "tid",
        "--json",
        "--",
        prog.to_str().unwrap(),
        "3",
    ]);
    let expected = logged_counts(&stdout, "TID ");
    let a = &json[0]["aggregation"];
    assert_eq!(a["aggregate"], "count by tid", "{json}");
    assert_eq!(a["not_aggregated"], 0, "{json}");
    let got: BTreeMap<String, u64> = a["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].to_string(), k["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, expected, "{json}");

    let prog = program("agg_sizes");
    let (stdout, json) = run_json(&[
        "count",
        "libc:malloc",
        "--lhist=arg0:0:4096:1024",
        "--json",
        "--",
        prog.to_str().unwrap(),
        "50",
    ]);
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let rows: Vec<Row> = json[0]["aggregation"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| Row {
            lo: b["lo"].as_i64().map(i128::from),
            hi: b["hi"].as_i64().map(i128::from),
            count: b["count"].as_u64().unwrap(),
        })
        .collect();
    assert_rows_match(&rows, &sizes);
}

#[test]
fn a_condition_keeps_the_calls_it_holds_for() {
    // With a condition hotprobe evaluates, the entries are recorded and
    // aggregated by hotprobe: only the calls the condition holds for.
    let prog = program("agg_sizes");
    let (stdout, stderr) = succeeds(&[
        "count",
        "libc:malloc if arg0 > 1000",
        "--lhist=arg0:0:20000:2500",
        "--",
        prog.to_str().unwrap(),
        "200",
    ]);
    let sizes: Vec<i128> = logged(&stdout, "SIZE ")
        .iter()
        .map(|s| s.parse().unwrap())
        .filter(|&s: &i128| s > 1000)
        .collect();
    assert!(!sizes.is_empty() && sizes.len() < 200);
    let table = CountTable::parse(&stdout, &stderr);
    assert_eq!(table.hits("libc:malloc"), sizes.len() as u64, "{stdout}");
    assert_rows_match(&hist_rows(&agg_lines(&stdout)), &sizes);
}

/// `--by` a signed parameter shows its negative values as such (-5000,
/// not 18446744073709546616; found by review), an unsigned one as the
/// program passed it; on the fast path and on the trap alike.
#[test]
fn by_a_signed_parameter_keys_are_negative_numbers() {
    let bin = program("agg_signed");
    let b = bin.to_str().unwrap();
    for mech in ["auto", "trap"] {
        for (by, want) in [
            ("s", (-5..5).map(|i| i * 1000).collect::<Vec<i64>>()),
            ("x", (-5..5).collect()),
        ] {
            let (out, err) = succeeds(&["count", "g", "--mechanism", mech, "--by", by, "--", b]);
            let keys: Vec<i64> = out
                .lines()
                .filter_map(|l| l.strip_prefix("@["))
                .map(|l| l.split(']').next().unwrap().parse().unwrap())
                .collect::<Vec<_>>();
            let mut sorted = keys.clone();
            sorted.sort();
            assert_eq!(sorted, want, "{mech} --by {by}:\n{out}\n{err}");
        }
        let (out, _) = succeeds(&["count", "g", "--mechanism", mech, "--by", "u", "--", b]);
        assert!(out.contains("@[18446744073709551611]: 1"), "{mech}:\n{out}");
    }
}
