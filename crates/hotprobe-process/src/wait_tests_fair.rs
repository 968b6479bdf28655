//! Scripted cases of the wait state machine (see `wait_tests.rs`) for the
//! fair service of threads (`ready.rs`): every status ready when a wait
//! returns is served, least recently served thread first, before the next
//! wait; and for the table of stray statuses that queues them, shared by
//! the targets of a session (moved here from `wait_tests.rs`).

use crate::wait_tests::{fake_target, regs_at, render, run, Case, Op, L, T2, T3, WAIT_ANY};
use crate::*;

/// A drain look: `waitpid(-1, WNOHANG | __WNOTHREAD)`.
const READY: &str = "ready 0x20000000";

/// Data watchpoint 0 set (its hits are events the cases can tell apart).
fn watch_slot0(t: &mut ProcessTarget) {
    t.watches[0] = Some(HwWatch {
        addr: 0x601000,
        len: 8,
        kind: WatchKind::Write,
    });
}

/// The calls of one watchpoint hit of `tid` at `rip`.
fn hit(tid: i32, rip: u64) -> String {
    format!(
        "get_debugreg {tid} 6 = 0xffff0ff1
         set_debugreg {tid} 6 0x0 = ok
         getregs {tid} = {}",
        regs_at(rip)
    )
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "a thread stopped again waits behind one that never was served",
            tids: &[L, T2, T3],
            setup: watch_slot0,
            ops: &[
                Op::Wait,
                Op::Resume(T3, ResumeMode::Continue),
                Op::Wait,
                Op::Wait,
            ],
            script: format!(
                "# T3 stops alone: served.
                 {WAIT_ANY} = {T3} 0x57f
                 {READY} = none
                 {}
                 cont {T3} 0 = ok
                 # T3 stops again, and T2 meanwhile: the kernel gives the
                 # newest tracee first, T3, every time; the drain takes T2
                 # too, and T2, never served, goes first ...
                 {WAIT_ANY} = {T3} 0x57f
                 {READY} = {T2} 0x57f
                 {READY} = none
                 {}
                 # ... then T3, from the queue: no wait.
                 {}",
                hit(T3, 0x401000),
                hit(T2, 0x402000),
                hit(T3, 0x403000),
            ),
            events: &[
                "watchpoint 5000003 slots=0x1 rip=0x401000",
                "watchpoint 5000002 slots=0x1 rip=0x402000",
                "watchpoint 5000003 slots=0x1 rip=0x403000",
            ],
            threads_after: &[L, T2, T3],
        },
        Case {
            name: "a batch is served whole, least recently served first, before the next wait",
            tids: &[L, T2, T3],
            setup: watch_slot0,
            ops: &[
                Op::Wait,
                Op::Wait,
                Op::Wait,
                Op::Resume(L, ResumeMode::Continue),
                Op::Resume(T2, ResumeMode::Continue),
                Op::Resume(T3, ResumeMode::Continue),
                Op::Wait,
                Op::Wait,
                Op::Wait,
            ],
            script: format!(
                "# All three stopped: the leader first (a child), then the
                 # tracees newest first; none served yet, so that order.
                 {WAIT_ANY} = {L} 0x57f
                 {READY} = {T3} 0x57f
                 {READY} = {T2} 0x57f
                 {READY} = none
                 {}
                 {}
                 {}
                 cont {L} 0 = ok
                 cont {T2} 0 = ok
                 cont {T3} 0 = ok
                 # All three again, in the kernel's order: served in the
                 # order they were served before (L, then T3, then T2).
                 {WAIT_ANY} = {L} 0x57f
                 {READY} = {T3} 0x57f
                 {READY} = {T2} 0x57f
                 {READY} = none
                 {}
                 {}
                 {}",
                hit(L, 0x401000),
                hit(T3, 0x401003),
                hit(T2, 0x401002),
                hit(L, 0x401011),
                hit(T3, 0x401013),
                hit(T2, 0x401012),
            ),
            events: &[
                "watchpoint 5000001 slots=0x1 rip=0x401000",
                "watchpoint 5000003 slots=0x1 rip=0x401003",
                "watchpoint 5000002 slots=0x1 rip=0x401002",
                "watchpoint 5000001 slots=0x1 rip=0x401011",
                "watchpoint 5000003 slots=0x1 rip=0x401013",
                "watchpoint 5000002 slots=0x1 rip=0x401012",
            ],
            threads_after: &[L, T2, T3],
        },
    ]
}

#[test]
fn fair_service_cases() {
    for case in cases() {
        run(&case);
    }
}

#[test]
fn statuses_of_other_targets_stay_in_the_shared_table_until_taken() {
    let other = 6_000_001;
    let script = format!(
        "{WAIT_ANY} = {other} 0x137f
         {WAIT_ANY} = {L} 0x0"
    );
    let (mut a, _os) = fake_target(L, &[L], &script);
    let shared = Strays::new();
    a.share_strays(&shared);
    assert_eq!(render(&a.wait(None).expect("wait")), "exited Code(0)");
    // Another target's stop stays for it (task 6000001 has no /proc entry
    // but nothing pruned it: prunes happen when a status is stashed).
    assert_eq!(shared.entries(), vec![(other, 0x137f)]);
    let (mut b, os_b) = fake_target(other, &[other], "cont 6000001 19 = ok");
    b.share_strays(&shared);
    assert_eq!(b.strays.take(other), Some(0x137f));
    assert_eq!(
        b.handle_status(other, 0x137f, false).expect("handled"),
        None
    );
    assert!(os_b.remaining().is_empty());
    assert!(shared.is_empty());
    b.attached = false;
    a.attached = false;
}

#[test]
fn a_target_forgets_its_strays_when_dropped() {
    let shared = Strays::new();
    let (mut t, _os) = fake_target(L, &[L, T2], "");
    t.share_strays(&shared);
    shared.stash(T2, 0x0);
    shared.stash(7_000_001, 0x0);
    t.attached = false;
    drop(t);
    assert_eq!(shared.entries(), vec![(7_000_001, 0x0)]);
}
