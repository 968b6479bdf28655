//! Probe specs for guest kernels: [`KernelResolver`] turns `function[+off]`,
//! `module:function[+off]`, `0xADDR` (each optionally `%return`) into checked
//! addresses from the guest's `/proc/kallsyms`, `System.map` or vmlinux
//! symbols, and [`open_guest`] connects to a guest and gives the target and
//! its resolver, to add to a `hotprobe::Session`.
//!
//! # What is refused in a guest kernel, and why
//!
//! A probe on a guest is a breakpoint held by the GDB stub (`Z0`): the guest
//! itself never sees a `#BP` or a `#DB`, and no guest code runs while a
//! handler does (the VM is stopped). So the guest's own int3 and debug
//! exception paths (`asm_exc_int3`, `exc_int3`, `poke_int3_handler`,
//! `asm_exc_debug`, `exc_debug`) can be probed: there is no recursion for
//! them to fall into, unlike Kprobes in the guest. What is dangerous under a
//! stub is different:
//!
//! - **the entry text** (`__entry_text_start`..`__entry_text_end`:
//!   `entry_SYSCALL_64`, the `asm_exc_*` and `asm_sysvec_*` stubs,
//!   `native_iret`): its first instructions run on the user's page tables
//!   when page-table isolation is on, where the out-of-line area (in normal
//!   kernel text) is not mapped, and with the user's GS. A boosted or
//!   stepped-out-of-line hit there would fault with no way back
//!   (triple fault). Refused through the blacklist.
//! - **`hlt`, `mwait`, `monitor`** and other always-trapping instructions:
//!   QEMU single-steps with interrupts masked, so stepping `hlt` would wait
//!   for an interrupt that never comes and wedge the stub. The engine keeps
//!   refusing them (see `hotprobe::Engine::set_step_unsupported_in_place`);
//!   other privileged instructions (`cli`, `wrmsr`, `swapgs`, `sysretq`,
//!   `iretq`, ...) are single-stepped in place by the stub.
//! - the **out-of-line area** itself (refused by the engine).
//!
//! Known limits (not checked, documented): an instruction with an
//! exception-table fixup (a user-memory access that may fault) must not run
//! out of line, since the guest looks the fixup up by the faulting address;
//! probe such instructions with a post handler off (they are then still
//! boosted) at your own risk, or probe the function entry instead. Code the
//! guest patches at run time (static keys, ftrace call sites once guest
//! ftrace is enabled) is planned from the bytes seen when the probe was
//! placed.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use hotprobe_resolve::{check_probe_point, BlacklistEntry, CheckOptions, Resolver, Symbolizer};
use hotprobe_symbols::pattern::{is_pattern, NamePattern};
use hotprobe_symbols::{ElfModule, KernelSymbols, LinkAddr, ProbeSpec, ResolvedProbe, SymbolError};
use hotprobe_target::{RuntimeAddr, Target, TargetError};

use crate::target::{GuestConfig, GuestTarget};

/// Address ranges, named by their start/end symbols, refused in a guest
/// kernel (see the module documentation for why).
pub const KERNEL_BLACKLIST: &[(&str, &str, &str)] = &[(
    "__entry_text_start",
    "__entry_text_end",
    "the kernel entry text (runs on user page tables with PTI; the out-of-line area is not mapped there)",
)];

/// The module name given to core-kernel symbols in resolved probes.
pub const KERNEL_MODULE: &str = "vmlinux";

