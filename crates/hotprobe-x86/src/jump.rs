//! Jump plans: can the first bytes at a probe site be overwritten with a
//! 5-byte `jmp rel32` to a trampoline, and if so, which instructions move to
//! the trampoline and how are they relocated there.
//!
//! A site qualifies when
//! * the instructions starting at the site cover at least
//!   [`crate::JMP_REL32_LEN`] bytes inside the function,
//! * none of them is a breakpoint, a trapping or transactional instruction
//!   or a system call, nor a `ret` before the 5th byte,
//! * a `call` among them ends at or past the 5th byte (it is the last one
//!   displaced): it is relocated as a push of its *original* return address
//!   followed by a `jmp` to its callee, so the callee returns straight into
//!   the function after the call and unwinders see the original return
//!   address; a `call` ending earlier is refused (the bytes after it, where
//!   it returns, are overwritten),
//! * an unconditional `jmp` before the 5th byte ends the code that runs:
//!   the bytes after it up to the 5th are overwritten and never reached but
//!   by a branch, which the scan below refuses,
//! * no branch anywhere in the function (linear sweep) lands strictly inside
//!   the displaced bytes (it would execute half of the `jmp rel32`),
//! * each displaced instruction can be re-encoded at the trampoline with
//!   iced-x86's `BlockEncoder` (RIP-relative operands and relative branches
//!   re-targeted to the same absolute addresses; a `jcc rel8` becomes a
//!   `jcc rel32`, or a `jcc` over an absolute jump when out of reach).
//!
//! Indirect jumps through jump tables cannot be followed by a linear sweep;
//! gcc and clang place switch-case labels after the prologue, never within
//! the first 5 bytes of a function, which is where the fast path probes.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Mnemonic, OpKind, Register,
};

use crate::{format_instruction, JMP_REL32_LEN};

/// Why a site cannot take a `jmp rel32` (the trap mechanism must be used).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JumpError {
    /// The function is shorter than the jump.
    #[error("function shorter than 5 bytes ({len} bytes)")]
    FunctionTooShort {
        /// The function's size in bytes.
        len: u64,
    },
    /// The code from the site to the function's end is shorter than the jump.
    #[error("only {len} bytes from the site to the end of the function")]
    TooShortFromSite {
        /// Bytes available.
        len: u64,
    },
    /// The site is not inside the function bytes given.
    #[error("site {site:#x} lies outside the function [{start:#x}, {end:#x})")]
    OutsideFunction {
        /// The site.
        site: u64,
        /// Function start.
        start: u64,
        /// Function end.
        end: u64,
    },
    /// The bytes at an address do not decode.
    #[error("invalid instruction at +{offset:#x}")]
    Invalid {
        /// Offset from the function start.
        offset: u64,
    },
    /// An instruction among the displaced ones ends the straight-line code or
    /// cannot run from the trampoline.
    #[error("`{mnemonic}` at +{offset:#x} within the first 5 bytes {why}")]
    Unrelocatable {
        /// Offset from the function start.
        offset: u64,
        /// The instruction as text.
        mnemonic: String,
        /// Why.
        why: &'static str,
    },
    /// A branch of the function lands strictly inside the displaced bytes.
    #[error("a jump lands inside the first 5 bytes at +{target_offset} (from `{mnemonic}` at +{from_offset:#x})")]
    BranchInto {
        /// Offset of the branch target from the site.
        target_offset: u64,
        /// Offset of the branch instruction from the function start.
        from_offset: u64,
        /// The branch instruction as text.
        mnemonic: String,
    },
    /// iced-x86 could not re-encode the displaced instructions at the
    /// trampoline address.
    #[error("cannot relocate the displaced instructions to {at:#x}: {why}")]
    Relocation {
        /// Trampoline address asked for.
        at: u64,
        /// The encoder's message.
        why: String,
    },
}

/// A site that can take a `jmp rel32`: the instructions it displaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpPlan {
    /// Run-time (or link-time, consistently) address of the site.
    pub site: u64,
    /// Number of bytes displaced (≥ 5): the jump's 5 bytes plus the tail of
    /// the last displaced instruction, which the patch fills with `int3`.
    pub covered: usize,
    /// The original bytes at `site..site + covered`.
    pub original: Vec<u8>,
    /// The displaced instructions that run, decoded at their original
    /// addresses (those after an unconditional `jmp`, never reached, are
    /// covered but not listed).
    pub instructions: Vec<Instruction>,
}

