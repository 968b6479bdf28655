//! A fake machine for the engine's tests: memory in which breakpoints are
//! real `int3` bytes, threads, and a small x86-64 interpreter that runs a
//! thread until it traps, as a traced process would. The engine drives it
//! through [`Target`]; a test keeps a handle on the same [`World`] to run
//! threads, play the program's own jumps (`longjmp`, an unwinder's context
//! install) and look at registers and memory.
//!
//! The fake keeps [`Target`]'s rules and fails loudly where a real target
//! would: registers of a running thread cannot be read or written, a
//! running thread cannot be resumed, code fetched from unmapped memory (a
//! trampoline after detach released the scratch memory) panics, and so
//! does an `int3` no breakpoint explains.

use crate::engine::Restores;
use hotprobe_target::{
    Registers, ResumeMode, ReturnStrategy, RuntimeAddr, ScratchRegion, Target, TargetError,
    TargetEvent, ThreadId,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

/// Where the program's code is mapped.
pub(super) const CODE: u64 = 0x40_0000;
/// Its size.
pub(super) const CODE_LEN: u64 = 0x1_0000;
/// Where scratch memory is handed out (within reach of the code).
const SCRATCH: u64 = 0x60_0000;
/// A data page (an unwinder's context lives here).
pub(super) const DATA: u64 = 0x70_0000;
/// Thread stacks: thread `n` has the 64 KiB below `STACKS + n * 64 KiB`.
const STACKS: u64 = 0x7ff0_0000;
/// Size of each thread's stack.
const STACK_LEN: u64 = 0x1_0000;
/// A byte that is no instruction the interpreter runs: fills code that was
/// not assembled, so a thread sent astray stops with a panic.
const INVALID: u8 = 0x06;

/// What a thread is doing, as the target sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RunState {
    /// Stopped: at an event, or by `stop_all`.
    Stopped,
    /// Resumed by the engine (or let go at detach).
    Running(ResumeMode),
}

/// One thread.
#[derive(Clone, Copy, Debug)]
pub(super) struct Thread {
    pub regs: Registers,
    pub state: RunState,
    /// Where [`World::run`] last stopped it at the test's request: a run
    /// from there goes on instead of stopping again.
    paused_at: Option<u64>,
}

/// A mapped range of memory.
struct Region {
    start: u64,
    bytes: Vec<u8>,
    scratch: bool,
}

/// Everything the fake target holds, shared between the engine (through
/// [`FakeTarget`]) and the test.
pub(super) struct World {
    regions: Vec<Region>,
    /// The code as assembled, to compare with after detach.
    original_code: Vec<u8>,
    /// Armed breakpoints: address and the byte the `int3` replaced.
    pub breakpoints: BTreeMap<u64, u8>,
    pub threads: BTreeMap<ThreadId, Thread>,
    /// Events the target has and the engine has not waited for yet.
    pub pending: VecDeque<TargetEvent>,
    /// Every resume the engine asked for: thread, mode, `rip` then.
    pub resumes: Vec<(ThreadId, ResumeMode, u64)>,
    /// Calls of `stop_all`.
    pub stop_alls: usize,
    /// The engine detached.
    pub detached: bool,
    /// Forked children released, with the restores written into them.
    pub released: Vec<(u64, Restores)>,
    strategy: ReturnStrategy,
    next_scratch: u64,
}

/// A handle on a [`World`].
pub(super) type Shared = Rc<RefCell<World>>;

/// The [`Target`] the engine drives.
pub(super) struct FakeTarget(pub Shared);

/// Why [`World::run`] gave control back to the test.
// An event is as large as it is everywhere else: a test's value, matched
// at once, not stored.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// The thread trapped: an event for the engine (the thread stopped).
    Event(TargetEvent),
    /// The thread reached one of the addresses the test asked to stop at,
    /// before running it (the thread still counts as running).
    At(u64),
    /// The thread ran `hlt`: the end of a program, or a marker the test
    /// acts at (the thread still counts as running).
    Halted(u64),
}

