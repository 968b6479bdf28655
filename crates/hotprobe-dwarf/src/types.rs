//! The type model and its reading from DWARF (gimli).

use crate::DwarfError;
use gimli::{AttributeValue, Reader as _};
use std::collections::HashMap;
use std::sync::Arc;

type R = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// How deep pointers and struct members are followed when a type is built
/// (a list node pointing to itself stops there, as an [`Type::Other`]).
const TYPE_DEPTH: u32 = 4;
/// Members kept per struct and enumerators per enum (hostile DWARF cannot
/// make a type unbounded).
const MAX_MEMBERS: usize = 256;

/// A C type as far as hotprobe prints values of it. Typedefs, `const`,
/// `volatile` and `restrict` are looked through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    /// `void` (a return type only).
    Void,
    /// An integer of `size` bytes (1, 2, 4, 8).
    Int {
        /// Bytes.
        size: u8,
        /// Signed.
        signed: bool,
    },
    /// `bool` / `_Bool`.
    Bool,
    /// `char` (one byte, a character encoding).
    Char {
        /// Signed.
        signed: bool,
    },
    /// `float` (4) or `double` (8).
    Float {
        /// Bytes.
        size: u8,
    },
    /// A pointer (to what, as far as [`TYPE_DEPTH`] allows).
    Pointer(Box<Type>),
    /// An enumeration.
    Enum {
        /// Its tag name (may be empty).
        name: String,
        /// Bytes.
        size: u8,
        /// Enumerators: value and name.
        values: Vec<(i64, String)>,
    },
    /// A struct or union.
    Struct {
        /// Its tag name (may be empty).
        name: String,
        /// Bytes.
        size: u64,
        /// Members with a constant offset.
        fields: Vec<Field>,
    },
    /// Anything else (arrays, functions, `long double`, `__int128`, too deep).
    Other {
        /// A name for messages.
        name: String,
    },
}

impl Type {
    /// `char *` or `const char *` (any qualifiers): printed as a string.
    pub fn is_string(&self) -> bool {
        matches!(self, Type::Pointer(t) if matches!(**t, Type::Char { .. }))
    }

    /// Passed in a general register under the System V ABI (INTEGER class,
    /// eight bytes at most).
    pub fn is_integer_class(&self) -> bool {
        matches!(
            self,
            Type::Int { .. }
                | Type::Bool
                | Type::Char { .. }
                | Type::Pointer(_)
                | Type::Enum { .. }
        )
    }

    /// A short C-like name, for messages.
    pub fn describe(&self) -> String {
        match self {
            Type::Void => "void".into(),
            Type::Int { size, signed } => {
                format!("{}int{}", if *signed { "" } else { "u" }, size * 8)
            }
            Type::Bool => "bool".into(),
            Type::Char { .. } => "char".into(),
            Type::Float { size: 4 } => "float".into(),
            Type::Float { .. } => "double".into(),
            Type::Pointer(t) => format!("{} *", t.describe()),
            Type::Enum { name, .. } => format!("enum {name}"),
            Type::Struct { name, .. } => format!("struct {name}"),
            Type::Other { name } => name.clone(),
        }
    }
}

/// A struct member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its name (may be empty: anonymous members).
    pub name: String,
    /// Byte offset in the struct.
    pub offset: u64,
    /// Its type.
    pub ty: Type,
}

/// Where DWARF says a parameter is at the function's first instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryLoc {
    /// In DWARF register `n` (0 rax, 1 rdx, 2 rcx, 3 rbx, 4 rsi, 5 rdi,
    /// 8–15 r8–r15, 17–32 xmm0–15).
    Reg(u16),
    /// In the frame (`-O0`: `DW_OP_fbreg`, or any memory location valid
    /// for the whole function: valid once the prologue ran; at the entry
    /// the value is where the ABI put it).
    Frame,
    /// Nowhere at the entry: optimised out there.
    OptimisedOut,
    /// A constant, as raw little-endian bits (`DW_AT_const_value`, also
    /// its block forms; a location computing a constant:
    /// `DW_OP_lit1; DW_OP_stack_value`, `DW_OP_implicit_value`): the
    /// caller passed nothing for it.
    Const(i64),
    /// A value computed from the thread at the entry (`DW_OP_breg4 +0;
    /// …; DW_OP_stack_value`, an entry value, a stack slot of a location
    /// list); its `size` is set by the plan.
    Expr(crate::DwarfExpr),
    /// No location attribute, or one hotprobe does not evaluate.
    Unknown,
}

