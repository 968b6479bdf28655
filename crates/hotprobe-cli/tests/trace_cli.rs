//! `hotprobe record`, `replay`, `report` and `export` on C programs compiled
//! here with gcc (tests/programs/): the recorded call tree equals the one
//! a multi-threaded program logs itself, babeltrace2 and serde_json read
//! the exports with the recorded event counts, the minimum-duration filter
//! keeps exactly the long calls, marker functions split phases with the
//! program's own counts, and truncated streams give one error line. The
//! live tree of `hotprobe trace` marks the lines of a function on a trap
//! and ends with the legend as `replay` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

mod common;
use common::{hotprobe, text};

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace-cli");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles tests/programs/NAME.c (once per test run and process).
fn program(name: &str) -> PathBuf {
    program_with(name, "o1", &["-O1"])
}

/// Compiles tests/programs/NAME.c with `-g -fno-inline
/// -fno-optimize-sibling-calls` and `flags` (once per test run, process
/// and `tag`).
fn program_with(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out = tmp().join(format!("bin-{name}-{tag}"));
    let flags: Vec<&str> = flags
        .iter()
        .copied()
        .chain(["-g", "-fno-inline", "-fno-optimize-sibling-calls"])
        .collect();
    hotprobe_testkit::compile("gcc", &src, &out, &flags, &["-lpthread"])
}

/// `hotprobe record -o DIR ARGS -- PROG`; returns the program's stdout
/// (passed through) and hotprobe's stderr.
fn record(dir: &Path, args: &[&str], prog: &Path) -> (String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "-o", dir.to_str().unwrap()];
    a.extend_from_slice(args);
    a.push("--");
    a.push(prog.to_str().unwrap());
    let o = hotprobe(&a);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "record failed: {err}");
    assert!(err.contains("exited with code 0"), "{err}");
    (out, err)
}

fn info(dir: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(dir.join("info.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn stat(dir: &Path, path: &[&str]) -> u64 {
    let mut v = &info(dir)["stats"];
    for p in path {
        v = &v[p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no stats.{path:?} in info.json"))
}

/// Runs an analysis; asserts success and returns stdout.
fn analyse(args: &[&str]) -> String {
    let o = hotprobe(args);
    assert!(
        o.status.success(),
        "hotprobe {args:?} failed: {}",
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Per thread: the (depth, function) of every call in entry order.
type Tree = BTreeMap<u32, Vec<(usize, String)>>;

/// The tree `tree.c` logs itself: `TID DEPTH NAME` lines.
fn program_tree(out: &str) -> Tree {
    let mut t = Tree::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 3, "odd program line {l:?}");
        t.entry(f[0].parse().unwrap())
            .or_default()
            .push((f[1].parse().unwrap(), f[2].to_string()));
    }
    t
}

/// The tree `hotprobe replay` prints (`[  TID] | <indent>name() {`, or
/// `name();` for a leaf; closing lines skipped).
fn replay_tree(replay: &str) -> Tree {
    let mut t = Tree::new();
    for l in replay.lines().filter(|l| !l.starts_with('#')) {
        let (head, body) = l.split_once("] | ").expect("replay line");
        let tid: u32 = head
            .rsplit('[')
            .next()
            .unwrap()
            .trim()
            .parse()
            .expect("tid");
        if tid == 0 {
            // Lost records of threads without a ring slot (issue 22).
            continue;
        }
        assert!(!body.contains("lost"), "events lost: {l}");
        let name = body.trim_start();
        if name.starts_with('}') {
            continue;
        }
        let depth = (body.len() - name.len()) / 2;
        let name = name.split('(').next().unwrap().to_string();
        t.entry(tid).or_default().push((depth, name));
    }
    t
}

struct TreeRun {
    dir: PathBuf,
    program: Tree,
}

/// `tree` recorded once (without its own logging helpers), shared by the
/// tests that only read the trace.
fn tree_run() -> &'static TreeRun {
    static RUN: OnceLock<TreeRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tmp().join(format!("tree-{}", std::process::id()));
        let (out, err) = record(&dir, &["--exclude", "note_*"], &program("tree"));
        assert!(err.contains("drops:    0 "), "{err}");
        TreeRun {
            dir,
            program: program_tree(&out),
        }
    })
}

#[test]
fn replay_equals_the_tree_the_program_logged() {
    let run = tree_run();
    let d = run.dir.to_str().unwrap();
    let replayed = replay_tree(&analyse(&["replay", d]));
    assert_eq!(run.program.len(), 5, "main and 4 workers logged");
    assert_eq!(replayed, run.program);
    // Every call is an entry and an exit; nothing else was recorded.
    let calls: usize = run.program.values().map(Vec::len).sum();
    assert_eq!(stat(&run.dir, &["events_out"]), 2 * calls as u64);
    assert_eq!(stat(&run.dir, &["lost"]), 0);
    assert_eq!(stat(&run.dir, &["threads"]), 5);
    // The report counts the same calls per function.
    let report = analyse(&["report", d]);
    let mut logged: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, name) in run.program.values().flatten() {
        *logged.entry(name).or_default() += 1;
    }
    for (name, n) in logged {
        let row = report
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{report}"));
        let calls: u64 = row
            .split_whitespace()
            .rev()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(calls, n, "{name}");
    }
}

