//! Classification of a probed instruction and its out-of-line slot.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, ConditionCode, FlowControl, Instruction,
    InstructionBlock, Mnemonic, OpKind, Register,
};

use crate::{decode, format_instruction, X86Error, JMP_ABS_LEN, JMP_REL32_LEN, SLOT_SIZE};
use hotprobe_target::Registers;

/// A 64-bit general-purpose register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gpr {
    /// `rax`.
    Rax,
    /// `rcx`.
    Rcx,
    /// `rdx`.
    Rdx,
    /// `rbx`.
    Rbx,
    /// `rsp`.
    Rsp,
    /// `rbp`.
    Rbp,
    /// `rsi`.
    Rsi,
    /// `rdi`.
    Rdi,
    /// `r8`.
    R8,
    /// `r9`.
    R9,
    /// `r10`.
    R10,
    /// `r11`.
    R11,
    /// `r12`.
    R12,
    /// `r13`.
    R13,
    /// `r14`.
    R14,
    /// `r15`.
    R15,
}

impl Gpr {
    /// The register for an iced 64-bit GPR (`RAX`..`R15`); `None` for any
    /// other register (sub-registers included).
    pub fn from_iced(reg: Register) -> Option<Gpr> {
        Some(match reg {
            Register::RAX => Gpr::Rax,
            Register::RCX => Gpr::Rcx,
            Register::RDX => Gpr::Rdx,
            Register::RBX => Gpr::Rbx,
            Register::RSP => Gpr::Rsp,
            Register::RBP => Gpr::Rbp,
            Register::RSI => Gpr::Rsi,
            Register::RDI => Gpr::Rdi,
            Register::R8 => Gpr::R8,
            Register::R9 => Gpr::R9,
            Register::R10 => Gpr::R10,
            Register::R11 => Gpr::R11,
            Register::R12 => Gpr::R12,
            Register::R13 => Gpr::R13,
            Register::R14 => Gpr::R14,
            Register::R15 => Gpr::R15,
            _ => return None,
        })
    }

    /// Reads the register from `regs`.
    pub fn get(self, regs: &Registers) -> u64 {
        match self {
            Gpr::Rax => regs.rax,
            Gpr::Rcx => regs.rcx,
            Gpr::Rdx => regs.rdx,
            Gpr::Rbx => regs.rbx,
            Gpr::Rsp => regs.rsp,
            Gpr::Rbp => regs.rbp,
            Gpr::Rsi => regs.rsi,
            Gpr::Rdi => regs.rdi,
            Gpr::R8 => regs.r8,
            Gpr::R9 => regs.r9,
            Gpr::R10 => regs.r10,
            Gpr::R11 => regs.r11,
            Gpr::R12 => regs.r12,
            Gpr::R13 => regs.r13,
            Gpr::R14 => regs.r14,
            Gpr::R15 => regs.r15,
        }
    }

    /// Writes the register in `regs`.
    pub fn set(self, regs: &mut Registers, value: u64) {
        let slot = match self {
            Gpr::Rax => &mut regs.rax,
            Gpr::Rcx => &mut regs.rcx,
            Gpr::Rdx => &mut regs.rdx,
            Gpr::Rbx => &mut regs.rbx,
            Gpr::Rsp => &mut regs.rsp,
            Gpr::Rbp => &mut regs.rbp,
            Gpr::Rsi => &mut regs.rsi,
            Gpr::Rdi => &mut regs.rdi,
            Gpr::R8 => &mut regs.r8,
            Gpr::R9 => &mut regs.r9,
            Gpr::R10 => &mut regs.r10,
            Gpr::R11 => &mut regs.r11,
            Gpr::R12 => &mut regs.r12,
            Gpr::R13 => &mut regs.r13,
            Gpr::R14 => &mut regs.r14,
            Gpr::R15 => &mut regs.r15,
        };
        *slot = value;
    }
}

/// A `jcc` condition, in opcode order (`0x70 + n` / `0x0f 0x80 + n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Overflow: OF = 1.
    O,
    /// No overflow: OF = 0.
    No,
    /// Below (carry): CF = 1.
    B,
    /// Above or equal (no carry): CF = 0.
    Ae,
    /// Equal (zero): ZF = 1.
    E,
    /// Not equal: ZF = 0.
    Ne,
    /// Below or equal: CF = 1 or ZF = 1.
    Be,
    /// Above: CF = 0 and ZF = 0.
    A,
    /// Sign: SF = 1.
    S,
    /// No sign: SF = 0.
    Ns,
    /// Parity even: PF = 1.
    P,
    /// Parity odd: PF = 0.
    Np,
    /// Less: SF ≠ OF.
    L,
    /// Greater or equal: SF = OF.
    Ge,
    /// Less or equal: ZF = 1 or SF ≠ OF.
    Le,
    /// Greater: ZF = 0 and SF = OF.
    G,
}

