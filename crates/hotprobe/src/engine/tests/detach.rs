//! Detach, and a fork, while threads are inside followed calls: whatever
//! the engine changed in the target (return addresses on stacks, threads
//! in out-of-line slots, `int3` bytes, scratch memory) is undone, and each
//! thread returns to its real callers.

use super::machine::{RunState, Stop, World};
use super::*;
use crate::engine::{Holds, Report};
use crate::Probe;
use hotprobe_target::{ExitStatus, ResumeMode, TargetEvent, ThreadId};
use std::cell::Cell;

/// Where thread 2 is when the engine detaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// Running inside `inner`, three followed calls deep.
    Parked,
    /// Single-stepping `inner`'s probed `mov eax, 42` out of line (a probe
    /// with a post handler): the step is done when the engine stops it.
    MidStep,
    /// `inner` returned: its `ret` trapped (on the trampoline, or at a
    /// return breakpoint) and the engine has not seen that event yet.
    ReturnPending,
    /// Back from a signal handler that ran on an alternate stack and
    /// called a return-probed function: the interrupted frames were
    /// dropped as left, their slots still hold the trampoline.
    AfterSignal,
}

#[test]
fn detach_while_threads_hold_trampoline_return_addresses() {
    use ReturnStrategy::{BreakpointAtReturn as AtReturn, Trampoline};
    let rows = [
        (Trampoline, Where::Parked),
        (Trampoline, Where::MidStep),
        (Trampoline, Where::ReturnPending),
        (Trampoline, Where::AfterSignal),
        (AtReturn, Where::Parked),
        (AtReturn, Where::MidStep),
        (AtReturn, Where::ReturnPending),
    ];
    for (strategy, at) in rows {
        let name = format!("{strategy:?}, thread 2 {at:?}");
        let mut rig = Rig::new(MAIN, &[1, 2], strategy);
        let log = Returns::default();
        for (func, fname) in [(OUTER, "outer"), (MIDDLE, "middle"), (INNER, "inner")] {
            recorded(&mut rig, func, fname, 8, &log);
        }
        let posts = Rc::new(Cell::new(0));
        if at == Where::MidStep {
            let p = posts.clone();
            let probe = Probe::new().post(move |_| p.set(p.get() + 1));
            rig.engine
                .add_probe(RuntimeAddr(INNER_BODY), probe)
                .unwrap();
        }
        if at == Where::AfterSignal {
            recorded(&mut rig, LEAF, "leaf", 8, &log);
        }
        rig.start();
        let trampoline = rig.engine.trampoline.map(|t| t.0);
        let top = World::stack_top(2);

        match at {
            Where::Parked => {
                assert_eq!(rig.drive(2, &[INNER_BODY]), Stop::At(INNER_BODY), "{name}");
            }
            Where::MidStep => {
                // The hit at inner's body: the engine sends the thread to
                // step the instruction's copy in its slot.
                let hit = rig.drive_to_trap(2, INNER_BODY);
                rig.engine.handle(hit).unwrap();
                let w = rig.world.borrow();
                assert_eq!(w.state(2), RunState::Running(ResumeMode::Step), "{name}");
                assert!(rig.engine.in_scratch(RuntimeAddr(w.regs(2).rip)), "{name}");
            }
            Where::ReturnPending => {
                assert_eq!(rig.drive(2, &[INNER_BODY]), Stop::At(INNER_BODY), "{name}");
                let ev = rig.drive_to_trap(2, trampoline.unwrap_or(MIDDLE_RET));
                rig.world.borrow_mut().pending.push_back(ev);
            }
            Where::AfterSignal => {
                const ALT_TOP: u64 = 0x7fff_8000;
                assert_eq!(rig.drive(2, &[INNER_BODY]), Stop::At(INNER_BODY), "{name}");
                let interrupted = rig.world.borrow().regs(2);
                {
                    let mut w = rig.world.borrow_mut();
                    w.map(ALT_TOP - 0x1000, 0x1000);
                    w.set_word(ALT_TOP - 8, SIGRETURN);
                    w.program_sets(2, |r| {
                        r.rsp = ALT_TOP - 8;
                        r.rip = HANDLER;
                    });
                }
                assert_eq!(rig.drive(2, &[]), Stop::Halted(SIGRETURN), "{name}");
                rig.world.borrow_mut().program_sets(2, |r| *r = interrupted);
            }
        }
        // Thread 1 hits outer's entry; the engine has not seen it yet.
        let ev = rig.drive_to_trap(1, OUTER);
        rig.world.borrow_mut().pending.push_back(ev);
        if let Some(t) = trampoline {
            let w = rig.world.borrow();
            assert!(!w.stack_words_equal_to(t).is_empty(), "{name}");
        }
        let resumes = rig.world.borrow().resumes.len();

        rig.engine.detach().unwrap();

        let gone = Some(ExitStatus::Disconnected("detached".into()));
        assert_eq!(rig.engine.gone(), gone.as_ref(), "{name}");
        {
            let w = rig.world.borrow();
            assert!(w.detached, "{name}");
            assert_eq!(
                w.resumes.len(),
                resumes,
                "{name}: a thread resumed at detach"
            );
            assert!(w.pending.is_empty(), "{name}: events left unread");
            assert!(w.breakpoints.is_empty(), "{name}");
            assert!(
                w.code_is_original(),
                "{name}: the code differs from the file"
            );
            assert!(!w.has_scratch(), "{name}");
            // Thread 2's live return-address slots hold its real callers.
            let regs = w.regs(2);
            assert_eq!(w.word(top - 8), MAIN_RET, "{name}: outer's return");
            assert_eq!(w.word(top - 24), OUTER_RET, "{name}: middle's return");
            match at {
                Where::ReturnPending => assert_eq!(regs.rip, MIDDLE_RET, "{name}"),
                Where::MidStep => {
                    assert_eq!((regs.rip, regs.rax), (INNER_BODY + 5, 42), "{name}");
                    assert_eq!(w.word(top - 40), MIDDLE_RET, "{name}: inner's return");
                }
                Where::Parked | Where::AfterSignal => {
                    assert_eq!(regs.rip, INNER_BODY, "{name}");
                    assert_eq!(w.word(top - 40), MIDDLE_RET, "{name}: inner's return");
                }
            }
            if let Some(t) = trampoline {
                // (A dead slot on the alternate stack may keep it.)
                let live: Vec<u64> = w
                    .stack_words_equal_to(t)
                    .into_iter()
                    .filter(|a| (regs.rsp..top).contains(a))
                    .collect();
                assert!(live.is_empty(), "{name}: trampoline left at {live:x?}");
            }
            assert_eq!(w.regs(1).rip, OUTER, "{name}: thread 1 not at outer");
        }
        assert_eq!(posts.get(), 0, "{name}: a handler ran during detach");
        let returns_before = log.borrow().len();
        // Both threads run on without the engine and return to main.
        for t in [1, 2] {
            let mut w = rig.world.borrow_mut();
            assert_eq!(w.run(t, &[]), Stop::Halted(MAIN_END), "{name}: thread {t}");
            let regs = w.regs(t);
            assert_eq!((regs.rsp, regs.rax), (World::stack_top(t), 1), "{name}");
        }
        assert_eq!(log.borrow().len(), returns_before, "{name}");
    }
}

