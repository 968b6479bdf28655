//! A thread's ring is ready before its recorded calls (issue 23, an
//! 8-thread program's start): under `record`, a thread's calls after its
//! first take no page fault. tests/programs/ring_faults.c runs 20 threads
//! one after another, 1,000 calls of `work` each, with a pause between
//! them in which the tracer's drain gives the last thread's slot back, so
//! that later threads take over a slot an earlier one wrote into; each
//! thread prints the minor faults it took during its calls after the
//! first (`getrusage(RUSAGE_THREAD)`). Natively that is 0, and so it must
//! stay: the program's output is compared whole.
//!
//! Before, every thread that took over a slot faulted 15–16 times (its
//! events went on past the pages the last owner wrote, each a fresh page
//! of shared memory: ≈ 8 µs a fault here). The first threads' slots are
//! mapped by the agent when the first recording site goes in
//! (`hotprobe_agent_map_rings`, spawned and attached alike).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::attached::CountAttached;
use common::record::{info, record, trace_dir};
use common::{drops, gcc, text};

const LIMIT: Duration = Duration::from_secs(120);
/// Threads, calls each, and the pause between two threads (µs): 2,000
/// events of 32 bytes a thread, within the 64 KiB a ring is made ready by.
const ARGS: [&str; 3] = ["20", "1000", "3000"];

fn program() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ring-ready");
    std::fs::create_dir_all(&d).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/ring_faults.c");
    gcc(&src, &d.join("ring_faults"), &["-O1", "-pthread"])
}

/// The program's output natively: every thread took no fault in its
/// calls, and the calls add up.
fn native(prog: &str) -> String {
    let o = Command::new(prog).args(ARGS).output().unwrap();
    assert!(o.status.success(), "natively: {:?}", o.status);
    let out = text(&o.stdout);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" faults 0")).count(),
        20,
        "{out}"
    );
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("calls 20000 sum "), "{out}");
    out
}

#[test]
fn recorded_threads_take_no_page_fault_after_their_first_call() {
    let prog = program();
    let p = prog.to_str().unwrap();
    let out = native(p);
    let dir = trace_dir("ring-ready");
    let mut cmd = vec![p];
    cmd.extend(ARGS);
    let (stdout, err) = record(&dir, &["work"], &cmd, LIMIT);
    assert_eq!(stdout, out, "{err}");
    let i = info(&dir, LIMIT);
    assert_eq!((i.calls, i.lost, drops(&err)), (20_000, 0, 0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn threads_of_an_attached_process_take_no_page_fault_after_their_first_call() {
    let prog = program();
    let p = prog.to_str().unwrap();
    let out = native(p);
    let mut child = Command::new(p)
        .args(ARGS)
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let dir = trace_dir("ring-ready-attached");
    let s = CountAttached::start_as(
        &["record", "-o", dir.to_str().unwrap()],
        child.id(),
        &["work"],
        LIMIT,
    );
    assert!(s.first.contains("attached to pid"), "{}", s.first);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let got: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success());
    let (status, _, err) = s.end();
    assert!(status.success(), "{err}");
    assert_eq!(format!("{}\n", got.join("\n")), out, "{err}");
    let i = info(&dir, LIMIT);
    assert_eq!((i.calls, i.lost, drops(&err)), (20_000, 0, 0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
