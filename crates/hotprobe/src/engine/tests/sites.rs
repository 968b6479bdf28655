//! Several probes at one address: each runs and counts on every hit, one
//! disabled is passed over while the others run, the `int3` stays until
//! the last probe is removed, and the program's result never changes.
//! `leaf` (`mov eax, 7; ret`) carries a plain probe, a probe with a post
//! handler (the instruction is then stepped out of line, else boosted)
//! and a return probe, all at its first byte.

use super::machine::Stop;
use super::*;
use crate::{EngineError, Probe};
use std::cell::Cell;

/// A step of a row: run `main_leaf` once, or act on probe `n` (0: plain,
/// 1: with a post handler, 2: return probe).
#[derive(Clone, Copy, Debug)]
enum Step {
    Run,
    Disable(usize),
    Enable(usize),
    Remove(usize),
}

/// Handler runs counted: probe 0's pre, probe 1's pre and post, probe 2's
/// entry and return.
type Runs = [Rc<Cell<u64>>; 5];

fn counter(c: &Rc<Cell<u64>>) -> impl FnMut(&mut HitContext<'_>) + 'static {
    let c = c.clone();
    move |_| c.set(c.get() + 1)
}

/// The three probes at `leaf`.
fn three_at_leaf(rig: &mut Rig, runs: &Runs) -> [ProbeId; 3] {
    let at = RuntimeAddr(LEAF);
    let e = &mut rig.engine;
    let plain = e.add_probe(at, Probe::new().pre(counter(&runs[0])));
    let post = Probe::new().pre(counter(&runs[1])).post(counter(&runs[2]));
    let with_post = e.add_probe(at, post);
    let rp = RetProbe::new(4)
        .entry(counter(&runs[3]))
        .ret(counter(&runs[4]));
    let ret = e.add_retprobe(at, rp);
    [plain.unwrap(), with_post.unwrap(), ret.unwrap()]
}

/// Runs `main_leaf` from its start: it must end at its `hlt` with its
/// result and its stack as without probes.
fn run_main_leaf(rig: &mut Rig, name: &str) {
    let top = machine::World::stack_top(1);
    rig.world.borrow_mut().program_sets(1, |r| {
        r.rip = MAIN_LEAF;
        r.rsp = top;
        r.rax = 0;
    });
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_LEAF_END), "{name}");
    let regs = rig.world.borrow().regs(1);
    assert_eq!(
        (regs.rax, regs.rsp),
        (7, top),
        "{name}: the program's result"
    );
}

/// One row of [`several_probes_at_one_address`].
struct Row {
    name: &'static str,
    steps: &'static [Step],
    /// Hits of each probe at the end, `None` once removed.
    hits: [Option<u64>; 3],
    /// Handler runs, as in [`Runs`].
    runs: [u64; 5],
    /// Whether the `int3` is still at `leaf`.
    armed: bool,
}

#[test]
fn several_probes_at_one_address() {
    use Step::*;
    let rows = [
        Row {
            name: "each probe runs once per hit",
            steps: &[Run, Run],
            hits: [Some(2); 3],
            runs: [2; 5],
            armed: true,
        },
        Row {
            name: "a disabled probe is passed over while the others run",
            steps: &[Run, Disable(1), Run, Run, Enable(1), Run],
            hits: [Some(4), Some(2), Some(4)],
            runs: [4, 2, 2, 4, 4],
            armed: true,
        },
        Row {
            name: "a disabled return probe follows no call",
            steps: &[Disable(2), Run, Enable(2), Run],
            hits: [Some(2), Some(2), Some(1)],
            runs: [2, 2, 2, 1, 1],
            armed: true,
        },
        Row {
            name: "every probe disabled: the int3 stays, nothing counts",
            steps: &[Disable(0), Disable(1), Disable(2), Run, Run],
            hits: [Some(0); 3],
            runs: [0; 5],
            armed: true,
        },
        Row {
            name: "removed one by one: the int3 goes with the last",
            steps: &[Run, Remove(1), Run, Remove(0), Run, Remove(2), Run],
            hits: [None; 3],
            runs: [2, 1, 1, 3, 3],
            armed: false,
        },
        Row {
            name: "the return probe removed first: the plain ones stay",
            steps: &[Run, Remove(2), Run],
            hits: [Some(2), Some(2), None],
            runs: [2, 2, 2, 1, 1],
            armed: true,
        },
    ];
    for row in rows {
        let name = row.name;
        let mut rig = Rig::new(MAIN_LEAF, &[1], ReturnStrategy::Trampoline);
        let runs: Runs = Default::default();
        let ids = three_at_leaf(&mut rig, &runs);
        rig.start();
        for step in row.steps {
            match *step {
                Step::Run => run_main_leaf(&mut rig, name),
                Step::Disable(n) => rig.engine.set_enabled(ids[n], false).unwrap(),
                Step::Enable(n) => rig.engine.set_enabled(ids[n], true).unwrap(),
                Step::Remove(n) => rig.engine.remove_probe(ids[n]).unwrap(),
            }
        }
        let hits = ids.map(|id| rig.engine.stats(id).map(|s| s.hits));
        assert_eq!(hits, row.hits, "{name}: hits");
        assert_eq!(
            runs.clone().map(|c| c.get()),
            row.runs,
            "{name}: handler runs"
        );
        let w = rig.world.borrow();
        assert_eq!(w.breakpoints.contains_key(&LEAF), row.armed, "{name}");
        let byte = w.raw(LEAF, 1).unwrap()[0];
        assert_eq!(byte, if row.armed { 0xcc } else { 0xb8 }, "{name}");
    }
}

