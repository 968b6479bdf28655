//! The target process's lifecycle under `hotprobe`, the same for every
//! mechanism (trap, patch, jump): an exec keeps the hits made before it and
//! leaves the new image's text as its file's; forked children run without
//! probes unless `-f` follows them (one table row per process); probes on
//! a library wait for it to be loaded and come back when it is reloaded;
//! constructors are probed; Ctrl-C prints the table or finishes the trace;
//! hotprobe exits with its command's status; `trace` uses the fast path
//! and shows the tree `record` + `replay` show.
//!
//! The C programs (tests/programs/) print their own counts and the pids
//! involved; every assertion compares with what they printed.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

mod common;
use common::{
    call_tree, gcc, gcc_with, hotprobe_within, kill_group, line_reader, output_within,
    program_output, reader, text, CountTable, HOTPROBE,
};

/// The longest any hotprobe run here may take (they take well under a
/// second when right); a run still going is a hang.
const LIMIT: Duration = Duration::from_secs(60);

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lifecycle");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"))
}

/// tests/programs/NAME.c built for `mechanism`: with
/// `-fpatchable-function-entry=5` for patch, plain `-O2` otherwise (where
/// `work` gets jump: `hotprobe list`).
fn build(name: &str, mechanism: &str) -> PathBuf {
    let (tag, flags): (&str, &[&str]) = if mechanism == "patch" {
        ("pfe", &["-O2", "-fpatchable-function-entry=5"])
    } else {
        ("o2", &["-O2"])
    };
    gcc(
        &source(name),
        &out_dir().join(format!("{name}-{tag}")),
        flags,
    )
}

/// A shared library `FILE` (libtest.so, libctor.so) from tests/programs/NAME.c.
fn library(name: &str, file: &str) -> PathBuf {
    gcc(
        &source(name),
        &out_dir().join(file),
        &["-O2", "-shared", "-fPIC"],
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `hotprobe count [--mechanism M] [EXTRA...] PROBES... -- CMD...`.
fn count(mechanism: Option<&str>, extra: &[&str], probes: &[&str], cmd: &[&str]) -> Output {
    let mut a = vec!["count"];
    if let Some(m) = mechanism {
        a.extend(["--mechanism", m]);
    }
    a.extend_from_slice(extra);
    a.extend_from_slice(probes);
    a.push("--");
    a.extend_from_slice(cmd);
    hotprobe_within(&a, LIMIT)
}

/// The count table, the program's output before it, and stderr.
fn table(o: &Output) -> (CountTable, String, String) {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    (
        CountTable::parse(&out, &err),
        program_output(&out).to_string(),
        err,
    )
}

/// The probe's row says the mechanism asked for.
fn assert_mechanism(t: &CountTable, probe: &str, mechanism: &str) {
    let e = t.execution(probe);
    assert!(
        e.starts_with(mechanism),
        "{probe}: {e}, not {mechanism}:\n{}",
        t.all
    );
}

fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "hotprobe's exit status {:?}, not its command's {code}; stderr:\n{}",
        o.status,
        text(&o.stderr)
    );
}

/// `hotprobe record -o DIR ARGS -- CMD...`, bounded by [`LIMIT`].
fn record(dir: &Path, args: &[&str], cmd: &[&str]) -> Output {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "-o", s(dir)];
    a.extend_from_slice(args);
    a.push("--");
    a.extend_from_slice(cmd);
    hotprobe_within(&a, LIMIT)
}

/// `hotprobe replay|report DIR`: stdout; asserts success.
fn analyse(what: &str, dir: &Path) -> String {
    let o = hotprobe_within(&[what, s(dir)], LIMIT);
    assert!(
        o.status.success(),
        "hotprobe {what} {}: {}",
        dir.display(),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// The calls of `name` in a call tree.
fn calls_of(tree: &[(u32, usize, String)], name: &str) -> Vec<u32> {
    tree.iter()
        .filter(|(_, _, n)| n == name)
        .map(|(tid, _, _)| *tid)
        .collect()
}

/// Tests `$case::{trap, patch, jump}` calling `$case(mechanism)`.
macro_rules! per_mechanism {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[test]
            fn trap() {
                super::$case("trap")
            }
            #[test]
            fn patch() {
                super::$case("patch")
            }
            #[test]
            fn jump() {
                super::$case("jump")
            }
        }
    )*};
}

