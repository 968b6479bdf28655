//! Shared-memory handlers and the agent's limits (issue 22): a handler on
//! `clock_gettime` or `syscall` runs for the program's calls only (the
//! agent's own waits read the clock and sleep by the system call, not
//! through libc), and handler slots are given back when threads exit, so
//! that handlers keep running past the 256th thread ever created; they
//! grow on demand, so that 1,500 threads alive at once all have one.
//!
//! The C programs are the CLI tests' (crates/hotprobe-cli/tests/programs);
//! every assertion compares with what they printed.

mod support;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use hotprobe::{Action, ExitStatus, Placement, RunEnd};
use support::{lines_with, spawn, Captured};

/// Long enough that a loaded machine starving the session of CPU
/// withdraws no call.
const SERVED: Duration = Duration::from_secs(60);

/// As [`SERVED`], for 1,500 threads served in turn.
const SERVED_MANY: Duration = Duration::from_secs(120);

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

/// Probe `spec` of the spawned program with `action`: its placement.
fn placed(c: &mut Captured, spec: &str, action: Action) -> Placement {
    c.session.add(c.target, spec, action).unwrap().placements[0].clone()
}

/// Runs the started session to its end: the program's output, once it
/// exited with status 0.
fn ran_to_exit_0(c: &mut Captured) -> String {
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    let status = c.session.exit_status(c.target);
    assert!(matches!(status, Some(ExitStatus::Code(0))), "{status:?}");
    c.output()
}

/// What `bin args` prints run alone (it exits 0).
fn alone(bin: &Path, args: &[&str]) -> String {
    let o = std::process::Command::new(bin).args(args).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout).unwrap()
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
    let mut probes = Vec::new();
    for spec in ["clock_gettime", "syscall"] {
        let (probe, seen) = counting();
        probes.push((spec, placed(&mut c, spec, Action::Handler(probe)).id, seen));
    }
    c.session.start().unwrap();
    let out = ran_to_exit_0(&mut c);
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
    let (probe, seen) = counting();
    let id = placed(&mut c, "work", Action::Handler(probe)).id;
    c.session.start().unwrap();
    let out = ran_to_exit_0(&mut c);
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
    let (probe, seen) = counting();
    let id = placed(&mut c, "work", Action::Handler(probe)).id;
    c.session.start().unwrap();
    let out = ran_to_exit_0(&mut c);
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
    let (probe, seen) = counting();
    let id = placed(&mut c, "work", Action::Handler(probe)).id;
    c.session.start().unwrap();
    let out = ran_to_exit_0(&mut c);
    let (before, after) = (printed(&out, "before "), printed(&out, "after "));
    assert_eq!((before, after), (300, 300));
    let st = c.session.stats(id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (600, before, after));
}

/// Handler slots grow on demand: 1,500 threads alive at once, each
/// waiting at a barrier and then calling a function that has a
/// shared-memory handler, hold 1,500 handler slots at once — past the
/// trap table's 256 and the first chunk's 1,024 thread slots. Every call
/// runs the handler: none is missed for lack of a slot (`waves.c`, 64 KiB
/// thread stacks).
#[test]
fn fifteen_hundred_threads_alive_at_once_all_run_their_handlers() {
    let bin = build("waves");
    // 1 wave of 1,500 threads, 2 calls each, all alive at once.
    let mut c = spawn(&bin, &["1", "1500", "2", "1"]);
    // Threads sleep on their slot while the session serves the others.
    c.session.set_handler_spin(Duration::ZERO);
    c.session.set_handler_timeout(SERVED_MANY);
    let (probe, seen) = counting();
    let id = placed(&mut c, "work", Action::Handler(probe)).id;
    c.session.start().unwrap();
    let out = ran_to_exit_0(&mut c);
    assert_eq!(printed(&out, "threads "), 1500);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 3000);
    let st = c.session.stats(id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (calls, calls, 0));
}

