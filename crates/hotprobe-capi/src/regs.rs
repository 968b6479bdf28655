//! Copies between hotprobe's [`Registers`] and the C API's
//! [`hotprobe_regs`] / `HOTPROBE_REG_*` indices.

use crate::*;
use hotprobe::Registers;

/// Applies `$m!(field, INDEX)` to every register of `hotprobe_regs`.
macro_rules! each_reg {
    ($m:ident) => {
        $m!(rax, HOTPROBE_REG_RAX);
        $m!(rbx, HOTPROBE_REG_RBX);
        $m!(rcx, HOTPROBE_REG_RCX);
        $m!(rdx, HOTPROBE_REG_RDX);
        $m!(rsi, HOTPROBE_REG_RSI);
        $m!(rdi, HOTPROBE_REG_RDI);
        $m!(rbp, HOTPROBE_REG_RBP);
        $m!(rsp, HOTPROBE_REG_RSP);
        $m!(r8, HOTPROBE_REG_R8);
        $m!(r9, HOTPROBE_REG_R9);
        $m!(r10, HOTPROBE_REG_R10);
        $m!(r11, HOTPROBE_REG_R11);
        $m!(r12, HOTPROBE_REG_R12);
        $m!(r13, HOTPROBE_REG_R13);
        $m!(r14, HOTPROBE_REG_R14);
        $m!(r15, HOTPROBE_REG_R15);
        $m!(rip, HOTPROBE_REG_RIP);
        $m!(rflags, HOTPROBE_REG_RFLAGS);
    };
}

/// The register `index` (`HOTPROBE_REG_*`) of `r`, writable.
pub(crate) fn reg_mut(r: &mut Registers, index: u32) -> Option<&mut u64> {
    macro_rules! pick {
        ($f:ident, $i:ident) => {
            if index == $i {
                return Some(&mut r.$f);
            }
        };
    }
    each_reg!(pick);
    None
}

pub(crate) fn to_c_regs(r: &Registers) -> hotprobe_regs {
    let mut c = hotprobe_regs::default();
    macro_rules! copy {
        ($f:ident, $i:ident) => {
            c.$f = r.$f;
        };
    }
    each_reg!(copy);
    c
}

pub(crate) fn from_c_regs(c: &hotprobe_regs, r: &mut Registers) {
    macro_rules! copy {
        ($f:ident, $i:ident) => {
            r.$f = c.$f;
        };
    }
    each_reg!(copy);
}