per_mechanism!(
    exec_count,
    fork_one_child,
    fork_hundred_children,
    fork_from_a_thread,
    follow_forks,
    constructor_of_the_program,
);

// ---------------------------------------------------------------- exec

const EXEC_OUTPUT: &str = "first work 1\nsecond work 7\nsecond text OK\n";

/// Case 1, exec: the hit before the exec is kept; the new image (7 calls) is
/// not probed and its text is its file's.
fn exec_count(mechanism: &str) {
    let bin = build("exec_self", mechanism);
    let o = count(Some(mechanism), &[], &["work"], &[s(&bin)]);
    let (t, prog, err) = table(&o);
    assert_eq!(prog, EXEC_OUTPUT, "stderr:\n{err}");
    assert_mechanism(&t, "work", mechanism);
    assert_eq!(t.hits("work"), 1, "the pre-exec call:\n{}", t.all);
    assert_exit(&o, 0);
}

#[test]
fn exec_record() {
    let bin = build("exec_self", "jump");
    let dir = out_dir().join("exec-record");
    let o = record(&dir, &["work"], &[s(&bin)]);
    let err = text(&o.stderr);
    assert_eq!(text(&o.stdout), EXEC_OUTPUT, "stderr:\n{err}");
    assert_exit(&o, 0);
    let replay = analyse("replay", &dir);
    let tree = call_tree(&replay);
    assert_eq!(
        calls_of(&tree, "work").len(),
        1,
        "the pre-exec call:\n{replay}"
    );
}

// ---------------------------------------------------------------- fork

/// What a forking program printed: `parent P` first, `parent P work N`
/// last, and per child `child C work 5` and `child C exit 0`, nothing
/// else.
struct Forked {
    parent: i32,
    children: Vec<i32>,
    parent_calls: u64,
}

fn forked(out: &str, nchildren: usize, err: &str) -> Forked {
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let bad = || format!("unexpected output:\n{out}\nstderr:\n{err}");
    assert!(lines.len() == 2 + 2 * nchildren, "{}", bad());
    let first = &lines[0];
    let last = &lines[lines.len() - 1];
    assert!(first.len() == 2 && first[0] == "parent", "{}", bad());
    let parent: i32 = first[1].parse().unwrap();
    assert!(
        last.len() == 4 && last[..3] == ["parent", first[1], "work"],
        "{}",
        bad()
    );
    let parent_calls: u64 = last[3].parse().unwrap();
    let mut worked = Vec::new();
    let mut exited = Vec::new();
    for l in &lines[1..lines.len() - 1] {
        assert!(l.len() == 4 && l[0] == "child", "{}", bad());
        let pid: i32 = l[1].parse().unwrap();
        match (l[2], l[3]) {
            ("work", "5") => worked.push(pid),
            ("exit", "0") => exited.push(pid),
            _ => panic!(
                "child {pid} did not call work 5 times and exit 0: {l:?}\n{}",
                bad()
            ),
        }
    }
    let mut children = worked.clone();
    children.sort_unstable();
    children.dedup();
    exited.sort_unstable();
    assert_eq!(children.len(), nchildren, "{}", bad());
    assert_eq!(children, exited, "{}", bad());
    assert!(!children.contains(&parent), "{}", bad());
    Forked {
        parent,
        children,
        parent_calls,
    }
}

/// Case 2: `count work` of a program forking `n` children: the parent's calls
/// only; the children exit 0.
fn fork_default(mechanism: &str, program: &str, args: &[&str], n: usize) -> Forked {
    let bin = build(program, mechanism);
    let mut cmd = vec![s(&bin)];
    cmd.extend_from_slice(args);
    let o = count(Some(mechanism), &[], &["work"], &cmd);
    let (t, prog, err) = table(&o);
    let f = forked(&prog, n, &err);
    assert_mechanism(&t, "work", mechanism);
    assert_eq!(
        t.hits("work"),
        f.parent_calls,
        "the parent's calls only:\n{}",
        t.all
    );
    assert_exit(&o, 0);
    f
}

