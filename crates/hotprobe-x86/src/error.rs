//! The crate's one error type.

/// Why an instruction could not be decoded, planned, relocated or emulated.
///
/// Every variant carries `addr`, the address of the instruction concerned
/// (for [`X86Error::StackRead`], the stack address that could not be read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum X86Error {
    /// No bytes at all were supplied.
    #[error("{addr:#x}: no instruction bytes available")]
    Empty {
        /// Address of the (missing) instruction.
        addr: u64,
    },
    /// The bytes end before the instruction does (e.g. near the end of a
    /// mapping, or a short read).
    #[error("{addr:#x}: truncated instruction (only {available} bytes available)")]
    Truncated {
        /// Address of the instruction.
        addr: u64,
        /// How many bytes were supplied.
        available: usize,
    },
    /// The bytes are not a valid x86-64 instruction.
    #[error("{addr:#x}: invalid x86-64 instruction encoding")]
    Invalid {
        /// Address of the bytes.
        addr: u64,
    },
    /// A valid instruction that cannot be probed (breakpoint, trapping,
    /// privileged, far control transfer, transactional, ...).
    #[error("{addr:#x}: cannot probe `{mnemonic}`: {reason}")]
    Unsupported {
        /// Address of the instruction.
        addr: u64,
        /// The instruction as text.
        mnemonic: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A RIP-relative operand's absolute address is outside the ±2 GiB
    /// `rel32` reach of the slot.
    #[error(
        "{addr:#x}: `{mnemonic}` refers to {target:#x}, out of ±2 GiB reach of the slot at {slot:#x}"
    )]
    OutOfReach {
        /// Address of the instruction.
        addr: u64,
        /// The instruction as text.
        mnemonic: String,
        /// The absolute address the operand refers to.
        target: u64,
        /// The slot address asked for.
        slot: u64,
    },
    /// Re-encoding the instruction for the slot failed or gave a different
    /// instruction.
    #[error("{addr:#x}: cannot relocate `{mnemonic}`: {reason}")]
    Relocation {
        /// Address of the instruction.
        addr: u64,
        /// The instruction as text.
        mnemonic: String,
        /// What went wrong.
        reason: String,
    },
    /// The tracer could not read the target's stack during an emulation.
    #[error("{addr:#x}: cannot read the stack: {reason}")]
    StackRead {
        /// The stack address.
        addr: u64,
        /// What the reader reported.
        reason: String,
    },
}

impl X86Error {
    /// The address the error is about.
    pub fn addr(&self) -> u64 {
        match self {
            X86Error::Empty { addr }
            | X86Error::Truncated { addr, .. }
            | X86Error::Invalid { addr }
            | X86Error::Unsupported { addr, .. }
            | X86Error::OutOfReach { addr, .. }
            | X86Error::Relocation { addr, .. }
            | X86Error::StackRead { addr, .. } => *addr,
        }
    }
}