/// A formal parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name (may be empty).
    pub name: String,
    /// Its type.
    pub ty: Type,
    /// Its location at the entry.
    pub entry: EntryLoc,
}

/// A function's parameters and return type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The DWARF name.
    pub name: String,
    /// The entry address (link-time).
    pub low_pc: u64,
    /// The parameters in order (varargs are not listed).
    pub params: Vec<Param>,
    /// The return type ([`Type::Void`] when none).
    pub ret: Type,
    /// `DW_AT_calling_convention DW_CC_nocall`: the compiler changed how
    /// the function is called (rustc/LLVM dropping constant arguments), so
    /// the declared parameters are not where the ABI says.
    pub abi_changed: bool,
}

/// One ELF file's DWARF, indexed by function entry address.
pub struct DebugTypes {
    dwarf: gimli::Dwarf<R>,
    units: Vec<gimli::Unit<R>>,
    /// Entry address → unit index and DIE offset.
    by_pc: HashMap<u64, (usize, gimli::UnitOffset)>,
}

impl DebugTypes {
    /// Reads `path` (the executable or library; separate debug files are
    /// not looked for).
    pub fn load(path: &std::path::Path) -> Result<DebugTypes, DwarfError> {
        let bytes = std::fs::read(path).map_err(|source| DwarfError::Io {
            path: path.display().to_string(),
            source,
        })?;
        DebugTypes::from_bytes(&bytes)
    }

    /// Parses an ELF file's DWARF and indexes its functions.
    pub fn from_bytes(bytes: &[u8]) -> Result<DebugTypes, DwarfError> {
        use object::{Object as _, ObjectSection as _};
        let file = object::File::parse(bytes).map_err(|e| DwarfError::Elf(e.to_string()))?;
        if file.section_by_name(".debug_info").is_none() {
            return Err(DwarfError::NoDebugInfo);
        }
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let load = |id: gimli::SectionId| -> Result<R, gimli::Error> {
            let data: Arc<[u8]> = match file.section_by_name(id.name()) {
                Some(sec) => match sec.uncompressed_data() {
                    Ok(d) => Arc::from(&*d),
                    Err(_) => Arc::from(&[][..]),
                },
                None => Arc::from(&[][..]),
            };
            Ok(gimli::EndianArcSlice::new(data, endian))
        };
        let dwarf = gimli::Dwarf::load(load)?;
        let mut units = Vec::new();
        let mut by_pc = HashMap::new();
        let mut headers = dwarf.units();
        while let Some(h) = headers.next()? {
            let Ok(unit) = dwarf.unit(h) else { continue };
            let ui = units.len();
            let mut cursor = unit.entries();
            while let Ok(Some((_, e))) = cursor.next_dfs() {
                if e.tag() != gimli::DW_TAG_subprogram {
                    continue;
                }
                if let Some(pc) = entry_pc(&dwarf, &unit, e) {
                    by_pc.entry(pc).or_insert((ui, e.offset()));
                }
            }
            units.push(unit);
        }
        Ok(DebugTypes {
            dwarf,
            units,
            by_pc,
        })
    }

