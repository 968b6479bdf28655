//! The registers a hit fetches, and steps in place, over a mock target
//! that counts what the engine asks of it.

use crate::engine::{StandaloneEngine, SCRATCH_CHUNK};
use crate::Probe;
use hotprobe_target::{
    Registers, ResumeMode, RuntimeAddr, ScratchRegion, Target, TargetError, TargetEvent, ThreadId,
};
use std::cell::RefCell;
use std::rc::Rc;

/// What the engine asked of the mock target.
#[derive(Default)]
struct Log {
    register_reads: u32,
    register_writes: u32,
    pc_writes: Vec<u64>,
    resumes: u32,
    steps: u32,
    inserts: u32,
}

/// A target with code at `BASE`, scratch at `SCRATCH`, one thread, that
/// reports breakpoint hits with `rip` alone.
struct Mock {
    regs: Registers,
    log: Rc<RefCell<Log>>,
    /// No scratch memory (sites step in place).
    no_scratch: bool,
}

const BASE: u64 = 0x40_0000;
const SCRATCH: u64 = 0x50_0000;
/// `mov eax, 1` (boosted), `nop` (emulated), `ret`.
const CODE: &[u8] = &[0xb8, 0x01, 0, 0, 0, 0x90, 0xc3];

impl Target for Mock {
    fn describe(&self) -> String {
        "mock".into()
    }
    fn threads(&self) -> Vec<ThreadId> {
        vec![ThreadId(1)]
    }
    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        let off = addr.0.wrapping_sub(BASE) as usize;
        match CODE.get(off..off + buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: buf.len(),
                target: self.describe(),
            }),
        }
    }
    fn write_memory(&mut self, _: RuntimeAddr, _: &[u8]) -> Result<(), TargetError> {
        Ok(())
    }
    fn registers(&mut self, _: ThreadId) -> Result<Registers, TargetError> {
        self.log.borrow_mut().register_reads += 1;
        Ok(self.regs)
    }
    fn set_registers(&mut self, _: ThreadId, regs: &Registers) -> Result<(), TargetError> {
        self.log.borrow_mut().register_writes += 1;
        self.regs = *regs;
        Ok(())
    }
    fn set_pc(&mut self, _: ThreadId, pc: u64) -> Result<(), TargetError> {
        self.log.borrow_mut().pc_writes.push(pc);
        self.regs.rip = pc;
        Ok(())
    }
    fn set_partial_breakpoint_registers(&mut self, on: bool) -> bool {
        on
    }
    fn resume(&mut self, _: ThreadId, mode: ResumeMode) -> Result<(), TargetError> {
        let mut log = self.log.borrow_mut();
        log.resumes += 1;
        if mode == ResumeMode::Step {
            log.steps += 1;
        }
        Ok(())
    }
    fn wait(&mut self, _: Option<std::time::Duration>) -> Result<TargetEvent, TargetError> {
        Ok(TargetEvent::Timeout)
    }
    fn insert_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
        self.log.borrow_mut().inserts += 1;
        Ok(())
    }
    fn remove_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
        Ok(())
    }
    fn stop_all(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
    fn resume_all(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
    fn detach(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
    fn alloc_scratch(&mut self, _: RuntimeAddr, len: u64) -> Result<ScratchRegion, TargetError> {
        if self.no_scratch {
            return Err(TargetError::NoScratch {
                near: BASE,
                target: self.describe(),
                why: "none in the mock".into(),
            });
        }
        Ok(ScratchRegion {
            start: RuntimeAddr(SCRATCH),
            len,
        })
    }
}

/// A hit at `addr` as the mock reports it: `rip` alone.
fn hit(e: &mut StandaloneEngine, addr: u64) {
    e.handle(TargetEvent::Breakpoint {
        thread: ThreadId(1),
        addr: RuntimeAddr(addr),
        regs: Registers {
            rip: addr,
            ..Registers::default()
        },
    })
    .unwrap();
}

#[test]
fn registers_are_fetched_only_when_a_handler_asks() {
    let log = Rc::new(RefCell::new(Log::default()));
    let mock = Mock {
        regs: Registers {
            rip: BASE,
            rdi: 7,
            ..Registers::default()
        },
        log: log.clone(),
        no_scratch: false,
    };
    let mut e = StandaloneEngine::new(Box::new(mock), 0);
    let boosted = e
        .add_probe(RuntimeAddr(BASE), Probe::new().pre(|_| {}))
        .unwrap();
    assert_eq!(e.execution_of(RuntimeAddr(BASE)), Some("boosted"));

    // A null handler on a boosted site: rip alone is written, to the slot.
    hit(&mut e, BASE);
    assert_eq!(e.stats(boosted).unwrap().hits, 1);
    assert_eq!(log.borrow().register_reads, 0);
    assert_eq!(log.borrow().register_writes, 0);
    assert_eq!(log.borrow().pc_writes, vec![SCRATCH]);
    assert_eq!(log.borrow().resumes, 1);

    // A null handler on an emulated NOP: rip moves past it, nothing read.
    let nop = BASE + 5;
    let p = e
        .add_probe(RuntimeAddr(nop), Probe::new().pre(|_| {}))
        .unwrap();
    assert_eq!(e.execution_of(RuntimeAddr(nop)), Some("emulated"));
    hit(&mut e, nop);
    assert_eq!(log.borrow().register_reads, 0);
    assert_eq!(log.borrow().pc_writes, vec![SCRATCH, nop + 1]);

    // A handler that reads an argument: one fetch, then the whole set
    // is written back (with rip past the NOP).
    e.remove_probe(p).unwrap();
    let seen = Rc::new(RefCell::new(None));
    let s2 = seen.clone();
    e.add_probe(
        RuntimeAddr(nop),
        Probe::new().pre(move |ctx| *s2.borrow_mut() = ctx.arg(0)),
    )
    .unwrap();
    hit(&mut e, nop);
    assert_eq!(*seen.borrow(), Some(7));
    assert_eq!(log.borrow().register_reads, 1);
    assert_eq!(log.borrow().register_writes, 1);
    assert_eq!(log.borrow().pc_writes.len(), 2);
    assert_eq!(log.borrow().resumes, 3);

    // A post handler: the thread steps the slot; after the step only
    // rip moves (back to the original code), so rip alone is written.
    e.remove_probe(boosted).unwrap();
    e.add_probe(RuntimeAddr(BASE), Probe::new().post(|_| {}))
        .unwrap();
    hit(&mut e, BASE);
    let slot = *log.borrow().pc_writes.last().unwrap();
    assert!((SCRATCH..SCRATCH + SCRATCH_CHUNK).contains(&slot));
    let after_step = Registers {
        rip: slot + 5,
        rdi: 7,
        ..Registers::default()
    };
    e.handle(TargetEvent::Stepped {
        thread: ThreadId(1),
        regs: after_step,
    })
    .unwrap();
    assert_eq!(log.borrow().pc_writes.last(), Some(&(BASE + 5)));
    assert_eq!(log.borrow().register_writes, 1);
    assert_eq!(log.borrow().resumes, 5);
}

#[test]
fn an_in_place_step_that_did_not_execute_is_stepped_again() {
    let log = Rc::new(RefCell::new(Log::default()));
    let mock = Mock {
        regs: Registers {
            rip: BASE,
            ..Registers::default()
        },
        log: log.clone(),
        no_scratch: true,
    };
    let mut e = StandaloneEngine::new(Box::new(mock), 0);
    let posts = Rc::new(RefCell::new(0));
    let p2 = posts.clone();
    let id = e
        .add_probe(
            RuntimeAddr(BASE),
            Probe::new().post(move |_| *p2.borrow_mut() += 1),
        )
        .unwrap();
    let inserts = log.borrow().inserts;
    hit(&mut e, BASE);
    assert_eq!(log.borrow().steps, 1);
    let stepped = |rip| TargetEvent::Stepped {
        thread: ThreadId(1),
        regs: Registers {
            rip,
            ..Registers::default()
        },
    };
    // A step stop taken before the instruction ran: the same
    // execution, stepped again with the breakpoint still lifted.
    e.handle(stepped(BASE)).unwrap();
    assert_eq!(log.borrow().steps, 2);
    assert_eq!(log.borrow().inserts, inserts);
    assert_eq!(*posts.borrow(), 0);
    e.handle(stepped(BASE + 5)).unwrap();
    assert_eq!(log.borrow().steps, 2);
    assert_eq!(log.borrow().inserts, inserts + 1, "re-armed once");
    assert_eq!(*posts.borrow(), 1);
    assert_eq!(e.stats(id).unwrap().hits, 1);
}
