//! Which stopped thread a remote call runs on, through the scripted fake
//! of the ptrace layer: never one inside its clone call while another is
//! there, and a lone one at its fork event only once the call is done.

use crate::wait_tests::{fake_target, L, T2, T3};
use crate::RunState;
use hotprobe_target::Target;

/// A thread parked at its clone event is inside clone3: run on, it would
/// finish the call first (the kernel writing the result into rax), so a
/// remote call goes to another stopped thread, even one of a higher tid
/// (the leader's clone3 "failed" with the restored -ENOSYS, and glibc
/// started the thread again with clone: count -p crashed programs making
/// threads at detach).
#[test]
fn a_thread_inside_its_clone_call_is_not_the_one_remote_calls_run_on() {
    let script = format!(
        "interrupt {L} = ok
         interrupt {T2} = ok
         waitpid {L} 0x1 = {L} 0x3057f
         geteventmsg {L} = {T3}
         waitpid {T3} 0x0 = {T3} 0x80057f
         waitpid {T2} 0x0 = {T2} 0x80057f"
    );
    let (mut t, os) = fake_target(L, &[L, T2], &script);
    t.stop_all().expect("stop_all");
    assert!(os.remaining().is_empty(), "{:?}", os.remaining());
    assert_eq!(t.threads[&L].state, RunState::Parked);
    assert_eq!(t.any_stopped_thread(), Some(T2));
    // With no other thread stopped, the leader is all there is.
    t.threads.retain(|tid, _| *tid == L);
    assert_eq!(t.any_stopped_thread(), Some(L));
    t.attached = false;
}

/// A single-threaded program at its fork event stop: before a remote
/// call runs on its only thread, the fork call is finished (to its exit
/// stop, a signal that came meanwhile kept for later), so the program
/// gets the child's pid in rax, not the stop's -ENOSYS.
#[test]
fn a_lone_thread_at_its_fork_finishes_the_call_before_a_remote_call() {
    let script = format!(
        "syscall {L} 0 = ok
         # SIGCHLD first (held), then the fork's exit stop.
         waitpid {L} 0x0 = {L} 0x117f
         syscall {L} 0 = ok
         waitpid {L} 0x0 = {L} 0x57f"
    );
    let (mut t, os) = fake_target(L, &[L], &script);
    // Stopped at its fork event (the child already handled).
    let th = t.threads.get_mut(&L).unwrap();
    th.state = RunState::Event;
    th.last_event = libc::PTRACE_EVENT_FORK;
    assert_eq!(t.thread_for_remote().expect("finished"), Some(L));
    assert!(os.remaining().is_empty(), "{:?}", os.remaining());
    assert_eq!(t.threads[&L].last_event, 0);
    assert_eq!(t.threads[&L].held_signals, vec![libc::SIGCHLD]);
    // Finished once: the next remote call takes it as it is.
    assert_eq!(t.thread_for_remote().expect("as is"), Some(L));
    t.attached = false;
}