#[test]
fn ctf_and_chrome_exports_hold_every_event() {
    let run = tree_run();
    let d = run.dir.to_str().unwrap();
    let events = stat(&run.dir, &["events_out"]);
    // CTF through babeltrace2: one line per event.
    let ctf = tmp().join(format!("tree-ctf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ctf);
    analyse(&["export", d, "--format", "ctf", "-o", ctf.to_str().unwrap()]);
    let o = Command::new("babeltrace2")
        .arg(&ctf)
        .output()
        .expect("babeltrace2 installed (scripts/setup.sh)");
    assert!(o.status.success(), "babeltrace2: {}", text(&o.stderr));
    let lines = text(&o.stdout);
    assert_eq!(lines.lines().count() as u64, events);
    let entries = lines.lines().filter(|l| l.contains("func_entry")).count();
    assert_eq!(entries as u64, events / 2);
    // Chrome JSON: parses; per thread B and E balance; B + X = calls.
    let json = tmp().join(format!("tree-{}.json", std::process::id()));
    analyse(&[
        "export",
        d,
        "--format",
        "chrome",
        "-o",
        json.to_str().unwrap(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    let mut per_tid: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for e in v["traceEvents"].as_array().expect("traceEvents") {
        let tid = e["tid"].as_u64().unwrap();
        let c = per_tid.entry(tid).or_default();
        match e["ph"].as_str().unwrap() {
            "B" => c.0 += 1,
            "E" => c.1 += 1,
            "X" => c.2 += 1,
            _ => {}
        }
    }
    let mut calls = 0;
    for (tid, (b, e, x)) in &per_tid {
        assert_eq!(b, e, "B/E of tid {tid}");
        calls += b + x;
    }
    assert_eq!(calls, events / 2);
    // Folded stacks: the call counts add up too.
    let folded = analyse(&["export", d, "--format", "folded", "--calls"]);
    let sum: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, events / 2);
}

/// `(function, calls)` rows of a report table.
fn report_rows(table: &str) -> BTreeMap<String, u64> {
    table
        .lines()
        .filter(|l| !l.trim_start().starts_with(['#', '=', 'T']))
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[f.len() - 1].to_string(), f[f.len() - 2].parse().unwrap())
        })
        .collect()
}

#[test]
fn min_duration_keeps_exactly_the_long_calls() {
    let dir = tmp().join(format!("sleeps-{}", std::process::id()));
    let (out, err) = record(
        &dir,
        &["--min-duration", "10ms", "main", "short_call", "long_call"],
        &program("sleeps"),
    );
    // The program's own view: its calls and those lasting >= 10 ms, timed
    // from outside each call (1 ms and 30 ms sleeps: normally 0 and 10).
    let f: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(f[..4], ["short", "10", "long", "10"], "{out}");
    let short_over: u64 = f[6].parse().unwrap();
    let long_over: u64 = f[8].parse().unwrap();
    let rows = report_rows(&analyse(&["report", dir.to_str().unwrap()]));
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    want.insert("main".into(), 1);
    for (name, n) in [("short_call", short_over), ("long_call", long_over)] {
        if n > 0 {
            want.insert(name.into(), n);
        }
    }
    assert_eq!(rows, want, "{err}");
    // Removed: every other call, an entry and an exit each.
    let removed = 2 * (20 - short_over - long_over);
    assert_eq!(stat(&dir, &["filtered", "duration"]), removed);
    assert_eq!(stat(&dir, &["filtered", "kept_short"]), 0);
    assert!(err.contains(&format!("duration {removed},")), "{err}");
}

#[test]
fn phase_markers_split_the_report() {
    let dir = tmp().join(format!("phases-{}", std::process::id()));
    let (out, _) = record(&dir, &["--phase", "phase_marker"], &program("phases"));
    let want: Vec<u64> = out
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(want.len(), 3, "{out}");
    let rep = analyse(&["report", dir.to_str().unwrap(), "--phases"]);
    let mut phases: Vec<(String, BTreeMap<String, u64>)> = Vec::new();
    for block in rep.split("# phase ").skip(1) {
        let name = block
            .split_whitespace()
            .nth(1)
            .expect("phase name")
            .to_string();
        let table = block.split_once('\n').map_or("", |(_, t)| t);
        phases.push((name, report_rows(table)));
    }
    let names: Vec<&str> = phases.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "(start)",
            "phase_marker",
            "phase_marker#2",
            "phase_marker#3"
        ],
        "{rep}"
    );
    assert_eq!(phases[0].1.get("main"), Some(&1));
    for (i, (_, rows)) in phases[1..].iter().enumerate() {
        assert_eq!(rows.get("work"), Some(&want[i]), "{rep}");
        assert_eq!(rows.get("phase_marker"), Some(&1), "{rep}");
        assert_eq!(rows.len(), 2, "{rep}");
    }
}

