//! A second hotprobe session on a process another session probes is
//! refused, naming the first session's pid (issue 22): whether the first
//! holds it by ptrace (a trap probe), runs it released with a jump, or
//! started it with an in-process trap in (before, the second session
//! re-attached the agent to its own memory, and the first session's next
//! in-process trap killed the program with SIGTRAP). The program and the
//! first session are untouched: its counts equal the calls made, the
//! program's output and exit status are its own, and its text equals the
//! file once the sessions are gone. A session that ended, normally or
//! killed with SIGKILL (its agent put its sites back), is no hold: the
//! next one attaches. The program (tests/programs/two_sessions.c) is
//! driven line by line through pipes.

mod common;

use common::attached::CountAttached;
use common::two_sessions::{exit_3, program, started, tracer_of, under_count, N, WAIT};
use common::{hotprobe_within, text, untraced, CountTable};

/// A `count -p` session, past its "attached" line (and, `released`, until
/// the process runs untraced).
struct Attached(CountAttached);

impl Attached {
    fn start(pid: u32, probes: &[&str], released: bool) -> Attached {
        let s = CountAttached::start_explaining_release(pid, probes, WAIT);
        assert!(
            s.first.contains(&format!("attached to pid {pid}")),
            "{}",
            s.first
        );
        s.until_released(pid, released, WAIT);
        Attached(s)
    }

    /// Ctrl-C: the session detaches; its count table.
    fn interrupt(self) -> CountTable {
        let (status, stdout, stderr) = self.0.interrupt();
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("interrupted: detached"), "{stderr}");
        CountTable::parse(&stdout, &stderr)
    }
}

/// `count -p PID probe` while another session holds PID: refused with
/// exactly the line naming that session, exit 1, nothing done.
fn refused(pid: u32, probe: &str, session: u32) {
    let out = hotprobe_within(&["count", probe, "-p", &pid.to_string()], WAIT);
    assert_eq!(
        text(&out.stderr),
        format!(
            "hotprobe: error: pid {pid} is probed by another hotprobe session (pid {session}); \
             detach it first\n"
        )
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn a_session_holding_or_releasing_an_attached_process_keeps_it_from_a_second() {
    let (child, mut p) = started();
    let pid = p.pid;
    // Released: `work` takes a jump, nothing keeps the process traced.
    let first = Attached::start(pid, &["work"], true);
    p.round();
    refused(pid, "work", first.0.id());
    refused(pid, "tiny", first.0.id());
    p.round();
    let t = first.interrupt();
    assert_eq!(t.hits("work"), 2 * N);
    assert_eq!(hotprobe_testkit::text_differences(pid, &program()), vec![]);
    // Ended: the next session attaches. Held by ptrace: `tiny` takes a
    // trap (the agent injected into a running process cannot keep
    // SIGTRAP unblocked for an in-process one).
    let second = Attached::start(pid, &["work", "tiny"], false);
    assert_eq!(second.0.id() as i32, tracer_of(pid));
    p.round();
    refused(pid, "work", second.0.id());
    p.round();
    let t = second.interrupt();
    assert_eq!((t.hits("work"), t.hits("tiny")), (2 * N, 2 * N));
    assert!(t.execution("tiny").starts_with("trap"), "{}", t.all);
    assert_eq!(hotprobe_testkit::text_differences(pid, &program()), vec![]);
    assert!(untraced(pid));
    p.round();
    exit_3(child, p);
}

/// The original hostile case: a session that started the program with an
/// in-process trap in, running it untraced; a second `count -p` on it.
#[test]
fn a_second_session_on_a_started_process_with_in_process_traps_is_refused() {
    let (mut hp, err, mut p) = under_count();
    assert!(untraced(p.pid), "the program runs released");
    p.round();
    refused(p.pid, "tiny", hp.id());
    refused(p.pid, "work", hp.id());
    p.round();
    p.say("exit 3");
    let mut out = Vec::new();
    while let Ok(l) = p.lines.recv_timeout(WAIT) {
        out.push(l);
    }
    let status = hp.wait().unwrap();
    let rest: Vec<String> = err.iter().collect();
    assert_eq!(status.code(), Some(3), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| l == &format!("hotprobe: pid {} exited with code 3", p.pid)),
        "{rest:?}"
    );
    // The program's own lines were read round by round: nothing of its
    // follows, only the table.
    let stdout = out.join("\n") + "\n";
    assert_eq!(common::program_output(&stdout), "");
    let t = CountTable::parse(&stdout, &rest.join("\n"));
    assert_eq!((t.hits("tiny"), t.hits("work")), (2 * N, 2 * N));
    assert!(t.execution("tiny").starts_with("in-process"), "{}", t.all);
}

/// A session killed with SIGKILL holds nothing once its agent put its
/// sites back: the next session takes the agent over and counts exactly.
#[test]
fn a_killed_sessions_agent_is_taken_over_once_its_sites_are_back() {
    let (child, mut p) = started();
    let pid = p.pid;
    let first = Attached::start(pid, &["work"], true);
    p.round();
    first.0.kill();
    p.round();
    let second = Attached::start(pid, &["work"], true);
    p.round();
    let t = second.interrupt();
    assert_eq!(t.hits("work"), N);
    // Nothing took the process back while the second session ran (a
    // site found reverted, say): a take-back is followed by a release
    // now, but nothing here changes the program's code.
    for unexpected in [
        "release of slot 0: taken back",
        "held the original code again",
    ] {
        assert!(!t.all.contains(unexpected), "{}", t.all);
    }
    assert_eq!(hotprobe_testkit::text_differences(pid, &program()), vec![]);
    p.round();
    exit_3(child, p);
}
