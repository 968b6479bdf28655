//! Scripted cases of the wait state machine (see `wait_tests.rs`) for a
//! leader that called `pthread_exit` while its threads run on: a zombie
//! the kernel never reports stopped.

use crate::wait_tests::{no_setup, run, Case, Op, L, T2, T3, WAIT_ANY};

fn cases() -> Vec<Case> {
    vec![
        Case {
            name:
                "a leader that called pthread_exit is not waited for; its status is the process's",
            tids: &[L, T2, T3],
            setup: no_setup,
            ops: &[
                Op::StopAll,
                Op::ResumeAll,
                Op::Wait,
                Op::Wait,
                Op::Wait,
                Op::Wait,
            ],
            script: format!(
                "# main called pthread_exit: its task is a zombie, the kernel
                 # takes the interrupt and never reports it stopped.
                 interrupt {L} = ok
                 interrupt {T2} = ok
                 interrupt {T3} = ok
                 waitpid {L} 0x1 = none
                 {WAIT_ANY} = {T2} 0x80057f
                 waitpid {L} 0x1 = none
                 {WAIT_ANY} = {T3} 0x80057f
                 # Every other thread parked, nothing from the leader: its
                 # state says why (the wait hung here, detach with it).
                 waitpid {L} 0x1 = none
                 task_state {L} {L} = Z
                 cont {T2} 0 = ok
                 cont {T3} 0 = ok
                 # T3 calls exit(7): the threads' exits, then the leader's
                 # status, the process's.
                 {WAIT_ANY} = {T2} 0x700
                 {WAIT_ANY} = {T3} 0x700
                 {WAIT_ANY} = {L} 0x700"
            ),
            events: &[
                "thread-exited 5000001",
                "thread-exited 5000002",
                "thread-exited 5000003",
                "exited Code(7)",
            ],
            threads_after: &[],
        },
        Case {
            name: "a leader still in its exit is waited for with a deadline, then seen a zombie",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::StopAll, Op::ResumeAll],
            script: format!(
                "interrupt {L} = ok
                 interrupt {T2} = ok
                 waitpid {L} 0x1 = none
                 {WAIT_ANY} = {T2} 0x80057f
                 waitpid {L} 0x1 = none
                 # Not yet a zombie (it may be on its way to the stop too):
                 # no blocking wait, which a zombie would never end.
                 task_state {L} {L} = R
                 waitpid_timeout -1 0x20000000 = none
                 waitpid {L} 0x1 = none
                 task_state {L} {L} = Z
                 cont {T2} 0 = ok"
            ),
            events: &[],
            threads_after: &[T2],
        },
        Case {
            name: "a leader that stops after a look at its state is parked as any thread",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::StopAll, Op::ResumeAll],
            script: format!(
                "interrupt {L} = ok
                 interrupt {T2} = ok
                 waitpid {L} 0x1 = none
                 {WAIT_ANY} = {T2} 0x80057f
                 waitpid {L} 0x1 = none
                 task_state {L} {L} = S
                 waitpid_timeout -1 0x20000000 = {L} 0x80057f
                 cont {L} 0 = ok
                 cont {T2} 0 = ok"
            ),
            events: &[],
            threads_after: &[L, T2],
        },
    ]
}

#[test]
fn zombie_leader_cases() {
    for case in cases() {
        run(&case);
    }
}