/// Reads guest kernel symbols from a file: `/proc/kallsyms` or `System.map`
/// text, a vmlinux ELF file, or the kernel's bzImage (symbols recovered from
/// its kallsyms tables, see [`crate::image`]), recognised by their magic.
pub fn load_symbols(path: &Path) -> Result<(KernelSymbols, Option<(u64, u64)>), SymbolError> {
    let bytes = std::fs::read(path).map_err(|source| SymbolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if crate::image::is_kernel_image(&bytes) {
        let syms = crate::image::symbols_from_image_bytes(
            path,
            &bytes,
            crate::image::default_cache_dir().as_deref(),
        )?;
        let text = text_bounds(&syms);
        return Ok((syms, text));
    }
    if bytes.starts_with(b"\x7fELF") {
        let m = ElfModule::from_bytes(path.to_path_buf(), bytes)?;
        let text = match (m.find("_stext"), m.find("_etext")) {
            (Some(s), Some(e)) => Some((s.addr.0, e.addr.0)),
            _ => None,
        };
        return Ok((KernelSymbols::from_elf(&m), text));
    }
    let syms = KernelSymbols::parse(&String::from_utf8_lossy(&bytes))?;
    let text = text_bounds(&syms);
    Ok((syms, text))
}

/// `[_stext, _etext)` from a symbol table, if both are there.
pub fn text_bounds(syms: &KernelSymbols) -> Option<(u64, u64)> {
    let exact = |n: &str| {
        syms.lookup(n)
            .ok()
            .filter(|s| s.name == n)
            .map(|s| s.addr.0)
    };
    match (exact("_stext").or_else(|| exact("_text")), exact("_etext")) {
        (Some(s), Some(e)) if s < e => Some((s, e)),
        _ => None,
    }
}

/// Resolves probe specs against a guest kernel's symbols and checks them.
pub struct KernelResolver {
    symbols: Arc<KernelSymbols>,
    blacklist: Vec<BlacklistEntry>,
}

struct KernelSymbolizer(Arc<KernelSymbols>);

impl Symbolizer for KernelSymbolizer {
    fn symbolize(&self, addr: RuntimeAddr) -> Option<String> {
        let (s, off) = self.0.symbolize(addr.0)?;
        let module = self.0.module_of(s).unwrap_or(KERNEL_MODULE);
        Some(if off == 0 {
            format!("{} [{module}]", s.name)
        } else {
            format!("{}+{off:#x} [{module}]", s.name)
        })
    }
}

impl KernelResolver {
    /// A resolver over `symbols`, with the blacklist computed from them.
    pub fn new(symbols: KernelSymbols) -> Self {
        let mut blacklist = Vec::new();
        let exact = |n: &str| {
            symbols
                .lookup(n)
                .ok()
                .filter(|s| s.name == n)
                .map(|s| s.addr.0)
        };
        for (start, end, what) in KERNEL_BLACKLIST {
            if let (Some(s), Some(e)) = (exact(start), exact(end)) {
                if s < e {
                    blacklist.push(BlacklistEntry {
                        start: RuntimeAddr(s),
                        end: RuntimeAddr(e),
                        what: (*what).to_string(),
                    });
                }
            }
        }
        KernelResolver {
            symbols: Arc::new(symbols),
            blacklist,
        }
    }

    /// The symbols.
    pub fn symbols(&self) -> &KernelSymbols {
        &self.symbols
    }

    fn resolved(
        &self,
        sym: &hotprobe_symbols::Symbol,
        offset: u64,
        is_return: bool,
    ) -> ResolvedProbe {
        let addr = sym.addr.0.wrapping_add(offset);
        ResolvedProbe {
            addr: RuntimeAddr(addr),
            link_addr: LinkAddr(addr),
            module: self
                .symbols
                .module_of(sym)
                .unwrap_or(KERNEL_MODULE)
                .to_string(),
            function: Some(sym.name.clone()),
            offset,
            function_range: (sym.size > 0)
                .then(|| RuntimeAddr(sym.addr.0)..RuntimeAddr(sym.addr.0 + sym.size)),
            is_return,
            in_plt: false,
            kind: Some(sym.kind.clone()),
            not_entry: if offset != 0 {
                Some(format!(
                    "{addr:#x} is {offset} bytes into {}, not its entry",
                    sym.name
                ))
            } else {
                sym.not_entry_reason()
            },
            boundary: Some(hotprobe_symbols::Boundary {
                start: RuntimeAddr(sym.addr.0),
                end: (sym.size > 0).then(|| RuntimeAddr(sym.addr.0 + sym.size)),
                source: hotprobe_symbols::BoundarySource::Function(sym.name.clone()),
            }),
            no_return: (offset == 0)
                .then(|| hotprobe_symbols::no_return_reason(None, Some(&sym.name), LinkAddr(addr)))
                .flatten(),
            semaphore: None,
            usdt_args: Vec::new(),
            usdt: false,
        }
    }

    fn find_function(
        &self,
        module: Option<&str>,
        name: &str,
    ) -> Result<&hotprobe_symbols::Symbol, SymbolError> {
        match core_or_module(module) {
            None => self.symbols.lookup(name),
            Some(m) => self
                .find_in_module(m, name)
                .ok_or_else(|| SymbolError::SymbolNotFound {
                    symbol: name.to_string(),
                    module: format!("guest kernel module {m}"),
                    similar: Vec::new(),
                }),
        }
    }

    fn find_in_module(&self, m: &str, name: &str) -> Option<&hotprobe_symbols::Symbol> {
        self.symbols.symbols().iter().find(|s| {
            (s.name == name || s.name.split_once('.').is_some_and(|(b, _)| b == name))
                && self.symbols.module_of(s) == Some(m)
        })
    }

    /// What [`Resolver::resolve`] gives for `spec` (the guest itself is
    /// not needed): `function[+off]` (core kernel before modules),
    /// `module:function[+off]`, a pattern (`__x64_sys_getpp*`, every
    /// matching function of the core kernel or the named module), or an
    /// absolute `0xADDR`; each optionally `%return`.
    pub fn resolve_spec(&self, spec: &ProbeSpec) -> Result<Vec<ResolvedProbe>, SymbolError> {
        match spec {
            ProbeSpec::Function {
                module,
                name,
                offset,
                is_return,
            } => self.resolve_function(module.as_deref(), name, *offset, *is_return),
            ProbeSpec::Address {
                module: None,
                addr,
                is_return,
            } => match self.symbols.symbolize(*addr) {
                Some((sym, off)) => Ok(vec![self.resolved(sym, off, *is_return)]),
                None => Err(SymbolError::AddressNotMapped {
                    addr: *addr,
                    why: "is in no function of the guest kernel's symbol table".into(),
                }),
            },
            ProbeSpec::Address {
                module: Some(m), ..
            } => Err(SymbolError::Unprobeable {
                spec: spec.to_string(),
                reason: format!(
                    "module-relative addresses ({m}:0x...) are not supported for guest kernels: \
                     give the absolute address from kallsyms"
                ),
            }),
            ProbeSpec::Usdt { .. } => Err(SymbolError::Unprobeable {
                spec: spec.to_string(),
                reason: "USDT markers are in user-space programs, not in a guest kernel".into(),
            }),
            ProbeSpec::Line { .. } => Err(SymbolError::Unprobeable {
                spec: spec.to_string(),
                reason: "source lines need the kernel's DWARF; not supported for guest kernels"
                    .into(),
            }),
        }
    }

    /// `function[+offset]`: the function named so if there is one, else,
    /// for a pattern, every function matching it (see
    /// [`KernelResolver::resolve_pattern`]).
    fn resolve_function(
        &self,
        module: Option<&str>,
        name: &str,
        offset: u64,
        is_return: bool,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        if is_pattern(name) {
            let exact = match core_or_module(module) {
                None => self.symbols.find(name),
                Some(m) => self.find_in_module(m, name),
            };
            if exact.is_none() {
                return self.resolve_pattern(module, name, offset, is_return);
            }
        }
        let sym = self.find_function(module, name)?;
        Ok(vec![self.function_probe(sym, offset, is_return)?])
    }

    fn function_probe(
        &self,
        sym: &hotprobe_symbols::Symbol,
        offset: u64,
        is_return: bool,
    ) -> Result<ResolvedProbe, SymbolError> {
        if sym.size > 0 && offset >= sym.size {
            return Err(SymbolError::OffsetPastEnd {
                offset,
                function: sym.name.clone(),
                size: sym.size,
            });
        }
        Ok(self.resolved(sym, offset, is_return))
    }

    /// Every function whose name matches `pattern`, in the core kernel
    /// (no module, `vmlinux:` or `kernel:`) or in the named kernel module:
    /// one probe per address (the first alias matching), each named by its
    /// match, none left out (the caller checks each); the offset applies to
    /// every match. Matching nothing is an error naming the pattern.
    fn resolve_pattern(
        &self,
        module: Option<&str>,
        pattern: &str,
        offset: u64,
        is_return: bool,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        let pat = NamePattern::new(pattern)?;
        let want = core_or_module(module);
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (sym, m) in self.symbols.with_modules() {
            if m == want && pat.matches(&sym.name) && seen.insert(sym.addr) {
                out.push(self.function_probe(sym, offset, is_return)?);
            }
        }
        if out.is_empty() {
            return Err(SymbolError::NoMatch {
                pattern: pattern.to_string(),
                module: match want {
                    None => "the guest kernel".into(),
                    Some(m) => format!("guest kernel module {m}"),
                },
            });
        }
        Ok(out)
    }
}

/// The kernel module a spec names: `None` for the core kernel (no module,
/// `vmlinux` or `kernel`).
fn core_or_module(module: Option<&str>) -> Option<&str> {
    module.filter(|m| !matches!(*m, KERNEL_MODULE | "kernel"))
}

impl Resolver for KernelResolver {
    fn resolve(
        &mut self,
        spec: &ProbeSpec,
        _target: &mut dyn Target,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        self.resolve_spec(spec)
    }

    fn check_with(
        &self,
        probe: &ResolvedProbe,
        target: &mut dyn Target,
        options: CheckOptions,
    ) -> Result<(), String> {
        check_probe_point(probe, &self.blacklist, target, options)
    }

    fn blacklist(&self) -> Vec<BlacklistEntry> {
        self.blacklist.clone()
    }

    fn symbolizer(&self) -> Box<dyn Symbolizer> {
        Box::new(KernelSymbolizer(self.symbols.clone()))
    }
}

/// Connects to a guest's stub and gives the target with a [`KernelResolver`]
/// over `symbols`: the kernel text bounds for the out-of-line area are taken
/// from the symbols (`_stext`, `_etext`) unless `config` has them. The VM
/// stays stopped.
///
/// To probe it through a `hotprobe::Session`, add both with
/// `Session::add_target` and have the target's engine single-step in place
/// the instructions it cannot run out of line (privileged ones), which the
/// stub can:
///
/// ```ignore
/// let (target, resolver) = hotprobe_guest::open_guest(config, symbols)?;
/// let id = session.add_target(Box::new(target), Some(Box::new(resolver)));
/// session.engine(id)?.set_step_unsupported_in_place(true);
/// ```
pub fn open_guest(
    mut config: GuestConfig,
    symbols: KernelSymbols,
) -> Result<(GuestTarget, KernelResolver), TargetError> {
    if config.kernel_text.is_none() {
        config.kernel_text = text_bounds(&symbols);
    }
    let target = GuestTarget::connect(config)?;
    Ok((target, KernelResolver::new(symbols)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
ffffffff81000000 T _stext
ffffffff81000010 T func_a
ffffffff81000040 t func_b.constprop.0
ffffffff81000080 T __entry_text_start
ffffffff81000090 T entry_SYSCALL_64
ffffffff810000c0 T __entry_text_end
ffffffff810000d0 T _etext
ffffffffc0000000 t mod_fn\t[mymod]
ffffffffc0000040 t mod_end\t[mymod]
";

    #[test]
    fn resolves_and_blacklists() {
        let syms = KernelSymbols::parse(MAP).unwrap();
        assert_eq!(
            text_bounds(&syms),
            Some((0xffffffff81000000, 0xffffffff810000d0))
        );
        let r = KernelResolver::new(syms);
        let bl = r.blacklist();
        assert_eq!(bl.len(), 1);
        assert_eq!(bl[0].start, RuntimeAddr(0xffffffff81000080));
        let sym = r.symbols.lookup("func_a").unwrap().clone();
        let p = r.resolved(&sym, 4, false);
        assert_eq!(p.addr, RuntimeAddr(0xffffffff81000014));
        assert_eq!(p.module, KERNEL_MODULE);
        let m = r.find_function(Some("mymod"), "mod_fn").unwrap();
        assert_eq!(m.addr.0, 0xffffffffc0000000);
        assert!(r.find_function(Some("other"), "mod_fn").is_err());
        assert!(r.find_function(None, "func_b").is_ok());
        let s = r.symbolizer();
        assert_eq!(
            s.symbolize(RuntimeAddr(0xffffffff81000012)).as_deref(),
            Some("func_a+0x2 [vmlinux]")
        );
    }

    /// A kallsyms excerpt: the getpid family with their `__pfx_` padding
    /// symbols, an alias, a `.cold` part, and a module.
    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff810a1f30 t __pfx___x64_sys_getppid
ffffffff810a1f40 T __x64_sys_getppid
ffffffff810a1f40 T __x64_sys_getppid_alias
ffffffff810a1f90 t __pfx___ia32_sys_getppid
ffffffff810a1fa0 T __ia32_sys_getppid
ffffffff810a2000 T __x64_sys_getpid
ffffffff810a2050 T __x64_sys_getpgid
ffffffff810a2100 T __x64_sys_getpgrp
ffffffff810a2180 t __x64_sys_getppid.cold
ffffffff810a21c0 T __entry_text_start
ffffffff810a21d0 T entry_SYSCALL_64
ffffffff810a2200 T __entry_text_end
ffffffff810a2300 T _etext
ffffffffc0000000 t __x64_sys_getppid_hook\t[mymod]
ffffffffc0000040 t mymod_init\t[mymod]
ffffffffc0000080 t other_fn\t[mymod]
";

    fn names(r: &KernelResolver, spec: &str) -> Vec<String> {
        r.resolve_spec(&spec.parse().unwrap())
            .unwrap()
            .into_iter()
            .map(|p| p.function.unwrap())
            .collect()
    }

    #[test]
    fn patterns() {
        let r = KernelResolver::new(KernelSymbols::parse(KALLSYMS).unwrap());
        // Core kernel only, one probe per address (the alias is left out,
        // the `.cold` part is a function of its own).
        assert_eq!(
            names(&r, "__x64_sys_getpp*"),
            ["__x64_sys_getppid", "__x64_sys_getppid.cold"]
        );
        let p = r
            .resolve_spec(&"__x64_sys_getpp*".parse().unwrap())
            .unwrap();
        assert_eq!(p[0].addr, RuntimeAddr(0xffffffff810a1f40));
        assert_eq!(p[0].module, KERNEL_MODULE);
        assert_eq!(p[0].offset, 0);
        assert!(p[0].function_range.is_some());
        assert_eq!(
            names(&r, "vmlinux:__x64_sys_getp?id"),
            ["__x64_sys_getppid", "__x64_sys_getpgid"]
        );
        assert_eq!(
            names(&r, "kernel:__[xi]*_sys_getppid"),
            ["__x64_sys_getppid", "__ia32_sys_getppid"]
        );
        assert_eq!(
            names(&r, "__x64_sys_getp[!p]*"),
            ["__x64_sys_getpid", "__x64_sys_getpgid", "__x64_sys_getpgrp"]
        );
        // A module pattern searches that module only.
        assert_eq!(
            names(&r, "mymod:*"),
            ["__x64_sys_getppid_hook", "mymod_init", "other_fn"]
        );
        // Offsets and %return apply to every match.
        let p = r
            .resolve_spec(&"__x64_sys_getpgid+0x4".parse().unwrap())
            .unwrap();
        assert_eq!(p[0].addr, RuntimeAddr(0xffffffff810a2054));
        let p = r
            .resolve_spec(&"__x64_sys_getp?id%return".parse().unwrap())
            .unwrap();
        assert!(p.iter().all(|p| p.is_return));
        // Matches the checks refuse are still returned (the caller checks).
        assert_eq!(names(&r, "entry_SYSCALL_6?"), ["entry_SYSCALL_64"]);
        // No match, and a bad pattern, are errors naming the pattern.
        let e = r
            .resolve_spec(&"__x64_sys_nothing*".parse().unwrap())
            .unwrap_err();
        assert!(matches!(e, SymbolError::NoMatch { .. }), "{e}");
        assert!(e.to_string().contains("__x64_sys_nothing*"), "{e}");
        let e = r.resolve_spec(&"mymod:zz*".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("module mymod"), "{e}");
        let e = r.resolve_spec(&"sys_[z-a]*".parse().unwrap()).unwrap_err();
        assert!(matches!(e, SymbolError::BadPattern(_)), "{e}");
        assert!(e.to_string().contains("sys_[z-a]*"), "{e}");
        // An offset past the end of one match fails the spec.
        assert!(matches!(
            r.resolve_spec(&"__x64_sys_getp?id+0x50".parse().unwrap()),
            Err(SymbolError::OffsetPastEnd { .. })
        ));
    }
}