    /// Entry addresses of every function with DWARF, sorted.
    pub fn functions(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.by_pc.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The signature of the function whose entry is `low_pc` (link-time),
    /// `None` when DWARF has no function there.
    pub fn signature(&self, low_pc: u64) -> Result<Option<Signature>, DwarfError> {
        let Some(&(ui, off)) = self.by_pc.get(&low_pc) else {
            return Ok(None);
        };
        let unit = &self.units[ui];
        let r = Resolver {
            dwarf: &self.dwarf,
            unit,
        };
        let name = r.name(off).unwrap_or_default();
        let ret = match r.attr_ref(off, gimli::DW_AT_type) {
            Some(t) => r.ty(t, TYPE_DEPTH),
            None => Type::Void,
        };
        // The concrete DIE's parameters: (abstract origin, DIE, where).
        let mut concrete = Vec::new();
        let mut tree = unit.entries_tree(Some(off))?;
        let root = tree.root()?;
        let mut children = root.children();
        while let Some(child) = children.next()? {
            let e = child.entry();
            if e.tag() != gimli::DW_TAG_formal_parameter {
                continue;
            }
            let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
                Ok(Some(AttributeValue::UnitRef(o))) => Some(o),
                _ => None,
            };
            concrete.push((origin, e.offset(), r.entry_loc(e, low_pc)));
            if concrete.len() >= MAX_MEMBERS {
                break;
            }
        }
        // A concrete instance (gcc's clones) may list its parameters in
        // another order than the declaration, or leave some out: the
        // abstract instance's order is the declared one.
        let order = match unit.entry(off)?.attr_value(gimli::DW_AT_abstract_origin) {
            Ok(Some(AttributeValue::UnitRef(a))) => r.formal_parameters(a),
            _ => Vec::new(),
        };
        let mut slots: Vec<(gimli::UnitOffset, EntryLoc)> = Vec::new();
        if order.is_empty() {
            slots.extend(concrete.into_iter().map(|(_, o, l)| (o, l)));
        } else {
            for a in &order {
                let loc = match concrete.iter().position(|c| c.0 == Some(*a)) {
                    Some(i) => concrete.remove(i).2,
                    None => EntryLoc::OptimisedOut,
                };
                slots.push((*a, loc));
            }
            slots.extend(concrete.into_iter().map(|(_, o, l)| (o, l)));
        }
        let params = slots
            .into_iter()
            .take(MAX_MEMBERS)
            .map(|(po, entry)| Param {
                name: r.name(po).unwrap_or_default(),
                ty: match r.attr_ref(po, gimli::DW_AT_type) {
                    Some(t) => r.ty(t, TYPE_DEPTH),
                    None => Type::Other {
                        name: "unknown".into(),
                    },
                },
                entry,
            })
            .collect();
        let abi_changed = matches!(
            r.attr(off, gimli::DW_AT_calling_convention),
            Some(AttributeValue::CallingConvention(gimli::DW_CC_nocall))
        );
        Ok(Some(Signature {
            name,
            low_pc,
            params,
            ret,
            abi_changed,
        }))
    }
}

/// A function DIE's entry address: its `DW_AT_low_pc`, else (a function
/// in several pieces, as gcc splits a hot part from a `.cold` one, e.g.
/// glibc's `_IO_new_fclose`) its `DW_AT_entry_pc`, else the start of the
/// first of its `DW_AT_ranges` (gcc lists the part with the entry first).
fn entry_pc(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    e: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> Option<u64> {
    for at in [gimli::DW_AT_low_pc, gimli::DW_AT_entry_pc] {
        if let Ok(Some(v)) = e.attr_value(at) {
            if let Ok(Some(pc)) = dwarf.attr_address(unit, v) {
                return Some(pc);
            }
        }
    }
    let v = e.attr_value(gimli::DW_AT_ranges).ok()??;
    let offset = dwarf.attr_ranges_offset(unit, v).ok()??;
    let mut ranges = dwarf.ranges(unit, offset).ok()?;
    let first = ranges.next().ok()??;
    (first.begin < first.end).then_some(first.begin)
}

struct Resolver<'a> {
    dwarf: &'a gimli::Dwarf<R>,
    unit: &'a gimli::Unit<R>,
}

