//! The session's notices (issue 21): every number in one counts the
//! user's probes, never the session's own (here the trap-table publisher
//! a trap return probe brings), and a normal exit names no dropped probe.

mod support;

use hotprobe::{ProbeId, RetProbe, RunEnd};
use std::path::PathBuf;
use support::*;

/// A program that calls `work` 4 times and prints their sum; then, as its
/// argument says, executes another program (`exec PATH`), dies of
/// `SIGABRT` (`abort`), or exits 0.
fn worker() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("notices");
    let src = hotprobe_testkit::write_source(
        &dir,
        "worker.c",
        r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
volatile long sink;
__attribute__((noinline)) long work(long x) { sink += x; return x + 1; }
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    long s = 0;
    for (int i = 0; i < 4; i++)
        s += work(i);
    printf("sum %ld\n", s);
    if (argc > 2 && !strcmp(argv[1], "exec")) {
        execl(argv[2], argv[2], (char *)0);
        return 127;
    }
    if (argc > 1 && !strcmp(argv[1], "abort"))
        abort();
    return 0;
}
"#,
    );
    hotprobe_testkit::compile("gcc", &src, &dir.join("worker"), &["-O1", "-g"], &[])
}

/// Runs `worker args` with one trap return probe on `work` (the user's
/// only probe) to its end; its notices, after checking the counts, the
/// output, and that the session's own publisher probe was in the engine
/// beside it.
fn run_with_one_return_probe(args: &[&str]) -> (i32, Vec<String>) {
    let mut c = spawn(&worker(), args);
    let pid = c.session.pid(c.target).unwrap();
    let rp = c
        .session
        .retprobe(c.target, "work", RetProbe::new(16))
        .unwrap();
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    let st = c.session.stats(rp).unwrap();
    assert_eq!((st.hits, st.returns), (4, 4), "{args:?}");
    assert_eq!(lines_with(&c.output(), "sum "), vec!["sum 10"], "{args:?}");
    // The publisher is placed just before the return probe (the id
    // before its own) and runs at every entry: a second probe in the
    // engine, which no notice may count.
    let publisher = c.session.stats(ProbeId(rp.0 - 1));
    assert_eq!(publisher.map(|s| s.hits), Some(4), "{args:?}");
    (pid, c.session.take_notices())
}

#[test]
fn a_normal_exit_names_no_dropped_probe() {
    let (pid, notices) = run_with_one_return_probe(&[]);
    assert_eq!(notices, vec![format!("pid {pid} exited with code 0")]);
}

#[test]
fn a_death_by_signal_counts_the_users_probes_only() {
    let (pid, notices) = run_with_one_return_probe(&["abort"]);
    assert_eq!(
        notices,
        vec![format!(
            "pid {pid} killed by signal 6: its 1 probes are dropped"
        )]
    );
}

#[test]
fn an_exec_counts_the_users_probes_only() {
    let (pid, notices) = run_with_one_return_probe(&["exec", "/bin/true"]);
    assert_eq!(
        notices,
        vec![
            format!(
                "pid {pid}: exec: 1 trap probes dropped (their counts before the exec are kept)"
            ),
            format!("pid {pid} exited with code 0"),
        ]
    );
}
