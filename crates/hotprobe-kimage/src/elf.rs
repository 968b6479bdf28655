//! Symbols of an unstripped vmlinux ELF file (`.symtab`), typed like `nm`.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind, SymbolSection};

use crate::{Error, KernelSymbol};

/// The `.symtab` symbols of an ELF file (none if it is stripped), sorted by
/// address, with `nm`'s type letters.
pub fn symtab_symbols(data: &[u8]) -> Result<Vec<KernelSymbol>, Error> {
    let file = object::File::parse(data).map_err(|e| Error::Elf {
        reason: e.to_string(),
    })?;
    let mut out = Vec::new();
    for sym in file.symbols() {
        if matches!(sym.kind(), SymbolKind::Section | SymbolKind::File) || sym.is_undefined() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() {
            continue;
        }
        let letter = match sym.section() {
            SymbolSection::Absolute => 'a',
            SymbolSection::Common => 'b',
            SymbolSection::Section(i) => match file.section_by_index(i).map(|s| s.kind()) {
                Ok(SectionKind::Text) => 't',
                Ok(SectionKind::Data | SectionKind::Tls) => 'd',
                Ok(SectionKind::UninitializedData | SectionKind::UninitializedTls) => 'b',
                Ok(
                    SectionKind::ReadOnlyData
                    | SectionKind::ReadOnlyString
                    | SectionKind::ReadOnlyDataWithRel,
                ) => 'r',
                _ => 'n',
            },
            _ => continue,
        };
        let kind = if sym.is_weak() {
            if letter == 't' {
                'W'
            } else {
                'V'
            }
        } else if sym.is_global() {
            letter.to_ascii_uppercase()
        } else {
            letter
        };
        out.push(KernelSymbol {
            addr: sym.address(),
            kind,
            name: name.to_string(),
        });
    }
    out.sort_by(|a, b| a.addr.cmp(&b.addr).then_with(|| a.name.cmp(&b.name)));
    Ok(out)
}