impl JumpPlan {
    /// The bytes to write at the site: `jmp rel32` to `trampoline_code`
    /// followed by `int3` up to `covered` (never executed: no branch lands
    /// there). `None` if the trampoline is out of ±2 GiB.
    pub fn patch_bytes(&self, trampoline_code: u64) -> Option<Vec<u8>> {
        let rel = trampoline_code.wrapping_sub(self.site.wrapping_add(5)) as i64;
        let rel = i32::try_from(rel).ok()?;
        let mut v = vec![0xcc; self.covered];
        v[0] = 0xe9;
        v[1..5].copy_from_slice(&rel.to_le_bytes());
        Some(v)
    }

    /// The displaced instructions re-encoded to run at `at`, followed by a
    /// jump back to `site + covered` (none after a relocated `call`, whose
    /// callee returns there itself).
    pub fn relocate(&self, at: u64) -> Result<Vec<u8>, JumpError> {
        let fail = |why: String| JumpError::Relocation { at, why };
        let mut instrs = Vec::with_capacity(self.instructions.len() + 4);
        let mut called = false;
        for i in &self.instructions {
            match i.flow_control() {
                FlowControl::Call | FlowControl::IndirectCall => {
                    relocated_call(i, &mut instrs).map_err(fail)?;
                    called = true;
                }
                _ => instrs.push(*i),
            }
        }
        if !called {
            let back = self.site.wrapping_add(self.covered as u64);
            let mut jmp = Instruction::with_branch(Code::Jmp_rel32_64, back)
                .map_err(|e| fail(e.to_string()))?;
            // An address no branch targets: BlockEncoder re-targets branches to
            // instructions of the block, and `back` must stay the original address.
            jmp.set_ip(0);
            instrs.push(jmp);
        }
        let block = InstructionBlock::new(&instrs, at);
        let r = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
            .map_err(|e| fail(e.to_string()))?;
        Ok(r.code_buffer)
    }
}

/// A displaced `call` as it runs from the trampoline: its original return
/// address pushed (registers and flags untouched: `push imm32` when the
/// address sign-extends from 32 bits, else `lea rsp, [rsp-8]` and two
/// `mov dword`), then a `jmp` to the callee (rel32, or through memory when
/// out of reach: BlockEncoder's choice), or, for `call r/m64`, `jmp r/m64`
/// with the same operand.
fn relocated_call(call: &Instruction, out: &mut Vec<Instruction>) -> Result<(), String> {
    let ret = call.next_ip();
    let e = |e: iced_x86::IcedError| e.to_string();
    let mut jmp = match call.code() {
        Code::Call_rel32_64 => {
            Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch_target()).map_err(e)?
        }
        Code::Call_rm64 => {
            let mut j = *call;
            j.set_code(Code::Jmp_rm64);
            j
        }
        _ => return Err(format!("no relocation for `{}`", format_instruction(call))),
    };
    jmp.set_ip(0);
    if let Ok(imm) = i32::try_from(ret as i64) {
        out.push(Instruction::with1(Code::Pushq_imm32, imm).map_err(e)?);
    } else {
        let rsp = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
        out.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp(-8)).map_err(e)?);
        out.push(Instruction::with2(Code::Mov_rm32_imm32, rsp(0), ret as u32).map_err(e)?);
        out.push(Instruction::with2(Code::Mov_rm32_imm32, rsp(4), (ret >> 32) as u32).map_err(e)?);
    }
    out.push(jmp);
    Ok(())
}

/// Why a `call` at the end of the displaced bytes cannot be relocated as
/// push + jmp, if it cannot.
fn call_refusal(instr: &Instruction, site: u64, end: u64) -> Option<&'static str> {
    match instr.code() {
        Code::Call_rel32_64 => {
            let t = instr.near_branch_target();
            (site..end)
                .contains(&t)
                .then_some("is a call into the displaced bytes")
        }
        Code::Call_rm64 => {
            let uses_rsp = if instr.op0_kind() == OpKind::Register {
                instr.op0_register() == Register::RSP
            } else {
                instr.memory_base() == Register::RSP || instr.memory_index() == Register::RSP
            };
            uses_rsp.then_some("is an indirect call through the stack pointer")
        }
        _ => Some("is a call that cannot be relocated (far, or no r/m64 operand)"),
    }
}

