//! `--stacks` on the trap (issue 24): at an entry hit of a probe its stack
//! hook takes, the engine walks the stack and hands the stack's id to
//! that probe's handler (a trap `Record` probe's entry event carries it,
//! so `record --stacks` keeps each call's stack); a probe the hook does
//! not take gets none. A stack whose first word cannot be read is counted
//! as not walked and recorded as an empty truncated stack, not dropped.

use super::machine::Stop;
use super::*;
use crate::stacks::{CallStack, StackCount, TrapStacks, TRAP_STACK_ID};
use crate::Probe;

/// Stack ids the handler of a probe saw, in order.
type Seen = Rc<RefCell<Vec<Option<u32>>>>;

/// A plain probe at `addr` noting the stack id its handler gets.
fn noting(rig: &mut Rig, addr: u64, seen: &Seen) -> ProbeId {
    let seen = seen.clone();
    let probe = Probe::new().pre(move |ctx: &mut HitContext<'_>| {
        seen.borrow_mut().push(ctx.stack_id());
    });
    rig.engine.add_probe(RuntimeAddr(addr), probe).unwrap()
}

#[test]
fn an_entry_handler_gets_the_id_of_the_stack_walked_at_its_hit() {
    let mut rig = Rig::new(MAIN, &[1], ReturnStrategy::Trampoline);
    let (at_inner, at_outer): (Seen, Seen) = Default::default();
    let inner = noting(&mut rig, INNER, &at_inner);
    noting(&mut rig, OUTER, &at_outer);
    let trap = TrapStacks::new();
    trap.add_probe(inner);
    rig.engine.stack_hook = Some(trap.clone());
    rig.start();
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END));
    // Again, from main's start: the same stack, the same id.
    let top = machine::World::stack_top(1);
    rig.world.borrow_mut().program_sets(1, |r| {
        r.rip = MAIN;
        r.rsp = top;
    });
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_END));
    assert_eq!(rig.world.borrow().regs(1).rax, 1, "the program's result");

    let ids = at_inner.borrow().clone();
    assert_eq!(ids.len(), 2, "{ids:?}");
    let id = ids[0].expect("a stack id for the probe the hook takes");
    assert_eq!(ids[1], Some(id), "the same stack, the same id");
    assert_ne!(id & TRAP_STACK_ID, 0, "{id:#x}");
    assert_eq!(*at_outer.borrow(), [None, None], "not walked: no id");
    // Named without modules: the return addresses; inner's caller first.
    let named = TrapStacks::call_stack(id).expect("a live stack");
    assert_eq!(
        named.frames.first(),
        Some(&format!("{MIDDLE_RET:#x}")),
        "{named:?}"
    );
    let counted = trap.stacks_of(inner);
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert_eq!(counted[0].count, 2);
    assert_eq!(counted[0].frames[0], MIDDLE_RET);
    assert_eq!(trap.totals().captured, 2);
    assert_eq!(trap.totals().unwalked, 0);
    assert_eq!(
        TrapStacks::call_stack(id & !TRAP_STACK_ID),
        None,
        "an agent's id"
    );
}

#[test]
fn a_stack_that_cannot_be_read_is_counted_not_dropped() {
    let mut rig = Rig::new(MAIN_LEAF, &[1], ReturnStrategy::Trampoline);
    let seen: Seen = Default::default();
    let leaf = noting(&mut rig, LEAF, &seen);
    let trap = TrapStacks::new();
    trap.add_probe(leaf);
    rig.engine.stack_hook = Some(trap.clone());
    rig.start();
    // The thread enters leaf with its stack pointer where nothing is
    // mapped: not even the return address can be read.
    rig.world.borrow_mut().program_sets(1, |r| {
        r.rip = LEAF;
        r.rsp = 0x1000;
    });
    assert_eq!(rig.drive(1, &[LEAF + 5]), Stop::At(LEAF + 5));
    assert_eq!(rig.world.borrow().regs(1).rax, 7, "the program's result");
    let id = seen.borrow()[0].expect("an id: the call keeps a stack");
    assert_eq!(
        TrapStacks::call_stack(id),
        Some(CallStack {
            frames: Vec::new(),
            truncated: true
        })
    );
    assert_eq!(trap.totals().unwalked, 1);
    assert_eq!(trap.totals().captured, 0);
    assert_eq!(
        trap.stacks_of(leaf),
        [StackCount {
            probe: 0,
            frames: Vec::new(),
            truncated: true,
            count: 1
        }]
    );
}
