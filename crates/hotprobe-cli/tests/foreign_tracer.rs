//! A tracer that comes to a process running released with in-process traps
//! in (issue 22): its `SIGTRAP`s reach that tracer first. hotprobe names
//! the tracer at once in one notice with what it must do; with that done
//! (the signals passed on, as gdb's `handle SIGTRAP nostop noprint pass`
//! does) the program computes what it computes alone, and the counts
//! equal the calls. Two tracers: a small one the test compiles
//! (tests/programs/passing_tracer.c: it seizes the process, passes every
//! signal on and counts the SIGTRAPs, and detaches when told), and gdb.

mod common;

use common::two_sessions::{tracer_of, under_count, N, WAIT};
use common::{line_reader, CountTable};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;

fn passing_tracer() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/passing_tracer.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("two_sessions");
    std::fs::create_dir_all(&dir).unwrap();
    common::gcc(&src, &dir.join("passing_tracer"), &["-O1"])
}

/// The notice hotprobe gives for tracer `tracer` (`comm`) of `pid`.
fn notice(pid: u32, tracer: u32, comm: &str) -> String {
    format!(
        "hotprobe: pid {pid} is now traced by pid {tracer} ({comm}) while hotprobe's in-process \
         traps are in it: their SIGTRAPs reach that tracer first, and it must pass them on to \
         the program unstopped (gdb: `handle SIGTRAP nostop noprint pass`), or the program \
         computes wrong results or dies"
    )
}

/// hotprobe's end after "exit 3": its status is the program's, the
/// notice was said once, the counts are `rounds` × N each.
fn ends_with_exact_counts(
    hp: Child,
    err: Receiver<String>,
    lines: Receiver<String>,
    pid: u32,
    said: &str,
    rounds: u64,
) {
    let mut out = Vec::new();
    while let Ok(l) = lines.recv_timeout(WAIT) {
        out.push(l);
    }
    let status = hp.wait_with_output().unwrap().status;
    let rest: Vec<String> = err.iter().collect();
    assert_eq!(status.code(), Some(3), "{rest:?}");
    assert!(
        rest.contains(&format!("hotprobe: pid {pid} exited with code 3")),
        "{rest:?}"
    );
    assert!(!rest.iter().any(|l| l == said), "said once: {rest:?}");
    let stdout = out.join("\n") + "\n";
    // The program's own lines were read round by round: only the table follows.
    assert_eq!(common::program_output(&stdout), "");
    let t = CountTable::parse(&stdout, &rest.join("\n"));
    assert_eq!(
        (t.hits("tiny"), t.hits("work")),
        (rounds * N, rounds * N),
        "{}",
        t.all
    );
    assert!(t.execution("tiny").starts_with("in-process"), "{}", t.all);
}

#[test]
fn a_tracer_that_seizes_the_released_process_is_named_and_passing_sigtrap_keeps_it_right() {
    let (hp, err, mut p) = under_count();
    let pid = p.pid;
    p.round();
    let mut tracer = Command::new(passing_tracer())
        .arg(pid.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let tracer_out = line_reader(tracer.stdout.take().unwrap());
    assert_eq!(
        tracer_out.recv_timeout(WAIT).unwrap(),
        format!("seized {pid}")
    );
    assert_eq!(tracer_of(pid), tracer.id() as i32);
    let said = notice(pid, tracer.id(), "passing_tracer");
    assert_eq!(err.recv_timeout(WAIT).expect("the notice"), said);
    // Each in-process trap's SIGTRAP goes through the tracer, which
    // passes it on: the round is right, and it saw one per call.
    p.round();
    drop(tracer.stdin.take());
    assert_eq!(
        tracer_out.recv_timeout(WAIT).unwrap(),
        format!("passed {N} SIGTRAPs")
    );
    assert!(tracer.wait().unwrap().success());
    assert_eq!(tracer_of(pid), 0);
    p.round();
    p.say("exit 3");
    ends_with_exact_counts(hp, err, p.lines, pid, &said, 3);
}

#[test]
fn gdb_attached_with_the_documented_handling_is_named_and_the_program_stays_right() {
    let (hp, err, mut p) = under_count();
    let pid = p.pid;
    p.round();
    // gdb runs until the program exits (batch mode, `continue`).
    let gdb = Command::new("gdb")
        .args(["-q", "-nx", "-batch", "-p", &pid.to_string()])
        .args([
            "-ex",
            "handle SIGTRAP nostop noprint pass",
            "-ex",
            "continue",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdb runs");
    let said = notice(pid, gdb.id(), "gdb");
    assert_eq!(err.recv_timeout(WAIT).expect("the notice"), said);
    p.round();
    p.round();
    p.say("exit 3");
    ends_with_exact_counts(hp, err, p.lines, pid, &said, 3);
    let g = gdb.wait_with_output().unwrap();
    let gdb_out = common::text(&g.stdout);
    assert!(
        gdb_out.contains(&format!("[Inferior 1 (process {pid}) exited with code 03]")),
        "{gdb_out}\n{}",
        common::text(&g.stderr)
    );
}