impl Resolver<'_> {
    /// An attribute of the DIE at `off`, following `DW_AT_abstract_origin`
    /// and `DW_AT_specification` within the unit (a few hops).
    fn attr(&self, mut off: gimli::UnitOffset, at: gimli::DwAt) -> Option<AttributeValue<R>> {
        for _ in 0..4 {
            let e = self.unit.entry(off).ok()?;
            if let Ok(Some(v)) = e.attr_value(at) {
                return Some(v);
            }
            let next = [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification]
                .into_iter()
                .find_map(|a| match e.attr_value(a) {
                    Ok(Some(AttributeValue::UnitRef(o))) => Some(o),
                    _ => None,
                })?;
            off = next;
        }
        None
    }

    fn attr_ref(&self, off: gimli::UnitOffset, at: gimli::DwAt) -> Option<gimli::UnitOffset> {
        match self.attr(off, at)? {
            AttributeValue::UnitRef(o) => Some(o),
            _ => None,
        }
    }

    fn name(&self, off: gimli::UnitOffset) -> Option<String> {
        let v = self.attr(off, gimli::DW_AT_name)?;
        let s = self.dwarf.attr_string(self.unit, v).ok()?;
        Some(s.to_string_lossy().ok()?.into_owned())
    }

    fn udata(&self, off: gimli::UnitOffset, at: gimli::DwAt) -> Option<u64> {
        self.attr(off, at)?.udata_value()
    }

    /// The type at `off`, members and pointees followed `depth` levels.
    fn ty(&self, off: gimli::UnitOffset, depth: u32) -> Type {
        self.ty_inner(off, depth, 0)
    }

    fn ty_inner(&self, off: gimli::UnitOffset, depth: u32, hops: u32) -> Type {
        let other = |n: &str| Type::Other { name: n.into() };
        let Ok(e) = self.unit.entry(off) else {
            return other("unknown");
        };
        let name = self.name(off).unwrap_or_default();
        let next = || self.attr_ref(off, gimli::DW_AT_type);
        match e.tag() {
            gimli::DW_TAG_typedef
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_atomic_type => {
                if hops > 16 {
                    return other("typedef loop");
                }
                match next() {
                    Some(t) => self.ty_inner(t, depth, hops + 1),
                    None => Type::Void,
                }
            }
            gimli::DW_TAG_base_type => {
                let size = self.udata(off, gimli::DW_AT_byte_size).unwrap_or(0);
                let enc = match self.attr(off, gimli::DW_AT_encoding) {
                    Some(AttributeValue::Encoding(x)) => x,
                    _ => return other(&name),
                };
                match (enc, size) {
                    (gimli::DW_ATE_boolean, _) => Type::Bool,
                    (gimli::DW_ATE_signed_char, 1) => Type::Char { signed: true },
                    (gimli::DW_ATE_unsigned_char, 1) => Type::Char { signed: false },
                    (gimli::DW_ATE_float, 4 | 8) => Type::Float { size: size as u8 },
                    (
                        gimli::DW_ATE_signed
                        | gimli::DW_ATE_signed_char
                        | gimli::DW_ATE_unsigned
                        | gimli::DW_ATE_unsigned_char,
                        1 | 2 | 4 | 8,
                    ) => Type::Int {
                        size: size as u8,
                        signed: matches!(enc, gimli::DW_ATE_signed | gimli::DW_ATE_signed_char),
                    },
                    _ => other(&name),
                }
            }
            gimli::DW_TAG_pointer_type | gimli::DW_TAG_reference_type => {
                let to = match (next(), depth) {
                    (None, _) => Type::Void,
                    (Some(_), 0) => other("…"),
                    (Some(t), d) => self.ty_inner(t, d - 1, 0),
                };
                Type::Pointer(Box::new(to))
            }
            gimli::DW_TAG_enumeration_type => {
                let size = self.udata(off, gimli::DW_AT_byte_size).unwrap_or(4);
                if !matches!(size, 1 | 2 | 4 | 8) {
                    return other(&format!("enum {name}"));
                }
                let mut values = Vec::new();
                self.children(off, |c| {
                    if c.tag() == gimli::DW_TAG_enumerator && values.len() < MAX_MEMBERS {
                        let v = match c.attr_value(gimli::DW_AT_const_value) {
                            Ok(Some(AttributeValue::Udata(u))) => Some(u as i64),
                            Ok(Some(v)) => v.sdata_value().or(v.udata_value().map(|u| u as i64)),
                            _ => None,
                        };
                        if let (Some(v), Some(n)) = (v, self.name(c.offset())) {
                            values.push((v, n));
                        }
                    }
                });
                Type::Enum {
                    name,
                    size: size as u8,
                    values,
                }
            }
            gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type | gimli::DW_TAG_class_type => {
                let size = self.udata(off, gimli::DW_AT_byte_size).unwrap_or(0);
                let mut fields = Vec::new();
                if depth > 0 {
                    self.children(off, |c| {
                        if c.tag() != gimli::DW_TAG_member || fields.len() >= MAX_MEMBERS {
                            return;
                        }
                        let offset = match c.attr_value(gimli::DW_AT_data_member_location) {
                            Ok(Some(v)) => match v.udata_value() {
                                Some(o) => o,
                                None => return,
                            },
                            // A union member has none: offset 0.
                            Ok(None) => 0,
                            Err(_) => return,
                        };
                        if matches!(c.attr_value(gimli::DW_AT_bit_size), Ok(Some(_))) {
                            return;
                        }
                        let ty = match self.attr_ref(c.offset(), gimli::DW_AT_type) {
                            Some(t) => self.ty_inner(t, depth - 1, 0),
                            None => other("unknown"),
                        };
                        fields.push(Field {
                            name: self.name(c.offset()).unwrap_or_default(),
                            offset,
                            ty,
                        });
                    });
                }
                Type::Struct { name, size, fields }
            }
            gimli::DW_TAG_array_type => other("array"),
            gimli::DW_TAG_subroutine_type => other("function"),
            _ => other(&name),
        }
    }

    fn children(
        &self,
        off: gimli::UnitOffset,
        mut f: impl FnMut(&gimli::DebuggingInformationEntry<R>),
    ) {
        let Ok(mut tree) = self.unit.entries_tree(Some(off)) else {
            return;
        };
        let Ok(root) = tree.root() else { return };
        let mut children = root.children();
        while let Ok(Some(c)) = children.next() {
            f(c.entry());
        }
    }

    /// The formal parameters of the DIE at `off`, in order.
    fn formal_parameters(&self, off: gimli::UnitOffset) -> Vec<gimli::UnitOffset> {
        let mut v = Vec::new();
        self.children(off, |c| {
            if c.tag() == gimli::DW_TAG_formal_parameter && v.len() < MAX_MEMBERS {
                v.push(c.offset());
            }
        });
        v
    }

    /// Where the parameter `e` is at `pc` (the entry).
    fn entry_loc(&self, e: &gimli::DebuggingInformationEntry<R>, pc: u64) -> EntryLoc {
        let v = match e.attr_value(gimli::DW_AT_location) {
            Ok(Some(v)) => v,
            Ok(None) => {
                // A concrete instance may leave the location to nobody:
                // DWARF knows no place for the value anywhere.
                return match e.attr_value(gimli::DW_AT_const_value) {
                    Ok(Some(v)) => const_value(&v).map_or(EntryLoc::Unknown, EntryLoc::Const),
                    _ => EntryLoc::OptimisedOut,
                };
            }
            Err(_) => return EntryLoc::Unknown,
        };
        if let AttributeValue::Exprloc(expr) = v {
            return self.expr_loc(expr, true);
        }
        let Ok(Some(mut locs)) = self.dwarf.attr_locations(self.unit, v) else {
            return EntryLoc::Unknown;
        };
        let mut n = 0;
        while let Ok(Some(l)) = locs.next() {
            n += 1;
            if n > 4096 {
                break;
            }
            if l.range.begin <= pc && pc < l.range.end {
                return self.expr_loc(l.data, false);
            }
        }
        EntryLoc::OptimisedOut
    }

    /// What the location expression `expr` says at the entry; `whole`: it
    /// holds for the whole function (not a location list's range at the
    /// entry), so a memory location in it is the frame's, set up by the
    /// prologue.
    fn expr_loc(&self, expr: gimli::Expression<R>, whole: bool) -> EntryLoc {
        let enc = self.unit.encoding();
        let mut ops = expr.clone().operations(enc);
        let first = match ops.next() {
            Ok(Some(op)) => op,
            _ => return EntryLoc::Unknown,
        };
        let mut last = first.clone();
        let mut count = 1;
        while let Ok(Some(op)) = ops.next() {
            last = op;
            count += 1;
            if count > 64 {
                return EntryLoc::Unknown;
            }
        }
        match first {
            gimli::Operation::Register { register } if count == 1 => {
                return EntryLoc::Reg(register.0)
            }
            gimli::Operation::FrameOffset { .. } => return EntryLoc::Frame,
            _ => {}
        }
        let value = matches!(
            last,
            gimli::Operation::StackValue | gimli::Operation::ImplicitValue { .. }
        );
        if whole && !value {
            return EntryLoc::Frame;
        }
        let Ok(bytes) = expr.0.to_slice() else {
            return EntryLoc::Unknown;
        };
        let e = crate::DwarfExpr {
            bytes: bytes.into_owned(),
            address_size: enc.address_size,
            version: enc.version,
            format64: enc.format == gimli::Format::Dwarf64,
            size: 8,
        };
        match e.fold() {
            crate::expr::Folded::Const(c) => EntryLoc::Const(c as i64),
            crate::expr::Folded::Runtime => EntryLoc::Expr(e),
            crate::expr::Folded::No => EntryLoc::Unknown,
        }
    }
}

/// A `DW_AT_const_value` as raw little-endian bits: the data and
/// constant forms, or a block of at most 8 bytes (a `double`).
fn const_value(v: &AttributeValue<R>) -> Option<i64> {
    match v {
        AttributeValue::Block(b) => crate::expr::le_bits(&b.to_slice().ok()?).map(|x| x as i64),
        AttributeValue::Sdata(x) => Some(*x),
        v => v.udata_value().map(|u| u as i64),
    }
}