impl World {
    /// A machine with `code` at [`CODE`] (the rest of the code page filled
    /// with an invalid opcode), a data page, a stack per thread of
    /// `threads`, each thread stopped at `entry`; return probes done the
    /// `strategy` way.
    pub(super) fn new(
        code: Vec<u8>,
        entry: u64,
        threads: &[u64],
        strategy: ReturnStrategy,
    ) -> Shared {
        let mut text = code;
        text.resize(CODE_LEN as usize, INVALID);
        let mut regions = vec![
            Region {
                start: CODE,
                bytes: text.clone(),
                scratch: false,
            },
            Region {
                start: DATA,
                bytes: vec![0; 0x1000],
                scratch: false,
            },
        ];
        let mut map = BTreeMap::new();
        for &t in threads {
            regions.push(Region {
                start: STACKS + (t - 1) * STACK_LEN,
                bytes: vec![0; STACK_LEN as usize],
                scratch: false,
            });
            let regs = Registers {
                rip: entry,
                rsp: Self::stack_top(t),
                ..Registers::default()
            };
            map.insert(
                ThreadId(t),
                Thread {
                    regs,
                    state: RunState::Stopped,
                    paused_at: None,
                },
            );
        }
        Rc::new(RefCell::new(World {
            regions,
            original_code: text,
            breakpoints: BTreeMap::new(),
            threads: map,
            pending: VecDeque::new(),
            resumes: Vec::new(),
            stop_alls: 0,
            detached: false,
            released: Vec::new(),
            strategy,
            next_scratch: SCRATCH,
        }))
    }

    /// The stack pointer thread `t` starts with.
    pub(super) fn stack_top(t: u64) -> u64 {
        STACKS + t * STACK_LEN - 0x100
    }

    fn region(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        self.regions.iter().enumerate().find_map(|(i, r)| {
            let off = addr.checked_sub(r.start)? as usize;
            (off + len <= r.bytes.len()).then_some((i, off))
        })
    }

    /// The bytes at `addr` as they are in memory (breakpoints included).
    pub(super) fn raw(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (i, off) = self.region(addr, len)?;
        Some(&self.regions[i].bytes[off..off + len])
    }