fn fork_one_child(mechanism: &str) {
    let f = fork_default(mechanism, "fork_children", &["1"], 1);
    assert_eq!(f.parent_calls, 10);
}

fn fork_hundred_children(mechanism: &str) {
    let f = fork_default(mechanism, "fork_children", &["100"], 100);
    assert_eq!(f.parent_calls, 10);
}

fn fork_from_a_thread(mechanism: &str) {
    fork_default(mechanism, "fork_thread", &[], 1);
}

#[test]
fn fork_record() {
    let bin = build("fork_children", "jump");
    let dir = out_dir().join("fork-record");
    let o = record(&dir, &["work"], &[s(&bin), "1"]);
    let f = forked(&text(&o.stdout), 1, &text(&o.stderr));
    assert_exit(&o, 0);
    let replay = analyse("replay", &dir);
    let tids = calls_of(&call_tree(&replay), "work");
    assert_eq!(tids.len() as u64, f.parent_calls, "{replay}");
    assert!(
        tids.iter().all(|&t| t as i32 == f.parent),
        "calls of another thread than the parent {}:\n{replay}",
        f.parent
    );
}

/// Case 3: `count -f work`: one row for the parent (10) and one for the child (5).
fn follow_forks(mechanism: &str) {
    let bin = build("fork_children", mechanism);
    let o = count(Some(mechanism), &["-f"], &["work"], &[s(&bin), "1"]);
    let (t, prog, err) = table(&o);
    let f = forked(&prog, 1, &err);
    assert_eq!(t.rows_of("work").len(), 2, "a row per process:\n{}", t.all);
    assert_eq!(t.hits_of("work", f.parent), 10, "{}", t.all);
    assert_eq!(t.hits_of("work", f.children[0]), 5, "{}", t.all);
    assert_exit(&o, 0);
}

/// `record -f`: the child's events too (how replay shows a pid is not
/// settled: its number appears).
#[test]
fn follow_forks_record() {
    let bin = build("fork_children", "jump");
    let dir = out_dir().join("follow-record");
    let o = record(&dir, &["-f", "work"], &[s(&bin), "1"]);
    let f = forked(&text(&o.stdout), 1, &text(&o.stderr));
    assert_exit(&o, 0);
    let replay = analyse("replay", &dir);
    let calls = replay.lines().filter(|l| l.contains("work(")).count();
    assert_eq!(
        calls, 15,
        "the parent's 10 calls and the child's 5:\n{replay}"
    );
    for pid in [f.parent, f.children[0]] {
        assert!(replay.contains(&pid.to_string()), "pid {pid} in:\n{replay}");
    }
}

// ---------------------------------------------------------------- dlopen

const DLOPEN_OUTPUT: &str = "first libfn 3\nunloaded yes\nsecond libfn 4\ntotal libfn 7\n";

/// Case 4: A probe on a library loaded later by dlopen, unloaded and loaded
/// again: every call counted.
fn dlopen_twice(mechanism: Option<&str>) {
    let lib = library("libtest", "libtest.so");
    let bin = build("dlopen_twice", "jump");
    let o = count(mechanism, &[], &["libtest.so:libfn"], &[s(&bin), s(&lib)]);
    let (t, prog, err) = table(&o);
    assert_eq!(prog, DLOPEN_OUTPUT, "stderr:\n{err}");
    assert_eq!(t.hits("libtest.so:libfn"), 7, "{}", t.all);
    assert_exit(&o, 0);
}

#[test]
fn dlopen_twice_auto() {
    dlopen_twice(None)
}

#[test]
fn dlopen_twice_trap() {
    dlopen_twice(Some("trap"))
}

/// ctor_main (with libctor.so, DT_NEEDED) for `mechanism`.
fn ctor_program(mechanism: &str) -> PathBuf {
    let lib = library("libctor", "libctor.so");
    let dir = lib.parent().unwrap().to_str().unwrap().to_string();
    let tag = if mechanism == "patch" { "pfe" } else { "o2" };
    let mut flags = vec!["-O2"];
    if mechanism == "patch" {
        flags.push("-fpatchable-function-entry=5");
    }
    gcc_with(
        &source("ctor_main"),
        &out_dir().join(format!("ctor_main-{tag}")),
        &flags,
        &["-L", &dir, "-lctor", &format!("-Wl,-rpath,{dir}")],
    )
}