/// RFLAGS carry flag.
pub(crate) const CF: u64 = 1 << 0;
/// RFLAGS parity flag.
pub(crate) const PF: u64 = 1 << 2;
/// RFLAGS zero flag.
pub(crate) const ZF: u64 = 1 << 6;
/// RFLAGS sign flag.
pub(crate) const SF: u64 = 1 << 7;
/// RFLAGS overflow flag.
pub(crate) const OF: u64 = 1 << 11;

impl Condition {
    /// All sixteen conditions, in opcode order.
    pub const ALL: [Condition; 16] = [
        Condition::O,
        Condition::No,
        Condition::B,
        Condition::Ae,
        Condition::E,
        Condition::Ne,
        Condition::Be,
        Condition::A,
        Condition::S,
        Condition::Ns,
        Condition::P,
        Condition::Np,
        Condition::L,
        Condition::Ge,
        Condition::Le,
        Condition::G,
    ];

    /// The condition encoded in the low nibble of a `jcc`/`setcc`/`cmovcc`
    /// opcode.
    pub fn from_nibble(nibble: u8) -> Condition {
        Condition::ALL[usize::from(nibble & 0xf)]
    }

    /// The condition for an iced condition code; `None` for
    /// `ConditionCode::None`.
    pub fn from_iced(cc: ConditionCode) -> Option<Condition> {
        Some(match cc {
            ConditionCode::o => Condition::O,
            ConditionCode::no => Condition::No,
            ConditionCode::b => Condition::B,
            ConditionCode::ae => Condition::Ae,
            ConditionCode::e => Condition::E,
            ConditionCode::ne => Condition::Ne,
            ConditionCode::be => Condition::Be,
            ConditionCode::a => Condition::A,
            ConditionCode::s => Condition::S,
            ConditionCode::ns => Condition::Ns,
            ConditionCode::p => Condition::P,
            ConditionCode::np => Condition::Np,
            ConditionCode::l => Condition::L,
            ConditionCode::ge => Condition::Ge,
            ConditionCode::le => Condition::Le,
            ConditionCode::g => Condition::G,
            _ => return None,
        })
    }

    /// Whether the condition holds for the flags in `rflags` (CF, PF, ZF,
    /// SF, OF), exactly as the CPU evaluates it.
    pub fn holds(self, rflags: u64) -> bool {
        let cf = rflags & CF != 0;
        let pf = rflags & PF != 0;
        let zf = rflags & ZF != 0;
        let sf = rflags & SF != 0;
        let of = rflags & OF != 0;
        match self {
            Condition::O => of,
            Condition::No => !of,
            Condition::B => cf,
            Condition::Ae => !cf,
            Condition::E => zf,
            Condition::Ne => !zf,
            Condition::Be => cf || zf,
            Condition::A => !cf && !zf,
            Condition::S => sf,
            Condition::Ns => !sf,
            Condition::P => pf,
            Condition::Np => !pf,
            Condition::L => sf != of,
            Condition::Ge => sf == of,
            Condition::Le => zf || sf != of,
            Condition::G => !zf && sf == of,
        }
    }
}

/// The `loop`-family and `jrcxz`-family branches (all `rel8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    /// `loop`: `rcx -= 1`; taken if `rcx != 0`.
    Loop,
    /// `loope`: `rcx -= 1`; taken if `rcx != 0` and ZF = 1.
    Loope,
    /// `loopne`: `rcx -= 1`; taken if `rcx != 0` and ZF = 0.
    Loopne,
    /// `jrcxz`: taken if `rcx == 0`.
    Jrcxz,
    /// `jecxz` (`67 e3`): taken if the low 32 bits of `rcx` are zero.
    Jecxz,
}

