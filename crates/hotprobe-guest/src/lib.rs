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
//! - [`resolver`]: [`KernelResolver`], the `hotprobe_resolve::Resolver` of
//!   guests (probe specs and patterns over kallsyms/System.map/vmlinux
//!   symbols, the guest blacklist), and [`open_guest`], which connects and
//!   gives the target and its resolver to add to a `hotprobe::Session`.
//! - [`image`]: [`symbols_from_kernel_image`], the kernel's symbols from the
//!   bzImage QEMU boots (`hotprobe-kimage`), cached.
//!
//! - [`syscalls`]: decoding Linux system calls for `hotprobe guest syscalls`.
//! - [`launch`]: starts a guest with hotprobe's QEMU plugin (`hotprobe_qemu`)
//!   and its stub, for `hotprobe::Session::add_plugin_guest`.
//! - [`fleet`]: [`GuestFleet`], the guests started so far, whose QEMUs are
//!   killed on drop until released.
//!
//! This crate does not depend on the engine (`hotprobe`).

#![warn(missing_docs)]

pub mod client;
pub mod fleet;
pub mod image;
pub mod launch;
pub mod mem;
pub mod resolver;
pub mod rsp;
pub mod syscalls;
pub mod target;

pub use client::{GdbClient, GdbError};
pub use fleet::{kernel_image, shell_exit_code, FleetGuest, GuestFleet};
pub use image::{
    is_kernel_image, symbols_from_kernel_image, task_layout_from_kernel_image, ImageSymbolsError,
};
pub use launch::{launch, LaunchError, LaunchOptions, LaunchedGuest};
pub use mem::{MemError, RamFile, Translation};
pub use resolver::{load_symbols, open_guest, text_bounds, KernelResolver};
pub use target::{GuestConfig, GuestStats, GuestTarget, StatsHandle, StubAddr};
