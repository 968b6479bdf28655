//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target `module_info` of `fuzz/`
//! (included there by path). Depends on hotprobe-fastpath and std only.
#![allow(dead_code)]

use std::path::Path;

use hotprobe_fastpath::{MechanismChoice, ModuleInfo};

/// A probe list naming real functions (`main`, `tiny` of
/// tests/programs/loop.c) at an impossible address.
fn hostile(vaddr: &str) -> String {
    format!(
        "hotprobe-probes 1\nbuild-id -\n\
         site\t0x0\t{vaddr}\t5\tentry\tmain\t-\n\
         site\t0xffffffffffffffff\t{vaddr}\t6\texit\tmain\t-\n\
         site\t0x10\t{vaddr}\t5\tmcount\ttiny\t-\n\
         site\t0x20\t{vaddr}\t5\texit-tail\t-\t-\n\
         site\t0x30\t{vaddr}\t5\tentry\tnot_in_symtab\t-\n"
    )
}

/// Which probe list comes with the ELF file, by the first input byte
/// (modulo 5).
pub const NO_LIST: u8 = 0;
/// The list is in the input: its text, a NUL byte, then the ELF file.
pub const EMBEDDED_LIST: u8 = 1;
// 2, 3, 4: a hostile list at address 0, u64::MAX, u64::MAX - 3.

/// The input for an ELF file with its probe list embedded.
pub fn with_list(list: &str, elf: &[u8]) -> Vec<u8> {
    let mut s = vec![EMBEDDED_LIST];
    s.extend(list.as_bytes());
    s.push(0);
    s.extend(elf);
    s
}

/// `ModuleInfo::from_bytes` on an ELF file and a probe list picked by the
/// first byte, then `plan` for functions under every choice and `code`
/// at the edges. True if the module was accepted.
pub fn module_info(data: &[u8]) -> bool {
    let Some((&which, rest)) = data.split_first() else {
        return false;
    };
    let (list, elf) = match which % 5 {
        NO_LIST => (None, rest),
        EMBEDDED_LIST => {
            let nul = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            let list = String::from_utf8_lossy(&rest[..nul]).into_owned();
            (Some(list), rest.get(nul + 1..).unwrap_or(&[]))
        }
        2 => (Some(hostile("0x0")), rest),
        3 => (Some(hostile("0xffffffffffffffff")), rest),
        _ => (Some(hostile("0xfffffffffffffffc")), rest),
    };
    let Ok(m) = ModuleInfo::from_bytes(Path::new("fuzz.elf"), elf.to_vec(), list.as_deref()) else {
        return false;
    };
    let _ = (m.path(), m.has_probe_list());
    let fs = m.functions();
    for f in fs.iter().take(16).chain(fs.iter().rev().take(16)) {
        for choice in [
            MechanismChoice::Auto,
            MechanismChoice::Patch,
            MechanismChoice::Jump,
            MechanismChoice::Trap,
        ] {
            let _ = m.plan(f, choice);
        }
        let _ = m.code(f.addr, f.size);
        let _ = m.function(&f.name);
    }
    for (addr, len) in [(u64::MAX, 5), (0, u64::MAX), (u64::MAX - 3, 5)] {
        let _ = m.code(addr, len);
    }
    true
}
