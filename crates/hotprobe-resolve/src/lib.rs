//! From probe specs to checked addresses: symbol resolution per target kind
//! and the blacklist of unsafe probe points, below the engine.
//!
//! - [`Resolver`]: what a target kind implements (resolve a [`ProbeSpec`],
//!   check a resolved address, list the blacklist, give a [`Symbolizer`]);
//!   the engine (`hotprobe::Session`) holds one per target, and target
//!   crates implement it without depending on the engine.
//! - [`ProcessResolver`]: Linux processes, over `/proc/PID/maps` and their
//!   ELF files.
//! - [`check_probe_point`]: the blacklist and instruction-boundary checks
//!   every resolver makes ([`CheckOptions::force`] skips the boundary
//!   check); [`SIGRETURN_SYMBOLS`]: signal-return trampolines.
//!
//! A function name that is a pattern ([`hotprobe_symbols::pattern`]:
//! `comp*`, `sys_[gs]et?id`) resolves to every function matching it.

#![warn(missing_docs)]

use hotprobe_symbols::{ProbeSpec, ProcessSymbols, ResolvedProbe, SymbolError};
use hotprobe_target::{LinkAddr, RuntimeAddr, Target};
use std::sync::Arc;

/// Something that symbolizes run-time addresses of a target.
pub trait Symbolizer {
    /// `function+0xoff [module]`, or `None` if unknown.
    fn symbolize(&self, addr: RuntimeAddr) -> Option<String>;

    /// The start of the function containing `addr`, if known (`None` by
    /// default).
    fn function_start(&self, addr: RuntimeAddr) -> Option<RuntimeAddr> {
        let _ = addr;
        None
    }
}

/// An address range where probes are refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlacklistEntry {
    /// First address.
    pub start: RuntimeAddr,
    /// One past the last.
    pub end: RuntimeAddr,
    /// What it is (`.plt of libc.so.6`, `__restore_rt (signal return)`).
    pub what: String,
}

/// Resolves probe specs for one target and knows its unsafe points.
pub trait Resolver {
    /// Addresses a spec names (the symbol tables are refreshed first, so
    /// libraries loaded since are seen).
    ///
    /// A function name that is a pattern ([`hotprobe_symbols::pattern`])
    /// and names no function as such gives every function matching it, one
    /// per address, each with [`ResolvedProbe::function`] set to the name
    /// that matched: in the named module (`lib:pat*`), else in the main
    /// executable (processes) or the core kernel (guests). None is left out
    /// here, not even those [`Resolver::check`] will refuse: the caller
    /// checks each. There is no limit on the number of matches; matching
    /// nothing is [`SymbolError::NoMatch`], a bad pattern
    /// [`SymbolError::BadPattern`].
    fn resolve(
        &mut self,
        spec: &ProbeSpec,
        target: &mut dyn Target,
    ) -> Result<Vec<ResolvedProbe>, SymbolError>;

    /// `Err(reason)` if the resolved address must not be probed: in the
    /// blacklist, or not shown to start an instruction (see
    /// [`check_probe_point`]).
    fn check(&self, probe: &ResolvedProbe, target: &mut dyn Target) -> Result<(), String> {
        self.check_with(probe, target, CheckOptions::default())
    }

    /// [`Resolver::check`] with options (`force`: skip the instruction
    /// boundary check, never the blacklist).
    fn check_with(
        &self,
        probe: &ResolvedProbe,
        target: &mut dyn Target,
        options: CheckOptions,
    ) -> Result<(), String>;

    /// [`Resolver::check_with`] on the code as it was before hotprobe
    /// wrote into it (see [`check_probe_point_over`]). By default the
    /// originals are not looked at.
    fn check_over(
        &self,
        probe: &ResolvedProbe,
        target: &mut dyn Target,
        options: CheckOptions,
        originals: &[(u64, Vec<u8>)],
    ) -> Result<(), String> {
        let _ = originals;
        self.check_with(probe, target, options)
    }

    /// The blacklist.
    fn blacklist(&self) -> Vec<BlacklistEntry>;