/// An instruction the tracer performs itself instead of executing it.
///
/// Absolute addresses are already computed for the probe address the plan
/// was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emulation {
    /// Any NOP form (`90`, `0f 1f /0`, `66 ...` padding) and `endbr64` /
    /// `endbr32`: only `rip` advances.
    Nop,
    /// `jmp rel8` / `jmp rel32`.
    JmpRel {
        /// Branch target.
        target: u64,
    },
    /// `call rel32`: pushes `return_addr`, jumps to `target`.
    CallRel {
        /// Call target.
        target: u64,
        /// The address after the call (pushed).
        return_addr: u64,
    },
    /// `jcc rel8` / `jcc rel32`.
    Jcc {
        /// The condition on RFLAGS.
        cond: Condition,
        /// Target if the condition holds.
        target: u64,
        /// The next instruction otherwise.
        fallthrough: u64,
    },
    /// `loop`/`loope`/`loopne` (64-bit `rcx` forms) and `jrcxz`/`jecxz`.
    Loop {
        /// Which instruction.
        kind: LoopKind,
        /// Target if taken.
        target: u64,
        /// The next instruction otherwise.
        fallthrough: u64,
    },
    /// Near `ret` / `ret imm16`: pops the return address, then `pop_extra`
    /// more bytes.
    Ret {
        /// The `imm16` of `ret imm16` (0 for plain `ret`).
        pop_extra: u16,
    },
    /// `push r64` (e.g. the `push rbp` of a prologue).
    Push {
        /// The register pushed (`push rsp` pushes the value before the push).
        reg: Gpr,
    },
    /// `pushfq`: pushes RFLAGS with RF and VM cleared (as the CPU does).
    /// Emulated because a single-stepped `pushf` would push TF set.
    Pushf,
    /// `mov r64, r64` (e.g. the `mov rbp, rsp` of a prologue).
    MovReg {
        /// Destination register.
        dst: Gpr,
        /// Source register.
        src: Gpr,
    },
    /// `leave`: `rsp = rbp; rbp = pop()`.
    Leave,
}

/// What the tracer must repair after single-stepping a slot, besides moving
/// `rip` from `slot + insn_len_in_slot` back to `probe_addr + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepFixup {
    /// Nothing else.
    None,
    /// An indirect `call r/m64`: after the step `[rsp]` holds the slot's
    /// next address and must become `probe_addr + len`.
    CallReturnAddr,
}

/// How a probed instruction is executed after the pre handlers ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    /// The tracer emulates it with [`crate::emulate`]; no slot is used.
    Emulate(Emulation),
    /// Resume the thread at the slot, which ends in a jump back to
    /// `probe_addr + len`; no stop after the instruction. If post handlers
    /// must run, the engine may instead step the slot with
    /// [`StepFixup::None`] (see [`ProbePlan::step_fixup`]).
    ///
    /// Also chosen for indirect `jmp r/m` (control never reaches the jump
    /// back) and for `syscall` / `int 0x80`: the kernel returns to the
    /// slot's next instruction, so after a boosted `syscall` the clobbered
    /// `rcx` holds a slot address instead of `probe_addr + len` (the ABI
    /// leaves `rcx` undefined; only code reading it back would notice).
    Boost,
    /// Single-step the slot's first instruction, then call
    /// [`crate::fixup_after_step`] (which applies the fixup).
    Step(StepFixup),
}

/// The bytes to write into an out-of-line slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotImage {
    /// Exactly [`SLOT_SIZE`] bytes: the (relocated) instruction, the jump
    /// back to `probe_addr + len`, then `int3` padding.
    pub bytes: Vec<u8>,
    /// Length of the instruction in the slot: a single-step that falls
    /// through lands at `slot_addr + insn_len_in_slot`, which is also where
    /// the jump back starts.
    pub insn_len_in_slot: usize,
}

/// Everything the engine needs to execute a probed instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePlan {
    /// Length of the original instruction.
    pub len: usize,
    /// How to execute it.
    pub execution: Execution,
    /// `true` if the slot may run straight through to its jump back without
    /// a single-step (the plan is [`Execution::Boost`]).
    pub boostable: bool,
    /// The out-of-line slot image; `None` for emulated instructions.
    pub slot: Option<SlotImage>,
    /// The instruction as text, for messages (e.g. `mov rax, [rip+0x2ee5]`).
    pub mnemonic: String,
    /// The absolute address of a RIP-relative memory operand, if any (kept
    /// by the relocation).
    pub rip_relative_target: Option<u64>,
    /// The decoded original instruction.
    pub instruction: Instruction,
}