fn is_near_branch(instr: &Instruction) -> bool {
    matches!(
        instr.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    ) && matches!(
        instr.flow_control(),
        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
    )
}

/// Plans a jump at `site` inside the function whose bytes are `function`
/// (starting at `func_start`; pass exactly the function's bytes, its size
/// from the symbol table).
pub fn plan_jump(function: &[u8], func_start: u64, site: u64) -> Result<JumpPlan, JumpError> {
    let len = function.len() as u64;
    let end = func_start.wrapping_add(len);
    if site < func_start || site >= end {
        return Err(JumpError::OutsideFunction {
            site,
            start: func_start,
            end,
        });
    }
    if len < JMP_REL32_LEN as u64 {
        return Err(JumpError::FunctionTooShort { len });
    }
    let off = (site - func_start) as usize;
    if len - off as u64 <= 4 {
        return Err(JumpError::TooShortFromSite {
            len: len - off as u64,
        });
    }
    // The displaced instructions.
    let mut dec = Decoder::with_ip(64, &function[off..], site, DecoderOptions::NONE);
    let mut instructions = Vec::new();
    let mut covered = 0usize;
    // Past an unconditional jump nothing displaced runs (a branch landing
    // there is refused below): its bytes are only counted.
    let mut dead = false;
    while covered < JMP_REL32_LEN {
        if !dec.can_decode() {
            return Err(JumpError::TooShortFromSite {
                len: covered as u64,
            });
        }
        let instr = dec.decode();
        let at = instr.ip() - func_start;
        if instr.code() == Code::INVALID {
            return Err(JumpError::Invalid { offset: at });
        }
        if dead {
            covered += instr.len();
            continue;
        }
        let refuse = |why| {
            Err(JumpError::Unrelocatable {
                offset: at,
                mnemonic: format_instruction(&instr),
                why,
            })
        };
        // A `ret`, `jmp` or `call` may be the last instruction displaced
        // when it ends at or past the jump's 5th byte: no byte after it is
        // overwritten (it runs relocated; the callee of a call returns to
        // the original code after it).
        let last = covered + instr.len() >= JMP_REL32_LEN;
        // iced-x86 counts `syscall` as a call: checked first.
        if matches!(instr.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) {
            return refuse("is a system call (the kernel may restart it by address)");
        }
        match instr.flow_control() {
            FlowControl::Return if !last => return refuse("returns before 5 bytes"),
            FlowControl::IndirectBranch if !last => return refuse("jumps away before 5 bytes"),
            FlowControl::UnconditionalBranch if !last => dead = true,
            FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch => {}
            FlowControl::Call | FlowControl::IndirectCall if !last => {
                return refuse(
                    "is a call ending before the 5th byte (it returns into the overwritten bytes)",
                )
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                if let Some(why) = call_refusal(&instr, site, instr.next_ip()) {
                    return refuse(why);
                }
            }
            FlowControl::Interrupt if instr.code() == Code::Int3 => {
                return refuse(
                    "is a breakpoint already (a kernel uprobe's, another debugger's, or padding)",
                )
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                return refuse("traps or faults on purpose")
            }
            FlowControl::XbeginXabortXend => {
                return refuse("is a transactional-memory instruction")
            }
            FlowControl::Next | FlowControl::ConditionalBranch => {}
        }
        if instr.is_ip_rel_memory_operand() && instr.memory_base() != iced_x86::Register::RIP {
            return refuse("uses EIP-relative addressing");
        }
        covered += instr.len();
        instructions.push(instr);
    }
    if site + covered as u64 > end {
        return Err(JumpError::TooShortFromSite { len: end - site });
    }
    // Branch-target scan over the whole function (linear sweep).
    let inside = site + 1..site + covered as u64;
    let mut dec = Decoder::with_ip(64, function, func_start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut instr);
        if is_near_branch(&instr) {
            let t = instr.near_branch_target();
            if inside.contains(&t) {
                return Err(JumpError::BranchInto {
                    target_offset: t - site,
                    from_offset: instr.ip() - func_start,
                    mnemonic: format_instruction(&instr),
                });
            }
        }
    }
    Ok(JumpPlan {
        site,
        covered,
        original: function[off..off + covered].to_vec(),
        instructions,
    })
}

