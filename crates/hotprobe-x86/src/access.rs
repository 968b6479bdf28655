//! Which instruction made a data access a watchpoint trapped after.
//!
//! A data breakpoint traps *after* the accessing instruction, with `rip`
//! on the next one. Decoding backwards from there is not reliable (x86
//! lengths vary), so [`data_access`] decodes forward from a known
//! boundary (the function's start) up to the trap's `rip`, and checks
//! that the last instruction ends exactly there and touches the watched
//! bytes.

use crate::plan::Gpr;
use crate::{decode, instruction_starts};
use hotprobe_target::Registers;
use iced_x86::{Code, InstructionInfoFactory, OpAccess, OpKind, Register};

/// The instruction that made a watched access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataAccess {
    /// Its address.
    pub addr: u64,
    /// Whether it writes (some of) the watched bytes.
    pub writes: bool,
    /// The value it stored, when its operand says (a `mov` of a register or
    /// an immediate onto exactly the watched bytes).
    pub written: Option<u64>,
}

/// `v` cut to `len` bytes.
fn mask(v: u64, len: u64) -> u64 {
    if len >= 8 {
        v
    } else {
        v & ((1u64 << (8 * len)) - 1)
    }
}

/// The value of `reg` in `regs` (`rip` as in `regs`, segment bases for
/// `fs`/`gs`, 0 for the other segments).
fn register_value(regs: &Registers, reg: Register) -> Option<u64> {
    match reg {
        Register::RIP => return Some(regs.rip),
        Register::FS => return Some(regs.fs_base),
        Register::GS => return Some(regs.gs_base),
        Register::ES | Register::CS | Register::SS | Register::DS => return Some(0),
        _ => {}
    }
    let full = Gpr::from_iced(reg.full_register())?.get(regs);
    Some(match reg {
        Register::AH | Register::BH | Register::CH | Register::DH => (full >> 8) & 0xff,
        _ => mask(full, reg.size() as u64),
    })
}