impl ProbePlan {
    /// The fixup to apply if the engine single-steps the slot: for
    /// [`Execution::Step`] its own, for [`Execution::Boost`] (stepped
    /// because post handlers must run) [`StepFixup::None`]; `None` for
    /// emulated instructions, which have no slot.
    pub fn step_fixup(&self) -> Option<StepFixup> {
        match self.execution {
            Execution::Emulate(_) => None,
            Execution::Boost => Some(StepFixup::None),
            Execution::Step(fixup) => Some(fixup),
        }
    }
}

/// What [`classify`] decided, before any slot is built.
enum Class {
    Emulate(Emulation),
    Boost,
    Step(StepFixup),
}

/// Plans how to execute the instruction at `probe_addr` whose bytes start
/// `original` (up to [`crate::MAX_INSN_LEN`] bytes; fewer near the end of a
/// mapping is fine if the instruction fits), with an out-of-line slot at
/// `slot_addr` (ignored for emulated instructions).
///
/// Rules:
/// * refused ([`X86Error::Unsupported`]): `int3` (someone's breakpoint, or
///   padding), `int1`, `int n` other than `int 0x80`, `ud0`/`ud1`/`ud2` and
///   other always-faulting instructions, RTM `xbegin`/`xabort`/`xend`,
///   privileged instructions (CPL 0 or IOPL: `hlt`, `cli`, `in`, ...), far
///   `call`/`jmp`/`ret`, `iret`, `sysenter`, 16/32-bit-operand near
///   branches and returns, `loop`/`loope`/`loopne` with a 32-bit (`ecx`)
///   counter;
/// * emulated: NOPs and `endbr64`/`endbr32`, relative `jmp`/`call`/`jcc`,
///   `loop*`/`jrcxz`/`jecxz`, near `ret`/`ret imm16`, `push r64`, `pushfq`,
///   `mov r64, r64`, `leave`. Relative branches are always emulated, never
///   run in a slot;
/// * stepped: indirect `call r/m64` ([`StepFixup::CallReturnAddr`]);
/// * boosted: everything else, including indirect `jmp r/m64`, `syscall`
///   and `int 0x80`.
///
/// A RIP-relative memory operand is re-encoded for the slot (iced
/// [`BlockEncoder`]) so that it refers to the same absolute address; if that
/// address is out of `rel32` reach of the slot the result is
/// [`X86Error::OutOfReach`]. The jump back is `jmp rel32` when in reach,
/// else `jmp qword [rip+0]; dq target`.
pub fn plan_probe(original: &[u8], probe_addr: u64, slot_addr: u64) -> Result<ProbePlan, X86Error> {
    let instr = decode(original, probe_addr)?;
    let len = instr.len();
    let mnemonic = format_instruction(&instr);
    let class = classify(&instr).map_err(|reason| X86Error::Unsupported {
        addr: probe_addr,
        mnemonic: mnemonic.clone(),
        reason,
    })?;
    let rip_relative_target = instr
        .is_ip_rel_memory_operand()
        .then(|| instr.ip_rel_memory_address());
    let (execution, slot) = match class {
        Class::Emulate(e) => (Execution::Emulate(e), None),
        Class::Boost => (
            Execution::Boost,
            Some(build_slot(&instr, original, slot_addr, &mnemonic)?),
        ),
        Class::Step(f) => (
            Execution::Step(f),
            Some(build_slot(&instr, original, slot_addr, &mnemonic)?),
        ),
    };
    Ok(ProbePlan {
        len,
        boostable: execution == Execution::Boost,
        execution,
        slot,
        mnemonic,
        rip_relative_target,
        instruction: instr,
    })
}

/// The 64-bit register operand `op` of `instr`, if it is one.
fn reg_operand(instr: &Instruction, op: u32) -> Option<Gpr> {
    if instr.op_kind(op) != OpKind::Register {
        return None;
    }
    Gpr::from_iced(instr.op_register(op))
}

fn is_near64_branch(instr: &Instruction) -> bool {
    instr.op0_kind() == OpKind::NearBranch64
}

