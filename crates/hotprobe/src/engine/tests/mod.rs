//! Unit tests of the trap engine. `fetch` uses a mock that counts what the
//! engine asks of it; the others run a small program on a fake machine
//! ([`machine`]) whose threads execute real x86-64 bytes, so that what they
//! check is what a traced program would see: where each thread resumes,
//! its registers and stack, the counts, and the bytes in memory.

mod detach;
mod fetch;
mod machine;
mod nonlocal;
mod sites;
mod stacks;

use crate::engine::StandaloneEngine;
use crate::handler::{HitContext, ProbeId, RetProbe};
use hotprobe_target::{ReturnStrategy, RuntimeAddr, TargetEvent};
use machine::{FakeTarget, Shared, Stop, World, CODE};
use std::cell::RefCell;
use std::rc::Rc;

// The program (see `program`). Functions save `rbp` first: the engine
// emulates that `push`, so an entry probe needs no slot.

/// `call OUTER; nop; hlt`.
const MAIN: u64 = 0x40_1000;
/// Where `main`'s call of `outer` returns.
const MAIN_RET: u64 = 0x40_1005;
/// `main`'s end.
const MAIN_END: u64 = 0x40_1006;
/// `push rbp; call MIDDLE; mov eax, 1; pop rbp; ret`.
const OUTER: u64 = 0x40_2000;
/// In `outer`, the call of `middle` (a `setjmp` taken before it lands
/// here again).
const OUTER_CALL: u64 = 0x40_2001;
/// Where `outer`'s call of `middle` returns (also its `catch`).
const OUTER_RET: u64 = 0x40_2006;
/// `push rbp; call INNER; pop rbp; ret`, then a cleanup landing pad.
const MIDDLE: u64 = 0x40_3000;
/// Where `middle`'s call of `inner` returns.
const MIDDLE_RET: u64 = 0x40_3006;
/// `middle`'s cleanup (a destructor): `call RESUME` (`_Unwind_Resume`).
const MIDDLE_CLEANUP: u64 = 0x40_3008;
/// `push rbp; mov eax, 42; pop rbp; ret`, then `call RAISE`.
const INNER: u64 = 0x40_4000;
/// `inner`'s body: `mov eax, 42` (where a test has it longjmp or throw).
const INNER_BODY: u64 = 0x40_4001;
/// `inner`'s throw: `call RAISE`.
const INNER_THROW: u64 = 0x40_4008;
/// `_Unwind_RaiseException`: `push rbp; nop; call SETIP; hlt`.
const RAISE: u64 = 0x40_6000;
/// `_Unwind_Resume`, built as [`RAISE`].
const RESUME: u64 = 0x40_6100;
/// In the unwinder, after its entry: where it walks the stack.
const WALK: u64 = 1;
/// In the unwinder, the `hlt` after `_Unwind_SetIP`: where it installs
/// the landing frame's context.
const INSTALL: u64 = 7;
/// `_Unwind_SetIP`: `nop; ret`.
const SETIP: u64 = 0x40_7000;
/// `push rbp; nop; call REC; pop rbp; ret`: recursion, as deep as the
/// test wants (it jumps over the call at `REC_BODY` to stop).
const REC: u64 = 0x40_8000;
/// The `nop` before `rec`'s recursive call.
const REC_BODY: u64 = 0x40_8001;
/// Where `rec` returns from itself (the jump over the call lands here).
const REC_RET: u64 = 0x40_8007;
/// `call REC; call REC; nop; hlt`.
const MAIN_REC: u64 = 0x40_1100;
/// `main_rec`'s end.
const MAIN_REC_END: u64 = 0x40_110b;
/// `mov eax, 7; ret`: its first instruction is boosted (run out of line
/// with a jump back) or single-stepped out of line.
const LEAF: u64 = 0x40_9000;
/// `call LEAF; hlt`.
const MAIN_LEAF: u64 = 0x40_1200;
/// `main_leaf`'s end.
const MAIN_LEAF_END: u64 = 0x40_1205;
/// A signal handler: `call LEAF; ret`.
const HANDLER: u64 = 0x40_a100;
/// The signal return trampoline a handler returns to: `hlt` (the test
/// plays `rt_sigreturn` there).
const SIGRETURN: u64 = 0x40_a000;
/// The offset of the CFA in the fake unwinder's context.
const CFA_OFFSET: u32 = 0x30;

/// Writes instructions at fixed addresses.
struct Asm {
    code: Vec<u8>,
    at: u64,
}

impl Asm {
    fn org(&mut self, addr: u64) -> &mut Self {
        self.at = addr;
        self
    }

    /// Checks the next instruction goes at `addr` (the constants above).
    fn here(&mut self, addr: u64) -> &mut Self {
        assert_eq!(self.at, addr, "the program's layout moved");
        self
    }

