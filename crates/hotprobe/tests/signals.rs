//! Library code installs no process-wide signal handler: a whole session
//! (two traced programs, so that its waits have deadlines, probed with
//! ptrace traps, run to their exit) leaves the handler this test installed
//! for SIGRTMIN+6 (the signal the target's timed waits used to take over)
//! as it was.

mod support;

use hotprobe::{Action, MechanismChoice, RunEnd, Session, SessionConfig, SpawnOptions};
use hotprobe_testkit::{install_counting_handler, signal_action, sigrtmin_plus, HANDLER_CALLS};
use std::sync::atomic::{AtomicBool, Ordering};
use support::*;

#[test]
fn a_session_leaves_the_hosts_signal_handlers_alone() {
    let sig = sigrtmin_plus(6);
    let before = install_counting_handler(sig);

    let bin = program("threads", &["-O1"]);
    let mut s = Session::with_config(SessionConfig {
        mechanism: MechanismChoice::Trap,
        ..SessionConfig::default()
    });
    let args: Vec<std::ffi::OsString> = vec!["50".into()];
    let quiet = || SpawnOptions {
        stdout: Some(std::fs::File::create("/dev/null").expect("/dev/null")),
        ..SpawnOptions::default()
    };
    let a = s.spawn_with(&bin, &args, &quiet()).expect("spawn a");
    let b = s.spawn_with(&bin, &args, &quiet()).expect("spawn b");
    let pa = s.add(a, "work", Action::Count).expect("probe a").placements[0].id;
    let pb = s.add(b, "work", Action::Count).expect("probe b").placements[0].id;
    s.start().expect("start");
    let end = s.run_until(&AtomicBool::new(false)).expect("run");
    assert_eq!(end, RunEnd::AllExited);
    // 8 threads × 50 calls in each program: every hit seen, though each
    // target's waits reap the other's statuses (the session's strays).
    assert_eq!(s.stats(pa).expect("stats a").hits, 400);
    assert_eq!(s.stats(pb).expect("stats b").hits, 400);
    assert_eq!(s.exit_status(a), Some(hotprobe::ExitStatus::Code(0)));
    assert_eq!(s.exit_status(b), Some(hotprobe::ExitStatus::Code(0)));
    drop(s);

    assert_eq!(
        signal_action(sig),
        before,
        "the handler of SIGRTMIN+6 was replaced"
    );
    assert_eq!(
        HANDLER_CALLS.load(Ordering::Relaxed),
        0,
        "the host's handler ran"
    );
}
