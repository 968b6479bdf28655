//! Emulation of planned instructions and fixups after a single-step.

use hotprobe_target::Registers;

use crate::plan::{Emulation, LoopKind, ProbePlan, StepFixup, ZF};
use crate::{X86Error, SLOT_SIZE};

/// RFLAGS resume flag (cleared in the image `pushf` pushes).
const RF: u64 = 1 << 16;
/// RFLAGS virtual-8086 flag (cleared in the image `pushf` pushes).
const VM: u64 = 1 << 17;

/// A write into the target's memory (always a stack slot here) that the
/// tracer must perform for an emulation or a step fixup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemWrite {
    /// Where to write.
    pub addr: u64,
    /// What to write (little-endian).
    pub bytes: Vec<u8>,
}

impl MemWrite {
    fn qword(addr: u64, value: u64) -> MemWrite {
        MemWrite {
            addr,
            bytes: value.to_le_bytes().to_vec(),
        }
    }
}

/// Performs `e`, the emulation planned for the `len`-byte instruction at
/// `probe_addr`, on `regs`.
///
/// Updates `rip`, and as the instruction requires `rsp`, `rcx` (loops),
/// `rbp` (`leave`) or the destination register. Stack reads (`ret`,
/// `leave`) go through `read_stack`, which returns the 8-byte little-endian
/// value at an address. A push returns the [`MemWrite`] the tracer must
/// perform (at the new `rsp`); if that write fails, the caller should
/// restore its copy of the registers. On error `regs` is left unchanged.
///
/// Caveat: emulated `call`/`ret` do not touch a CET shadow stack; a process
/// running with user shadow stacks enabled must not have them emulated.
pub fn emulate(
    e: &Emulation,
    probe_addr: u64,
    len: usize,
    regs: &mut Registers,
    read_stack: &mut dyn FnMut(u64) -> Result<u64, X86Error>,
) -> Result<Option<MemWrite>, X86Error> {
    let next = probe_addr.wrapping_add(len as u64);
    let mut write = None;
    match *e {
        Emulation::Nop => regs.rip = next,
        Emulation::JmpRel { target } => regs.rip = target,
        Emulation::CallRel {
            target,
            return_addr,
        } => {
            regs.rsp = regs.rsp.wrapping_sub(8);
            write = Some(MemWrite::qword(regs.rsp, return_addr));
            regs.rip = target;
        }
        Emulation::Jcc {
            cond,
            target,
            fallthrough,
        } => {
            regs.rip = if cond.holds(regs.rflags) {
                target
            } else {
                fallthrough
            };
        }
        Emulation::Loop {
            kind,
            target,
            fallthrough,
        } => {
            let zf = regs.rflags & ZF != 0;
            let taken = match kind {
                LoopKind::Loop | LoopKind::Loope | LoopKind::Loopne => {
                    regs.rcx = regs.rcx.wrapping_sub(1);
                    regs.rcx != 0
                        && match kind {
                            LoopKind::Loope => zf,
                            LoopKind::Loopne => !zf,
                            _ => true,
                        }
                }
                LoopKind::Jrcxz => regs.rcx == 0,
                LoopKind::Jecxz => regs.rcx as u32 == 0,
            };
            regs.rip = if taken { target } else { fallthrough };
        }
        Emulation::Ret { pop_extra } => {
            let ret = read_stack(regs.rsp)?;
            regs.rsp = regs.rsp.wrapping_add(8 + u64::from(pop_extra));
            regs.rip = ret;
        }
        Emulation::Push { reg } => {
            let value = reg.get(regs);
            regs.rsp = regs.rsp.wrapping_sub(8);
            write = Some(MemWrite::qword(regs.rsp, value));
            regs.rip = next;
        }
        Emulation::Pushf => {
            let value = regs.rflags & !(RF | VM);
            regs.rsp = regs.rsp.wrapping_sub(8);
            write = Some(MemWrite::qword(regs.rsp, value));
            regs.rip = next;
        }
        Emulation::MovReg { dst, src } => {
            let value = src.get(regs);
            dst.set(regs, value);
            regs.rip = next;
        }
        Emulation::Leave => {
            let saved_rbp = read_stack(regs.rbp)?;
            regs.rsp = regs.rbp.wrapping_add(8);
            regs.rbp = saved_rbp;
            regs.rip = next;
        }
    }
    Ok(write)
}

/// Repairs `regs` after the slot's instruction was single-stepped.
///
/// If `rip` is at `slot_addr + insn_len_in_slot` (the instruction fell
/// through) it becomes `probe_addr + len`; anywhere else (a jump or call
/// went elsewhere) it stays. For [`StepFixup::CallReturnAddr`], once the
/// call executed (`rip` left `slot_addr`), the return address at `[rsp]`
/// must become `probe_addr + len`: the returned [`MemWrite`] does that.
///
/// `rip == slot_addr` after a step means the instruction has not completed
/// (one iteration of a `rep` string instruction, or a fault): nothing is
/// changed, and the engine should step again. Plans without a slot
/// (emulated) are left alone.
pub fn fixup_after_step(
    plan: &ProbePlan,
    probe_addr: u64,
    slot_addr: u64,
    regs: &mut Registers,
) -> Option<MemWrite> {
    let slot = plan.slot.as_ref()?;
    let fixup = plan.step_fixup()?;
    if regs.rip == slot_addr {
        return None;
    }
    let orig_next = probe_addr.wrapping_add(plan.len as u64);
    let write = match fixup {
        StepFixup::None => None,
        StepFixup::CallReturnAddr => Some(MemWrite::qword(regs.rsp, orig_next)),
    };
    if regs.rip == slot_addr.wrapping_add(slot.insn_len_in_slot as u64) {
        regs.rip = orig_next;
    }
    write
}

/// Maps an address inside a slot back to the original code, e.g. to report
/// a fault or a signal delivered while a thread ran a boosted slot:
/// `slot_addr` maps to `probe_addr` (the instruction had not executed), the
/// jump back and the padding to `probe_addr + len` (it had). `None` if `rip`
/// is not at one of those places in the slot.
pub fn slot_to_original(
    plan: &ProbePlan,
    probe_addr: u64,
    slot_addr: u64,
    rip: u64,
) -> Option<u64> {
    let slot = plan.slot.as_ref()?;
    let offset = rip.wrapping_sub(slot_addr);
    if offset == 0 {
        Some(probe_addr)
    } else if offset >= slot.insn_len_in_slot as u64 && offset < SLOT_SIZE as u64 {
        Some(probe_addr.wrapping_add(plan.len as u64))
    } else {
        None
    }
}
