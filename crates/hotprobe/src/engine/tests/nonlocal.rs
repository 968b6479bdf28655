//! Return probes against frames left without a return: `longjmp` past
//! followed calls, exceptions unwound through them, a signal handler on an
//! alternate stack, a thread ending inside them; and `maxactive` on
//! recursion. `outer`, `middle` and `inner` call each other; each has a
//! return probe. Stack slots are named from thread 1's first stack
//! pointer `r0`: `outer`'s return address is at `r0 - 8`, `middle`'s at
//! `r0 - 24`, `inner`'s at `r0 - 40` (each function pushes `rbp` first).

use super::machine::{Stop, World, CODE_LEN, DATA};
use super::*;
use crate::nonlocal::UnwindHook;
use hotprobe_target::{TargetEvent, ThreadId};

/// The stack pointer thread 1 starts with.
fn r0() -> u64 {
    World::stack_top(1)
}

/// Return probes on `outer`, `middle`, `inner`, in that order.
fn three_probes(rig: &mut Rig, maxactive: usize, log: &Returns) -> [ProbeId; 3] {
    [
        recorded(rig, OUTER, "outer", maxactive, log),
        recorded(rig, MIDDLE, "middle", maxactive, log),
        recorded(rig, INNER, "inner", maxactive, log),
    ]
}

/// One row of [`longjmp_past_live_return_instances`].
struct Longjmp {
    name: &'static str,
    /// Where `longjmp` lands in `outer` (with `outer`'s stack pointer),
    /// `None` for no `longjmp` at all.
    landing: Option<u64>,
    maxactive: usize,
    /// `[hits, returns, nmissed, abandoned]` of `outer`, `middle`, `inner`.
    counts: [[u64; 4]; 3],
    /// What the return handlers saw: name, caller's `rip`, `rax`, depth.
    returns: &'static [(&'static str, u64, u64, usize)],
}

#[test]
fn longjmp_past_live_return_instances() {
    const ALL_RETURN: &[(&str, u64, u64, usize)] = &[
        ("inner", MIDDLE_RET, 42, 2),
        ("middle", OUTER_RET, 42, 1),
        ("outer", MAIN_RET, 1, 0),
    ];
    let rows = [
        Longjmp {
            name: "no longjmp: every call returns",
            landing: None,
            maxactive: 4,
            counts: [[1, 1, 0, 0]; 3],
            returns: ALL_RETURN,
        },
        Longjmp {
            name: "longjmp from inner to outer, which returns",
            landing: Some(OUTER_RET),
            maxactive: 4,
            counts: [[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 1]],
            returns: &[("outer", MAIN_RET, 1, 0)],
        },
        Longjmp {
            name: "longjmp to a setjmp before the call: middle and inner called again",
            landing: Some(OUTER_CALL),
            maxactive: 4,
            counts: [[1, 1, 0, 0], [2, 1, 0, 1], [2, 1, 0, 1]],
            returns: ALL_RETURN,
        },
        Longjmp {
            name: "the same with maxactive 1: the abandoned calls free their places",
            landing: Some(OUTER_CALL),
            maxactive: 1,
            counts: [[1, 1, 0, 0], [2, 1, 0, 1], [2, 1, 0, 1]],
            returns: ALL_RETURN,
        },
    ];
    for row in rows {
        let name = row.name;
        let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
        let log = Returns::default();
        let ids = three_probes(&mut rig, row.maxactive, &log);
        rig.start();
        assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY), "{name}");
        // Three calls followed: each return address is the trampoline's.
        let t = rig.trampoline();
        let slots = vec![r0() - 40, r0() - 24, r0() - 8];
        assert_eq!(rig.world.borrow().stack_words_equal_to(t), slots, "{name}");
        if let Some(landing) = row.landing {
            // longjmp(buf, 1) with buf from a setjmp in outer, after its
            // push rbp: two followed frames are left at once.
            rig.world.borrow_mut().program_sets(1, |r| {
                r.rsp = r0() - 16;
                r.rip = landing;
            });
        }
        assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END), "{name}");
        let regs = rig.world.borrow().regs(1);
        assert_eq!((regs.rsp, regs.rax), (r0(), 1), "{name}: stack or result");
        let counts = ids.map(|id| rig.counts(id));
        assert_eq!(
            counts, row.counts,
            "{name}: [hits, returns, nmissed, abandoned]"
        );
        assert_eq!(*log.borrow(), row.returns, "{name}: returns seen");
    }
}

/// A landing the unwinder installs: which unwinder entry point got there,
/// the landing frame's stack pointer (the CFA of the callee unwound
/// last), the landing pad.
#[derive(Clone, Copy)]
struct Landing {
    unwinder: u64,
    cfa: u64,
    pad: u64,
}

/// One row of [`an_exception_through_followed_frames`].
struct Exception {
    name: &'static str,
    landings: Vec<Landing>,
    counts: [[u64; 4]; 3],
    returns: &'static [(&'static str, u64, u64, usize)],
}