/// As [`plan_jump`], for a function shorter than the jump followed by
/// padding no code reaches: `code` holds the function's `body_len` bytes
/// and then the padding after it up to the next function (the caller
/// checked that no symbol starts there). Such a function (a 1-byte `ret`,
/// a 4-byte `lea eax, [rdi+1]; ret`, common in stock libraries, where only
/// a trap took it) can take the jump when its last instruction leaves it
/// (`ret` or `jmp`) and the bytes after it, up to the jump's 5th, decode
/// as padding (`nop` forms or `int3`): the whole function is displaced and
/// runs relocated; the padding overwritten was never executed. A function
/// of 5 bytes or more is planned by [`plan_jump`] on its own bytes.
///
/// A short function whose entry already holds a `jmp rel32` (a probe
/// placed there before, ours or another tool's: no instruction of a
/// function under 5 bytes is one) is planned on that jump, as [`plan_jump`]
/// plans a second probe on a longer function: the new trampoline runs
/// the relocated jump, so both probes see every call.
pub fn plan_jump_padded(
    code: &[u8],
    body_len: usize,
    func_start: u64,
    site: u64,
) -> Result<JumpPlan, JumpError> {
    let body = code.get(..body_len).unwrap_or(code);
    if body.len() >= JMP_REL32_LEN || code.len() <= body.len() {
        return plan_jump(body, func_start, site);
    }
    if site == func_start && code.len() >= JMP_REL32_LEN && code[0] == 0xe9 {
        return plan_jump(&code[..JMP_REL32_LEN], func_start, site);
    }
    let too_short = JumpError::FunctionTooShort {
        len: body.len() as u64,
    };
    if site != func_start || code.len() < JMP_REL32_LEN || body.is_empty() {
        return Err(too_short);
    }
    let instructions = short_body(body, func_start)?;
    // The padding the jump's tail lands on: nothing but `nop` and `int3`.
    let pad_start = func_start + body.len() as u64;
    let mut dec = Decoder::with_ip(64, &code[body.len()..], pad_start, DecoderOptions::NONE);
    while dec.ip() < func_start + JMP_REL32_LEN as u64 {
        if !dec.can_decode() {
            return Err(too_short);
        }
        let instr = dec.decode();
        if instr.mnemonic() != Mnemonic::Nop && instr.code() != Code::Int3 {
            return Err(too_short);
        }
    }
    Ok(JumpPlan {
        site,
        covered: JMP_REL32_LEN,
        original: code[..JMP_REL32_LEN].to_vec(),
        instructions,
    })
}

