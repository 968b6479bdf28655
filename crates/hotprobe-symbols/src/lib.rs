//! Symbols for hotprobe: everything that turns a probe spec into addresses
//! and addresses back into names, without touching a live process.
//!
//! - [`ElfModule`]: one ELF file's function symbols (`.symtab`, `.dynsym`,
//!   demangled Rust and C++ names), PLT sections, executable segments,
//!   build id, DWARF line table, and the load bias of one of its mappings.
//!   Separate debug files under `/usr/lib/debug/.build-id` are merged in.
//! - [`parse_maps`] / [`read_maps`]: `/proc/PID/maps`.
//! - [`ProcessSymbols`]: every module mapped in a process, with biases;
//!   resolves a [`ProbeSpec`] to run-time addresses and symbolizes them.
//! - [`ProbeSpec`]: `[module:]function[+offset]`, `[module:]0xADDR`,
//!   `file.c:LINE`, each with an optional `%return`.
//! - [`KernelSymbols`]: `/proc/kallsyms`, `System.map` or vmlinux symbols.
//! - [`pattern`]: the one glob matcher for function names (`comp*`,
//!   `sys_[gs]et?id`), [`NamePattern`].

mod debuginfo;
mod demangle;
mod elf;
mod error;
mod kernel;
mod kind;
mod libpath;
mod maps;
mod noreturn;
pub mod pattern;
mod process;
mod spec;
mod usdt;

pub use debuginfo::{debug_files_hidden, find_debug_file, set_debug_files_hidden, DebugFileSource};
pub use demangle::demangle;
pub use elf::{data_symbol, ElfModule, Symbol, DEBUG_ROOT};
pub use error::SymbolError;
pub use kernel::{KernelSymbols, MAX_KALLSYMS_SIZE};
pub use kind::{Fde, FunctionKind};
pub use libpath::find_library;
pub use maps::{parse_maps, proc_dir, read_maps, Mapping, Perms};
pub use noreturn::{no_return_reason, NO_RETURN};
pub use pattern::{is_pattern, NamePattern, PatternError};
pub use process::{
    Boundary, BoundarySource, LoadedModule, ModuleCache, ProcessSymbols, ResolvedProbe,
    SymbolizedAddr,
};
pub use spec::{ProbeSpec, MAX_SPEC_LEN, RETURN_SUFFIX, USDT_PREFIX};
pub use usdt::{
    parse_args as parse_usdt_args, usdt_markers, UsdtArg, UsdtError, UsdtMarker, UsdtOperand,
    MAX_USDT_ARGS,
};

pub use hotprobe_target::{LinkAddr, LoadBias, RuntimeAddr};