/// A shared-memory handler and a ptrace trap in one traced process: a
/// handler on `clock_gettime` (served through the doorbell) and a return
/// probe on `syscall` (the engine's trap: two ptrace stops a call, entry
/// and return), called in turn 2,000 times by one thread. The session's
/// wait for handler calls also ends at each stop (the waiter thread rings
/// the doorbell): every call runs its handler once, every `syscall`
/// returns the program's pid to the return handler, and the program's
/// output and exit status are those of a run without hotprobe. (A stop
/// that did not end the wait would wait out the untimed serve's bound,
/// 1 s, 4,000 times.)
#[test]
fn a_trap_stop_ends_the_wait_for_handler_calls_in_a_traced_process() {
    let bin = build("own_calls");
    let native = alone(&bin, &["2000"]);
    let mut c = spawn(&bin, &["2000"]);
    // Sleeping at once on both sides: only a ring wakes the session.
    c.session.set_handler_spin(Duration::ZERO);
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let pid = c.session.pid(t).unwrap() as u64;
    let (probe, seen) = counting();
    let handled = placed(&mut c, "clock_gettime", Action::Handler(probe));
    assert_ne!(handled.mechanism, hotprobe::Mechanism::Trap, "{handled:?}");
    let returns = Rc::new(Cell::new(0u64));
    let wrong = Rc::new(Cell::new(0u64));
    let (r, w) = (returns.clone(), wrong.clone());
    let ret = hotprobe::RetProbe::new(4).ret(move |ctx| {
        r.set(r.get() + 1);
        if ctx.regs().rax != pid {
            w.set(w.get() + 1);
        }
    });
    let trapped = placed(&mut c, "syscall", Action::Return(ret));
    assert_eq!(trapped.mechanism, hotprobe::Mechanism::Trap, "{trapped:?}");
    c.session.start().unwrap();
    assert!(!c.session.is_untraced(t), "the trap keeps it traced");
    let out = ran_to_exit_0(&mut c);
    assert_eq!(out, native);
    let (clocks, syscalls) = (printed(&out, "clock_gettime "), printed(&out, "syscall "));
    assert_eq!((clocks, syscalls), (2000, 2000));
    let st = c.session.stats(handled.id).unwrap();
    assert_eq!(
        (st.hits, seen.get(), st.nmissed),
        (clocks, clocks, 0),
        "clock_gettime: hits, handler runs, missed"
    );
    assert_eq!(c.session.stats(trapped.id).unwrap().hits, syscalls);
    assert_eq!(
        (returns.get(), wrong.get()),
        (syscalls, 0),
        "syscall returns"
    );
}

/// As above with threads: 4 waves of 10 threads, each calling `work` 50
/// times with a handler on it, in a process kept traced by a return probe
/// on `pthread_create` (a trap). Each thread's start and end are ptrace
/// stops that end the wait for handler calls as a call does, among the
/// threads' calls: none is lost or counted wrong. Every call runs its
/// handler, every `pthread_create` returns 0 to the return handler, and
/// the program prints what it prints alone.
#[test]
fn thread_starts_and_ends_end_the_wait_for_handler_calls_in_a_traced_process() {
    let bin = build("waves");
    let args = ["4", "10", "50"];
    let native = alone(&bin, &args);
    let mut c = spawn(&bin, &args);
    c.session.set_handler_timeout(SERVED);
    let t = c.target;
    let (probe, seen) = counting();
    let handled = placed(&mut c, "work", Action::Handler(probe));
    assert_ne!(handled.mechanism, hotprobe::Mechanism::Trap, "{handled:?}");
    let returns = Rc::new(Cell::new(Vec::new()));
    let r = returns.clone();
    let ret = hotprobe::RetProbe::new(4).ret(move |ctx| {
        let mut v = r.take();
        v.push(ctx.regs().rax);
        r.set(v);
    });
    let trapped = placed(&mut c, "pthread_create", Action::Return(ret));
    assert_eq!(trapped.mechanism, hotprobe::Mechanism::Trap, "{trapped:?}");
    c.session.start().unwrap();
    assert!(!c.session.is_untraced(t), "the trap keeps it traced");
    let out = ran_to_exit_0(&mut c);
    assert_eq!(out, native);
    let (threads, calls) = (printed(&out, "threads "), printed(&out, "calls "));
    assert_eq!((threads, calls), (40, 2000));
    let st = c.session.stats(handled.id).unwrap();
    assert_eq!((st.hits, seen.get(), st.nmissed), (calls, calls, 0));
    assert_eq!(
        returns.take(),
        vec![0; threads as usize],
        "pthread_create returns"
    );
}
