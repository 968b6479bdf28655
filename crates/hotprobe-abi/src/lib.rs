//! The shared-memory protocol between the hotprobe agent (inside the target)
//! and the tracer.
//!
//! One mapping (a memfd, or a file in `/dev/shm`) holds a versioned
//! [`Header`], an open-addressing site table mapping a patched call's return
//! address to a probe id and action ([`SiteSlot`], O(1) lookup), counters,
//! and one slot per thread with a lock-free single-producer single-consumer
//! ring of [`Event`]s and a private counter array (so `count` needs no
//! `lock` prefix). [`Shm`] is the validated view both sides use; [`patch`]
//! holds the instruction bytes the patch mechanism writes. [`plugin`] is the
//! layout shared with hotprobe's QEMU TCG plugin (guests).
//!
//! Every `Acquire`/`Release` is commented with the operation it pairs with
//! on the other side.
#![no_std]

pub mod agg;
pub mod capture;
pub mod fast;
mod layout;
pub mod patch;
pub mod plugin;
mod ring;
mod shm;
pub mod sigsite;
mod slots;
pub mod stacks;

pub use layout::*;
pub use ring::{Consumer, DataWriter, DrainStats, Producer, PREFETCH_AHEAD};
pub use shm::{
    growable_file_len, LedgerSite, Shm, SlotDirectory, DEFAULT_CHUNK_SLOTS, MAX_SLOTS,
    MAX_SLOT_CHUNKS, SLOT_DIRECTORY_OFFSET,
};
pub use slots::{
    RING_POOL_RECORDING, RING_START_BYTES, THREAD_CLAIMING, THREAD_EXITED, THREAD_FREE,
    THREAD_LIVE, THREAD_RETIRING, THREAD_REUSABLE,
};

/// Errors of this crate (no_std: `Display` by hand, no `std::error::Error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbiError {
    /// Invalid creation parameters.
    BadParams(&'static str),
    /// Null mapping pointer.
    Null,
    /// Mapping not 64-byte aligned.
    Misaligned,
    /// The mapping is shorter than the layout needs.
    TooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes available.
        len: usize,
    },
    /// The first word is not [`MAGIC`].
    BadMagic(u64),
    /// Another layout version.
    Version {
        /// Version in the header.
        found: u32,
        /// This crate's [`VERSION`].
        expected: u32,
    },
    /// Header fields contradict each other.
    Inconsistent(&'static str),
    /// A probe id not below `n_probes`.
    ProbeOutOfRange(u32),
    /// The site table has no free slot.
    SiteTableFull,
    /// No site with that key.
    NoSuchSite(u64),
    /// A ring's head ran more than its capacity ahead of its tail.
    RingCorrupt {
        /// Head read.
        head: u64,
        /// Tail read.
        tail: u64,
    },
}

impl core::fmt::Display for AbiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AbiError::BadParams(m) => write!(f, "bad shared-memory parameters: {m}"),
            AbiError::Null => write!(f, "null shared-memory pointer"),
            AbiError::Misaligned => write!(f, "shared memory not 64-byte aligned"),
            AbiError::TooSmall { needed, len } => {
                write!(
                    f,
                    "shared memory too small: {len} bytes, layout needs {needed}"
                )
            }
            AbiError::BadMagic(m) => write!(f, "not hotprobe shared memory (magic {m:#x})"),
            AbiError::Version { found, expected } => {
                write!(
                    f,
                    "shared-memory layout version {found}, this build speaks {expected}"
                )
            }
            AbiError::Inconsistent(m) => write!(f, "inconsistent shared-memory header: {m}"),
            AbiError::ProbeOutOfRange(p) => write!(f, "probe id {p} out of range"),
            AbiError::SiteTableFull => {
                write!(f, "site table full: create the memory with more site slots")
            }
            AbiError::NoSuchSite(k) => write!(f, "no site with key {k:#x}"),
            AbiError::RingCorrupt { head, tail } => {
                write!(
                    f,
                    "ring corrupt: head {head} more than a capacity ahead of tail {tail}"
                )
            }
        }
    }
}

/// Reads the time stamp counter (the [`Event::tsc`] and heartbeat clock).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: rdtsc reads a counter into edx:eax; no memory, no stack.
    unsafe {
        core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    (hi as u64) << 32 | lo as u64
}
