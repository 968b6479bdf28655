//! Shared-memory handlers and the agent's limits (issue 22): a handler on
//! `clock_gettime` or `syscall` runs for the program's calls only (the
//! agent's own waits read the clock and sleep by the system call, not
//! through libc), and handler slots are given back when threads exit, so
//! that handlers keep running past the 256th thread ever created.
//!
//! The C programs are the CLI tests' (crates/hotprobe-cli/tests/programs);
//! every assertion compares with what they printed.

mod support;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use hotprobe::{Action, ExitStatus, RunEnd};
use support::{lines_with, spawn};

/// Long enough that a loaded machine starving the session of CPU
/// withdraws no call.
const SERVED: Duration = Duration::from_secs(60);

/// crates/hotprobe-cli/tests/programs/NAME.c built with -O1.
fn build(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hotprobe-cli/tests/programs")
        .join(format!("{name}.c"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("agent-handlers");
    std::fs::create_dir_all(&dir).unwrap();
    hotprobe_testkit::compile("gcc", &src, &dir.join(name), &["-O1", "-g"], &["-lpthread"])
}

/// The `N` in the line `PREFIX N` of `out`.
fn printed(out: &str, prefix: &str) -> u64 {
    let l = lines_with(out, prefix);
    assert_eq!(l.len(), 1, "one {prefix:?} line in {out}");
    l[0][prefix.len()..].trim().parse().unwrap()
}

/// A pre handler counting its runs.
fn counting() -> (hotprobe::Probe, Rc<Cell<u64>>) {
    let seen = Rc::new(Cell::new(0u64));
    let s = seen.clone();
    (
        hotprobe::Probe::new().pre(move |_| s.set(s.get() + 1)),
        seen,
    )
}

/// Handlers on libc's `clock_gettime` and `syscall`, sleeping (spin 0:
/// the agent's wait reads the clock at once and sleeps on a futex): each
/// runs once per call the program made, none for the agent's own.
#[test]
fn handlers_on_clock_gettime_and_syscall_see_only_the_programs_calls() {
    let bin = build("own_calls");
    let mut c = spawn(&bin, &["2000"]);
    c.session.set_handler_spin(Duration::ZERO);
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let mut probes = Vec::new();
    for spec in ["clock_gettime", "syscall"] {
        let (probe, seen) = counting();
        let added = c.session.add(t, spec, Action::Handler(probe)).unwrap();
        probes.push((spec, added.placements[0].id, seen));
    }
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert!(
        matches!(c.session.exit_status(t), Some(ExitStatus::Code(0))),
        "{:?}",
        c.session.exit_status(t)
    );
    let out = c.output();
    for (spec, id, seen) in &probes {
        let st = c.session.stats(*id).unwrap();
        let calls = printed(&out, &format!("{spec} "));
        assert_eq!(calls, 2000);
        assert_eq!(
            (st.hits, seen.get(), st.nmissed),
            (calls, calls, 0),
            "{spec}: hits, handler runs, missed"
        );
    }
}

/// 300 threads over the run (6 waves of 50), each calling `work` once,
/// with a handler on it: more threads than the 256 handler slots, so
/// every call is served only if slots are given back at thread exit.
#[test]
fn handlers_keep_running_past_the_256th_thread() {
    let bin = build("waves");
    let mut c = spawn(&bin, &["6", "50", "1"]);
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let (probe, seen) = counting();
    let added = c.session.add(t, "work", Action::Handler(probe)).unwrap();
    let id = added.placements[0].id;
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert!(
        matches!(c.session.exit_status(t), Some(ExitStatus::Code(0))),
        "{:?}",
        c.session.exit_status(t)
    );
    let out = c.output();
    assert_eq!(printed(&out, "threads "), 300);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 300);
    let st = c.session.stats(id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (calls, calls, 0));
}

/// A handler on `work` in a program that forbids itself `rdtsc` after one
/// call (`PR_SET_TSC`), on its main thread and a thread it creates: the
/// agent's waits read the clock by the system call; every call is served.
#[test]
fn handlers_run_in_a_program_that_forbids_rdtsc() {
    let bin = build("notsc");
    let mut c = spawn(&bin, &["500"]);
    c.session.set_handler_spin(Duration::from_micros(20));
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let (probe, seen) = counting();
    let id = c
        .session
        .add(t, "work", Action::Handler(probe))
        .unwrap()
        .placements[0]
        .id;
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert!(
        matches!(c.session.exit_status(t), Some(ExitStatus::Code(0))),
        "{:?}",
        c.session.exit_status(t)
    );
    let out = c.output();
    assert_eq!(lines_with(&out, "tsc "), vec!["tsc sigsegv"]);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 1001);
    let st = c.session.stats(id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (calls, calls, 0));
}

/// A handler on `work` in a program that enters seccomp strict mode
/// halfway (where the wait's futex and clock would kill it): the calls
/// before are served, the ones after counted and missed, and the program
/// ends normally with its own output.
#[test]
fn handlers_in_seccomp_strict_mode_are_missed_not_fatal() {
    let bin = build("strict");
    let mut c = spawn(&bin, &["300"]);
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let (probe, seen) = counting();
    let id = c
        .session
        .add(t, "work", Action::Handler(probe))
        .unwrap()
        .placements[0]
        .id;
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert!(
        matches!(c.session.exit_status(t), Some(ExitStatus::Code(0))),
        "{:?}",
        c.session.exit_status(t)
    );
    let out = c.output();
    let (before, after) = (printed(&out, "before "), printed(&out, "after "));
    assert_eq!((before, after), (300, 300));
    let st = c.session.stats(id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (600, before, after));
}