#[test]
fn an_exception_through_followed_frames() {
    let catch_in_outer = Landing {
        unwinder: RAISE,
        cfa: r0() - 16,
        pad: OUTER_RET,
    };
    let rows = [
        Exception {
            name: "thrown in inner, caught in outer",
            landings: vec![catch_in_outer],
            counts: [[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 1]],
            returns: &[("outer", MAIN_RET, 1, 0)],
        },
        Exception {
            name: "thrown in inner, caught in middle",
            landings: vec![Landing {
                unwinder: RAISE,
                cfa: r0() - 32,
                pad: MIDDLE_RET,
            }],
            counts: [[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 1]],
            returns: &[("middle", OUTER_RET, 0, 1), ("outer", MAIN_RET, 1, 0)],
        },
        Exception {
            name: "a cleanup in middle, _Unwind_Resume, caught in outer",
            landings: vec![
                Landing {
                    unwinder: RAISE,
                    cfa: r0() - 32,
                    pad: MIDDLE_CLEANUP,
                },
                Landing {
                    unwinder: RESUME,
                    ..catch_in_outer
                },
            ],
            counts: [[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 1]],
            returns: &[("outer", MAIN_RET, 1, 0)],
        },
    ];
    for row in rows {
        let name = row.name;
        let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
        let log = Returns::default();
        let ids = three_probes(&mut rig, 4, &log);
        let hooks = [
            (RuntimeAddr(RAISE), UnwindHook::Enter),
            (RuntimeAddr(RESUME), UnwindHook::Enter),
            (
                RuntimeAddr(SETIP),
                UnwindHook::Landing {
                    cfa_offset: CFA_OFFSET,
                },
            ),
        ];
        rig.engine.set_unwind_hooks(&hooks).unwrap();
        rig.start();
        let t = rig.trampoline();
        assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY), "{name}");
        // throw: inner calls _Unwind_RaiseException.
        rig.world
            .borrow_mut()
            .program_sets(1, |r| r.rip = INNER_THROW);
        for landing in &row.landings {
            let walk = landing.unwinder + WALK;
            assert_eq!(rig.drive(1, &[walk]), Stop::At(walk), "{name}");
            {
                // The unwinder walks the stack by return address: every
                // live slot holds the real one, none the trampoline.
                let w = rig.world.borrow();
                let rsp = w.regs(1).rsp;
                let live: Vec<u64> = w
                    .stack_words_equal_to(t)
                    .into_iter()
                    .filter(|a| *a >= rsp)
                    .collect();
                assert_eq!(live, Vec::<u64>::new(), "{name}: trampoline left");
                assert_eq!(w.word(r0() - 8), MAIN_RET, "{name}");
                assert_eq!(w.word(r0() - 24), OUTER_RET, "{name}");
            }
            // _Unwind_SetIP(context, pad), then the context's install.
            {
                let mut w = rig.world.borrow_mut();
                w.set_word(DATA + CFA_OFFSET as u64, landing.cfa);
                w.program_sets(1, |r| r.rdi = DATA);
            }
            let install = landing.unwinder + INSTALL;
            assert_eq!(rig.drive(1, &[]), Stop::Halted(install), "{name}");
            {
                // Frames from the landing one up follow their returns again.
                let w = rig.world.borrow();
                assert_eq!(w.word(r0() - 8), t, "{name}: outer's slot");
                let middle_lives = landing.cfa <= r0() - 24;
                assert_eq!(w.word(r0() - 24) == t, middle_lives, "{name}: middle's");
            }
            rig.world.borrow_mut().program_sets(1, |r| {
                r.rsp = landing.cfa;
                r.rip = landing.pad;
            });
        }
        assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END), "{name}");
        let regs = rig.world.borrow().regs(1);
        assert_eq!((regs.rsp, regs.rax), (r0(), 1), "{name}: stack or result");
        let counts = ids.map(|id| rig.counts(id));
        assert_eq!(
            counts, row.counts,
            "{name}: [hits, returns, nmissed, abandoned]"
        );
        assert_eq!(*log.borrow(), row.returns, "{name}: returns seen");
    }
}

#[test]
fn a_signal_handler_on_an_alternate_stack_does_not_lose_the_frames_it_interrupts() {
    const ALT_TOP: u64 = 0x7fff_8000;
    let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
    let log = Returns::default();
    let ids = three_probes(&mut rig, 4, &log);
    let leaf = recorded(&mut rig, LEAF, "leaf", 4, &log);
    rig.start();
    assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY));
    let interrupted = rig.world.borrow().regs(1);
    {
        // The kernel delivers a signal on the alternate stack, above the
        // thread's: the handler returns to the sigreturn trampoline.
        let mut w = rig.world.borrow_mut();
        w.map(ALT_TOP - 0x1000, 0x1000);
        w.set_word(ALT_TOP - 8, SIGRETURN);
        w.program_sets(1, |r| {
            r.rsp = ALT_TOP - 8;
            r.rip = HANDLER;
        });
    }
    // The handler calls leaf: by stack pointer the interrupted frames look
    // left (as after a longjmp) and are counted abandoned meanwhile.
    assert_eq!(rig.drive(1, &[]), Stop::Halted(SIGRETURN));
    assert_eq!(ids.map(|id| rig.counts(id)), [[1, 0, 0, 1]; 3]);
    assert_eq!(rig.counts(leaf), [1, 1, 0, 0]);
    // rt_sigreturn: the interrupted frames return after all.
    rig.world.borrow_mut().program_sets(1, |r| *r = interrupted);
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END));
    let regs = rig.world.borrow().regs(1);
    assert_eq!((regs.rsp, regs.rax), (r0(), 1));
    assert_eq!(ids.map(|id| rig.counts(id)), [[1, 1, 0, 0]; 3]);
    let returns = [
        ("leaf", HANDLER + 5, 7, 0),
        ("inner", MIDDLE_RET, 42, 2),
        ("middle", OUTER_RET, 42, 1),
        ("outer", MAIN_RET, 1, 0),
    ];
    assert_eq!(*log.borrow(), returns);
}

