//! Which code symbols are function entries: a return probe, a recorded call
//! or a `%return` count reads the return address at `[rsp]`, which only a
//! function's entry has.
//!
//! - The ELF: `STT_FUNC` symbols are entries, gcc's clones included
//!   (`.part.N`, `.isra.N`, `.constprop.N`: called like any function), but
//!   not the `.cold` partitions (`g.cold`, `g.cold.0`, `g.part.0.cold`) of
//!   `-freorder-blocks-and-partition` (clang's `-fsplit-machine-functions`
//!   names them the same way): the parent jumps there with its frame
//!   pushed. Local `STT_NOTYPE` symbols in code are labels.
//! - DWARF, where present: a `DW_TAG_subprogram`'s entry (`DW_AT_entry_pc`,
//!   `DW_AT_low_pc`, or its first range) is an entry; the start of another
//!   of its `DW_AT_ranges` pieces is a cold part of it, whatever its symbol
//!   is called.
//! - `.eh_frame`, for code without symbols: FDE starts are instruction
//!   boundaries, and the call frame information there says whether `[rsp]`
//!   holds the return address (CFA = rsp+8, return address at CFA-8). A cold
//!   part usually has an FDE of its own, so an FDE start alone cannot tell
//!   a function from a cold part: only the symbol name can.

use std::collections::HashMap;

use hotprobe_target::LinkAddr;

/// What a code symbol is to a probe that needs a function entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    /// A function's entry: code is called here, `[rsp]` holds the return
    /// address (gcc's `.part.N`, `.isra.N`, `.constprop.N` clones too).
    Entry,
    /// A cold partition of function `parent` (`g.cold`): gcc's
    /// `-freorder-blocks-and-partition` moved its rarely run blocks there,
    /// and `parent` jumps to it with its own frame on the stack.
    ColdPart {
        /// The function it belongs to (demangled).
        parent: String,
    },
    /// A label in code (a local symbol without a function type): a place
    /// inside a function.
    Label,
}

impl FunctionKind {
    /// Whether this is a function's entry.
    pub fn is_entry(&self) -> bool {
        matches!(self, FunctionKind::Entry)
    }

    /// Why a symbol of this kind is not a function entry, without its name
    /// (one text for every symbol of the kind, for summaries); `None` for
    /// an entry.
    pub fn summary(&self) -> Option<&'static str> {
        match self {
            FunctionKind::Entry => None,
            FunctionKind::ColdPart { .. } => Some(
                "a cold partition of a function (gcc -freorder-blocks-and-partition): \
                 its [rsp] is not a return address",
            ),
            FunctionKind::Label => {
                Some("a label inside a function (a local symbol without a function type)")
            }
        }
    }

    /// Why the symbol `name` of this kind is not a function entry; `None`
    /// for an entry.
    pub fn reason(&self, name: &str) -> Option<String> {
        match self {
            FunctionKind::Entry => None,
            FunctionKind::ColdPart { parent } => Some(format!(
                "{name} is a cold partition of {parent} (gcc -freorder-blocks-and-partition), \
                 not a function entry: its [rsp] is not a return address"
            )),
            FunctionKind::Label => Some(format!(
                "{name} is a label inside a function (a local symbol without a function type), \
                 not a function entry: nothing says its [rsp] is a return address"
            )),
        }
    }
}

/// The raw (mangled, unversioned) name of the function whose cold
/// partition `raw` is, if `raw` names one: `g.cold` → `g`, `g.cold.0` →
/// `g`, `_Z1fi.part.0.cold` → `_Z1fi.part.0`.
pub(crate) fn cold_parent(raw: &str) -> Option<&str> {
    let mut rest = raw;
    // `.cold.N` (gcc < 8 numbered them).
    if let Some((head, n)) = rest.rsplit_once('.') {
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            rest = head;
        }
    }
    let parent = rest.strip_suffix(".cold")?;
    (!parent.is_empty()).then_some(parent)
}

/// One frame description entry of `.eh_frame`: a range of code and what
/// its call frame information says at its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fde {
    /// Its first address (an instruction boundary).
    pub start: LinkAddr,
    /// One past its last.
    pub end: LinkAddr,
    /// At `start`, the CFA is `rsp` plus this (8 at a function's entry);
    /// `None` when the CFA is not `rsp`-based there or the CFI cannot be
    /// evaluated.
    pub cfa_rsp_offset: Option<i64>,
    /// At `start`, the return address is saved at CFA plus this (-8 on
    /// x86-64); `None` when not saved at an offset of the CFA.
    pub ra_cfa_offset: Option<i64>,
}

