//! Kernel symbols from `/proc/kallsyms`, `System.map` or a vmlinux ELF.

use std::collections::HashMap;

use hotprobe_target::LinkAddr;

use crate::demangle::similar_names;
use crate::elf::{ElfModule, Symbol};
use crate::error::SymbolError;

/// Largest size given to a kallsyms function (the distance to the next
/// symbol), so that a gap in the table does not make one function huge.
pub const MAX_KALLSYMS_SIZE: u64 = 1 << 20;

/// A kernel's function symbols, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct KernelSymbols {
    syms: Vec<Symbol>,
    /// The kernel module of each symbol (`None` for the core kernel).
    modules: Vec<Option<String>>,
    index: HashMap<String, Vec<u32>>,
}

fn is_function_type(t: &str) -> bool {
    matches!(t, "t" | "T" | "w" | "W")
}

impl KernelSymbols {
    /// Parse `/proc/kallsyms` or `System.map` text:
    /// `ffffffff81000000 T _text`, optionally followed by `\t[module]`.
    /// Only text symbols (`t`, `T`, `w`, `W`) are kept; a function's size is
    /// the distance to the next symbol (at most [`MAX_KALLSYMS_SIZE`]).
    /// Lines that do not parse are skipped; text with no parsable line, or
    /// whose addresses are all zero (kallsyms read without privilege), is an
    /// error.
    pub fn parse(text: &str) -> Result<Self, SymbolError> {
        let mut all: Vec<(u64, bool, String, Option<String>)> = Vec::new();
        let mut nonzero = false;
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(addr), Some(ty), Some(name)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if addr.is_empty() || addr.len() > 16 || ty.len() != 1 {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            let module = match f.next() {
                None => None,
                Some(m) => match m.strip_prefix('[').and_then(|m| m.strip_suffix(']')) {
                    Some(m) if !m.is_empty() => Some(m.to_string()),
                    _ => continue,
                },
            };
            if f.next().is_some() {
                continue;
            }
            nonzero |= addr != 0;
            all.push((addr, is_function_type(ty), name.to_string(), module));
        }
        if all.is_empty() {
            return Err(SymbolError::Kallsyms {
                reason: "no line has the form `ADDRESS TYPE NAME [MODULE]`".into(),
            });
        }
        if !nonzero {
            return Err(SymbolError::Kallsyms {
                reason: "addresses are all zero: read kallsyms as root \
                         (or set kernel.kptr_restrict=0)"
                    .into(),
            });
        }
        all.sort_by_key(|e| e.0);
        let mut syms = Vec::new();
        let mut modules = Vec::new();
        for (i, (addr, is_func, name, module)) in all.iter().enumerate() {
            if !is_func || *addr == 0 {
                continue;
            }
            let next = all
                .get(i + 1..)
                .unwrap_or(&[])
                .iter()
                .find(|e| e.0 > *addr)
                .map(|e| e.0);
            let size = next.map_or(0, |n| (n - addr).min(MAX_KALLSYMS_SIZE));
            let kind = match crate::kind::cold_parent(name) {
                Some(parent) => crate::FunctionKind::ColdPart {
                    parent: parent.to_string(),
                },
                None => crate::FunctionKind::Entry,
            };
            syms.push(Symbol {
                name: name.clone(),
                raw_name: name.clone(),
                addr: LinkAddr(*addr),
                size,
                kind,
            });
            modules.push(module.clone());
        }
        if syms.is_empty() {
            return Err(SymbolError::Kallsyms {
                reason: "no text (t/T/w/W) symbols".into(),
            });
        }
        Ok(Self::build(syms, modules))
    }

    /// The function symbols of a vmlinux ELF file.
    pub fn from_elf(m: &ElfModule) -> Self {
        let syms = m.functions().to_vec();
        let modules = vec![None; syms.len()];
        Self::build(syms, modules)
    }

    fn build(syms: Vec<Symbol>, modules: Vec<Option<String>>) -> Self {
        let mut index: HashMap<String, Vec<u32>> = HashMap::new();
        for (i, s) in syms.iter().enumerate() {
            let Ok(i) = u32::try_from(i) else { break };
            index.entry(s.name.clone()).or_default().push(i);
            // `foo.constprop.0`, `foo.isra.0`, `foo.cold` also answer to `foo`.
            if let Some((base, _)) = s.name.split_once('.') {
                if !base.is_empty() {
                    index.entry(base.to_string()).or_default().push(i);
                }
            }
        }
        KernelSymbols {
            syms,
            modules,
            index,
        }
    }

