//! Pure x86-64 instruction analysis for hotprobe.
//!
//! This crate decides *how* a probed instruction is executed once its first
//! byte has been replaced by `int3` (the Kprobes "trap" mechanism) and the
//! pre handlers have run:
//!
//! * [`decode`], [`instruction_starts`], [`is_instruction_boundary`]: one
//!   instruction, or the linear-sweep instruction boundaries of a body.
//! * [`plan_probe`]: classifies the instruction into an [`Execution`]
//!   (emulate it in the tracer, *boost* it through an out-of-line slot that
//!   ends in a jump back, or single-*step* the slot and fix up afterwards) and
//!   builds the [`SlotImage`] with any RIP-relative operand relocated for the
//!   slot address (the Kprobes booster, OLS 2006 §6).
//! * [`emulate`]: performs an [`Emulation`] on a [`Registers`] set, returning
//!   the stack write the tracer must do.
//! * [`data_access`]: the instruction a data breakpoint trapped after,
//!   and the value it stored.
//! * [`fixup_after_step`]: repairs registers (and the pushed return address
//!   of an indirect call) after a single-step in the slot.
//!
//! Nothing here does I/O, and no input bytes make it panic; every refusal is
//! an [`X86Error`] naming the address and the reason.

#![deny(missing_docs)]

mod access;
mod decode;
mod emulate;
mod error;
pub mod jump;
mod plan;
pub mod pun;

pub use access::{data_access, DataAccess};
pub use decode::{decode, format_instruction, instruction_starts, is_instruction_boundary};
pub use emulate::{emulate, fixup_after_step, slot_to_original, MemWrite};
pub use error::X86Error;
pub use hotprobe_target::Registers;
pub use jump::{plan_jump, plan_jump_padded, JumpError, JumpPlan};
pub use plan::{
    plan_probe, Condition, Emulation, Execution, Gpr, LoopKind, ProbePlan, SlotImage, StepFixup,
};
pub use pun::{PunPlan, PunWindow, PUN_PREFIX};

/// Re-export of the decoder library, so users name the same `Instruction`
/// type [`decode`] returns.
pub use iced_x86;

/// The architectural maximum length of one x86 instruction, in bytes.
pub const MAX_INSN_LEN: usize = 15;

/// Length of `jmp rel32` (`e9 xx xx xx xx`).
pub const JMP_REL32_LEN: usize = 5;

/// Length of the far jump form `jmp qword [rip+0]; dq target`
/// (`ff 25 00 00 00 00` followed by the 8-byte absolute target).
pub const JMP_ABS_LEN: usize = 14;

/// Bytes per out-of-line slot: room for the relocated instruction (at most
/// [`MAX_INSN_LEN`]) followed by the longest jump back ([`JMP_ABS_LEN`]);
/// unused bytes are `int3` padding.
pub const SLOT_SIZE: usize = 32;

const _: () = assert!(MAX_INSN_LEN + JMP_ABS_LEN <= SLOT_SIZE);