#[test]
fn calls_open_when_their_thread_ends_are_abandoned() {
    let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
    let log = Returns::default();
    let ids = three_probes(&mut rig, 1, &log);
    rig.start();
    assert_eq!(rig.drive(1, &[INNER_BODY]), Stop::At(INNER_BODY));
    // pthread_exit without unwinding (or the thread killed).
    rig.world.borrow_mut().end_thread(1);
    rig.engine
        .handle(TargetEvent::ThreadExited(ThreadId(1)))
        .unwrap();
    assert_eq!(ids.map(|id| rig.counts(id)), [[1, 0, 0, 1]; 3]);
    assert!(log.borrow().is_empty(), "no return handler runs");
    assert!(rig.engine.shadow.is_empty() && rig.engine.graveyard.is_empty());
}

#[test]
fn maxactive_follows_the_outermost_calls_and_counts_the_rest_missed() {
    use ReturnStrategy::{BreakpointAtReturn as AtReturn, Trampoline};
    // (strategy, recursion depth, maxactive); `main_rec` calls `rec` twice.
    let rows = [
        (Trampoline, 1, 1),
        (Trampoline, 3, 1),
        (Trampoline, 3, 3),
        (Trampoline, 5, 2),
        (AtReturn, 3, 1),
        (AtReturn, 3, 3),
        (AtReturn, 5, 2),
    ];
    for (strategy, depth, maxactive) in rows {
        let name = format!("{strategy:?}, depth {depth}, maxactive {maxactive}");
        let mut rig = Rig::new(MAIN_REC, &[1], strategy);
        let log = Returns::default();
        let rec = recorded(&mut rig, REC, "rec", maxactive, &log);
        rig.start();
        let followed = depth.min(maxactive);
        let mut expected = Vec::new();
        for round in 0..2u64 {
            for d in 1..=depth {
                assert_eq!(rig.drive(1, &[REC_BODY]), Stop::At(REC_BODY), "{name}");
                if d < depth {
                    continue;
                }
                if strategy == Trampoline {
                    // Only the followed calls' slots hold the trampoline.
                    let t = rig.trampoline();
                    let w = rig.world.borrow();
                    let rsp = w.regs(1).rsp;
                    let live = w.stack_words_equal_to(t).into_iter();
                    assert_eq!(live.filter(|a| *a >= rsp).count(), followed, "{name}");
                }
                // The deepest call does not recurse.
                rig.world.borrow_mut().program_sets(1, |r| r.rip = REC_RET);
            }
            let outermost = MAIN_REC + 5 * (round + 1);
            for k in (0..followed).rev() {
                let rip = if k == 0 { outermost } else { REC_RET };
                expected.push(("rec", rip, 0, k));
            }
        }
        assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_REC_END), "{name}");
        assert_eq!(rig.world.borrow().regs(1).rsp, r0(), "{name}");
        let d = depth as u64;
        let f = followed as u64;
        assert_eq!(rig.counts(rec), [2 * d, 2 * f, 2 * (d - f), 0], "{name}");
        assert_eq!(*log.borrow(), expected, "{name}: returns seen");
        // Return breakpoints go with the last return they wait for.
        let w = rig.world.borrow();
        let in_code = |a: &u64| (CODE..CODE + CODE_LEN).contains(a);
        let code_breakpoints: Vec<u64> = w.breakpoints.keys().copied().filter(in_code).collect();
        assert_eq!(code_breakpoints, vec![REC], "{name}");
    }
}

#[test]
fn a_return_address_no_breakpoint_can_go_to_is_a_miss() {
    // `main_leaf` is `call LEAF; hlt`: on a target that puts a breakpoint
    // at the return address, none can go on `hlt`.
    let mut rig = Rig::new(MAIN_LEAF, &[1], ReturnStrategy::BreakpointAtReturn);
    let log = Returns::default();
    let leaf = recorded(&mut rig, LEAF, "leaf", 4, &log);
    rig.start();
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_LEAF_END));
    assert_eq!(rig.world.borrow().regs(1).rax, 7);
    assert_eq!(rig.counts(leaf), [1, 0, 1, 0]);
    assert!(log.borrow().is_empty());
    assert!(!rig.world.borrow().breakpoints.contains_key(&MAIN_LEAF_END));
}