#[test]
fn truncated_streams_give_one_error_line() {
    let run = tree_run();
    let mut streams: Vec<PathBuf> = std::fs::read_dir(&run.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "hpt"))
        .collect();
    streams.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let big = streams.last().expect("a stream").clone();
    let len = std::fs::metadata(&big).unwrap().len();
    assert!(len > 40, "stream of {len} bytes");
    let copy = tmp().join(format!("tree-cut-{}", std::process::id()));
    for cut in [0, 1, 19, 20, 21, len / 3, len / 2, len - 2, len - 1] {
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy).unwrap();
        for e in std::fs::read_dir(&run.dir).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(copy.join(big.file_name().unwrap()))
            .unwrap();
        f.set_len(cut).unwrap();
        drop(f);
        for cmd in [&["replay"][..], &["report"], &["report", "--phases"]] {
            let mut a = cmd.to_vec();
            a.push(copy.to_str().unwrap());
            let o = hotprobe(&a);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{a:?} cut at {cut}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            let lines: Vec<&str> = err.lines().collect();
            assert_eq!(lines.len(), 1, "{a:?} cut at {cut}: {err}");
            assert!(lines[0].starts_with("hotprobe: error: "), "{err}");
        }
    }
    // A truncated info.json too.
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy).unwrap();
    let info = std::fs::read(run.dir.join("info.json")).unwrap();
    std::fs::write(copy.join("info.json"), &info[..info.len() / 2]).unwrap();
    let o = hotprobe(&["report", copy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(text(&o.stderr).lines().count(), 1, "{}", text(&o.stderr));
}

#[test]
fn usage_errors() {
    let prog = program("phases");
    let p = prog.to_str().unwrap();
    let o = hotprobe(&["record", "-o", "/nonexistent/x", "no_such_fn", "--", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("no_such_fn"));
    let o = hotprobe(&["record", "-o", "x", "--min-duration", "10 parsecs", "--", p]);
    assert_eq!(o.status.code(), Some(2));
    let o = hotprobe(&["record", "-o", "x", "--mechanism", "trap", "--", p]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn duration_detaches_and_leaves_a_readable_trace() {
    let dir = tmp().join(format!("sleeps-dur-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let prog = program("sleeps");
    let o = hotprobe(&[
        "record",
        "-o",
        dir.to_str().unwrap(),
        "--duration",
        "0.15",
        "--",
        prog.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("duration elapsed: detached"), "{err}");
    // The program ran on without probes and finished its work.
    assert!(
        text(&o.stdout).starts_with("short 10 long 10 "),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(info(&dir)["complete"], serde_json::Value::Bool(true));
    let rows = report_rows(&analyse(&["report", dir.to_str().unwrap()]));
    let long = rows.get("long_call").copied().unwrap_or(0);
    assert!(
        long < 10,
        "recorded {long} of 10 long calls in 0.15 s: {rows:?}"
    );
}

#[test]
fn attach_records_until_duration_and_leaves_the_target_running() {
    use std::io::BufRead;
    let prog = program("ticker");
    let mut child = Command::new(&prog)
        .arg("3000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    let pid = ready.strip_prefix("ready ").unwrap().to_string();
    let dir = tmp().join(format!("ticker-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = hotprobe(&[
        "record",
        "-o",
        dir.to_str().unwrap(),
        "--duration",
        "0.4",
        "-p",
        &pid,
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("attached to pid {pid}")), "{err}");
    assert!(
        err.contains("which runs on with its code restored"),
        "{err}"
    );
    // The target finishes its rounds untraced.
    assert_eq!(lines.next().unwrap().unwrap(), "done 3000");
    assert!(child.wait().unwrap().success());
    let rows = report_rows(&analyse(&["report", dir.to_str().unwrap()]));
    let ticks = rows.get("tick").copied().unwrap_or(0);
    let works = rows.get("work").copied().unwrap_or(0);
    assert!(ticks > 0 && ticks < 3000, "{rows:?}\n{err}");
    // Each tick calls work once; a tick cut by the start or the end of
    // the recording may miss its work call or its own entry.
    assert!(ticks.abs_diff(works) <= 1, "{rows:?}");
    assert!(!rows.contains_key("main"), "main started before: {rows:?}");
}

/// A probe must not change what the program computes: the return hook of a
/// jump site once clobbered rsi on return, where gcc -O2 (`-fipa-ra`) keeps
/// `main`'s sum across the call to the frameless leaf `is_digit`.
#[test]
fn recorded_program_computes_what_it_computes_natively() {
    for (tag, flags) in [
        ("o2", &["-O2"][..]),
        ("o2pfe", &["-O2", "-fpatchable-function-entry=5"][..]),
    ] {
        let prog = program_with("retval", tag, flags);
        let native = Command::new(&prog).output().unwrap();
        let dir = tmp().join(format!("retval-{tag}-{}", std::process::id()));
        let (out, err) = record(&dir, &[], &prog);
        assert_eq!(out, text(&native.stdout), "{tag}: {err}");
    }
}

#[test]
fn threads_without_a_ring_are_counted_as_drops() {
    let dir = tmp().join(format!("tree-2rings-{}", std::process::id()));
    let (out, err) = record(
        &dir,
        &["--exclude", "note_*", "--max-threads", "2"],
        &program("tree"),
    );
    let logged = program_tree(&out);
    let info = info(&dir);
    let with_ring: Vec<u32> = info["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tid"].as_u64().unwrap() as u32)
        // tid 0: the lost records of threads without a ring slot (issue 22).
        .filter(|&tid| tid != 0)
        .collect();
    // Two slots, given back when a thread exits (issue 22): a thread
    // starting after another ended may record too.
    assert!(with_ring.len() >= 2, "{info}");
    // What the other threads did is lost, and counted: 2 events a call.
    let lost: usize = logged
        .iter()
        .filter(|(tid, _)| !with_ring.contains(tid))
        .map(|(_, calls)| 2 * calls.len())
        .sum();
    assert!(lost > 0);
    assert!(
        err.contains(&format!("threads without a ring slot {lost})")),
        "{lost}: {err}"
    );
    // The threads with a ring are complete.
    let replayed = replay_tree(&analyse(&["replay", dir.to_str().unwrap()]));
    for tid in with_ring {
        assert_eq!(replayed.get(&tid), logged.get(&tid), "tid {tid}");
    }
}

#[test]
fn full_rings_lose_nothing_silently() {
    let dir = tmp().join(format!("tree-tiny-{}", std::process::id()));
    let (out, err) = record(
        &dir,
        &["--exclude", "note_*", "--ring-events", "64"],
        &program("tree"),
    );
    let calls: u64 = program_tree(&out).values().map(|c| c.len() as u64).sum();
    // Every event the program produced was either drained or counted lost
    // (and the lost ones are marked in their thread's stream).
    let drained = stat(&dir, &["events_in"]);
    let lost = stat(&dir, &["lost"]);
    assert_eq!(drained + lost, 2 * calls, "{err}");
    assert!(
        err.contains(&format!("drops:    {lost} (full rings {lost},")),
        "{err}"
    );
    let replay = analyse(&["replay", dir.to_str().unwrap()]);
    let marked: u64 = replay
        .lines()
        .filter_map(|l| l.split("/* lost ").nth(1))
        .map(|r| r.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(marked, lost);
}

#[test]
fn arguments_and_return_values_are_recorded() {
    // phases.c: work(i) returns i + 1 for i in 0..3, 0..5, 0..7.
    for nargs in ["1", "6"] {
        let dir = tmp().join(format!("args{nargs}-{}", std::process::id()));
        record(&dir, &["--args", nargs, "work"], &program("phases"));
        let replay = analyse(&["replay", dir.to_str().unwrap()]);
        let mut seen = Vec::new();
        for l in replay.lines().filter(|l| l.contains("work(")) {
            let call = l.split("work(").nth(1).unwrap();
            let (args, rest) = call.split_once(')').unwrap();
            let first: i64 = args.split(", ").next().unwrap().parse().unwrap();
            let ret: i64 = rest
                .trim_start_matches(" = ")
                .trim_end_matches(';')
                .parse()
                .unwrap_or_else(|_| panic!("no return value in {l:?}"));
            assert_eq!(ret, first + 1, "{l}");
            assert_eq!(
                args.split(", ").count(),
                nargs.parse::<usize>().unwrap(),
                "{l}"
            );
            seen.push(first);
        }
        let want: Vec<i64> = [3, 5, 7].iter().flat_map(|&n| 0..n).collect();
        assert_eq!(seen, want, "--args {nargs}");
    }
}

/// `hotprobe trace`'s live tree of tests/programs/trap_marks.c
/// (`t_tiny`, only a trap takes it, called `n` times, then the jump-probed
/// `t_work` `m` times) with `extra` options: the program's output and
/// exit status as when it runs alone, hotprobe's stderr, the tree's lines
/// (header, program output and legend left out) and the stdout lines after
/// the tree (the legend, when any).
struct LiveRun {
    err: String,
    tree: Vec<String>,
    after: Vec<String>,
}

fn trace_trap_marks(extra: &[&str], n: usize, m: usize) -> LiveRun {
    let prog = program_with("trap_marks", "o2", &["-O2"]);
    let (n, m) = (n.to_string(), m.to_string());
    let native = Command::new(&prog).args([&n, &m]).output().unwrap();
    assert_eq!(native.status.code(), Some(3));
    let mut args = vec!["trace"];
    args.extend_from_slice(extra);
    args.extend(["t_tiny", "t_work", "--", prog.to_str().unwrap(), &n, &m]);
    let o = hotprobe(&args);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), native.status.code(), "{out}\n{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("# DURATION     TID     FUNCTION"),
        "{out}"
    );
    let (mut tree, mut program, mut after) = (Vec::new(), String::new(), Vec::new());
    for l in lines {
        if l.contains("] | ") {
            assert!(after.is_empty(), "a tree line after the legend: {out}");
            tree.push(l.to_string());
        } else if l.starts_with('#') {
            after.push(l.to_string());
        } else {
            program.push_str(l);
            program.push('\n');
        }
    }
    assert_eq!(program, text(&native.stdout), "{out}");
    LiveRun { err, tree, after }
}

/// The function of a tree line and whether it is an entry (`f() {`) or an
/// exit (`} /* f */`).
fn live_line(l: &str) -> (String, bool) {
    let body = l.split_once("] | ").unwrap().1;
    match body.strip_prefix("} /* ") {
        Some(exit) => (exit.trim_end_matches(" */").to_string(), false),
        None => (body.trim_end_matches("() {").to_string(), true),
    }
}

/// `trace`: the lines of a function placed on a trap have `*` in the first column, as `replay` and `report` mark them, the
/// others a blank, and the tree ends with replay's legend; a function on
/// the in-process trap, then every function on the ptrace trap
/// (`--mechanism trap`).
#[test]
fn trace_marks_the_lines_of_functions_on_a_trap() {
    let (n, m) = (7, 4);
    let run = trace_trap_marks(&[], n, m);
    // The premise: t_tiny on the in-process trap, t_work on a jump.
    assert!(
        run.err.contains(" 2 probes (in-process 1, jump 1)\n"),
        "{}",
        run.err
    );
    let mut seen: BTreeMap<(String, bool), usize> = BTreeMap::new();
    for l in &run.tree {
        let (f, entry) = live_line(l);
        let on_trap = f == "t_tiny";
        assert!(on_trap || f == "t_work", "{l}");
        assert_eq!(l.starts_with('*'), on_trap, "{l}");
        assert_eq!(l.starts_with(' '), !on_trap, "{l}");
        // An entry's columns are blank but for the mark.
        if entry {
            let mark = if on_trap { '*' } else { ' ' };
            assert!(l.starts_with(&format!("{mark}{}[", " ".repeat(11))), "{l}");
        }
        *seen.entry((f, entry)).or_default() += 1;
    }
    let want: BTreeMap<(String, bool), usize> = [
        (("t_tiny".to_string(), true), n),
        (("t_tiny".to_string(), false), n),
        (("t_work".to_string(), true), m),
        (("t_work".to_string(), false), m),
    ]
    .into();
    assert_eq!(seen, want, "{:#?}", run.tree);
    let legend = "# * on a trap (in-process trap: µs a hit, left in these times)";
    assert_eq!(run.after, [legend], "{:#?}", run.tree);

    // The same program recorded: replay marks t_tiny's lines (a leaf: one
    // line a call) and, with the times as measured as trace shows them,
    // ends with the same legend.
    let dir = tmp().join(format!("trap-marks-{}", std::process::id()));
    let prog = program_with("trap_marks", "o2", &["-O2"]);
    let (n_arg, m_arg) = (n.to_string(), m.to_string());
    let o = hotprobe(&[
        "record",
        "--force",
        "-o",
        dir.to_str().unwrap(),
        "t_tiny",
        "t_work",
        "--",
        prog.to_str().unwrap(),
        &n_arg,
        &m_arg,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let replay = analyse(&["replay", "--raw-times", dir.to_str().unwrap()]);
    assert_eq!(replay.lines().last(), Some(legend), "{replay}");
    let marked: Vec<&str> = replay.lines().filter(|l| l.starts_with('*')).collect();
    assert_eq!(marked.len(), n, "{replay}");
    assert!(
        marked.iter().all(|l| l.ends_with("] | t_tiny();")),
        "{replay}"
    );

    // --mechanism trap: both functions on the ptrace trap, every line
    // marked.
    let (n, m) = (2, 1);
    let run = trace_trap_marks(&["--mechanism", "trap"], n, m);
    assert!(run.err.contains(" 2 probes (trap 2)\n"), "{}", run.err);
    assert_eq!(run.tree.len(), 2 * (n + m), "{:#?}", run.tree);
    assert!(
        run.tree.iter().all(|l| l.starts_with('*')),
        "{:#?}",
        run.tree
    );
    let tiny = run.tree.iter().filter(|l| live_line(l).0 == "t_tiny");
    assert_eq!(tiny.count(), 2 * n, "{:#?}", run.tree);
    assert_eq!(
        run.after,
        ["# * on a trap (ptrace trap: µs a hit, left in these times)"],
        "{:#?}",
        run.tree
    );
}
