//! What the trace tests of `record` share (trace_loss_cli, bad_input):
//! the `spin` program, `hotprobe` run with a time limit, `record` to
//! completion, a report's JSON rows.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{gcc, hotprobe_within, text};

/// The folder of these tests' programs and traces.
pub fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace-loss");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `spin [N]`: calls `work(i)` for i = 0, 1, ... (N times, or until
/// killed), each call a few microseconds of work (so that a drain starved
/// by a loaded machine keeps up); prints `done K` after every 20,000 calls
/// and `end N` at the end; exits with status 3.
///
/// With each line it raises SIGURG (ignored): a ptrace stop, which wakes
/// `record`'s event loop. That loop waits for the target in `waitpid`
/// under a one-shot timer (hotprobe-process, `wake::waitpid_for`); when
/// the timer fires before `waitpid` starts (a loaded machine), it blocks
/// until the target's next ptrace stop and drains nothing meanwhile, a
/// bug of its own (seen here: a run whose stream stayed at its header
/// while the program printed 334 lines), not what these tests are about.
pub const SPIN: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) long work(long i) {
    volatile long x = i;
    for (int k = 0; k < 1500; k++) x += k;
    return x;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    /* "pause": after each "done" line, waits for a line of its input (or
       its end) before it goes on. */
    int pause = argc > 2 && !strcmp(argv[2], "pause");
    for (long i = 0; n < 0 || i < n; i++) {
        work(i);
        if ((i + 1) % 20000 == 0) {
            printf("done %ld\n", i + 1); fflush(stdout); raise(SIGURG);
            char line[8];
            if (pause && !fgets(line, sizeof line, stdin)) pause = 0;
        }
    }
    printf("end %ld\n", n);
    return 3;
}
"#;

/// `src` (C) built as `bin-NAME` with `-O1 -fno-inline`.
pub fn program(name: &str, src: &str) -> PathBuf {
    let s = hotprobe_testkit::write_source(&tmp(), &format!("{name}.c"), src);
    gcc(
        &s,
        &tmp().join(format!("bin-{name}")),
        &["-O1", "-fno-inline"],
    )
}

/// `hotprobe ARGS` with a time limit; (status code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let o = hotprobe_within(args, Duration::from_secs(60));
    (
        o.status.code().unwrap_or(-1),
        text(&o.stdout),
        text(&o.stderr),
    )
}

/// `hotprobe record -o DIR ARGS -- PROG PARGS`, to completion.
pub fn record(dir: &Path, args: &[&str], prog: &Path, pargs: &[&str]) -> (i32, String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "-o", dir.to_str().unwrap()];
    a.extend_from_slice(args);
    a.push("--");
    a.push(prog.to_str().unwrap());
    a.extend_from_slice(pargs);
    run(&a)
}

pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The report row of `function` (`report --json`).
pub fn row(report: &serde_json::Value, function: &str) -> serde_json::Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == function)
        .unwrap_or_else(|| panic!("no row {function} in {report}"))
        .clone()
}
