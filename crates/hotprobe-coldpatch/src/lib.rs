//! iProbe ColdPatch: turns the compiler's instrumentation calls of an x86-64
//! ELF binary into NOP placeholders and lists them.
//!
//! A binary built with `-finstrument-functions` calls
//! `__cyg_profile_func_enter`/`__cyg_profile_func_exit` in every function
//! (through the PLT, a `call [rip+GOT]` with `-fno-plt`, or directly when the
//! hooks are linked in); one built with `-pg` calls `mcount` (or
//! `__fentry__` with `-mfentry`). [`coldpatch`] finds every such call in the
//! executable sections (linear sweep with iced-x86), replaces each with a NOP
//! of the same length — or, for a tail call `jmp __cyg_profile_func_exit`,
//! with `ret` + NOP, which is what the jump did minus the hook — and returns
//! the patched image with a [`ProbeList`]. The argument set-up before each
//! call (`lea rdi, [func]`, `mov rsi, [rsp+..]`) becomes dead but harmless:
//! the hooks' arguments are caller-saved registers, so the patched binary
//! behaves exactly like the original minus the calls.

mod probelist;

use std::borrow::Cow;
use std::collections::HashMap;

use iced_x86::{Code, Decoder, DecoderOptions, Register};
use object::elf::{SHF_EXECINSTR, SHT_PROGBITS};
use object::read::elf::{ElfFile64, SectionHeader};
use object::{
    Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget, SymbolKind,
};

pub use probelist::{ParseError, ProbeList, ProbeSite, SiteKind, MAGIC_LINE};

/// Why a binary could not be coldpatched.
#[derive(Debug, thiserror::Error)]
pub enum ColdpatchError {
    /// Not a parseable ELF file.
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    /// Not a 64-bit little-endian x86-64 ELF.
    #[error("not an x86-64 ELF64 binary")]
    NotX86_64,
    /// No instrumentation call found.
    #[error(
        "no call to __cyg_profile_func_enter/__cyg_profile_func_exit/mcount/__fentry__ found: \
         build with -finstrument-functions or -pg"
    )]
    NothingToPatch,
    /// A site lies outside the file's bytes (corrupt section headers).
    #[error("site at {vaddr:#x} lies outside the file")]
    OutOfFile {
        /// The site's address.
        vaddr: u64,
    },
}

/// The hook a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    Enter,
    Exit,
    Mcount,
}

fn hook_of(name: &str) -> Option<Hook> {
    // Versioned dynamic names look like `mcount@GLIBC_2.2.5` in some tools.
    let name = name.split('@').next().unwrap_or(name);
    match name {
        "__cyg_profile_func_enter" => Some(Hook::Enter),
        "__cyg_profile_func_exit" => Some(Hook::Exit),
        "mcount" | "_mcount" | "__fentry__" => Some(Hook::Mcount),
        _ => None,
    }
}

/// Where calls to the hooks can go: direct addresses (defined symbols and
/// PLT stubs) and GOT slots (`call [rip+GOT]`).
#[derive(Debug, Default)]
struct Hooks {
    direct: HashMap<u64, Hook>,
    got: HashMap<u64, Hook>,
}

fn find_hooks(elf: &ElfFile64<'_>) -> Hooks {
    let mut h = Hooks::default();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if let (Ok(name), true) = (sym.name(), sym.is_definition()) {
            if let Some(k) = hook_of(name) {
                if sym.address() != 0 {
                    h.direct.insert(sym.address(), k);
                }
            }
        }
    }
    // GOT slots through the dynamic relocations (JUMP_SLOT and GLOB_DAT).
    if let (Some(relocs), Some(dynsyms)) = (elf.dynamic_relocations(), elf.dynamic_symbol_table()) {
        for (slot, r) in relocs {
            if let RelocationTarget::Symbol(i) = r.target() {
                if let Some(k) = dynsyms
                    .symbol_by_index(i)
                    .ok()
                    .and_then(|s| s.name().ok().and_then(hook_of))
                {
                    h.got.insert(slot, k);
                }
            }
        }
    }
    // PLT stubs: every `jmp [rip+slot]` in a .plt* section; the stub starts
    // at the jump, or 4 bytes earlier when an endbr64 precedes it (.plt.sec).
    for sec in elf.sections() {
        let Ok(name) = sec.name() else { continue };
        if !name.starts_with(".plt") {
            continue;
        }
        let Ok(data) = sec.data() else { continue };
        let mut d = Decoder::with_ip(64, data, sec.address(), DecoderOptions::NONE);
        for ins in &mut d {
            if ins.code() == Code::Jmp_rm64 && ins.memory_base() == Register::RIP {
                if let Some(&k) = h.got.get(&ins.ip_rel_memory_address()) {
                    let off = (ins.ip() - sec.address()) as usize;
                    let endbr =
                        off >= 4 && data.get(off - 4..off) == Some(&[0xf3, 0x0f, 0x1e, 0xfa][..]);
                    h.direct
                        .insert(if endbr { ins.ip() - 4 } else { ins.ip() }, k);
                }
            }
        }
    }
    h
}

