//! Issue 22: an in-process trap never depends on a signal state the
//! program controls. Threads that block every signal, a signal handler
//! whose mask holds SIGTRAP and that calls the probed function, a program
//! that ignores and blocks SIGTRAP: each runs as it does alone (output,
//! exit status, the masks it reads back) and every call is counted. An
//! agent that cannot see the program's mask changes (injected into a
//! running process, or in a Go program, cgo included) gets no in-process
//! trap.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable, MixServer};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::{field, go_program, native_output, out_dir};

const LIMIT: Duration = Duration::from_secs(120);

fn sigstate() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/sigstate.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("signal-state");
    std::fs::create_dir_all(&dir).unwrap();
    // -no-pie: its 4-byte functions stay on the in-process trap these
    // tests are about (in a PIE they take a punned jump; a non-PIE's
    // punned-jump copies would fall below address 0).
    gcc(&src, &dir.join("sigstate"), &["-O1", "-no-pie"])
}

/// `hotprobe count tiny -- sigstate MODE`: the program's output (checked
/// to be a success), the table, stderr.
fn count_tiny(bin: &Path, mode: &str) -> (String, CountTable) {
    let out = hotprobe_within(&["count", "tiny", "--", bin.to_str().unwrap(), mode], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{mode}: {stdout}\n{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert!(t.execution("tiny") == "in-process", "{mode}: {}", t.all);
    (program_output(&stdout).to_string(), t)
}

#[test]
fn threads_that_block_every_signal_run_and_count_under_an_in_process_trap() {
    let bin = sigstate();
    let want = native_output(&bin, &["workers"]);
    assert_eq!(want, "calls=4000 result=6002000 main_blocked=1\n");
    let (got, t) = count_tiny(&bin, "workers");
    assert_eq!(got, want);
    assert_eq!(
        (t.hits("tiny"), t.row("tiny")[t.col("NMISSED")].as_str()),
        (4000, "0")
    );
}

#[test]
fn a_handler_with_sigtrap_in_its_mask_calling_the_probed_function_is_counted() {
    let bin = sigstate();
    let native = native_output(&bin, &["alarm"]);
    assert!(native.contains("handler_mask_has_trap=1"), "{native}");
    // Where the alarms fall is the kernel's: ten runs.
    for _ in 0..10 {
        let (got, t) = count_tiny(&bin, "alarm");
        let first = got.lines().next().unwrap_or_default();
        assert_eq!(first, native.lines().next().unwrap(), "{got}");
        let calls = field(&got, "main") + field(&got, "handler");
        let missed: u64 = t.row("tiny")[t.col("NMISSED")].parse().unwrap();
        assert_eq!(t.hits("tiny") + missed, calls, "{got}\n{}", t.all);
    }
}

#[test]
fn a_program_that_ignores_and_blocks_sigtrap_behaves_the_same() {
    let bin = sigstate();
    let want = native_output(&bin, &["ignore"]);
    assert_eq!(want, "calls=1000 sum=500500 blocked=1\n");
    let (got, t) = count_tiny(&bin, "ignore");
    assert_eq!(got, want);
    assert_eq!(t.hits("tiny"), 1000);
    // Recorded too: the same output, the calls in the trace.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("signal-state-trace");
    let _ = std::fs::remove_dir_all(&dir);
    let b = bin.to_str().unwrap();
    let o = dir.to_str().unwrap();
    let out = hotprobe_within(&["record", "-o", o, "tiny", "--", b, "ignore"], LIMIT);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), want);
}

#[test]
fn an_attached_process_or_a_go_program_gets_no_in_process_trap() {
    let server = MixServer::start();
    let pid = server.pid().to_string();
    let out = hotprobe_within(&["count", "-p", &pid, "--duration", "1", "mix+3"], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert!(t.execution("mix+3").starts_with("trap"), "{stdout}");
    assert!(
        t.all
            .contains("in-process trap: the agent was injected into a running process"),
        "{stdout}"
    );
    assert!(t.hits("mix+3") > 0);
    drop(server);

    let go = go_program("gofunc", "");
    let b = go.to_str().unwrap();
    let want = native_output(&go, &["500"]);
    let out = hotprobe_within(&["count", "main.mid+4", "--", b, "500"], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), want);
    let t = CountTable::parse(&stdout, &stderr);
    assert!(t.execution("main.mid+4").starts_with("trap"), "{stdout}");
    assert!(t.all.contains("a Go runtime sets signal masks"), "{stdout}");
}

/// tests/programs/cgo_four built with cgo (its Go build cache shared with
/// `go_program`'s, under the target directory).
fn cgo_four() -> PathBuf {
    let base = out_dir("go");
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cgo_four");
    hotprobe_testkit::go_build(&package, &base.join("cgo_four"), &base, "", true)
}

/// Issue 22: "a cgo Go program with a 4-byte function: fatal error:
/// traceback did not unwind completely" under the in-process trap. The C
/// function `four` (4 bytes of assembly, another function right after it:
/// too short for a jump, no patchable entry) is called `N` times through
/// a C loop from 4 goroutines that allocate and yield between their cgo
/// calls. The Go runtime in the process gets it the ptrace trap instead,
/// as the table says with the reason; every call is counted, and the
/// program's output and exit status (3) are what it gives alone.
#[test]
fn a_cgo_program_with_a_four_byte_function_is_counted_without_an_in_process_trap() {
    const N: u64 = 20_000;
    let bin = cgo_four();
    let n = N.to_string();
    let native = std::process::Command::new(&bin).arg(&n).output().unwrap();
    let want = format!("calls={N} sum={}\n", N * (N + 1) / 2);
    assert_eq!(
        (text(&native.stdout), native.status.code()),
        (want.clone(), Some(3)),
        "{}",
        text(&native.stderr)
    );
    let out = hotprobe_within(&["count", "four", "--", bin.to_str().unwrap(), &n], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stderr.contains("exited with code 3"), "{stderr}");
    assert_eq!(program_output(&stdout), want, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(
        (t.hits("four"), t.row("four")[t.col("NMISSED")].as_str()),
        (N, "0"),
        "{}",
        t.all
    );
    assert!(t.execution("four").starts_with("trap"), "{}", t.all);
    let why = t.row("four")[t.col("WHY")..].join(" ");
    assert!(
        why.contains("in-process trap: a Go runtime sets signal masks with raw system calls"),
        "{}",
        t.all
    );
}