    /// A symbolizer for handlers.
    fn symbolizer(&self) -> Box<dyn Symbolizer>;

    /// The run-time address and size (`st_size`, 0 if unknown) of a data
    /// symbol (`STT_OBJECT`, a global variable): `name` or `module:name`,
    /// for watchpoints. Targets without data symbols refuse it.
    fn resolve_data(
        &mut self,
        spec: &str,
        _target: &mut dyn Target,
    ) -> Result<(RuntimeAddr, u64), SymbolError> {
        Err(SymbolError::Unprobeable {
            spec: spec.to_string(),
            reason: "this target has no data symbols".into(),
        })
    }

    /// The file mapped at `addr` and the offset in it, as last read
    /// (`None` if unknown, or the target has no files).
    fn file_offset_at(&self, addr: RuntimeAddr) -> Option<(std::path::PathBuf, u64)> {
        let _ = addr;
        None
    }
}

/// Options of [`check_probe_point`] (and [`Resolver::check_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Accept an address not shown to start an instruction (`--force`):
    /// skips the instruction-boundary check only, never the blacklist.
    pub force: bool,
}

/// How far past a known boundary the code is decoded at most.
const MAX_DECODE: u64 = 1 << 20;

/// The checks every resolver makes on a resolved probe: its address is in
/// no `blacklist` entry and starts an instruction: it is a known
/// instruction boundary ([`ResolvedProbe::boundary`]: the containing
/// function's start, else the containing `.eh_frame` FDE's start), or
/// decoding the target's code from that boundary lands on it. An address
/// with no known boundary before it is refused, as is one decoding steps
/// over, unless `options.force`. `Err(reason)` otherwise.
pub fn check_probe_point(
    probe: &ResolvedProbe,
    blacklist: &[BlacklistEntry],
    target: &mut dyn Target,
    options: CheckOptions,
) -> Result<(), String> {
    check_probe_point_over(probe, blacklist, target, options, &[])
}

/// [`check_probe_point`] on the code as it was before hotprobe wrote into
/// it: `originals` (address, original bytes) are laid over what is read,
/// in order (the later over the earlier), so that an `int3` or a jump
/// hotprobe placed before does not make the decoding step over the
/// instruction boundaries.
pub fn check_probe_point_over(
    probe: &ResolvedProbe,
    blacklist: &[BlacklistEntry],
    target: &mut dyn Target,
    options: CheckOptions,
    originals: &[(u64, Vec<u8>)],
) -> Result<(), String> {
    if let Some(b) = blacklist
        .iter()
        .find(|b| probe.addr >= b.start && probe.addr < b.end)
    {
        return Err(format!("{:#x} is blacklisted: {}", probe.addr.0, b.what));
    }
    if options.force {
        return Ok(());
    }
    let Some(b) = &probe.boundary else {
        return Err(format!(
            "no known instruction boundary before {} (no symbol covers it and no \
             .eh_frame entry: stripped?): pass --force to probe it anyway",
            place(probe)
        ));
    };
    if probe.addr == b.start {
        return Ok(());
    }
    let Some(upto) = probe.addr.0.checked_sub(b.start.0) else {
        return Err(format!(
            "{} is before {b}: no known instruction boundary before it",
            place(probe)
        ));
    };
    if upto >= MAX_DECODE {
        return Err(format!(
            "{} is {upto} bytes past {b}, too far to decode up to it: pass --force to \
             probe it anyway",
            place(probe)
        ));
    }
    let mut len = upto + hotprobe_x86::MAX_INSN_LEN as u64;
    if let Some(end) = b.end {
        len = len.min(end.0.saturating_sub(b.start.0)).max(upto + 1);
    }
    let mut code = vec![0u8; len as usize];
    if let Err(e) = target.read_memory(b.start, &mut code) {
        return Err(format!(
            "cannot read the code from {b} to check instruction boundaries: {e}"
        ));
    }
    lay_over(&mut code, b.start.0, originals);
    if !hotprobe_x86::is_instruction_boundary(&code, b.start.0, probe.addr.0) {
        return Err(format!(
            "{} is in the middle of an instruction (decoded from {b})",
            place(probe)
        ));
    }
    Ok(())
}