    /// The function named `name` (core kernel symbols before module ones,
    /// exact names before `name.suffix` variants).
    pub fn lookup(&self, name: &str) -> Result<&Symbol, SymbolError> {
        self.find(name).ok_or_else(|| SymbolError::SymbolNotFound {
            symbol: name.to_string(),
            module: "the kernel".into(),
            similar: similar_names(name, self.syms.iter().map(|s| s.name.as_str()), 5),
        })
    }

    /// [`KernelSymbols::lookup`] without building an error (cheap when
    /// absent).
    pub fn find(&self, name: &str) -> Option<&Symbol> {
        let best = self.index.get(name).and_then(|v| {
            v.iter()
                .filter_map(|&i| usize::try_from(i).ok())
                .min_by_key(|&i| {
                    let inexact = self.syms.get(i).map(|s| s.name.as_str()) != Some(name);
                    let in_module = self.modules.get(i).is_some_and(Option::is_some);
                    (inexact, in_module, i)
                })
        });
        best.and_then(|i| self.syms.get(i))
    }

    /// The symbols with their kernel module (`None` for the core kernel),
    /// sorted by address.
    pub fn with_modules(&self) -> impl Iterator<Item = (&Symbol, Option<&str>)> {
        self.syms
            .iter()
            .zip(self.modules.iter().map(Option::as_deref))
    }

    /// The function containing `addr` and the offset into it.
    pub fn symbolize(&self, addr: u64) -> Option<(&Symbol, u64)> {
        let end = self.syms.partition_point(|s| s.addr.0 <= addr);
        let s = self.syms.get(end.checked_sub(1)?)?;
        s.contains(LinkAddr(addr)).then(|| (s, addr - s.addr.0))
    }

    /// The kernel module a symbol belongs to (`None` for the core kernel or
    /// a symbol not from this table).
    pub fn module_of(&self, sym: &Symbol) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.addr < sym.addr);
        self.syms
            .get(i..)?
            .iter()
            .zip(self.modules.get(i..)?)
            .take_while(|(s, _)| s.addr == sym.addr)
            .find(|(s, _)| s.name == sym.name)
            .and_then(|(_, m)| m.as_deref())
    }

    /// All function symbols, sorted by address.
    pub fn symbols(&self) -> &[Symbol] {
        &self.syms
    }

    /// Number of function symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// Whether there are no function symbols.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t do_thing.constprop.0
ffffffff81001040 T do_thing
ffffffff81001100 D some_data
ffffffff81002000 W weak_fn
garbage line
ffffffffc0000000 t mod_fn\t[mymod]
ffffffffc0000100 T do_thing\t[other]
";

    #[test]
    fn parses_system_map() {
        let k = KernelSymbols::parse(MAP).unwrap();
        assert_eq!(k.len(), 7);
        let s = k.lookup("do_thing").unwrap();
        assert_eq!(s.addr, LinkAddr(0xffffffff81001040));
        assert_eq!(s.size, 0xc0);
        assert_eq!(k.module_of(s), None);
        let m = k.lookup("mod_fn").unwrap();
        assert_eq!(k.module_of(m), Some("mymod"));
        assert_eq!(m.size, 0x100);
        let (s, off) = k.symbolize(0xffffffff81001010).unwrap();
        assert_eq!((s.name.as_str(), off), ("do_thing.constprop.0", 0x10));
        // weak_fn is followed by a module symbol far away: size is capped.
        assert_eq!(k.lookup("weak_fn").unwrap().size, MAX_KALLSYMS_SIZE);
        assert!(k.symbolize(0x10).is_none());
        let e = k.lookup("do_thng").unwrap_err().to_string();
        assert!(e.contains("do_thing"), "{e}");
        // The last symbol has no size: only its exact address matches.
        assert!(k.symbolize(0xffffffffc0000100).is_some());
        assert!(k.symbolize(0xffffffffc0000101).is_none());
    }

    #[test]
    fn rejects_unusable_text() {
        let e =
            KernelSymbols::parse("0000000000000000 T _text\n0000000000000000 t foo\n").unwrap_err();
        assert!(e.to_string().contains("read kallsyms as root"), "{e}");
        assert!(KernelSymbols::parse("").is_err());
        assert!(KernelSymbols::parse("hello world\n").is_err());
        assert!(KernelSymbols::parse("ffffffff81000000 D data\n").is_err());
        assert!(KernelSymbols::parse("fffffffff81000000000 T x\n").is_err());
    }
}