/// The instruction of `code` (bytes from `start`, a known instruction
/// boundary such as a function's start, up to the trap's `rip`, which is
/// `start + code.len()`) that ends at the trap and accesses `addr..addr +
/// len`, found by a linear sweep from `start`. `regs` are the registers at
/// the trap (after the access): memory operands are evaluated with them.
/// `None` when the sweep does not end exactly at the trap or its last
/// instruction touches none of the watched bytes.
pub fn data_access(
    code: &[u8],
    start: u64,
    regs: &Registers,
    addr: u64,
    len: u8,
) -> Option<DataAccess> {
    let pc_after = start.checked_add(code.len() as u64)?;
    let last = *instruction_starts(code, start).last()?;
    let insn = decode(&code[(last - start) as usize..], last).ok()?;
    if insn.next_ip() != pc_after {
        return None;
    }
    let mut factory = InstructionInfoFactory::new();
    let info = factory.info(&insn);
    let (w_start, w_end) = (addr, addr.saturating_add(len as u64));
    let eval =
        |m: &iced_x86::UsedMemory| m.try_virtual_address(0, |r, _, _| register_value(regs, r));
    let mut writes = false;
    let mut touches = false;
    for m in info.used_memory() {
        let Some(va) = eval(m) else { continue };
        let size = (m.memory_size().size() as u64).max(1);
        if va < w_end && w_start < va.saturating_add(size) {
            touches = true;
            writes |= matches!(
                m.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            );
        }
    }
    if !touches {
        return None;
    }
    // A plain store of a register or an immediate: the value is in the
    // instruction (which changes no register), so it is this thread's
    // even if another thread stored again before the trap was handled.
    let plain_store = matches!(
        insn.code(),
        Code::Mov_rm8_r8
            | Code::Mov_rm16_r16
            | Code::Mov_rm32_r32
            | Code::Mov_rm64_r64
            | Code::Mov_rm8_imm8
            | Code::Mov_rm16_imm16
            | Code::Mov_rm32_imm32
            | Code::Mov_rm64_imm32
    ) && insn.op0_kind() == OpKind::Memory;
    let written = if plain_store {
        let va = info.used_memory().first().and_then(eval);
        let size = insn.memory_size().size() as u64;
        if va == Some(addr) && size == len as u64 {
            match insn.op1_kind() {
                OpKind::Register => register_value(regs, insn.op1_register()),
                OpKind::Immediate8
                | OpKind::Immediate16
                | OpKind::Immediate32
                | OpKind::Immediate32to64 => Some(mask(insn.immediate(1), size)),
                _ => None,
            }
        } else {
            None
        }
    } else {
        None
    };
    Some(DataAccess {
        addr: last,
        writes,
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_rip_relative_store_and_its_value() {
        // nop; mov eax, 7; mov [rip+0x1000], eax; (trap here)
        let start = 0x40_0000u64;
        let code = [
            0x90, // nop
            0xb8, 0x07, 0, 0, 0, // mov eax, 7
            0x89, 0x05, 0x00, 0x10, 0, 0, // mov [rip+0x1000], eax
        ];
        let pc_after = start + code.len() as u64;
        let regs = Registers {
            rax: 0xffff_ffff_0000_0007,
            rip: pc_after,
            ..Registers::default()
        };
        let a = data_access(&code, start, &regs, pc_after + 0x1000, 4).unwrap();
        assert_eq!(a.addr, start + 6);
        assert!(a.writes);
        // eax, not rax.
        assert_eq!(a.written, Some(7));
        // Another address: not this instruction's access.
        assert_eq!(data_access(&code, start, &regs, pc_after + 0x2000, 4), None);
        // A watch on 2 of the 4 bytes: seen, but the value is not the operand's.
        let a = data_access(&code, start, &regs, pc_after + 0x1002, 2).unwrap();
        assert_eq!(a.written, None);
    }

    #[test]
    fn an_immediate_store() {
        // mov qword [rbx+8], -1 (imm32 sign-extended)
        let start = 0x1000u64;
        let code = [0x48, 0xc7, 0x43, 0x08, 0xff, 0xff, 0xff, 0xff];
        let regs = Registers {
            rbx: 0x5000,
            rip: start + code.len() as u64,
            ..Registers::default()
        };
        let a = data_access(&code, start, &regs, 0x5008, 8).unwrap();
        assert_eq!(a.written, Some(u64::MAX));
    }

    #[test]
    fn a_read_modify_write_gives_no_operand_value() {
        // add dword [rip+0x10], 1
        let start = 0x1000u64;
        let code = [0x83, 0x05, 0x10, 0, 0, 0, 0x01];
        let pc_after = start + code.len() as u64;
        let regs = Registers {
            rip: pc_after,
            ..Registers::default()
        };
        let a = data_access(&code, start, &regs, pc_after + 0x10, 4).unwrap();
        assert_eq!(a.addr, start);
        assert!(a.writes);
        assert_eq!(a.written, None);
    }

    #[test]
    fn a_load_is_a_read() {
        // mov eax, [rbx]
        let start = 0x1000u64;
        let code = [0x8b, 0x03];
        let regs = Registers {
            rbx: 0x5000,
            rip: start + 2,
            ..Registers::default()
        };
        let a = data_access(&code, start, &regs, 0x5000, 4).unwrap();
        assert!(!a.writes);
        assert_eq!(a.written, None);
    }

    #[test]
    fn a_sweep_not_ending_at_the_trap_is_no_answer() {
        // mov eax, [rbx] with the trap one byte into it.
        let regs = Registers {
            rbx: 0x5000,
            ..Registers::default()
        };
        assert_eq!(data_access(&[0x8b], 0x1000, &regs, 0x5000, 4), None);
        assert_eq!(data_access(&[], 0x1000, &regs, 0x5000, 4), None);
    }
}