    fn raw_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (i, off) = self.region(addr, len)?;
        Some(&mut self.regions[i].bytes[off..off + len])
    }

    /// The little-endian word at `addr` (which must be mapped).
    pub(super) fn word(&self, addr: u64) -> u64 {
        let b = self
            .raw(addr, 8)
            .unwrap_or_else(|| panic!("{addr:#x} unmapped"));
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }

    /// Writes the little-endian word `value` at `addr`.
    pub(super) fn set_word(&mut self, addr: u64, value: u64) {
        self.raw_mut(addr, 8)
            .unwrap_or_else(|| panic!("{addr:#x} unmapped"))
            .copy_from_slice(&value.to_le_bytes());
    }

    /// Whether the code is byte for byte what was assembled.
    pub(super) fn code_is_original(&self) -> bool {
        self.raw(CODE, CODE_LEN as usize) == Some(&self.original_code[..])
    }

    /// Whether any scratch memory is still mapped.
    pub(super) fn has_scratch(&self) -> bool {
        self.regions.iter().any(|r| r.scratch)
    }

    /// The addresses of the 8-byte words of every stack holding `value`.
    pub(super) fn stack_words_equal_to(&self, value: u64) -> Vec<u64> {
        let mut found = Vec::new();
        for r in self.regions.iter().filter(|r| r.start >= STACKS) {
            for (k, w) in r.bytes.chunks_exact(8).enumerate() {
                if u64::from_le_bytes(w.try_into().expect("8 bytes")) == value {
                    found.push(r.start + 8 * k as u64);
                }
            }
        }
        found
    }

    /// Thread `t`'s registers (whatever its state).
    pub(super) fn regs(&self, t: u64) -> Registers {
        self.threads[&ThreadId(t)].regs
    }

    /// Changes thread `t`'s registers as the program itself would (a
    /// `longjmp`, a context install): the thread must be running.
    pub(super) fn program_sets(&mut self, t: u64, f: impl FnOnce(&mut Registers)) {
        let th = self.threads.get_mut(&ThreadId(t)).expect("thread");
        assert!(
            matches!(th.state, RunState::Running(_)),
            "thread {t} is stopped: only a running program moves itself"
        );
        f(&mut th.regs);
    }

    /// Maps `len` zeroed bytes at `start` (an alternate signal stack).
    pub(super) fn map(&mut self, start: u64, len: u64) {
        self.regions.push(Region {
            start,
            bytes: vec![0; len as usize],
            scratch: false,
        });
    }

    /// Stops thread `t` for an event the test hands the engine itself
    /// (a fork): the thread must be running.
    pub(super) fn stop_for_event(&mut self, t: u64) {
        let th = self.threads.get_mut(&ThreadId(t)).expect("thread");
        assert!(
            matches!(th.state, RunState::Running(_)),
            "thread {t} already stopped"
        );
        th.state = RunState::Stopped;
    }

    /// Thread `t` ended: it is gone from the target.
    pub(super) fn end_thread(&mut self, t: u64) {
        self.threads.remove(&ThreadId(t));
    }

    /// The state of thread `t`.
    pub(super) fn state(&self, t: u64) -> RunState {
        self.threads[&ThreadId(t)].state
    }

    fn fetch(&self, rip: u64, len: usize) -> &[u8] {
        self.raw(rip, len)
            .unwrap_or_else(|| panic!("instruction fetch from unmapped {rip:#x}"))
    }

    fn push(&mut self, t: ThreadId, value: u64) {
        let rsp = self.threads[&t].regs.rsp - 8;
        self.set_word(rsp, value);
        self.threads.get_mut(&t).expect("thread").regs.rsp = rsp;
    }

    fn pop(&mut self, t: ThreadId) -> u64 {
        let rsp = self.threads[&t].regs.rsp;
        let v = self.word(rsp);
        self.threads.get_mut(&t).expect("thread").regs.rsp = rsp + 8;
        v
    }

    /// Executes thread `t`'s instruction at `rip`; `Some` when it traps.
    fn execute(&mut self, t: ThreadId) -> Option<Stop> {
        let rip = self.threads[&t].regs.rip;
        let op = self.fetch(rip, 1)[0];
        let rel32 = |w: &World| {
            let b = w.fetch(rip + 1, 4);
            i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64 as u64
        };
        let next = match op {
            0xcc if self.breakpoints.contains_key(&rip) => {
                let th = self.threads.get_mut(&t).expect("thread");
                th.state = RunState::Stopped;
                return Some(Stop::Event(TargetEvent::Breakpoint {
                    thread: t,
                    addr: RuntimeAddr(rip),
                    regs: th.regs,
                }));
            }
            0xcc => panic!("thread {t}: int3 at {rip:#x} is no breakpoint (SIGTRAP)"),
            0xf4 => return Some(Stop::Halted(rip)),
            0x90 => rip + 1,
            0x50..=0x57 => {
                let v = *reg(
                    &mut self.threads.get_mut(&t).expect("thread").regs,
                    op - 0x50,
                );
                self.push(t, v);
                rip + 1
            }
            0x58..=0x5f => {
                let v = self.pop(t);
                *reg(
                    &mut self.threads.get_mut(&t).expect("thread").regs,
                    op - 0x58,
                ) = v;
                rip + 1
            }
            0xb8..=0xbf => {
                let imm = u32::from_le_bytes(self.fetch(rip + 1, 4).try_into().expect("4 bytes"));
                *reg(
                    &mut self.threads.get_mut(&t).expect("thread").regs,
                    op - 0xb8,
                ) = imm as u64;
                rip + 5
            }
            0xe8 => {
                let target = (rip + 5).wrapping_add(rel32(self));
                self.push(t, rip + 5);
                target
            }
            0xe9 => (rip + 5).wrapping_add(rel32(self)),
            0xc3 => self.pop(t),
            _ => panic!("thread {t}: the fake CPU has no opcode {op:#04x} (at {rip:#x})"),
        };
        self.threads.get_mut(&t).expect("thread").regs.rip = next;
        None
    }

    /// Runs thread `t` as the engine resumed it: one instruction when it
    /// was to step (then [`TargetEvent::Stepped`]), else until it traps,
    /// halts, or reaches one of `stops` (where it already stopped at the
    /// test's request, it goes on).
    pub(super) fn run(&mut self, t: u64, stops: &[u64]) -> Stop {
        let t = ThreadId(t);
        let mode = match self.threads[&t].state {
            RunState::Running(mode) => mode,
            RunState::Stopped => panic!("thread {t} is stopped: nothing resumed it"),
        };
        if mode == ResumeMode::Step {
            if let Some(stop) = self.execute(t) {
                return stop;
            }
            let th = self.threads.get_mut(&t).expect("thread");
            th.state = RunState::Stopped;
            return Stop::Event(TargetEvent::Stepped {
                thread: t,
                regs: th.regs,
            });
        }
        let paused_at = self.threads.get_mut(&t).expect("thread").paused_at.take();
        for n in 0.. {
            assert!(n < 10_000, "thread {t} runs in circles");
            let rip = self.threads[&t].regs.rip;
            let goes_on = n == 0 && paused_at == Some(rip);
            if stops.contains(&rip) && !goes_on {
                self.threads.get_mut(&t).expect("thread").paused_at = Some(rip);
                return Stop::At(rip);
            }
            if let Some(stop) = self.execute(t) {
                return stop;
            }
        }
        unreachable!("the loop returns")
    }

    /// Let thread `t` run (a thread the program starts, or one a test
    /// moved while it was stopped for it).
    pub(super) fn let_run(&mut self, t: u64) {
        self.threads.get_mut(&ThreadId(t)).expect("thread").state =
            RunState::Running(ResumeMode::Continue);
    }

    fn stopped(&mut self, t: ThreadId) -> Result<&mut Thread, TargetError> {
        match self.threads.get_mut(&t) {
            Some(th) if th.state == RunState::Stopped => Ok(th),
            _ => Err(TargetError::NoSuchThread {
                thread: t,
                target: "fake".into(),
            }),
        }
    }
}