#[test]
fn a_forked_child_gets_the_real_return_addresses() {
    let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
    let log = Returns::default();
    let ids = [(OUTER, "outer"), (MIDDLE, "middle"), (INNER, "inner")]
        .map(|(f, n)| recorded(&mut rig, f, n, 8, &log));
    // Bytes another mechanism wrote: the child gets their originals too.
    let patched = (RuntimeAddr(LEAF), vec![0xb8]);
    rig.engine.set_fork_restores(vec![patched.clone()]);
    rig.start();
    assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY));
    let top = World::stack_top(1);
    // inner forks (the thread stops for the event).
    rig.world.borrow_mut().stop_for_event(1);
    let fork = TargetEvent::Forked {
        thread: ThreadId(1),
        child: 99,
    };
    rig.engine.handle(fork).unwrap();
    {
        let w = rig.world.borrow();
        assert_eq!(w.state(1), RunState::Running(ResumeMode::Continue));
        let [(child, restores)] = &w.released[..] else {
            panic!("one child released, got {:?}", w.released);
        };
        assert_eq!(*child, 99);
        let word = |a: u64, v: u64| (RuntimeAddr(a), v.to_le_bytes().to_vec());
        let expected = vec![
            patched,
            word(top - 8, MAIN_RET),
            word(top - 24, OUTER_RET),
            word(top - 40, MIDDLE_RET),
        ];
        assert_eq!(*restores, expected);
    }
    // The parent keeps its probes.
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END));
    assert_eq!(ids.map(|id| rig.counts(id)), [[1, 1, 0, 0]; 3]);
    assert_eq!(log.borrow().len(), 3);
}

#[test]
fn a_forked_child_held_for_the_session_is_reported_with_its_stack_fixes() {
    let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
    let log = Returns::default();
    let ids = [(OUTER, "outer"), (MIDDLE, "middle"), (INNER, "inner")]
        .map(|(f, n)| recorded(&mut rig, f, n, 8, &log));
    // A followed child keeps the other mechanisms' code: no restore of it.
    rig.engine
        .set_fork_restores(vec![(RuntimeAddr(LEAF), vec![0xb8])]);
    rig.start();
    assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY));
    let top = World::stack_top(1);
    rig.world.borrow_mut().stop_for_event(1);
    let fork = TargetEvent::Forked {
        thread: ThreadId(1),
        child: 99,
    };
    let holds = Holds {
        forks: true,
        exec: false,
    };
    rig.engine.handle_holding(fork, holds).unwrap();
    {
        let w = rig.world.borrow();
        assert_eq!(w.state(1), RunState::Running(ResumeMode::Continue));
        assert!(
            w.released.is_empty(),
            "held, not released: {:?}",
            w.released
        );
    }
    let word = |a: u64, v: u64| (RuntimeAddr(a), v.to_le_bytes().to_vec());
    let reports = rig.engine.take_reports();
    let [Report::Forked { child, fixes }] = &reports[..] else {
        panic!("one held child and no notice, got {reports:?}");
    };
    assert_eq!(*child, 99);
    assert_eq!(
        *fixes,
        vec![
            word(top - 8, MAIN_RET),
            word(top - 24, OUTER_RET),
            word(top - 40, MIDDLE_RET),
        ]
    );
    assert!(rig.engine.take_reports().is_empty(), "drained");
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END));
    assert_eq!(ids.map(|id| rig.counts(id)), [[1, 1, 0, 0]; 3]);
}
