//! Issue 22, the program's own `SIGTRAP` against hotprobe's traps, round
//! 3 (tests/programs/trap_sigstate_late.c):
//!
//! - `late`: a thread blocks `SIGTRAP` before the program installs its
//!   handler. Under the ptrace trap it was lifted (`sigtrap.rs`,
//!   "Lifted") only at its next signal-state call, so its first trap
//!   reset the new handler to `SIG_DFL` while the main thread raised
//!   `SIGTRAP`: killed by SIGTRAP (exit 133, 0 hits) in 3 runs of 3. Now
//!   the threads that block it are stopped while the handler goes in and
//!   lifted then. With the agent (the default: an in-process trap), the
//!   agent keeps `SIGTRAP` out of the kernel's masks and holds a
//!   `SIGTRAP` the program sends to a thread that believes it blocked.
//! - `attach`: `late` with the handler in and the thread blocking
//!   `SIGTRAP` when `count -p` attaches: such a thread was lifted only at
//!   its next signal-state call (killed by SIGTRAP on the trap, and in 4
//!   runs of 6 by default, the injected agent's handler holding the
//!   disposition). Now the blocking threads are lifted when the sites are
//!   armed.
//! - `stepq`: values queued with `SIGTRAP` (`sigqueue`, from a child
//!   process) to a program that single-steps over a breakpoint (an
//!   indirect call) in a loop. One pending when a step began was
//!   swallowed by the step's stop: 100 of 100 lost (each waited for 10 s),
//!   on the trap and by default; one held during a step was delivered
//!   with the step's siginfo (`TRAP_TRACE`, the value lost). Now it is
//!   queued again with its own siginfo: each value once, in order, with
//!   `SI_QUEUE` and the sender's pid. (Sent to a thread instead, with
//!   `pthread_sigqueue`, it can still be lost in the instant between a
//!   trap's or step's own `SIGTRAP` and its stop: the kernel keeps one
//!   pending `SIGTRAP` per thread and drops the second, and nothing of it
//!   is left to see; see docs/DESIGN.md.)
//!
//! Each run: the program's output and exit status are the native run's,
//! and the probe counts every call the program says it made.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, while_attached, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/trap_sigstate_late.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trap-sigstate-late");
    std::fs::create_dir_all(&dir).unwrap();
    // -no-pie: its 4-byte functions stay on the in-process trap these
    // tests are about (in a PIE they take a punned jump; a non-PIE's
    // punned-jump copies would fall below address 0).
    gcc(&src, &dir.join("trap_sigstate_late"), &["-O1", "-no-pie"])
}

/// The calls the program says it made (`CASE calls=N` on its stderr).
fn calls_said(stderr: &str, case: &str) -> u64 {
    let key = format!("{case} calls=");
    let said: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&key))
        .map(|n| n.trim().parse().unwrap())
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    said[0]
}

/// `hotprobe count ARGS PROBE -- BIN CASE`: output and exit status as
/// natively, the probe's EXECUTION starting with the words `exec`, every
/// call counted.
fn check(case: &str, args: &[&str], probe: &str, exec: &[&str]) {
    let bin = program();
    let native = Command::new(&bin).arg(case).output().unwrap();
    assert_eq!(native.status.code(), Some(5), "{case} natively");
    let want = text(&native.stdout);
    let whole = match case {
        "late" => "main: handled in main=1, in the worker=1",
        _ => "lost=0 handled=100 in order=1 SI_QUEUE=1 from the sender=1",
    };
    assert!(want.contains(whole), "{case} natively: {want}");
    let mut a = vec!["count"];
    a.extend_from_slice(args);
    a.extend([probe, "--", bin.to_str().unwrap(), case]);
    let o = hotprobe_within(&a, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("{a:?}\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(5), "{ctx}");
    assert!(err.contains("exited with code 5"), "{ctx}");
    assert_eq!(program_output(&out), want, "{ctx}");
    let t = CountTable::parse(&out, &err);
    let c = t.col("EXECUTION");
    let words: Vec<&str> = t.row(probe).iter().skip(c).map(String::as_str).collect();
    assert!(words.starts_with(exec), "{ctx}");
    assert_eq!(t.hits(probe), calls_said(&err, case), "{ctx}");
}

#[test]
fn a_thread_that_blocked_sigtrap_before_the_handler_came_keeps_it() {
    check("late", &["--mechanism", "trap"], "tiny", &["trap"]);
    check("late", &[], "tiny", &["in-process", "trap"]);
}

/// The program's case `attach`, started and past its `ready PID` line.
fn start_attached(bin: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(bin)
        .arg("attach")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    assert_eq!(ready, format!("ready {}\n", child.id()));
    (child, out)
}

/// Tells the program started by [`start_attached`] to go on; its output
/// after `ready`, its exit status and its stderr.
fn go_on(mut child: Child, mut out: BufReader<ChildStdout>) -> (String, Option<i32>, String) {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    (rest, o.status.code(), text(&o.stderr))
}

/// `hotprobe count -p PID ARGS tiny --duration 60` on `attach`: once
/// attached, the program goes on. Its output and exit status are the
/// native run's, every call is counted.
fn check_attached(args: &[&str]) {
    let bin = program();
    let (child, out) = start_attached(&bin);
    let (want, status, _) = go_on(child, out);
    assert_eq!(status, Some(5), "natively: {want}");
    assert!(
        want.contains("main: handled in main=1, in the worker=1"),
        "{want}"
    );
    let (child, out) = start_attached(&bin);
    let pid = child.id().to_string();
    let mut a = vec!["count", "-p", &pid];
    a.extend_from_slice(args);
    a.extend(["tiny", "--duration", "60"]);
    let ((got, status, said), hp, hp_out, hp_err) = while_attached(&a, || go_on(child, out));
    let ctx = format!("{a:?}\n{got}\n{hp_out}\n{hp_err}");
    assert_eq!(status, Some(5), "{ctx}");
    assert_eq!(got, want, "{ctx}");
    assert_eq!(hp.code(), Some(5), "{ctx}");
    assert!(hp_err.contains("exited with code 5"), "{ctx}");
    let t = CountTable::parse(&hp_out, &hp_err);
    assert_eq!(t.hits("tiny"), calls_said(&said, "late"), "{ctx}");
}

#[test]
fn a_thread_blocking_sigtrap_when_hotprobe_attaches_keeps_it() {
    check_attached(&["--mechanism", "trap"]);
    check_attached(&[]);
}

#[test]
fn a_sigtrap_queued_while_a_thread_single_steps_keeps_its_siginfo() {
    let stepped = ["trap", "(stepped)"];
    check("stepq", &["--mechanism", "trap"], "stepped", &stepped);
    check("stepq", &[], "stepped", &stepped);
}