fn ctor_output(mallocs: u32) -> String {
    format!("lib_ctor helper 2 malloc {mallocs}\nmain_ctor mainhelper 1\nmain\n")
}

/// `count PROBES -- ctor_main` with LIBCTOR_MALLOCS=`mallocs`.
fn count_ctor(mechanism: Option<&str>, probes: &[&str], mallocs: u32) -> CountTable {
    let bin = ctor_program(mechanism.unwrap_or("jump"));
    let mut a = vec!["count"];
    if let Some(m) = mechanism {
        a.extend(["--mechanism", m]);
    }
    a.extend_from_slice(probes);
    a.extend(["--", s(&bin)]);
    let mut c = Command::new(HOTPROBE);
    c.args(&a).env("LIBCTOR_MALLOCS", mallocs.to_string());
    let o = output_within(c, LIMIT);
    let (t, prog, err) = table(&o);
    assert_eq!(prog, ctor_output(mallocs), "stderr:\n{err}");
    assert_exit(&o, 0);
    t
}

/// A library's constructor (before the program's entry point) is probed.
fn constructor_of_a_library(mechanism: Option<&str>) {
    let t = count_ctor(mechanism, &["libctor.so:lib_ctor", "libctor.so:helper"], 3);
    assert_eq!(t.hits("libctor.so:lib_ctor"), 1, "{}", t.all);
    assert_eq!(t.hits("libctor.so:helper"), 2, "{}", t.all);
}

#[test]
fn constructor_of_a_library_auto() {
    constructor_of_a_library(None)
}

#[test]
fn constructor_of_a_library_trap() {
    constructor_of_a_library(Some("trap"))
}

/// The program's own constructor calls mainhelper once.
fn constructor_of_the_program(mechanism: &str) {
    let t = count_ctor(Some(mechanism), &["mainhelper"], 3);
    assert_mechanism(&t, "mainhelper", mechanism);
    assert_eq!(t.hits("mainhelper"), 1, "{}", t.all);
}

/// The constructor's mallocs are counted exactly: 3 more of them give 3
/// more hits (libc's own mallocs are the same in both runs).
#[test]
fn constructor_mallocs_exactly() {
    let three = count_ctor(None, &["libc.so.6:malloc"], 3).hits("libc.so.6:malloc");
    let six = count_ctor(None, &["libc.so.6:malloc"], 6).hits("libc.so.6:malloc");
    assert!(
        three >= 3,
        "{three} mallocs counted, the constructor made 3"
    );
    assert_eq!(
        six.checked_sub(three),
        Some(3),
        "{three} then {six} mallocs counted"
    );
}

// ---------------------------------------------------------------- Ctrl-C

/// What an interrupted run left: hotprobe's status, stdout, stderr.
struct Interrupted {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Interrupted {
    /// The largest `calls K` the program printed (calls it made).
    fn reported(&self) -> u64 {
        numbers_after(&self.stdout, "calls ").max().unwrap_or(0)
    }