/// The instructions of a function shorter than a jump (`body`, at
/// `func_start`), when all of them can run relocated in a trampoline: no
/// branch but the last instruction, which must leave the function (`ret`,
/// `jmp`), no system call, no EIP-relative operand.
pub(crate) fn short_body(body: &[u8], func_start: u64) -> Result<Vec<Instruction>, JumpError> {
    let too_short = JumpError::FunctionTooShort {
        len: body.len() as u64,
    };
    let mut dec = Decoder::with_ip(64, body, func_start, DecoderOptions::NONE);
    let mut instructions = Vec::new();
    while dec.can_decode() {
        let instr = dec.decode();
        if instr.code() == Code::INVALID {
            return Err(JumpError::Invalid {
                offset: instr.ip() - func_start,
            });
        }
        let ends_body = instr.next_ip() == func_start + body.len() as u64;
        let refuse = |why| {
            Err(JumpError::Unrelocatable {
                offset: instr.ip() - func_start,
                mnemonic: format_instruction(&instr),
                why,
            })
        };
        match instr.flow_control() {
            FlowControl::Return
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
                if ends_body => {}
            FlowControl::Next if !ends_body => {}
            FlowControl::Next => return Err(too_short),
            _ => return refuse("is a branch inside a function shorter than 5 bytes"),
        }
        if matches!(instr.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) {
            return refuse("is a system call (the kernel may restart it by address)");
        }
        if instr.is_ip_rel_memory_operand() && instr.memory_base() != Register::RIP {
            return refuse("uses EIP-relative addressing");
        }
        instructions.push(instr);
    }
    Ok(instructions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_function_refused() {
        // xor eax,eax; ret
        let e = plan_jump(&[0x31, 0xc0, 0xc3], 0x1000, 0x1000).unwrap_err();
        assert_eq!(e.to_string(), "function shorter than 5 bytes (3 bytes)");
    }

    #[test]
    fn branch_into_first_bytes_refused() {
        // 0: mov eax, edi (2); 2: add eax, 1 (3); 5: cmp eax, 10 (3); 8: jl 2 (2); a: ret
        let f = [
            0x89, 0xf8, 0x83, 0xc0, 0x01, 0x83, 0xf8, 0x0a, 0x7c, 0xf8, 0xc3,
        ];
        let e = plan_jump(&f, 0x1000, 0x1000).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("a jump lands inside the first 5 bytes at +2"),
            "{e}"
        );
    }

    #[test]
    fn a_ret_ending_at_the_fifth_byte_is_displaced_one_before_is_refused() {
        // lea rax, [rdi+1] (4); ret (1): the ret ends at byte 5.
        let f = [0x48, 0x8d, 0x47, 0x01, 0xc3];
        let p = plan_jump(&f, 0x1000, 0x1000).unwrap();
        assert_eq!(p.covered, 5);
        let code = p.relocate(0x8000).unwrap();
        let mut d = Decoder::with_ip(64, &code, 0x8000, DecoderOptions::NONE);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Lea);
        assert_eq!(d.decode().flow_control(), FlowControl::Return);
        // mov eax, edi (2); ret (1); nop x3: the ret ends at byte 3.
        let f = [0x89, 0xf8, 0xc3, 0x90, 0x90, 0x90];
        let e = plan_jump(&f, 0x1000, 0x1000).unwrap_err();
        assert!(e.to_string().contains("returns before 5 bytes"), "{e}");
        // xor eax, eax (2); jmp rel32 (5): the jmp ends past byte 5.
        let f = [0x31, 0xc0, 0xe9, 0x00, 0x10, 0x00, 0x00];
        let p = plan_jump(&f, 0x1000, 0x1000).unwrap();
        assert_eq!(p.covered, 7);
        let code = p.relocate(0x8000).unwrap();
        let mut d = Decoder::with_ip(64, &code, 0x8000, DecoderOptions::NONE);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Xor);
        assert_eq!(d.decode().near_branch_target(), 0x1000 + 7 + 0x1000);
    }

    #[test]
    fn a_short_function_before_padding_takes_the_jump() {
        // lea eax, [rdi+1] (3); ret; then `nop dword [rax+rax]` padding.
        let code = [0x8d, 0x47, 0x01, 0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00];
        let p = plan_jump_padded(&code, 4, 0x1000, 0x1000).unwrap();
        assert_eq!(p.covered, 5);
        assert_eq!(p.original, code[..5]);
        let reloc = p.relocate(0x8000).unwrap();
        let mut d = Decoder::with_ip(64, &reloc, 0x8000, DecoderOptions::NONE);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Lea);
        assert_eq!(d.decode().flow_control(), FlowControl::Return);
        // A 1-byte `ret` before int3 padding.
        let p = plan_jump_padded(&[0xc3, 0xcc, 0xcc, 0xcc, 0xcc], 1, 0x1000, 0x1000).unwrap();
        assert_eq!(p.instructions.len(), 1);
        // Too little padding, padding that is code, a function that does
        // not end in a ret or jmp, a site past the entry: refused.
        for (code, len, site) in [
            (&[0x8d, 0x47, 0x01, 0xc3][..], 4, 0x1000),
            (&[0x8d, 0x47, 0x01, 0xc3, 0x31, 0xc0][..], 4, 0x1000),
            (&[0x31, 0xc0, 0x90, 0x90, 0x90, 0x90][..], 2, 0x1000),
            (&[0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90][..], 3, 0x1002),
            (&[0x74, 0x00, 0xc3, 0x90, 0x90, 0x90][..], 3, 0x1000),
        ] {
            assert!(
                plan_jump_padded(code, len, 0x1000, site).is_err(),
                "{code:x?}"
            );
        }
        // A jump written there before (a first probe's): chained, the new
        // trampoline running that jump relocated.
        let code = [0xe9, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x1f, 0x44, 0x00];
        let p = plan_jump_padded(&code, 4, 0x1000, 0x1000).unwrap();
        assert_eq!(p.covered, 5);
        let reloc = p.relocate(0x8000).unwrap();
        let mut d = Decoder::with_ip(64, &reloc, 0x8000, DecoderOptions::NONE);
        assert_eq!(d.decode().near_branch_target(), 0x1000 + 5 + 0x1000);
        // 5 bytes or more: the function's own bytes, as plan_jump.
        let f = [0x48, 0x8d, 0x47, 0x01, 0xc3, 0x90];
        assert_eq!(
            plan_jump_padded(&f, 5, 0x1000, 0x1000).unwrap(),
            plan_jump(&f[..5], 0x1000, 0x1000).unwrap()
        );
    }

    #[test]
    fn relocates_rip_relative_and_jumps_back() {
        // mov rax, [rip+0x100] (7); ret
        let f = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0xc3];
        let p = plan_jump(&f, 0x40_1000, 0x40_1000).unwrap();
        assert_eq!(p.covered, 7);
        let code = p.relocate(0x40_8000).unwrap();
        let mut d = Decoder::with_ip(64, &code, 0x40_8000, DecoderOptions::NONE);
        let a = d.decode();
        assert_eq!(a.memory_displacement64(), 0x40_1107);
        let b = d.decode();
        assert_eq!(b.near_branch_target(), 0x40_1007);
        assert_eq!(
            p.patch_bytes(0x40_8000).unwrap()[..5],
            [0xe9, 0xfb, 0x6f, 0, 0]
        );
    }

    fn decode_all(code: &[u8], at: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, code, at, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    #[test]
    fn a_call_ending_the_displaced_bytes_becomes_push_and_jmp() {
        // sub rsp, 8 (4); call +0x100 (5); add rsp, 8; ret
        let f = [
            0x48, 0x83, 0xec, 0x08, 0xe8, 0x00, 0x01, 0x00, 0x00, 0x48, 0x83, 0xc4, 0x08, 0xc3,
        ];
        let site = 0x7f12_3456_0000u64;
        let p = plan_jump(&f, site, site).unwrap();
        assert_eq!(p.covered, 9);
        // Far from the callee: the return address does not fit a push imm32.
        let at = site + 0x1_0000_0000;
        let code = p.relocate(at).unwrap();
        let v = decode_all(&code, at);
        assert_eq!(v[0].mnemonic(), Mnemonic::Sub);
        assert_eq!(v[1].code(), Code::Lea_r64_m);
        assert_eq!(v[1].memory_base(), Register::RSP);
        assert_eq!(v[1].memory_displacement64() as i64, -8);
        assert_eq!(
            (v[2].code(), v[2].immediate32()),
            (Code::Mov_rm32_imm32, 0x3456_0009)
        );
        assert_eq!(
            (v[3].code(), v[3].immediate32()),
            (Code::Mov_rm32_imm32, 0x7f12)
        );
        assert_eq!(v[3].memory_displacement64(), 4);
        // Out of rel32 reach: jmp qword [rip+x] holding the callee.
        assert_eq!(v[4].code(), Code::Jmp_rm64);
        let slot = (v[4].memory_displacement64() - at) as usize;
        let target = u64::from_le_bytes(code[slot..slot + 8].try_into().unwrap());
        assert_eq!(target, site + 9 + 0x100);
        // No jump back: the callee returns to site + 9 itself.
        assert_eq!(code.len(), slot + 8);
        // Within reach, in the low 2 GiB: push imm32 and jmp rel32.
        let p = plan_jump(&f, 0x40_1000, 0x40_1000).unwrap();
        let code = p.relocate(0x40_8000).unwrap();
        let v = decode_all(&code, 0x40_8000);
        assert_eq!(
            (v[1].code(), v[1].immediate32to64()),
            (Code::Pushq_imm32, 0x40_1009)
        );
        assert_eq!(v[2].code(), Code::Jmp_rel32_64);
        assert_eq!(v[2].near_branch_target(), 0x40_1109);
        assert_eq!(v.len(), 3);
    }

    #[test]
    fn an_indirect_call_ending_the_displaced_bytes_becomes_push_and_jmp_through_it() {
        // push rbx (1); call [rip+0x100] (6); pop rbx; ret
        let f = [0x53, 0xff, 0x15, 0x00, 0x01, 0x00, 0x00, 0x5b, 0xc3];
        let p = plan_jump(&f, 0x40_1000, 0x40_1000).unwrap();
        assert_eq!(p.covered, 7);
        let code = p.relocate(0x40_8000).unwrap();
        let v = decode_all(&code, 0x40_8000);
        assert_eq!(v[0].mnemonic(), Mnemonic::Push);
        assert_eq!(
            (v[1].code(), v[1].immediate32to64()),
            (Code::Pushq_imm32, 0x40_1007)
        );
        assert_eq!(v[2].code(), Code::Jmp_rm64);
        assert_eq!(v[2].memory_displacement64(), 0x40_1107);
        assert_eq!(v.len(), 3);
        // Through the stack pointer: refused (the push moves it).
        let f = [0x53, 0xff, 0x54, 0x24, 0x08, 0x5b, 0xc3];
        let e = plan_jump(&f, 0x40_1000, 0x40_1000).unwrap_err();
        assert!(e.to_string().contains("through the stack pointer"), "{e}");
    }

    #[test]
    fn a_syscall_is_refused_as_a_system_call() {
        // mov eax, edi (2); syscall (2); ret
        let e = plan_jump(&[0x89, 0xf8, 0x0f, 0x05, 0xc3], 0x1000, 0x1000).unwrap_err();
        assert!(e.to_string().contains("is a system call"), "{e}");
    }

    #[test]
    fn a_call_ending_before_the_fifth_byte_is_refused() {
        // call rax (2); xor eax, eax (2); nop (1); ret
        let f = [0xff, 0xd0, 0x31, 0xc0, 0x90, 0xc3];
        let e = plan_jump(&f, 0x1000, 0x1000).unwrap_err();
        assert!(
            e.to_string().contains("call ending before the 5th byte"),
            "{e}"
        );
    }

    #[test]
    fn a_short_jmp_at_the_entry_moves_when_nothing_lands_in_the_bytes_after_it() {
        // sqlite3BackupRestart: jmp +0x13 (2); nopw (6); body at +8 ...;
        // +0x13: test rdi, rdi; jne +8; ret
        let f = [
            0xeb, 0x11, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc7, 0x47, 0x18, 0x01, 0x00, 0x00,
            0x00, 0x48, 0x8b, 0x7f, 0x40, 0x48, 0x85, 0xff, 0x75, 0xf0, 0xc3,
        ];
        let p = plan_jump(&f, 0x1000, 0x1000).unwrap();
        assert_eq!(p.covered, 8);
        assert_eq!(p.instructions.len(), 1);
        let code = p.relocate(0x8000).unwrap();
        let v = decode_all(&code, 0x8000);
        assert_eq!(v[0].code(), Code::Jmp_rel32_64);
        assert_eq!(v[0].near_branch_target(), 0x1013);
        // The same with the loop body right after the jmp: refused.
        let f = [
            0xeb, 0x03, 0x48, 0xff, 0xc7, 0x48, 0x85, 0xff, 0x75, 0xf8, 0xc3,
        ];
        let e = plan_jump(&f, 0x1000, 0x1000).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("a jump lands inside the first 5 bytes at +2"),
            "{e}"
        );
    }

    #[test]
    fn a_short_jcc_is_relocated_as_rel32() {
        // test edi, edi (2); je +0x20 (2); mov eax, 1 (5); ...
        let mut f = vec![0x85, 0xff, 0x74, 0x1c, 0xb8, 0x01, 0x00, 0x00, 0x00];
        f.resize(0x30, 0xc3);
        let p = plan_jump(&f, 0x40_1000, 0x40_1000).unwrap();
        assert_eq!(p.covered, 9);
        let code = p.relocate(0x40_8000).unwrap();
        let v = decode_all(&code, 0x40_8000);
        assert_eq!(v[1].code(), Code::Je_rel32_64);
        assert_eq!(v[1].near_branch_target(), 0x40_1020);
        assert_eq!(v[3].near_branch_target(), 0x40_1009);
    }
}
