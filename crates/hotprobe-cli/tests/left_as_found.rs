//! A running process that `count -p` and `record -p` (a hooked return:
//! shadow stacks) attached to, probed and detached from keeps exactly the
//! mappings it had before (issue 23, "live servers left as found"): not
//! only nothing named after hotprobe, but no anonymous memory of the
//! agent's either (its shadow stacks and their arena, unnamed in
//! `/proc/PID/maps`). The counts and recorded calls equal the calls made,
//! and the program's output and exit status are its own. The program
//! (tests/programs/two_sessions.c) is driven line by line through pipes.

mod common;

use common::attached::CountAttached;
use common::record::{info, trace_dir};
use common::two_sessions::{exit_3, started, N, WAIT};
use common::CountTable;

/// `pid`'s mappings, one line each (ranges, permissions, names).
fn maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
}

/// Runs one round (`N` calls of `work`) under `hotprobe COMMAND -p PID
/// work`, then Ctrl-C; returns hotprobe's stdout and stderr.
fn one_round_attached(command: &[&str], p: &mut common::two_sessions::Program) -> (String, String) {
    let s = CountAttached::start_as(command, p.pid, &["work"], WAIT);
    assert!(
        s.first.contains(&format!("attached to pid {}", p.pid)),
        "{}\n{:?}",
        s.first,
        s.said_so_far()
    );
    p.round();
    let (status, out, err) = s.interrupt();
    assert!(status.success(), "{command:?}: {status}\n{out}\n{err}");
    assert!(err.contains("interrupted: detached"), "{err}");
    (out, err)
}

#[test]
fn count_and_record_p_leave_the_process_mappings_as_they_were() {
    let (child, mut p) = started();
    let pid = p.pid;
    // A first round unattached: whatever the program maps for a round
    // (stdio buffers) is in before the snapshot.
    p.round();
    let before = maps(pid);

    let (out, err) = one_round_attached(&["count"], &mut p);
    assert_eq!(
        CountTable::parse(&out, &err).hits("work"),
        N,
        "{out}\n{err}"
    );
    assert_eq!(maps(pid), before, "after count -p:\n{err}");

    let trace = trace_dir("left-as-found");
    let (_, err) = one_round_attached(
        &["record", "--force", "-o", trace.to_str().unwrap()],
        &mut p,
    );
    let recorded = info(&trace, WAIT);
    assert_eq!((recorded.calls, recorded.lost), (N, 0), "{err}");
    assert_eq!(maps(pid), before, "after record -p:\n{err}");
    assert_eq!(
        hotprobe_testkit::text_differences(pid, &common::two_sessions::program()),
        vec![]
    );
    let _ = std::fs::remove_dir_all(&trace);

    // It runs on, as it would have.
    p.round();
    exit_3(child, p);
}
