//! Decoding one instruction, and linear-sweep instruction boundaries.

use iced_x86::{Decoder, DecoderError, DecoderOptions, Formatter, Instruction, IntelFormatter};

use crate::{X86Error, MAX_INSN_LEN};

/// Decodes the one 64-bit instruction at the start of `bytes`, which are
/// located at address `ip`.
///
/// Trailing bytes past the instruction are ignored. Empty input, bytes that
/// end inside the instruction, and invalid encodings are errors.
pub fn decode(bytes: &[u8], ip: u64) -> Result<Instruction, X86Error> {
    if bytes.is_empty() {
        return Err(X86Error::Empty { addr: ip });
    }
    let mut decoder = Decoder::try_with_ip(64, bytes, ip, DecoderOptions::NONE)
        .map_err(|_| X86Error::Invalid { addr: ip })?;
    let instr = decoder.decode();
    if instr.is_invalid() {
        return Err(match decoder.last_error() {
            DecoderError::NoMoreBytes if is_prefix_of_valid(bytes, ip) => X86Error::Truncated {
                addr: ip,
                available: bytes.len(),
            },
            _ => X86Error::Invalid { addr: ip },
        });
    }
    Ok(instr)
}

/// Whether the too-short `bytes` are the start of some valid instruction:
/// the decoder reports "no more bytes" even for an invalid opcode once it
/// runs out, so decode again with zero padding to tell the two apart.
fn is_prefix_of_valid(bytes: &[u8], ip: u64) -> bool {
    if bytes.len() >= MAX_INSN_LEN {
        return false;
    }
    let mut padded = [0u8; MAX_INSN_LEN];
    padded[..bytes.len()].copy_from_slice(bytes);
    Decoder::try_with_ip(64, &padded, ip, DecoderOptions::NONE)
        .map(|mut d| {
            let instr = d.decode();
            !instr.is_invalid() && instr.len() > bytes.len()
        })
        .unwrap_or(false)
}

/// The addresses of the instructions of `code` (located at `start`) found
/// by a linear sweep from its first byte.
///
/// The sweep stops at the first byte sequence that does not decode (invalid
/// or truncated at the end of `code`); only complete instructions are
/// listed. Linear sweep is exact for compiler-generated function bodies
/// without embedded data (jump tables live in `.rodata` on x86-64).
pub fn instruction_starts(code: &[u8], start: u64) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut offset = 0usize;
    while offset < code.len() {
        let addr = start.wrapping_add(offset as u64);
        match decode(&code[offset..], addr) {
            Ok(instr) => {
                starts.push(addr);
                offset += instr.len().max(1);
            }
            Err(_) => break,
        }
    }
    starts
}

/// `true` if `addr` is the start of an instruction in the linear sweep of
/// `code` (located at `start`); see [`instruction_starts`].
pub fn is_instruction_boundary(code: &[u8], start: u64, addr: u64) -> bool {
    let Some(target) = addr.checked_sub(start) else {
        return false;
    };
    let mut offset = 0u64;
    while (offset as usize) < code.len() && offset <= target {
        if offset == target {
            return true;
        }
        match decode(&code[offset as usize..], start.wrapping_add(offset)) {
            Ok(instr) => offset += instr.len().max(1) as u64,
            Err(_) => return false,
        }
    }
    false
}

/// Formats an instruction in Intel syntax for messages, objdump-like:
/// lower-case, `0x` hex, `[rip+0x2ee5]` for RIP-relative operands
/// (e.g. `mov rax, [rip+0x2ee5]`).
pub fn format_instruction(instr: &Instruction) -> String {
    let mut formatter = IntelFormatter::new();
    let options = formatter.options_mut();
    options.set_hex_prefix("0x");
    options.set_hex_suffix("");
    options.set_uppercase_hex(false);
    options.set_space_after_operand_separator(true);
    options.set_rip_relative_addresses(true);
    options.set_branch_leading_zeros(false);
    let mut out = String::new();
    formatter.format(instr, &mut out);
    out
}