fn classify(instr: &Instruction) -> Result<Class, &'static str> {
    let code = instr.code();
    match code {
        Code::Int3 => {
            return Err(
                "int3 is a breakpoint already (a kernel uprobe's, another debugger's, or padding)",
            )
        }
        Code::Int1 => return Err("int1 (icebp) raises a debug trap"),
        Code::Int_imm8 => {
            return match instr.immediate8() {
                0x80 => Ok(Class::Boost),
                3 => Err("int 3 is a breakpoint already"),
                _ => Err("software interrupt"),
            }
        }
        _ => {}
    }
    match instr.mnemonic() {
        // The kernel returns to the next instruction (the slot's jump back).
        Mnemonic::Syscall => return Ok(Class::Boost),
        Mnemonic::Xbegin | Mnemonic::Xabort | Mnemonic::Xend => {
            return Err("transactional memory (RTM) instruction")
        }
        Mnemonic::Vmcall | Mnemonic::Vmmcall | Mnemonic::Vmgexit => return Err("hypervisor call"),
        Mnemonic::Sysenter | Mnemonic::Sysexit | Mnemonic::Sysret => {
            return Err("legacy or privileged system-call instruction")
        }
        _ => {}
    }
    if instr.is_privileged() {
        return Err("privileged instruction (needs CPL 0 or IOPL)");
    }
    if instr.is_call_far()
        || instr.is_jmp_far()
        || instr.is_call_far_indirect()
        || instr.is_jmp_far_indirect()
        || matches!(
            instr.mnemonic(),
            Mnemonic::Retf | Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq | Mnemonic::Uiret
        )
    {
        return Err("far control transfer");
    }
    match instr.flow_control() {
        FlowControl::Next => Ok(classify_next(instr)),
        FlowControl::UnconditionalBranch => {
            if instr.is_jmp_short_or_near() && is_near64_branch(instr) {
                Ok(Class::Emulate(Emulation::JmpRel {
                    target: instr.near_branch_target(),
                }))
            } else {
                Err("unsupported branch form")
            }
        }
        FlowControl::ConditionalBranch => {
            if !is_near64_branch(instr) {
                return Err("unsupported branch form");
            }
            let target = instr.near_branch_target();
            let fallthrough = instr.next_ip();
            if instr.is_jcc_short_or_near() {
                let cond =
                    Condition::from_iced(instr.condition_code()).ok_or("unknown condition")?;
                return Ok(Class::Emulate(Emulation::Jcc {
                    cond,
                    target,
                    fallthrough,
                }));
            }
            let kind = match code {
                Code::Loop_rel8_64_RCX => LoopKind::Loop,
                Code::Loope_rel8_64_RCX => LoopKind::Loope,
                Code::Loopne_rel8_64_RCX => LoopKind::Loopne,
                Code::Jrcxz_rel8_64 => LoopKind::Jrcxz,
                Code::Jecxz_rel8_64 => LoopKind::Jecxz,
                Code::Loop_rel8_64_ECX | Code::Loope_rel8_64_ECX | Code::Loopne_rel8_64_ECX => {
                    return Err("loop with a 32-bit (ecx) counter")
                }
                _ => return Err("unsupported conditional branch"),
            };
            Ok(Class::Emulate(Emulation::Loop {
                kind,
                target,
                fallthrough,
            }))
        }
        FlowControl::IndirectBranch => {
            if code == Code::Jmp_rm64 {
                Ok(Class::Boost)
            } else {
                Err("unsupported indirect branch form")
            }
        }
        FlowControl::Call => {
            if instr.is_call_near() && is_near64_branch(instr) {
                Ok(Class::Emulate(Emulation::CallRel {
                    target: instr.near_branch_target(),
                    return_addr: instr.next_ip(),
                }))
            } else {
                Err("unsupported call form")
            }
        }
        FlowControl::IndirectCall => {
            if code == Code::Call_rm64 {
                Ok(Class::Step(StepFixup::CallReturnAddr))
            } else {
                Err("unsupported indirect call form")
            }
        }
        FlowControl::Return => match code {
            Code::Retnq => Ok(Class::Emulate(Emulation::Ret { pop_extra: 0 })),
            Code::Retnq_imm16 => Ok(Class::Emulate(Emulation::Ret {
                pop_extra: instr.immediate16(),
            })),
            _ => Err("16/32-bit operand-size return"),
        },
        FlowControl::Interrupt => Err("interrupt instruction"),
        FlowControl::XbeginXabortXend => Err("transactional memory (RTM) instruction"),
        FlowControl::Exception => {
            Err("the instruction always raises an exception (ud0/ud1/ud2, ...)")
        }
    }
}