impl Fde {
    /// Whether `[rsp]` holds the return address at the FDE's start.
    pub fn return_address_on_top(&self) -> bool {
        self.cfa_rsp_offset == Some(8) && self.ra_cfa_offset == Some(-8)
    }

    /// Whether `addr` lies in it.
    pub fn contains(&self, addr: LinkAddr) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// The FDEs of an `.eh_frame` section at link address `section_addr`,
/// sorted by start. Entries that do not parse are left out.
pub(crate) fn parse_eh_frame(data: &[u8], section_addr: u64, text_addr: u64) -> Vec<Fde> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, NativeEndian, UnwindContext, UnwindSection};
    let eh = EhFrame::new(data, NativeEndian);
    let bases = BaseAddresses::default()
        .set_eh_frame(section_addr)
        .set_text(text_addr);
    let mut ctx = Box::new(UnwindContext::new());
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    // A corrupt section must not loop forever: entries only move forward.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let (mut cfa_rsp_offset, mut ra_cfa_offset) = (None, None);
        if let Ok(row) = fde.unwind_info_for_address(&eh, &bases, &mut ctx, start) {
            if let gimli::CfaRule::RegisterAndOffset { register, offset } = row.cfa() {
                if *register == gimli::X86_64::RSP {
                    cfa_rsp_offset = Some(*offset);
                }
            }
            if let gimli::RegisterRule::Offset(o) = row.register(gimli::X86_64::RA) {
                ra_cfa_offset = Some(o);
            }
        }
        out.push(Fde {
            start: LinkAddr(start),
            end: LinkAddr(end),
            cfa_rsp_offset,
            ra_cfa_offset,
        });
    }
    out.sort_by_key(|f| (f.start, f.end));
    out
}

/// The FDE of `fdes` (sorted) containing `addr`: the innermost one if
/// some overlap.
pub(crate) fn fde_containing(fdes: &[Fde], addr: LinkAddr) -> Option<Fde> {
    let end = fdes.partition_point(|f| f.start <= addr);
    fdes[..end]
        .iter()
        .rev()
        .take(64)
        .filter(|f| f.contains(addr))
        .max_by_key(|f| f.start)
        .copied()
}

/// What DWARF says starts at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DwarfRole {
    /// A subprogram's entry; `no_return` when DWARF says it never returns
    /// (`DW_AT_noreturn`, on it or on the declaration it completes).
    Entry {
        /// `DW_AT_noreturn`.
        no_return: bool,
    },
    /// A piece of a subprogram's `DW_AT_ranges` other than the one holding
    /// its entry, whose entry is the address given.
    Piece(u64),
}

/// The entries of the subprograms of `dwarf` and the starts of their other
/// range pieces. Subprograms are looked for at the top of each unit and in
/// namespaces, classes and structures (not inside other subprograms).
pub(crate) fn dwarf_roles<R: gimli::Reader>(dwarf: &gimli::Dwarf<R>) -> HashMap<u64, DwarfRole> {
    let mut roles = HashMap::new();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let Ok(mut tree) = unit.entries_tree(None) else {
            continue;
        };
        let Ok(root) = tree.root() else { continue };
        walk(dwarf, &unit, root, &mut roles, 0);
    }
    roles
}

fn walk<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    node: gimli::EntriesTreeNode<'_, '_, '_, R>,
    roles: &mut HashMap<u64, DwarfRole>,
    depth: usize,
) {
    let mut children = node.children();
    while let Ok(Some(child)) = children.next() {
        let tag = child.entry().tag();
        match tag {
            gimli::DW_TAG_subprogram => subprogram(dwarf, unit, child.entry(), roles),
            gimli::DW_TAG_namespace
            | gimli::DW_TAG_class_type
            | gimli::DW_TAG_structure_type
            | gimli::DW_TAG_union_type
            | gimli::DW_TAG_module
                if depth < 32 =>
            {
                walk(dwarf, unit, child, roles, depth + 1)
            }
            _ => {}
        }
    }
}