    fn emit(&mut self, bytes: &[u8]) -> &mut Self {
        let off = (self.at - CODE) as usize;
        if self.code.len() < off + bytes.len() {
            self.code.resize(off + bytes.len(), 0x06);
        }
        self.code[off..off + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len() as u64;
        self
    }

    fn push_rbp(&mut self) -> &mut Self {
        self.emit(&[0x55])
    }

    fn pop_rbp(&mut self) -> &mut Self {
        self.emit(&[0x5d])
    }

    fn nop(&mut self) -> &mut Self {
        self.emit(&[0x90])
    }

    fn ret(&mut self) -> &mut Self {
        self.emit(&[0xc3])
    }

    fn hlt(&mut self) -> &mut Self {
        self.emit(&[0xf4])
    }

    fn mov_eax(&mut self, imm: u32) -> &mut Self {
        let mut b = vec![0xb8];
        b.extend_from_slice(&imm.to_le_bytes());
        self.emit(&b)
    }

    fn call(&mut self, target: u64) -> &mut Self {
        let rel = target.wrapping_sub(self.at + 5) as i64 as i32;
        let mut b = vec![0xe8];
        b.extend_from_slice(&rel.to_le_bytes());
        self.emit(&b)
    }
}

/// The program every test here runs.
fn program() -> Vec<u8> {
    let mut a = Asm {
        code: Vec::new(),
        at: CODE,
    };
    a.org(MAIN)
        .call(OUTER)
        .here(MAIN_RET)
        .nop()
        .here(MAIN_END)
        .hlt();
    a.org(OUTER).push_rbp().here(OUTER_CALL).call(MIDDLE);
    a.here(OUTER_RET).mov_eax(1).pop_rbp().ret();
    a.org(MIDDLE)
        .push_rbp()
        .call(INNER)
        .here(MIDDLE_RET)
        .pop_rbp()
        .ret();
    a.here(MIDDLE_CLEANUP).call(RESUME).hlt();
    a.org(INNER)
        .push_rbp()
        .here(INNER_BODY)
        .mov_eax(42)
        .pop_rbp()
        .ret();
    a.here(INNER_THROW).call(RAISE).hlt();
    for unwinder in [RAISE, RESUME] {
        a.org(unwinder)
            .push_rbp()
            .here(unwinder + WALK)
            .nop()
            .call(SETIP);
        a.here(unwinder + INSTALL).hlt();
    }
    a.org(SETIP).nop().ret();
    a.org(REC).push_rbp().here(REC_BODY).nop().call(REC);
    a.here(REC_RET).pop_rbp().ret();
    a.org(MAIN_REC)
        .call(REC)
        .call(REC)
        .nop()
        .here(MAIN_REC_END)
        .hlt();
    a.org(LEAF).mov_eax(7).ret();
    a.org(MAIN_LEAF).call(LEAF).here(MAIN_LEAF_END).hlt();
    a.org(SIGRETURN).hlt();
    a.org(HANDLER).call(LEAF).ret();
    a.code
}

/// An engine over a fresh machine running [`program`].
struct Rig {
    world: Shared,
    engine: StandaloneEngine,
}

impl Rig {
    /// Threads `threads`, each stopped at `entry`.
    fn new(entry: u64, threads: &[u64], strategy: ReturnStrategy) -> Rig {
        let world = World::new(program(), entry, threads, strategy);
        let engine = StandaloneEngine::new(Box::new(FakeTarget(world.clone())), 0);
        Rig { world, engine }
    }

    /// Lets every thread go (the session's start).
    fn start(&mut self) {
        let threads: Vec<u64> = self.world.borrow().threads.keys().map(|t| t.0).collect();
        for t in threads {
            self.world.borrow_mut().let_run(t);
        }
    }

    /// Runs thread `t`, the engine handling each event, until it halts or
    /// reaches one of `stops`.
    fn drive(&mut self, t: u64, stops: &[u64]) -> Stop {
        for _ in 0..1_000 {
            let stop = self.world.borrow_mut().run(t, stops);
            match stop {
                Stop::Event(ev) => self.engine.handle(ev).expect("the engine handles it"),
                other => return other,
            }
        }
        panic!("thread {t} traps again and again")
    }

    /// Runs thread `t`, the engine handling each event, until it traps at
    /// `addr`: that event is returned, not handled.
    fn drive_to_trap(&mut self, t: u64, addr: u64) -> TargetEvent {
        for _ in 0..1_000 {
            let stop = self.world.borrow_mut().run(t, &[]);
            match stop {
                Stop::Event(ev @ TargetEvent::Breakpoint { addr: at, .. }) if at.0 == addr => {
                    return ev
                }
                Stop::Event(ev) => self.engine.handle(ev).expect("the engine handles it"),
                other => panic!("thread {t} did not trap at {addr:#x}: {other:?}"),
            }
        }
        panic!("thread {t} traps again and again")
    }

    /// The trampoline's address (return probes placed).
    fn trampoline(&self) -> u64 {
        self.engine.trampoline.expect("a trampoline").0
    }

    /// `hits`, `returns`, `nmissed`, `abandoned` of probe `id`.
    fn counts(&self, id: ProbeId) -> [u64; 4] {
        let s = self.engine.stats(id).expect("a probe");
        [s.hits, s.returns, s.nmissed, s.abandoned]
    }
}

/// What return handlers saw, in order: the function's name, where its
/// caller resumes (`rip`), the return value, the call's depth.
type Returns = Rc<RefCell<Vec<(&'static str, u64, u64, usize)>>>;

/// A return probe on `func` (named `name`) that records its returns.
fn recorded(
    rig: &mut Rig,
    func: u64,
    name: &'static str,
    maxactive: usize,
    log: &Returns,
) -> ProbeId {
    let log = log.clone();
    let rp = RetProbe::new(maxactive).ret(move |ctx: &mut HitContext<'_>| {
        let depth = ctx.entry().expect("a return knows its entry").depth;
        log.borrow_mut()
            .push((name, ctx.regs().rip, ctx.return_value(), depth));
    });
    rig.engine
        .add_retprobe(RuntimeAddr(func), rp)
        .expect("a return probe")
}