/// Classifies an instruction that falls through to the next one.
fn classify_next(instr: &Instruction) -> Class {
    let emulation = match instr.code() {
        Code::Endbr64 | Code::Endbr32 => Some(Emulation::Nop),
        _ if instr.mnemonic() == Mnemonic::Nop => Some(Emulation::Nop),
        Code::Push_r64 | Code::Push_rm64 => {
            reg_operand(instr, 0).map(|reg| Emulation::Push { reg })
        }
        Code::Pushfq => Some(Emulation::Pushf),
        Code::Leaveq => Some(Emulation::Leave),
        Code::Mov_r64_rm64 | Code::Mov_rm64_r64 => {
            match (reg_operand(instr, 0), reg_operand(instr, 1)) {
                (Some(dst), Some(src)) => Some(Emulation::MovReg { dst, src }),
                _ => None,
            }
        }
        _ => None,
    };
    match emulation {
        Some(e) => Class::Emulate(e),
        None => Class::Boost,
    }
}

/// `rel32` displacement from `next` (the address after the instruction) to
/// `target`, if it fits.
fn rel32(next: u64, target: u64) -> Option<i32> {
    i32::try_from(target.wrapping_sub(next) as i64).ok()
}

/// Builds the slot: the (relocated) instruction, the jump back, padding.
fn build_slot(
    instr: &Instruction,
    original: &[u8],
    slot_addr: u64,
    mnemonic: &str,
) -> Result<SlotImage, X86Error> {
    let len = instr.len();
    let mut bytes = if instr.is_ip_rel_memory_operand() {
        relocate_ip_rel(instr, slot_addr, mnemonic)?
    } else {
        // Position-independent: the original bytes run anywhere.
        original[..len].to_vec()
    };
    let insn_len_in_slot = bytes.len();
    let back = instr.next_ip();
    let jmp_at = slot_addr.wrapping_add(insn_len_in_slot as u64);
    match rel32(jmp_at.wrapping_add(JMP_REL32_LEN as u64), back) {
        Some(disp) => {
            bytes.push(0xe9);
            bytes.extend_from_slice(&disp.to_le_bytes());
        }
        None => {
            bytes.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
            bytes.extend_from_slice(&back.to_le_bytes());
        }
    }
    debug_assert!(bytes.len() <= insn_len_in_slot + JMP_ABS_LEN);
    if bytes.len() > SLOT_SIZE {
        return Err(X86Error::Relocation {
            addr: instr.ip(),
            mnemonic: mnemonic.to_owned(),
            reason: format!("slot image of {} bytes exceeds {SLOT_SIZE}", bytes.len()),
        });
    }
    bytes.resize(SLOT_SIZE, 0xcc);
    Ok(SlotImage {
        bytes,
        insn_len_in_slot,
    })
}

/// Re-encodes an instruction with a RIP-relative memory operand at
/// `slot_addr`, keeping the operand's absolute address; verifies the result
/// by decoding it back.
fn relocate_ip_rel(
    instr: &Instruction,
    slot_addr: u64,
    mnemonic: &str,
) -> Result<Vec<u8>, X86Error> {
    let addr = instr.ip();
    let target = instr.ip_rel_memory_address();
    let out_of_reach = || X86Error::OutOfReach {
        addr,
        mnemonic: mnemonic.to_owned(),
        target,
        slot: slot_addr,
    };
    let relocation = |reason: String| X86Error::Relocation {
        addr,
        mnemonic: mnemonic.to_owned(),
        reason,
    };
    // Reach check against the original length; the re-encoding is verified
    // below, and an `[eip+disp]` fallback from the block encoder is refused.
    if rel32(slot_addr.wrapping_add(instr.len() as u64), target).is_none() {
        return Err(out_of_reach());
    }
    let instrs = [*instr];
    let block = InstructionBlock::new(&instrs, slot_addr);
    let result = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(|e| relocation(e.to_string()))?;
    let bytes = result.code_buffer;
    let back = decode(&bytes, slot_addr)
        .map_err(|e| relocation(format!("re-encoding does not decode: {e}")))?;
    // `Instruction`'s equality ignores ip/len, and a RIP-relative operand
    // is stored as its absolute address: equal means same instruction,
    // same operand target.
    if back.len() != bytes.len()
        || back != *instr
        || !back.is_ip_rel_memory_operand()
        || back.memory_base() != Register::RIP
        || back.ip_rel_memory_address() != target
    {
        if rel32(slot_addr.wrapping_add(bytes.len() as u64), target).is_none() {
            return Err(out_of_reach());
        }
        return Err(relocation(format!(
            "re-encoded as `{}`",
            format_instruction(&back)
        )));
    }
    Ok(bytes)
}
