//! A process whose probes are all on the agent's fast paths runs untraced
//! (issue 23): its 8 thread starts, its exec and its end cost no ptrace
//! stop ([`Session::ptrace_stops`] constant after the start), and what a
//! traced run gives is still there: exact counts, the program's output
//! and exit status, an exec's notice. The program
//! (tests/programs/untraced_threads.c) prints how many of its threads
//! saw a tracer at their start.

mod support;

use hotprobe::{Action, ExitStatus, Mechanism, RunEnd};
use support::{program, spawn};

const ITERS: u64 = 1000;

fn round_line() -> String {
    let total: u64 = (0..8u64)
        .map(|id| (0..ITERS).map(|i| i + id + 1).sum::<u64>())
        .sum();
    format!("round traced 0 total {total}\n")
}

/// Runs `untraced_threads ARGS` with `work` counted to its end: the
/// session's notices, the program's output, its exit status.
fn run(args: &[&str]) -> (Vec<String>, String, Option<ExitStatus>) {
    let bin = program("untraced_threads", &["-O1"]);
    let mut c = spawn(&bin, args);
    let t = c.target;
    let added = c.session.add(t, "work", Action::Count).unwrap();
    let p = &added.placements[0];
    assert!(
        matches!(p.mechanism, Mechanism::Jump | Mechanism::Patch(_)),
        "{p:?}"
    );
    c.session.start().unwrap();
    support::run_until_untraced(&mut c.session, t);
    let stops = c.session.ptrace_stops(t).unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    let notices = c.session.take_notices();
    let execd = notices.iter().any(|n| n.contains("exec:"));
    if !execd {
        assert_eq!(
            c.session.ptrace_stops(t).unwrap(),
            stops,
            "no ptrace stop after the start"
        );
        assert!(c.session.ended_untraced(t), "its end seen untraced");
    }
    assert_eq!(c.session.stats(p.id).unwrap().hits, 8 * ITERS);
    (notices, c.output(), c.session.exit_status(t))
}

#[test]
fn fast_path_threads_run_untraced_with_exact_counts_and_exit_status() {
    let iters = ITERS.to_string();
    let (_, out, status) = run(&["exit", &iters, "7"]);
    assert_eq!(out, round_line());
    assert_eq!(status, Some(ExitStatus::Code(7)));
}

#[test]
fn a_sigkill_of_an_untraced_process_is_its_status() {
    let iters = ITERS.to_string();
    let (_, out, status) = run(&["kill", &iters]);
    assert_eq!(out, round_line());
    assert_eq!(status, Some(ExitStatus::Signal(9)));
}

#[test]
fn an_exec_of_an_untraced_process_is_noticed_as_when_traced() {
    let iters = ITERS.to_string();
    let (notices, out, status) = run(&["exec", &iters, "/bin/echo", "after", "exec"]);
    assert_eq!(out, format!("{}after exec\n", round_line()));
    assert!(
        notices
            .iter()
            .any(|n| n.contains("exec: 1 fast-path probes dropped")),
        "{notices:?}"
    );
    assert_eq!(status, Some(ExitStatus::Code(0)));
}

/// An exec into an image that runs on: the process is taken back at it
/// (the new image waits to see a tracer), the exec said.
#[test]
fn an_exec_of_an_untraced_process_into_a_running_image_takes_it_back() {
    let iters = ITERS.to_string();
    let bin = program("untraced_threads", &["-O1"]);
    let bin = bin.to_str().unwrap();
    let (notices, out, status) = run(&["exec", &iters, bin, "await_seize", "0"]);
    assert_eq!(out, format!("{}seized after exec\n", round_line()));
    assert!(
        notices
            .iter()
            .any(|n| n.contains("exec: 1 fast-path probes dropped")),
        "{notices:?}"
    );
    assert_eq!(status, Some(ExitStatus::Code(0)));
}

/// An exec the session has not waited for yet when it detaches: said and
/// handled as any exec, the detach writes nothing into the new image.
#[test]
fn a_detach_after_an_unwaited_exec_restores_nothing_into_the_new_image() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let bin = program("untraced_threads", &["-O1"]);
    let (read, mut write) = std::io::pipe().unwrap();
    let iters = ITERS.to_string();
    let mut c = support::spawn_with_stdin(
        &bin,
        &["exec", &iters, "/bin/cat"],
        Some(std::fs::File::from(std::os::fd::OwnedFd::from(read))),
    );
    let t = c.target;
    c.session.add(t, "work", Action::Count).unwrap();
    c.session.start().unwrap();
    support::run_until_untraced(&mut c.session, t);
    let pid = c.session.pid(t).unwrap();
    // Until the process runs cat (no wait of the session's meanwhile).
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_link(format!("/proc/{pid}/exe")).map_or(true, |p| !p.ends_with("cat")) {
        assert!(Instant::now() < deadline, "pid {pid} never ran cat");
        std::thread::yield_now();
    }
    c.session.detach().unwrap();
    let notices = c.session.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("exec: 1 fast-path probes dropped")),
        "{notices:?}"
    );
    // cat runs on, unchanged: it copies its input and ends at its EOF.
    write.write_all(b"cat's line\n").unwrap();
    drop(write);
    while !c.output().ends_with("cat's line\n") {
        assert!(Instant::now() < deadline, "cat's output: {:?}", c.output());
        std::thread::yield_now();
    }
    assert_eq!(c.output(), format!("{}cat's line\n", round_line()));
}