    fn assert_exit(&self, code: i32) {
        assert_eq!(
            self.status.code(),
            Some(code),
            "hotprobe's exit status {:?}, not its command's {code}; stdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// The numbers after `prefix` at the start of lines (after a `^C` echo).
fn numbers_after<'a>(out: &'a str, prefix: &'a str) -> impl Iterator<Item = u64> + 'a {
    out.lines()
        .map(|l| l.trim_end_matches('\r').trim_start_matches("^C"))
        .filter_map(move |l| l.strip_prefix(prefix))
        .filter_map(|n| n.trim().parse().ok())
}

/// The process group of `pid`, if it still runs.
fn pgid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Runs `cmd` (hotprobe, or with `tty` `script` running hotprobe on a
/// pty) in a process group of its own; once the program printed 3 `calls`
/// lines, sends SIGINT to the whole group (as a terminal's Ctrl-C does),
/// or with `tty` writes `\x03` to script's input. Waits (at most
/// [`LIMIT`]) for `cmd` to exit; then kills whatever is left of its group
/// and of the program's.
fn interrupt(cmd: &[&str], tty: bool) -> Interrupted {
    let mut c = Command::new(cmd[0]);
    c.args(&cmd[1..])
        .stdin(if tty { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = c.spawn().unwrap();
    let pgid = child.id() as i32;
    let lines = line_reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take();
    let mut seen = Vec::new();
    let mut prog_pid = None;
    let cleanup = |prog_pid: Option<i32>| {
        if let Some(g) = prog_pid.and_then(pgid_of) {
            kill_group(g);
        }
        kill_group(pgid);
    };
    while seen
        .iter()
        .filter(|l: &&String| l.contains("calls "))
        .count()
        < 3
    {
        match lines.recv_timeout(LIMIT) {
            Ok(l) => {
                if let Some(p) = numbers_after(&l, "pid ").next() {
                    prog_pid = Some(p as i32);
                }
                seen.push(l);
            }
            Err(_) => {
                cleanup(prog_pid);
                panic!("no 3 `calls` lines from {cmd:?}: {seen:?}");
            }
        }
    }
    match &mut stdin {
        Some(tty) => {
            tty.write_all(b"\x03").unwrap();
            tty.flush().unwrap();
        }
        // SAFETY: a signal to the process group we started.
        None => assert_eq!(unsafe { libc::kill(-pgid, libc::SIGINT) }, 0),
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(LIMIT);
    let left = prog_pid.filter(|&p| pgid_of(p).is_some());
    cleanup(prog_pid);
    drop(stdin);
    seen.extend(lines.iter());
    let stderr = text(&err.join().unwrap());
    let stdout = seen.join("\n") + "\n";
    let Ok(status) = status else {
        panic!("{cmd:?} still running {LIMIT:?} after the interrupt\n{stdout}\n{stderr}");
    };
    let stderr = match left {
        Some(p) => {
            format!("{stderr}\n(the program, pid {p}, was still there after hotprobe exited)")
        }
        None => stderr,
    };
    Interrupted {
        status: status.unwrap(),
        stdout,
        stderr,
    }
}

/// Case 5: Ctrl-C of `count`, the program dying of SIGINT: the table holds at
/// least the calls the program reported; the exit status is 130.
#[test]
fn ctrl_c_count() {
    let bin = build("interrupt", "jump");
    let r = interrupt(&[HOTPROBE, "count", "work", "--", s(&bin)], false);
    let t = CountTable::parse(&r.stdout, &r.stderr);
    let hits = t.hits("work");
    assert!(
        hits >= r.reported(),
        "{hits} < {} calls:\n{}",
        r.reported(),
        t.all
    );
    r.assert_exit(130);
}

/// The program handles SIGINT, prints its final count and exits 3.
fn ctrl_c_count_handled(mechanism: &str) {
    let bin = build("interrupt", mechanism);
    let r = interrupt(
        &[
            HOTPROBE,
            "count",
            "--mechanism",
            mechanism,
            "work",
            "--",
            s(&bin),
            "handle",
        ],
        false,
    );
    let fin = numbers_after(&r.stdout, "final ")
        .next()
        .unwrap_or_else(|| {
            panic!("no final count:\n{}\nstderr:\n{}", r.stdout, r.stderr);
        });
    let t = CountTable::parse(&r.stdout, &r.stderr);
    assert_eq!(t.hits("work"), fin, "{}", t.all);
    r.assert_exit(3);
}

#[test]
fn ctrl_c_count_handled_jump() {
    ctrl_c_count_handled("jump")
}

#[test]
fn ctrl_c_count_handled_trap() {
    ctrl_c_count_handled("trap")
}

/// Ctrl-C of `record`: the trace is readable and holds the calls made.
#[test]
fn ctrl_c_record() {
    let bin = build("interrupt", "jump");
    let dir = out_dir().join("ctrl-c-record");
    let _ = std::fs::remove_dir_all(&dir);
    let r = interrupt(
        &[HOTPROBE, "record", "-o", s(&dir), "work", "--", s(&bin)],
        false,
    );
    let o = hotprobe_within(&["replay", s(&dir)], LIMIT);
    assert!(
        o.status.success(),
        "replay failed: {}\nrecord's stderr:\n{}",
        text(&o.stderr),
        r.stderr
    );
    let replay = text(&o.stdout);
    let replayed = calls_of(&call_tree(&replay), "work").len() as u64;
    assert!(
        replayed >= r.reported(),
        "replay shows {replayed} calls of {}",
        r.reported()
    );
    let report = analyse("report", &dir);
    let calls: u64 = report
        .lines()
        .find(|l| l.split_whitespace().last() == Some("work"))
        .and_then(|l| l.split_whitespace().rev().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no work in the report:\n{report}"));
    assert_eq!(calls, replayed, "{report}");
    r.assert_exit(130);
}

/// Ctrl-C typed on a real terminal: `script` runs `hotprobe count` on a
/// pty and gets `\x03` on its input.
#[test]
fn ctrl_c_count_on_a_terminal() {
    let bin = build("interrupt", "jump");
    // hotprobe's stderr goes to a file: on the pty it would cut into the
    // program's lines.
    let errfile = out_dir().join("ctrl-c-tty.stderr");
    let _ = std::fs::remove_file(&errfile);
    let line = format!(
        "'{HOTPROBE}' count work -- '{}' 2>'{}'",
        s(&bin),
        s(&errfile)
    );
    let mut r = interrupt(&["script", "-qec", &line, "/dev/null"], true);
    r.stderr += &std::fs::read_to_string(&errfile).unwrap_or_default();
    let stdout = r.stdout.replace('\r', "");
    let t = CountTable::parse(&stdout, &r.stderr);
    let hits = t.hits("work");
    assert!(
        hits >= r.reported(),
        "{hits} < {} calls:\n{}",
        r.reported(),
        t.all
    );
    r.assert_exit(130);
}

// ---------------------------------------------------------------- exit status

/// Case 6: hotprobe exits with its command's status, and still prints the table.
fn exit_status(mechanism: Option<&str>, arg: &str, code: i32) {
    let bin = build("exit_status", mechanism.unwrap_or("jump"));
    let o = count(mechanism, &[], &["work"], &[s(&bin), arg]);
    let (t, prog, err) = table(&o);
    assert_eq!(prog, "work 1\n", "stderr:\n{err}");
    assert_eq!(t.hits("work"), 1, "{}", t.all);
    assert_exit(&o, code);
}

#[test]
fn exit_status_7_auto() {
    exit_status(None, "7", 7)
}

#[test]
fn exit_status_7_trap() {
    exit_status(Some("trap"), "7", 7)
}

#[test]
fn exit_status_sigsegv_auto() {
    exit_status(None, "segv", 128 + libc::SIGSEGV)
}

#[test]
fn exit_status_sigsegv_trap() {
    exit_status(Some("trap"), "segv", 128 + libc::SIGSEGV)
}

// ---------------------------------------------------------------- trace

/// Case 7: `trace` of a patchable build uses patch, and shows the tree `record`
/// + `replay` show (main → a → b, a called 3 times).
#[test]
fn trace_on_the_fast_path() {
    let bin = build("calltree", "patch");
    let o = hotprobe_within(&["trace", "main", "a", "b", "--", s(&bin)], LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.contains("a 3 b 3\n"), "{out}");
    let traced: Vec<(usize, String)> = call_tree(&out)
        .into_iter()
        .map(|(_, d, n)| (d, n))
        .collect();
    let dir = out_dir().join("calltree-record");
    let r = record(&dir, &["main", "a", "b"], &[s(&bin)]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let replay = analyse("replay", &dir);
    let replayed: Vec<(usize, String)> = call_tree(&replay)
        .into_iter()
        .map(|(_, d, n)| (d, n))
        .collect();
    let mut want = vec![(0, "main".to_string())];
    for _ in 0..3 {
        want.push((1, "a".into()));
        want.push((2, "b".into()));
    }
    assert_eq!(replayed, want, "{replay}");
    assert_eq!(traced, replayed, "trace:\n{out}\nreplay:\n{replay}");
    let says_patch = format!("{out}\n{err}")
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "patch");
    assert!(says_patch, "no mention of patch:\n{out}\nstderr:\n{err}");
}