/// Function symbols sorted by address, to name the function holding a site.
fn functions(elf: &ElfFile64<'_>) -> Vec<(u64, u64, String)> {
    let mut f: Vec<(u64, u64, String)> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect();
    f.sort();
    f.dedup_by_key(|x| x.0);
    f
}

fn containing(funcs: &[(u64, u64, String)], addr: u64) -> Option<String> {
    let i = funcs.partition_point(|f| f.0 <= addr).checked_sub(1)?;
    let (a, size, name) = &funcs[i];
    // A hostile symbol table may put a symbol at the top of the address
    // space: no overflow, just no match.
    (addr - a < *size).then(|| name.clone())
}

type Dwarf<'a> = addr2line::Context<gimli::EndianSlice<'a, gimli::RunTimeEndian>>;

/// Loads the DWARF line tables, if any (sections kept alive in `arena`).
fn dwarf<'a>(
    elf: &ElfFile64<'a>,
    arena: &'a mut HashMap<gimli::SectionId, Cow<'a, [u8]>>,
) -> Option<Dwarf<'a>> {
    elf.section_by_name(".debug_info")?;
    for id in [
        gimli::SectionId::DebugAbbrev,
        gimli::SectionId::DebugAddr,
        gimli::SectionId::DebugAranges,
        gimli::SectionId::DebugInfo,
        gimli::SectionId::DebugLine,
        gimli::SectionId::DebugLineStr,
        gimli::SectionId::DebugRanges,
        gimli::SectionId::DebugRngLists,
        gimli::SectionId::DebugStr,
        gimli::SectionId::DebugStrOffsets,
    ] {
        if let Some(data) = elf
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
        {
            arena.insert(id, data);
        }
    }
    let arena: &'a HashMap<_, _> = arena;
    let d = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
        let data = arena.get(&id).map(|c| &**c).unwrap_or(&[]);
        Ok(gimli::EndianSlice::new(data, gimli::RunTimeEndian::Little))
    })
    .ok()?;
    addr2line::Context::from_dwarf(d).ok()
}

