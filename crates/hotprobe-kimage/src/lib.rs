//! hotprobe-kimage: kernel symbols from a kernel image.
//!
//! Given the bytes of an x86 `bzImage` (what `qemu-system-x86_64 -kernel`
//! boots), [`kernel_symbols`] recovers the kernel's own symbol table without
//! the guest's help, equal to what `/proc/kallsyms` of that kernel prints
//! when booted with `nokaslr`:
//!
//! 1. [`bzimage::BzImage::parse`]: the boot header (`HdrS`, boot protocol
//!    ≥ 2.08, `setup_sects`, `payload_offset`/`payload_length`);
//! 2. [`decompress::decompress`]: the payload, by its magic bytes: gzip,
//!    xz (LZMA2 with the x86 BCJ filter, as the kernel builds it), lzma,
//!    zstd or lz4 (legacy frames); bzip2 and lzo are recognised and refused;
//! 3. [`vmlinux_symbols`]: in the decompressed vmlinux, an ELF `.symtab` if
//!    there is one, else the kernel's kallsyms tables ([`kallsyms`]), found
//!    by the heuristics of vmlinux-to-elf: the token table (256
//!    NUL-terminated strings, `0`..`9` among them in order), the token index
//!    after it, then backwards the markers, the compressed names, the symbol
//!    count and the address offsets with their relative base.
//!
//! Every malformed input is an [`Error`] saying what was not found; nothing
//! here panics on untrusted bytes (fuzzed: `tests/fuzz.rs`, `fuzz/`).

#![warn(missing_docs)]

pub mod btf;
pub mod bzimage;
pub mod decompress;
pub mod elf;
pub mod kallsyms;

use std::fmt::Write as _;

pub use bzimage::{is_bzimage, BzImage};
pub use decompress::{decompress, Compression};

/// One kernel symbol, as a line of `/proc/kallsyms`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelSymbol {
    /// Its address (the kernel's link address: KASLR off).
    pub addr: u64,
    /// Its `nm` type letter (`T`, `t`, `D`, `r`, `A`, `W`, ...).
    pub kind: char,
    /// Its name.
    pub name: String,
}

impl KernelSymbol {
    /// Whether it is a text symbol (`t`, `T`, `w`, `W`).
    pub fn is_text(&self) -> bool {
        matches!(self.kind, 't' | 'T' | 'w' | 'W')
    }
}

/// Where symbols came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolSource {
    /// The ELF `.symtab` of an unstripped vmlinux.
    Symtab,
    /// The kernel's own kallsyms tables.
    Kallsyms,
}

/// A kernel's symbols, recovered from its image.
#[derive(Clone, Debug)]
pub struct KernelSymbols {
    /// Where they came from.
    pub source: SymbolSource,
    /// The symbols, in the table's order (by address).
    pub symbols: Vec<KernelSymbol>,
}

impl KernelSymbols {
    /// The symbols as `/proc/kallsyms` text (`ffffffff81000000 T _text`).
    pub fn to_kallsyms_text(&self) -> String {
        to_kallsyms_text(&self.symbols)
    }
}

/// Renders symbols as `/proc/kallsyms` text, one `ADDRESS TYPE NAME` line
/// each.
pub fn to_kallsyms_text(symbols: &[KernelSymbol]) -> String {
    let mut s = String::with_capacity(symbols.len() * 40);
    for sym in symbols {
        let _ = writeln!(s, "{:016x} {} {}", sym.addr, sym.kind, sym.name);
    }
    s
}

/// Everything that can be wrong with a kernel image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither a bzImage nor an ELF vmlinux.
    #[error("not a kernel image: no x86 boot header (`HdrS` at 0x202) and no ELF magic")]
    NotKernelImage,
    /// The boot header is there but too old to locate the payload.
    #[error(
        "boot protocol {major}.{minor:02} is older than 2.08: no payload_offset/payload_length"
    )]
    OldBootProtocol {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// The image is shorter than a structure it describes.
    #[error("truncated image: {what} needs bytes up to {needed:#x}, the image has {len:#x}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// The end offset needed.
        needed: u64,
        /// The image's size.
        len: u64,
    },
    /// The payload's magic bytes are not a known compression.
    #[error("unknown payload compression (first bytes {magic:02x?})")]
    UnknownCompression {
        /// The payload's first bytes.
        magic: Vec<u8>,
    },
    /// A compression recognised but not supported.
    #[error("{format}-compressed kernels are not supported (gzip, xz, lzma, zstd and lz4 are)")]
    UnsupportedCompression {
        /// The format.
        format: &'static str,
    },
    /// The payload does not decompress.
    #[error("cannot decompress the {format} payload: {reason}")]
    Decompress {
        /// The format.
        format: &'static str,
        /// What the decoder said.
        reason: String,
    },
    /// The payload decompresses to more than the limit.
    #[error("the {format} payload decompresses to more than {limit} bytes")]
    TooLarge {
        /// The format.
        format: &'static str,
        /// The limit.
        limit: usize,
    },
    /// An ELF vmlinux that does not parse.
    #[error("bad ELF vmlinux: {reason}")]
    Elf {
        /// What the parser said.
        reason: String,
    },
    /// The kernel's BTF.
    #[error(transparent)]
    Btf(btf::BtfError),
    /// A kallsyms table was not found (or not consistent).
    #[error("kallsyms: {what} not found{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    KallsymsNotFound {
        /// The table.
        what: &'static str,
        /// What was tried.
        detail: String,
    },
}

/// Where the kernel of an image (bzImage or ELF vmlinux) keeps its current
/// task and the task's pid, tgid and comm, from the vmlinux's BTF.
pub fn task_offsets(image: &[u8]) -> Result<btf::TaskOffsets, Error> {
    let of_vmlinux = |v: &[u8]| -> Result<btf::TaskOffsets, Error> {
        let blob = btf::btf_section(v).map_err(Error::Btf)?;
        let b = btf::Btf::parse(blob).map_err(Error::Btf)?;
        btf::task_offsets(&b).map_err(Error::Btf)
    };
    if is_bzimage(image) {
        let bz = BzImage::parse(image)?;
        return of_vmlinux(&bz.decompress()?);
    }
    if image.starts_with(b"\x7fELF") {
        return of_vmlinux(image);
    }
    Err(Error::NotKernelImage)
}

/// Kernel symbols from the bytes of a kernel image: a bzImage (its payload
/// decompressed) or an ELF vmlinux.
pub fn kernel_symbols(image: &[u8]) -> Result<KernelSymbols, Error> {
    if is_bzimage(image) {
        let bz = BzImage::parse(image)?;
        let vmlinux = bz.decompress()?;
        return vmlinux_symbols(&vmlinux);
    }
    if image.starts_with(b"\x7fELF") {
        return vmlinux_symbols(image);
    }
    Err(Error::NotKernelImage)
}

/// Symbols of a decompressed vmlinux: its ELF `.symtab` if it is an ELF
/// file with one, else its kallsyms tables (the whole file is searched, so
/// a raw binary works too).
pub fn vmlinux_symbols(vmlinux: &[u8]) -> Result<KernelSymbols, Error> {
    if vmlinux.starts_with(b"\x7fELF") {
        let syms = elf::symtab_symbols(vmlinux)?;
        if !syms.is_empty() {
            return Ok(KernelSymbols {
                source: SymbolSource::Symtab,
                symbols: syms,
            });
        }
    }
    let k = kallsyms::Kallsyms::find(vmlinux)?;
    Ok(KernelSymbols {
        source: SymbolSource::Kallsyms,
        symbols: k.symbols,
    })
}
