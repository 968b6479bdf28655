//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target `data_access` of `fuzz/`
//! (included there by path). Depends on hotprobe-x86 and std only.

use hotprobe_x86::{data_access, Registers};

/// `data_access` on arbitrary code, registers and watched bytes (the
/// first 24 bytes: start, base register value, watched address; then a
/// length selector; the rest is the code): an answer is an instruction of
/// the code. True if there was one.
pub fn data_access_input(data: &[u8]) -> bool {
    if data.len() < 25 {
        return false;
    }
    let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
    let (start, base, addr) = (word(0), word(8), word(16));
    let len = [1u8, 2, 4, 8][(data[24] & 3) as usize];
    let code = &data[25..];
    let regs = Registers {
        rax: base,
        rbx: base,
        rcx: base ^ 0x55,
        rsp: base.wrapping_sub(8),
        rbp: base,
        rip: start.wrapping_add(code.len() as u64),
        ..Registers::default()
    };
    match data_access(code, start, &regs, addr, len) {
        Some(a) => {
            assert!(a.addr >= start && a.addr - start < code.len() as u64);
            if a.written.is_some() {
                assert!(a.writes);
            }
            true
        }
        None => false,
    }
}

/// `plan_jump_padded` (and so `plan_jump`) on arbitrary function bytes:
/// the first byte is the function's length (the rest of the input is its
/// code, then the padding after it); a plan covers at least the jump, its
/// original bytes are the input's, and it relocates without a panic. True
/// if a plan was made.
#[allow(dead_code)] // unused by the cargo-fuzz target `data_access`
pub fn plan_jump_input(data: &[u8]) -> bool {
    let Some((&len, code)) = data.split_first() else {
        return false;
    };
    let start = 0x40_1000u64;
    match hotprobe_x86::plan_jump_padded(code, usize::from(len), start, start) {
        Ok(p) => {
            assert!(p.covered >= 5 && p.covered <= code.len(), "{p:?}");
            assert_eq!(p.original, code[..p.covered]);
            let _ = p.relocate(0x40_8000);
            let _ = p.patch_bytes(0x40_8000);
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}