/// Lays `originals` (address, bytes) over `code`, read at `at`: each
/// byte of them that falls inside `code` replaces what is there.
pub fn lay_over(code: &mut [u8], at: u64, originals: &[(u64, Vec<u8>)]) {
    let end = at.saturating_add(code.len() as u64);
    for (a, bytes) in originals {
        for (i, b) in bytes.iter().enumerate() {
            let x = a.saturating_add(i as u64);
            if (at..end).contains(&x) {
                code[(x - at) as usize] = *b;
            }
        }
    }
}

/// `0x55d0c0de1234 (compute+0x4)`, or `(prog:0x1234)` without a function.
fn place(probe: &ResolvedProbe) -> String {
    match &probe.function {
        Some(f) => format!("{:#x} ({f}+{:#x})", probe.addr.0, probe.offset),
        None if probe.module.is_empty() => format!("{:#x}", probe.addr.0),
        None => format!(
            "{:#x} ({}:{:#x})",
            probe.addr.0, probe.module, probe.link_addr.0
        ),
    }
}

/// Signal-return trampolines: probing them breaks every signal delivery.
pub const SIGRETURN_SYMBOLS: &[&str] = &["__restore_rt", "__restore", "__vdso_rt_sigreturn"];

/// The blacklist entries of one ELF module named `name`: its PLT stubs and
/// its signal-return trampolines ([`SIGRETURN_SYMBOLS`]), each at the
/// address `at` maps its link-time address to (the load bias in a
/// process; the link-time address itself for a file, as `hotprobe list
/// --blacklist BINARY` shows it).
pub fn module_blacklist(
    module: &hotprobe_symbols::ElfModule,
    name: &str,
    at: impl Fn(LinkAddr) -> RuntimeAddr,
) -> Vec<BlacklistEntry> {
    let mut v: Vec<BlacklistEntry> = module
        .plt_ranges()
        .into_iter()
        .map(|r| BlacklistEntry {
            start: at(r.start),
            end: at(r.end),
            what: format!("PLT stubs of {name}"),
        })
        .collect();
    for sym_name in SIGRETURN_SYMBOLS {
        if let Some(sym) = module.find(sym_name) {
            let start = at(sym.addr);
            v.push(BlacklistEntry {
                start,
                end: RuntimeAddr(start.0 + sym.size.max(1)),
                what: format!("{sym_name} in {name} (signal return trampoline)"),
            });
        }
    }
    v
}

/// Resolver for a Linux process, over /proc/PID/maps and its ELF files.
pub struct ProcessResolver {
    pid: i32,
    symbols: Arc<ProcessSymbols>,
    /// `/proc/PID/maps` as it was when `symbols` was read: while it reads
    /// the same, the modules are the same and are not read again (issue 14:
    /// re-checking every mapped file per probe made arming 100,000 probes
    /// slow).
    maps: String,
    /// [`Resolver::blacklist`] of `symbols`, computed once per read.
    blacklist: Vec<BlacklistEntry>,
}

impl ProcessResolver {
    /// Read the process's modules.
    pub fn new(pid: i32) -> Result<Self, SymbolError> {
        let mut r = ProcessResolver {
            pid,
            symbols: Arc::new(ProcessSymbols::for_pid(pid as u32)?),
            maps: String::new(),
            blacklist: Vec::new(),
        };
        r.blacklist = r.blacklist();
        Ok(r)
    }

    /// The process's symbols as last read.
    pub fn symbols(&self) -> &ProcessSymbols {
        &self.symbols
    }
}

struct ArcSymbolizer(Arc<ProcessSymbols>);

impl Symbolizer for ArcSymbolizer {
    fn symbolize(&self, addr: RuntimeAddr) -> Option<String> {
        self.0.symbolize(addr).map(|s| s.to_string())
    }