fn subprogram<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    roles: &mut HashMap<u64, DwarfRole>,
) {
    let addr = |attr| -> Option<u64> {
        let v = entry.attr_value(attr).ok()??;
        match v {
            gimli::AttributeValue::Addr(a) => Some(a),
            gimli::AttributeValue::DebugAddrIndex(i) => dwarf.address(unit, i).ok(),
            _ => None,
        }
    };
    let low = addr(gimli::DW_AT_low_pc);
    let entry_pc = addr(gimli::DW_AT_entry_pc);
    let mut pieces = Vec::new();
    if matches!(entry.attr(gimli::DW_AT_ranges), Ok(Some(_))) {
        if let Ok(mut ranges) = dwarf.die_ranges(unit, entry) {
            while let Ok(Some(r)) = ranges.next() {
                if r.end > r.begin && pieces.len() < 64 {
                    pieces.push(r.begin);
                }
            }
        }
    }
    // With ranges, DW_AT_low_pc (if any) is their base, not the entry:
    // gcc lists the piece holding the entry first.
    let first = if pieces.is_empty() {
        low
    } else {
        pieces.first().copied()
    };
    let Some(entry_addr) = entry_pc.or(first) else {
        return;
    };
    if entry_addr == 0 {
        // Discarded by the linker (a COMDAT copy or --gc-sections).
        return;
    }
    let no_return = is_no_return(unit, entry);
    roles.insert(entry_addr, DwarfRole::Entry { no_return });
    for p in pieces {
        if p != entry_addr && p != 0 {
            roles.entry(p).or_insert(DwarfRole::Piece(entry_addr));
        }
    }
}

/// Whether `entry` (a subprogram) has `DW_AT_noreturn`, itself or on the
/// declaration or abstract instance it completes (`DW_AT_specification`,
/// `DW_AT_abstract_origin`, followed two levels within its unit).
fn is_no_return<R: gimli::Reader>(
    unit: &gimli::Unit<R>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> bool {
    let flag = |e: &gimli::DebuggingInformationEntry<'_, '_, R>| {
        matches!(
            e.attr_value(gimli::DW_AT_noreturn),
            Ok(Some(gimli::AttributeValue::Flag(true)))
        )
    };
    if flag(entry) {
        return true;
    }
    let origin = |e: &gimli::DebuggingInformationEntry<'_, '_, R>| {
        [gimli::DW_AT_specification, gimli::DW_AT_abstract_origin]
            .into_iter()
            .find_map(|a| match e.attr_value(a) {
                Ok(Some(gimli::AttributeValue::UnitRef(o))) => Some(o),
                _ => None,
            })
    };
    let mut next = origin(entry);
    for _ in 0..2 {
        let Some(offset) = next else { return false };
        let Ok(e) = unit.entry(offset) else {
            return false;
        };
        if flag(&e) {
            return true;
        }
        next = origin(&e);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_names() {
        assert_eq!(cold_parent("g.cold"), Some("g"));
        assert_eq!(cold_parent("g.cold.0"), Some("g"));
        assert_eq!(cold_parent("g.cold.12"), Some("g"));
        assert_eq!(cold_parent("_Z1fi.part.0.cold"), Some("_Z1fi.part.0"));
        assert_eq!(cold_parent("_Z1fi.isra.0.cold"), Some("_Z1fi.isra.0"));
        assert_eq!(cold_parent("g.part.0"), None);
        assert_eq!(cold_parent("g.isra.0"), None);
        assert_eq!(cold_parent("g.constprop.0"), None);
        assert_eq!(cold_parent("cold"), None);
        assert_eq!(cold_parent(".cold"), None);
        assert_eq!(cold_parent("g_cold"), None);
        assert_eq!(cold_parent("gcold.0"), None);
    }

    #[test]
    fn kinds() {
        assert!(FunctionKind::Entry.is_entry());
        assert_eq!(FunctionKind::Entry.reason("g"), None);
        let cold = FunctionKind::ColdPart { parent: "g".into() };
        assert!(!cold.is_entry());
        assert_eq!(
            cold.reason("g.cold").unwrap(),
            "g.cold is a cold partition of g (gcc -freorder-blocks-and-partition), \
             not a function entry: its [rsp] is not a return address"
        );
        assert!(FunctionKind::Label.summary().is_some());
    }

    #[test]
    fn containing_fde() {
        let f = |s, e| Fde {
            start: LinkAddr(s),
            end: LinkAddr(e),
            cfa_rsp_offset: Some(8),
            ra_cfa_offset: Some(-8),
        };
        let fdes = vec![f(0x100, 0x140), f(0x140, 0x150), f(0x200, 0x210)];
        assert_eq!(fde_containing(&fdes, LinkAddr(0x100)), Some(fdes[0]));
        assert_eq!(fde_containing(&fdes, LinkAddr(0x13f)), Some(fdes[0]));
        assert_eq!(fde_containing(&fdes, LinkAddr(0x140)), Some(fdes[1]));
        assert_eq!(fde_containing(&fdes, LinkAddr(0x150)), None);
        assert_eq!(fde_containing(&fdes, LinkAddr(0xff)), None);
        assert_eq!(fde_containing(&fdes, LinkAddr(0x20f)), Some(fdes[2]));
    }
}