/// Replaces every instrumentation call of `input` (an x86-64 ELF) with a
/// placeholder and lists the sites. The output has the same size and
/// layout as the input; only the bytes of the listed sites differ.
pub fn coldpatch(input: &[u8]) -> Result<(Vec<u8>, ProbeList), ColdpatchError> {
    let elf = ElfFile64::<object::Endianness>::parse(input)?;
    if elf.architecture() != object::Architecture::X86_64 || !elf.is_little_endian() {
        return Err(ColdpatchError::NotX86_64);
    }
    let hooks = find_hooks(&elf);
    let funcs = functions(&elf);
    let mut arena = HashMap::new();
    let lines = dwarf(&elf, &mut arena);
    let mut out = input.to_vec();
    let mut sites = vec![];
    let endian = elf.endian();
    for sec in elf.sections() {
        let hdr = sec.elf_section_header();
        if hdr.sh_type(endian) != SHT_PROGBITS
            || hdr.sh_flags(endian) & u64::from(SHF_EXECINSTR) == 0
        {
            continue;
        }
        if sec.name().is_ok_and(|n| n.starts_with(".plt")) {
            continue;
        }
        let (Ok(data), Some((file_off, _))) = (sec.data(), sec.file_range()) else {
            continue;
        };
        let mut d = Decoder::with_ip(64, data, sec.address(), DecoderOptions::NONE);
        for ins in &mut d {
            let rip_mem = ins.memory_base() == Register::RIP;
            let (hook, tail) = match ins.code() {
                Code::Call_rel32_64 => (hooks.direct.get(&ins.near_branch_target()), false),
                Code::Jmp_rel32_64 => (hooks.direct.get(&ins.near_branch_target()), true),
                Code::Call_rm64 if rip_mem => (hooks.got.get(&ins.ip_rel_memory_address()), false),
                Code::Jmp_rm64 if rip_mem => (hooks.got.get(&ins.ip_rel_memory_address()), true),
                _ => (None, false),
            };
            let Some(&hook) = hook else { continue };
            let kind = match (hook, tail) {
                (Hook::Enter, false) => SiteKind::Entry,
                (Hook::Exit, false) => SiteKind::Exit,
                (Hook::Exit, true) => SiteKind::ExitTail,
                (Hook::Mcount, false) => SiteKind::Mcount,
                // A tail jump to an entry hook would be a compiler oddity:
                // leave it alone rather than guess.
                (_, true) => continue,
            };
            let len = ins.len();
            let bytes: &[u8] = match (len, tail) {
                (5, false) => &placeholder::NOP5,
                (6, false) => &placeholder::NOP6,
                (5, true) => &placeholder::RET_NOP4,
                (6, true) => &placeholder::RET_NOP5,
                _ => continue,
            };
            let offset = file_off + (ins.ip() - sec.address());
            let dst = usize::try_from(offset)
                .ok()
                .and_then(|o| out.get_mut(o..o + len))
                .ok_or(ColdpatchError::OutOfFile { vaddr: ins.ip() })?;
            dst.copy_from_slice(bytes);
            let location = lines
                .as_ref()
                .and_then(|c| c.find_location(ins.ip()).ok().flatten())
                .and_then(|l| Some(format!("{}:{}", l.file?, l.line?)));
            sites.push(ProbeSite {
                offset,
                vaddr: ins.ip(),
                len: len as u8,
                kind,
                function: containing(&funcs, ins.ip()),
                location,
            });
        }
    }
    if sites.is_empty() {
        return Err(ColdpatchError::NothingToPatch);
    }
    sites.sort_by_key(|s| s.offset);
    let build_id = elf.build_id().ok().flatten().map(|b| b.to_vec());
    Ok((out, ProbeList { build_id, sites }))
}

/// The placeholder byte sequences (the same as `hotprobe_abi::patch`, kept
/// here so this pure library does not depend on the agent's ABI crate).
pub mod placeholder {
    /// `nop dword [rax+rax*1+0]`.
    pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
    /// `nop word [rax+rax*1+0]`.
    pub const NOP6: [u8; 6] = [0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00];
    /// `ret` + `nop dword [rax+0]`: a 5-byte tail call to the exit hook.
    pub const RET_NOP4: [u8; 5] = [0xc3, 0x0f, 0x1f, 0x40, 0x00];
    /// `ret` + `nop dword [rax+rax*1+0]`: a 6-byte `jmp [rip+GOT]` tail call.
    pub const RET_NOP5: [u8; 6] = [0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00];
}

#[cfg(test)]
mod tests {
    use super::containing;

    #[test]
    fn a_symbol_at_the_top_of_the_address_space_is_no_overflow() {
        // Found by fuzz_coldpatch (HOTPROBE_FUZZ_SEED=0x6d64207fe4e2d473):
        // `a + size` overflowed.
        let funcs = vec![
            (0x1000, 0x10, "f".to_string()),
            (u64::MAX - 0x10, 0x100, "top".to_string()),
        ];
        assert_eq!(containing(&funcs, 0x1008), Some("f".into()));
        assert_eq!(containing(&funcs, 0x1010), None);
        assert_eq!(containing(&funcs, u64::MAX - 8), Some("top".into()));
        assert_eq!(containing(&funcs, 0x10), None);
    }
}