#[test]
fn a_return_probe_disabled_during_a_call_still_sees_that_return() {
    let mut rig = Rig::new(MAIN_LEAF, &[1], ReturnStrategy::Trampoline);
    let runs: Runs = Default::default();
    let [_, _, ret] = three_at_leaf(&mut rig, &runs);
    rig.start();
    // Stopped at leaf's ret: the call is followed.
    assert_eq!(rig.drive(1, &[LEAF + 5]), Stop::At(LEAF + 5));
    rig.engine.set_enabled(ret, false).unwrap();
    assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_LEAF_END));
    assert_eq!(rig.world.borrow().regs(1).rax, 7);
    // Its return went through the trampoline back to main_leaf, counted.
    assert_eq!(rig.counts(ret), [1, 1, 0, 0]);
    assert_eq!(runs[4].get(), 1);
    run_main_leaf(&mut rig, "disabled");
    assert_eq!(rig.counts(ret), [1, 1, 0, 0]);
    // A probe removed is gone for good; maxactive 0 follows nothing.
    rig.engine.remove_probe(ret).unwrap();
    assert!(matches!(
        rig.engine.set_enabled(ret, true),
        Err(EngineError::NoSuchProbe(id)) if id == ret
    ));
    let refused = rig.engine.add_retprobe(RuntimeAddr(LEAF), RetProbe::new(0));
    assert!(matches!(refused, Err(EngineError::Refused { .. })));
}

#[test]
fn a_return_probe_removed_during_a_call_lets_it_return_to_its_caller() {
    for strategy in [
        ReturnStrategy::Trampoline,
        ReturnStrategy::BreakpointAtReturn,
    ] {
        let name = format!("{strategy:?}");
        let mut rig = Rig::new(MAIN_REC, &[1], strategy);
        let log = Returns::default();
        let rec = recorded(&mut rig, REC, "rec", 4, &log);
        rig.start();
        // Two calls deep (followed), then the probe goes.
        assert_eq!(rig.drive(1, &[REC_BODY]), Stop::At(REC_BODY), "{name}");
        assert_eq!(rig.drive(1, &[REC_BODY]), Stop::At(REC_BODY), "{name}");
        rig.world.borrow_mut().program_sets(1, |r| r.rip = REC_RET);
        rig.engine.remove_probe(rec).unwrap();
        // Both return; main_rec's second call of rec does not recurse.
        assert_eq!(rig.drive(1, &[REC_BODY]), Stop::At(REC_BODY), "{name}");
        rig.world.borrow_mut().program_sets(1, |r| r.rip = REC_RET);
        assert_eq!(rig.drive(1, &[]), Stop::Halted(MAIN_REC_END), "{name}");
        let w = rig.world.borrow();
        assert_eq!(w.regs(1).rsp, machine::World::stack_top(1), "{name}");
        assert!(
            log.borrow().is_empty(),
            "{name}: a removed probe's handler ran"
        );
        // No breakpoint left in the code: not the entry's, not a return's.
        let code = machine::CODE..machine::CODE + machine::CODE_LEN;
        assert!(w.breakpoints.keys().all(|a| !code.contains(a)), "{name}");
        assert!(w.code_is_original(), "{name}");
    }
}