/// Register number `n` of the `push`/`pop`/`mov r32, imm` encodings.
fn reg(regs: &mut Registers, n: u8) -> &mut u64 {
    match n {
        0 => &mut regs.rax,
        1 => &mut regs.rcx,
        2 => &mut regs.rdx,
        3 => &mut regs.rbx,
        4 => &mut regs.rsp,
        5 => &mut regs.rbp,
        6 => &mut regs.rsi,
        _ => &mut regs.rdi,
    }
}

fn memory_error(op: &'static str, addr: RuntimeAddr, len: usize) -> TargetError {
    TargetError::Memory {
        op,
        addr: addr.0,
        len,
        target: "fake".into(),
    }
}

impl Target for FakeTarget {
    fn describe(&self) -> String {
        "fake".into()
    }

    fn threads(&self) -> Vec<ThreadId> {
        self.0.borrow().threads.keys().copied().collect()
    }

    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        let w = self.0.borrow();
        let raw = w
            .raw(addr.0, buf.len())
            .ok_or_else(|| memory_error("read", addr, buf.len()))?;
        buf.copy_from_slice(raw);
        // Breakpoints are the target's: reads see the original bytes.
        for (a, orig) in w.breakpoints.range(addr.0..addr.0 + buf.len() as u64) {
            buf[(a - addr.0) as usize] = *orig;
        }
        Ok(())
    }

    fn write_memory(&mut self, addr: RuntimeAddr, data: &[u8]) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        let World {
            regions,
            breakpoints,
            ..
        } = &mut *w;
        let end = addr.0 + data.len() as u64;
        for (a, orig) in breakpoints.range_mut(addr.0..end) {
            *orig = data[(a - addr.0) as usize];
        }
        let covered: Vec<u64> = breakpoints.range(addr.0..end).map(|(a, _)| *a).collect();
        let (i, off) = regions
            .iter()
            .enumerate()
            .find_map(|(i, r)| {
                let off = addr.0.checked_sub(r.start)? as usize;
                (off + data.len() <= r.bytes.len()).then_some((i, off))
            })
            .ok_or_else(|| memory_error("write", addr, data.len()))?;
        let region = &mut regions[i];
        region.bytes[off..off + data.len()].copy_from_slice(data);
        for a in covered {
            region.bytes[(a - region.start) as usize] = 0xcc;
        }
        Ok(())
    }

    fn registers(&mut self, t: ThreadId) -> Result<Registers, TargetError> {
        Ok(self.0.borrow_mut().stopped(t)?.regs)
    }

    fn set_registers(&mut self, t: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.0.borrow_mut().stopped(t)?.regs = *regs;
        Ok(())
    }

    fn resume(&mut self, t: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        let th = w.stopped(t)?;
        th.state = RunState::Running(mode);
        let rip = th.regs.rip;
        w.resumes.push((t, mode, rip));
        Ok(())
    }

    fn wait(&mut self, _: Option<std::time::Duration>) -> Result<TargetEvent, TargetError> {
        Ok(self
            .0
            .borrow_mut()
            .pending
            .pop_front()
            .unwrap_or(TargetEvent::Timeout))
    }

    fn insert_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        if w.breakpoints.contains_key(&addr.0) {
            return Err(TargetError::Breakpoint {
                addr: addr.0,
                target: "fake".into(),
                why: "already inserted",
            });
        }
        let b = w
            .raw_mut(addr.0, 1)
            .ok_or_else(|| memory_error("write", addr, 1))?;
        let orig = std::mem::replace(&mut b[0], 0xcc);
        w.breakpoints.insert(addr.0, orig);
        Ok(())
    }

    fn remove_breakpoint(&mut self, addr: RuntimeAddr) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        let orig = w
            .breakpoints
            .remove(&addr.0)
            .ok_or(TargetError::Breakpoint {
                addr: addr.0,
                target: "fake".into(),
                why: "none inserted",
            })?;
        w.raw_mut(addr.0, 1).expect("it was mapped")[0] = orig;
        Ok(())
    }

    fn stop_all(&mut self) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        w.stop_alls += 1;
        let running: Vec<(ThreadId, ResumeMode)> = w
            .threads
            .iter()
            .filter_map(|(t, th)| match th.state {
                RunState::Running(m) => Some((*t, m)),
                RunState::Stopped => None,
            })
            .collect();
        for (t, mode) in running {
            // A thread told to step has stepped by the time it stops: its
            // event waits for the engine.
            if mode == ResumeMode::Step {
                if let Stop::Event(ev) = w.run(t.0, &[]) {
                    w.pending.push_back(ev);
                }
            }
            w.threads.get_mut(&t).expect("thread").state = RunState::Stopped;
        }
        Ok(())
    }

    fn resume_all(&mut self) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        let waiting: Vec<ThreadId> =
            w.pending
                .iter()
                .filter_map(|ev| match ev {
                    TargetEvent::Breakpoint { thread, .. }
                    | TargetEvent::Stepped { thread, .. } => Some(*thread),
                    _ => None,
                })
                .collect();
        for (t, th) in w.threads.iter_mut() {
            if !waiting.contains(t) {
                th.state = RunState::Running(ResumeMode::Continue);
            }
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), TargetError> {
        let mut w = self.0.borrow_mut();
        let bps = std::mem::take(&mut w.breakpoints);
        for (a, orig) in bps {
            w.raw_mut(a, 1).expect("it was mapped")[0] = orig;
        }
        w.regions.retain(|r| !r.scratch);
        for th in w.threads.values_mut() {
            th.state = RunState::Running(ResumeMode::Continue);
        }
        w.detached = true;
        Ok(())
    }

    fn alloc_scratch(&mut self, near: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        let mut w = self.0.borrow_mut();
        let start = w.next_scratch;
        assert!(start.abs_diff(near.0) < 1 << 31, "scratch out of reach");
        let len = len.next_multiple_of(0x1000);
        w.next_scratch += len;
        w.regions.push(Region {
            start,
            bytes: vec![INVALID; len as usize],
            scratch: true,
        });
        Ok(ScratchRegion {
            start: RuntimeAddr(start),
            len,
        })
    }

    fn release_fork_child(
        &mut self,
        child: u64,
        restores: &[(RuntimeAddr, Vec<u8>)],
    ) -> Result<(), TargetError> {
        self.0
            .borrow_mut()
            .released
            .push((child, restores.to_vec()));
        Ok(())
    }

    fn return_strategy(&self) -> ReturnStrategy {
        self.0.borrow().strategy
    }
}