    fn function_start(&self, addr: RuntimeAddr) -> Option<RuntimeAddr> {
        let s = self.0.symbolize(addr)?;
        s.function.as_ref()?;
        Some(RuntimeAddr(addr.0 - s.offset))
    }
}

impl Resolver for ProcessResolver {
    fn resolve(
        &mut self,
        spec: &ProbeSpec,
        _target: &mut dyn Target,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap_or_default();
        if maps.is_empty() || maps != self.maps {
            if let Ok(fresh) = ProcessSymbols::for_pid(self.pid as u32) {
                self.symbols = Arc::new(fresh);
                self.maps = maps;
                self.blacklist = self.blacklist();
            }
        }
        self.symbols.resolve(spec)
    }

    fn check_with(
        &self,
        probe: &ResolvedProbe,
        target: &mut dyn Target,
        options: CheckOptions,
    ) -> Result<(), String> {
        if probe.in_plt {
            return Err(format!(
                "{:#x} is in a PLT stub ({}): probe the function it calls instead",
                probe.addr.0, probe.module
            ));
        }
        check_probe_point(probe, &self.blacklist, target, options)
    }

    fn check_over(
        &self,
        probe: &ResolvedProbe,
        target: &mut dyn Target,
        options: CheckOptions,
        originals: &[(u64, Vec<u8>)],
    ) -> Result<(), String> {
        if probe.in_plt {
            return self.check_with(probe, target, options);
        }
        check_probe_point_over(probe, &self.blacklist, target, options, originals)
    }

    fn blacklist(&self) -> Vec<BlacklistEntry> {
        let mut v = Vec::new();
        for m in self.symbols.modules() {
            v.extend(module_blacklist(&m.module, &m.name, |a| m.runtime(a)));
            if m.name.starts_with("libhotprobe_agent") {
                v.push(BlacklistEntry {
                    start: m.ranges.iter().map(|r| r.start).min().unwrap_or_default(),
                    end: m.ranges.iter().map(|r| r.end).max().unwrap_or_default(),
                    what: "the hotprobe agent".into(),
                });
            }
        }
        v
    }

    fn symbolizer(&self) -> Box<dyn Symbolizer> {
        Box::new(ArcSymbolizer(self.symbols.clone()))
    }

    fn file_offset_at(&self, addr: RuntimeAddr) -> Option<(std::path::PathBuf, u64)> {
        let m = self.symbols.module_at(addr)?;
        Some((m.path.clone(), m.file_offset(addr)?))
    }

    fn resolve_data(
        &mut self,
        spec: &str,
        _target: &mut dyn Target,
    ) -> Result<(RuntimeAddr, u64), SymbolError> {
        if let Ok(fresh) = ProcessSymbols::for_pid(self.pid as u32) {
            self.symbols = Arc::new(fresh);
        }
        let (module, name) = match spec.split_once(':') {
            Some((m, n)) => (Some(m), n),
            None => (None, spec),
        };
        let candidates: Vec<&hotprobe_symbols::LoadedModule> = match module {
            Some(m) => vec![self.symbols.find_module(m)?],
            // The main executable first, then every library in map order.
            None => self
                .symbols
                .main_module()
                .into_iter()
                .chain(self.symbols.modules().iter())
                .collect(),
        };
        let mut searched = Vec::new();
        for m in candidates {
            if searched.contains(&m.name) {
                continue;
            }
            match hotprobe_symbols::data_symbol(&m.path, name) {
                Ok(Some(sym)) => return Ok((m.runtime(sym.addr), sym.size)),
                Ok(None) => {}
                // A module named explicitly must be readable; in a search
                // an unreadable one ([vdso], a deleted file) is passed over.
                Err(e) if module.is_some() => return Err(e),
                Err(_) => {}
            }
            searched.push(m.name.clone());
        }
        Err(SymbolError::Unprobeable {
            spec: spec.to_string(),
            reason: format!(
                "no data symbol (STT_OBJECT) `{name}` in {}",
                searched.join(", ")
            ),
        })
    }
}
