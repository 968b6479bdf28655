//! hotprobe-guest: VM guest kernels as hotprobe targets, through the GDB
//! remote serial protocol (QEMU's gdbstub, TCG or KVM), Xenprobes-style.
//!
//! - [`rsp`]: the pure packet codec and reply parsers (fuzzed).
//! - [`client`]: [`GdbClient`], one connection to a stub.
//! - [`mem`]: guest RAM mapped from QEMU's shared `memory-backend-file` and
//!   the x86-64 page-table walk.
//! - [`target`]: [`GuestTarget`], the [`hotprobe_target::Target`]
//!   implementation (threads = vCPUs, breakpoints = `Z0`, out-of-line area in
//!   unused kernel-text fill).

#![warn(missing_docs)]

pub mod client;
pub mod mem;
pub mod rsp;
pub mod target;

pub use client::{GdbClient, GdbError};
pub use mem::{MemError, RamFile, Translation};
pub use target::{GuestConfig, GuestStats, GuestTarget, StubAddr};
