//! One ELF file: its function symbols, program headers, PLT and DWARF.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use hotprobe_target::{LinkAddr, LoadBias};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags, SymbolKind};

use crate::demangle::{demangle, lookup_keys, short_name, similar_names, strip_version};
use crate::error::SymbolError;
use crate::kind::{cold_parent, dwarf_roles, fde_containing, parse_eh_frame, DwarfRole, Fde};
use crate::maps::Mapping;
use crate::FunctionKind;

mod lines;
#[cfg(test)]
use lines::path_suffix_matches;

/// Where separate debug files live, indexed by build id.
pub const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Page size used for load-bias arithmetic (x86-64).
const PAGE: u64 = 4096;

/// A function symbol of an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Demangled name (Rust names keep their `::h<hash>`).
    pub name: String,
    /// The name as stored in the symbol table (mangled, maybe versioned).
    pub raw_name: String,
    /// Link-time address (`st_value`).
    pub addr: LinkAddr,
    /// Size in bytes (`st_size`); 0 when unknown.
    pub size: u64,
    /// Whether it is a function's entry, or else what (a `.cold`
    /// partition, a label), as the symbol table says (type, name):
    /// see [`FunctionKind`]; [`ElfModule::function_kind`] adds DWARF.
    pub kind: FunctionKind,
}

impl Symbol {
    /// Whether the symbol is a function's entry (`[rsp]` holds a return
    /// address there), not a `.cold` partition or a label, as the symbol
    /// table says.
    pub fn is_entry(&self) -> bool {
        self.kind.is_entry()
    }

    /// Why it is not a function entry (`g.cold is a cold partition of g
    /// …`); `None` for an entry.
    pub fn not_entry_reason(&self) -> Option<String> {
        self.kind.reason(&self.name)
    }

    /// Whether `addr` lies inside this symbol (for size 0: equals its start).
    pub fn contains(&self, addr: LinkAddr) -> bool {
        match addr.0.checked_sub(self.addr.0) {
            Some(0) => true,
            Some(off) => off < self.size,
            None => false,
        }
    }
}

/// A loadable segment (PT_LOAD) as the program header states it.
#[derive(Clone, Copy, Debug)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    memsz: u64,
    flags: u32,
}

const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// The DWARF reader type: owns its bytes, so the module is self-contained.
type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// An opened ELF file (executable, shared library, vmlinux or debug file),
/// holding its bytes.
pub struct ElfModule {
    path: PathBuf,
    /// The bytes holding DWARF: this file's or a separate debug file's.
    dwarf_bytes: Option<(PathBuf, Arc<[u8]>)>,
    /// The file's USDT markers (`.note.stapsdt`); none when it has none or
    /// they cannot be read.
    usdt: Vec<crate::UsdtMarker>,
    is_pie: bool,
    entry: LinkAddr,
    functions: Vec<Symbol>,
    /// The `.eh_frame` FDEs, sorted by start.
    fdes: Vec<Fde>,
    /// Preference of each function among aliases (lower is better).
    ranks: Vec<u8>,
    raw_index: HashMap<String, Vec<u32>>,
    alias_index: HashMap<String, Vec<u32>>,
    plt: Vec<Range<LinkAddr>>,
    segments: Vec<Segment>,
    build_id: Option<Vec<u8>>,
    debug_file: Option<PathBuf>,
    dwarf: OnceLock<Option<Arc<gimli::Dwarf<Reader>>>>,
    /// What DWARF says starts where (subprogram entries, other pieces).
    dwarf_roles: OnceLock<HashMap<u64, DwarfRole>>,
    a2l: Mutex<Option<addr2line::Context<Reader>>>,
}

impl std::fmt::Debug for ElfModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfModule")
            .field("path", &self.path)
            .field("is_pie", &self.is_pie)
            .field("entry", &self.entry)
            .field("functions", &self.functions.len())
            .field("debug_file", &self.debug_file)
            .finish_non_exhaustive()
    }
}

fn not_elf(path: &Path, e: impl std::fmt::Display) -> SymbolError {
    SymbolError::NotElf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// A function symbol before sorting, with its alias preference.
struct RawFunc {
    raw: String,
    addr: u64,
    size: u64,
    rank: u8,
    /// A label (`STT_NOTYPE`, local, in code), not a function symbol.
    label: bool,
}

/// Whether `sym` is a label in code: a local `STT_NOTYPE` symbol of an
/// executable section (hand-written assembly's local symbols).
fn is_code_label(file: &object::File<'_>, sym: &object::Symbol<'_, '_>) -> bool {
    if sym.kind() != SymbolKind::Unknown || !sym.is_local() || sym.is_undefined() {
        return false;
    }
    let Some(idx) = sym.section_index() else {
        return false;
    };
    file.section_by_index(idx)
        .is_ok_and(|sec| sec.kind() == object::SectionKind::Text)
}

fn collect_functions<'d>(file: &object::File<'d>, out: &mut HashMap<(u64, String), RawFunc>) {
    let tables = file.symbols().chain(file.dynamic_symbols());
    for sym in tables {
        let label = is_code_label(file, &sym);
        if (sym.kind() != SymbolKind::Text || sym.is_undefined()) && !label {
            continue;
        }
        let Ok(raw) = sym.name() else { continue };
        if raw.is_empty() || raw.starts_with(".L") || raw.starts_with('$') {
            continue;
        }
        let rank = if sym.is_global() {
            0
        } else if sym.is_weak() {
            1
        } else {
            2
        };
        let key = (sym.address(), strip_version(raw).to_string());
        let new = RawFunc {
            raw: raw.to_string(),
            addr: sym.address(),
            size: sym.size(),
            rank,
            label,
        };
        match out.get_mut(&key) {
            None => {
                out.insert(key, new);
            }
            Some(old) => {
                // Prefer the unversioned spelling, the larger size, the better binding.
                if old.raw.contains('@') && !new.raw.contains('@') {
                    old.raw = new.raw;
                }
                old.size = old.size.max(new.size);
                old.rank = old.rank.min(new.rank);
                // A function symbol wins over a label of the same name.
                old.label &= new.label;
            }
        }
    }
}

fn has_section(file: &object::File<'_>, name: &str) -> bool {
    file.section_by_name(name)
        .is_some_and(|s| s.size() > 0 && s.kind() != object::SectionKind::UninitializedData)
}

fn has_dwarf(file: &object::File<'_>) -> bool {
    has_section(file, ".debug_line") || has_section(file, ".debug_info")
}

fn has_symtab(file: &object::File<'_>) -> bool {
    file.symbols().next().is_some()
}

impl ElfModule {
    /// Read and parse the ELF file at `path`.
    pub fn open(path: &Path) -> Result<Self, SymbolError> {
        let bytes = std::fs::read(path).map_err(|source| SymbolError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(path.to_path_buf(), bytes)
    }

    /// Parse an ELF file already in memory; `path` is used for messages and
    /// as the module's name.
    pub fn from_bytes(path: PathBuf, bytes: Vec<u8>) -> Result<Self, SymbolError> {
        let bytes: Arc<[u8]> = Arc::from(bytes);
        let file = object::File::parse(&*bytes).map_err(|e| not_elf(&path, e))?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(not_elf(&path, "not ELF"));
        }
        let is_pie = file.kind() == object::ObjectKind::Dynamic;
        let entry = LinkAddr(file.entry());
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let usdt = crate::usdt_markers(&bytes).unwrap_or_default();

        let mut segments = Vec::new();
        for seg in file.segments() {
            let (offset, filesz) = seg.file_range();
            let flags = match seg.flags() {
                SegmentFlags::Elf { p_flags } => p_flags,
                _ => 0,
            };
            segments.push(Segment {
                vaddr: seg.address(),
                offset,
                filesz,
                memsz: seg.size(),
                flags,
            });
        }

        let mut plt = Vec::new();
        for name in [".plt", ".plt.sec", ".plt.got"] {
            if let Some(sec) = file.section_by_name(name) {
                let start = sec.address();
                if let Some(end) = start.checked_add(sec.size()) {
                    if end > start {
                        plt.push(LinkAddr(start)..LinkAddr(end));
                    }
                }
            }
        }
        plt.sort_by_key(|r| r.start);

        let mut raw_funcs = HashMap::new();
        collect_functions(&file, &mut raw_funcs);
        let fdes = eh_frame_of(&file);

        let own_symtab = has_symtab(&file);
        let own_dwarf = has_dwarf(&file);
        let mut debug_file = None;
        let mut dwarf_bytes = own_dwarf.then(|| (path.clone(), bytes.clone()));
        if !own_symtab || !own_dwarf {
            // Checked by `find_debug_file` to belong to this file (build
            // id or debuglink CRC).
            if let Some((dbg_path, _)) = crate::debuginfo::find_debug_file(&path, &bytes) {
                if let Ok(dbg_bytes) = std::fs::read(&dbg_path) {
                    let dbg_bytes: Arc<[u8]> = Arc::from(dbg_bytes);
                    if let Ok(dbg) = object::File::parse(&*dbg_bytes) {
                        if !own_symtab {
                            collect_functions(&dbg, &mut raw_funcs);
                        }
                        if !own_dwarf && has_dwarf(&dbg) {
                            dwarf_bytes = Some((dbg_path.clone(), dbg_bytes.clone()));
                        }
                        debug_file = Some(dbg_path);
                    }
                }
            }
        }
        drop(file);

        let mut funcs: Vec<RawFunc> = raw_funcs.into_values().collect();
        funcs.sort_by(|a, b| {
            let under = |s: &str| s.bytes().take_while(|&c| c == b'_').count();
            (a.addr, a.rank, under(&a.raw), a.raw.len(), &a.raw).cmp(&(
                b.addr,
                b.rank,
                under(&b.raw),
                b.raw.len(),
                &b.raw,
            ))
        });

        let mut functions = Vec::with_capacity(funcs.len());
        let mut ranks = Vec::with_capacity(funcs.len());
        let mut raw_index: HashMap<String, Vec<u32>> = HashMap::new();
        let mut alias_index: HashMap<String, Vec<u32>> = HashMap::new();
        for (i, f) in funcs.into_iter().enumerate() {
            let Ok(i) = u32::try_from(i) else { break };
            let name = demangle(&f.raw);
            raw_index.entry(f.raw.clone()).or_default().push(i);
            for key in lookup_keys(&f.raw, &name) {
                if key != f.raw {
                    alias_index.entry(key).or_default().push(i);
                }
            }
            ranks.push(f.rank);
            let kind = if f.label {
                FunctionKind::Label
            } else {
                match cold_parent(strip_version(&f.raw)) {
                    Some(parent) => FunctionKind::ColdPart {
                        parent: demangle(parent),
                    },
                    None => FunctionKind::Entry,
                }
            };
            functions.push(Symbol {
                name,
                raw_name: f.raw,
                addr: LinkAddr(f.addr),
                size: f.size,
                kind,
            });
        }

        Ok(ElfModule {
            path,
            dwarf_bytes,
            usdt,
            is_pie,
            entry,
            functions,
            ranks,
            raw_index,
            alias_index,
            plt,
            segments,
            build_id,
            debug_file,
            fdes,
            dwarf: OnceLock::new(),
            dwarf_roles: OnceLock::new(),
            a2l: Mutex::new(None),
        })
    }

    /// The kind of `sym` (one of this module's functions): its
    /// [`Symbol::kind`] from the symbol table, and where DWARF is present
    /// (read on first use), a function symbol not named as a cold part
    /// that starts a `DW_AT_ranges` piece of a subprogram entered
    /// elsewhere is a [`FunctionKind::ColdPart`] of the function there.
    pub fn function_kind(&self, sym: &Symbol) -> FunctionKind {
        if sym.kind != FunctionKind::Entry {
            return sym.kind.clone();
        }
        match self.dwarf_piece_of(sym.addr) {
            Some(parent) => FunctionKind::ColdPart { parent },
            None => FunctionKind::Entry,
        }
    }

    /// The function (its name, else its address) whose code DWARF splits
    /// into pieces (`DW_AT_ranges`) when `addr` starts a piece other than
    /// the one holding its entry: a cold partition. DWARF is read on first
    /// use; `None` without DWARF.
    pub fn dwarf_piece_of(&self, addr: LinkAddr) -> Option<String> {
        let roles = self
            .dwarf_roles
            .get_or_init(|| self.dwarf().map(|d| dwarf_roles(d)).unwrap_or_default());
        let &DwarfRole::Piece(entry) = roles.get(&addr.0)? else {
            return None;
        };
        Some(
            self.functions
                .iter()
                .find(|p| p.addr.0 == entry && p.kind == FunctionKind::Entry)
                .map_or_else(|| format!("the function at {entry:#x}"), |p| p.name.clone()),
        )
    }

    /// Whether DWARF marks the function entered at `addr` as one that
    /// never returns (`DW_AT_noreturn`). DWARF is read on first use;
    /// `false` without DWARF.
    pub fn dwarf_no_return(&self, addr: LinkAddr) -> bool {
        let roles = self
            .dwarf_roles
            .get_or_init(|| self.dwarf().map(|d| dwarf_roles(d)).unwrap_or_default());
        matches!(
            roles.get(&addr.0),
            Some(DwarfRole::Entry { no_return: true })
        )
    }

    /// The file's USDT markers (`.note.stapsdt`), in note order.
    pub fn usdt_markers(&self) -> &[crate::UsdtMarker] {
        &self.usdt
    }

    /// The file's path (as given to [`ElfModule::open`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name (last path component), for messages and module names.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// Whether the file is position independent (`ET_DYN`: PIE or shared
    /// library), i.e. loaded at a non-zero bias.
    pub fn is_pie(&self) -> bool {
        self.is_pie
    }

    /// The entry point (`e_entry`).
    pub fn entry(&self) -> LinkAddr {
        self.entry
    }

    /// The separate debug file whose symbols or DWARF were merged in, if any.
    pub fn debug_file(&self) -> Option<&Path> {
        self.debug_file.as_deref()
    }

    /// Function symbols (`STT_FUNC`, `STT_GNU_IFUNC`) from `.symtab` and
    /// `.dynsym`, deduplicated and sorted by address; among aliases at one
    /// address the preferred one (global, fewer leading underscores) comes
    /// first.
    pub fn functions(&self) -> &[Symbol] {
        &self.functions
    }

    fn best_of(&self, idxs: &[u32]) -> Option<&Symbol> {
        let best = idxs
            .iter()
            .filter_map(|&i| usize::try_from(i).ok())
            .min_by_key(|&i| (self.ranks.get(i).copied().unwrap_or(u8::MAX), i))?;
        self.functions.get(best)
    }

    /// Find a function by raw (mangled) name, demangled name, Rust name
    /// without hash, C++ name without parameter list, or unversioned name.
    /// Among several matches the global one at the lowest address wins.
    pub fn lookup(&self, name: &str) -> Result<&Symbol, SymbolError> {
        self.find(name).ok_or_else(|| SymbolError::SymbolNotFound {
            symbol: name.to_string(),
            module: self.path.display().to_string(),
            similar: self.similar(name),
        })
    }

    /// [`ElfModule::lookup`] without building an error (cheap when absent).
    pub fn find(&self, name: &str) -> Option<&Symbol> {
        self.raw_index
            .get(name)
            .and_then(|v| self.best_of(v))
            .or_else(|| self.alias_index.get(name).and_then(|v| self.best_of(v)))
    }

    /// The C++ overloads `name` stands for when it is a function's name
    /// without its parameter list (`ns::f` for `ns::f(int)` and
    /// `ns::f(double)`), one per address, lowest first: as `gdb`'s
    /// `break ns::f` takes them all. Empty when `name` is a symbol's own
    /// name or names one function only (then [`ElfModule::find`] has it).
    pub fn overloads(&self, name: &str) -> Vec<&Symbol> {
        if self.raw_index.contains_key(name) {
            return Vec::new();
        }
        let Some(idxs) = self.alias_index.get(name) else {
            return Vec::new();
        };
        let mut found: Vec<(LinkAddr, u8, &Symbol)> = idxs
            .iter()
            .filter_map(|&i| usize::try_from(i).ok())
            .filter_map(|i| Some((self.functions.get(i)?, self.ranks.get(i).copied()?)))
            .filter(|(s, _)| s.kind == FunctionKind::Entry)
            .filter(|(s, _)| strip_version(&s.raw_name).starts_with("_Z"))
            .filter(|(s, _)| short_name(&s.raw_name) == name)
            .map(|(s, rank)| (s.addr, rank, s))
            .collect();
        // The preferred alias of each address (the best rank).
        found.sort_by_key(|&(addr, rank, _)| (addr, rank));
        found.dedup_by_key(|&mut (addr, _, _)| addr);
        if found.len() < 2 {
            return Vec::new();
        }
        found.into_iter().map(|(_, _, s)| s).collect()
    }

    /// Up to five function names that look like `name`.
    pub fn similar(&self, name: &str) -> Vec<String> {
        let shorts: BTreeSet<String> = self
            .functions
            .iter()
            .map(|s| short_name(&s.raw_name))
            .collect();
        similar_names(name, shorts.iter().map(String::as_str), 5)
    }

    /// The function containing `addr` and the offset into it. Functions of
    /// size 0 only match their exact start.
    pub fn symbolize(&self, addr: LinkAddr) -> Option<(&Symbol, u64)> {
        let end = self.functions.partition_point(|s| s.addr <= addr);
        let mut i = end;
        let mut found: Option<usize> = None;
        let mut scanned = 0;
        while i > 0 && scanned < 4096 {
            i -= 1;
            scanned += 1;
            let s = self.functions.get(i)?;
            if s.kind == FunctionKind::Label {
                // A place inside a function, not one of its own.
                continue;
            }
            if let Some(f) = found {
                // Keep walking back over aliases at the same address.
                if self.functions.get(f).map(|x| x.addr) != Some(s.addr) {
                    break;
                }
            }
            if s.contains(addr) {
                found = Some(i);
            }
        }
        let s = self.functions.get(found?)?;
        Some((s, addr.0 - s.addr.0))
    }

    /// The frame description entries of its `.eh_frame` (sorted by start):
    /// instruction boundaries where no symbol is known.
    pub fn fdes(&self) -> &[Fde] {
        &self.fdes
    }

    /// The `.eh_frame` FDE containing `addr` (the innermost, should some
    /// overlap).
    pub fn fde_containing(&self, addr: LinkAddr) -> Option<Fde> {
        fde_containing(&self.fdes, addr)
    }

    /// Whether this module (or its debug file) has DWARF information.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf().is_some()
    }

    /// The PLT sections (`.plt`, `.plt.sec`, `.plt.got`).
    pub fn plt_ranges(&self) -> Vec<Range<LinkAddr>> {
        self.plt.clone()
    }

    /// Whether `addr` lies in a PLT section.
    pub fn in_plt(&self, addr: LinkAddr) -> bool {
        self.plt.iter().any(|r| r.contains(&addr))
    }

    /// Executable PT_LOAD segments (`p_vaddr..p_vaddr + p_memsz`).
    pub fn exec_ranges(&self) -> Vec<Range<LinkAddr>> {
        self.segments
            .iter()
            .filter(|s| s.flags & PF_X != 0 && s.memsz > 0)
            .map(|s| LinkAddr(s.vaddr)..LinkAddr(s.vaddr.saturating_add(s.memsz)))
            .collect()
    }

    /// Whether `addr` lies in an executable segment.
    pub fn is_executable(&self, addr: LinkAddr) -> bool {
        self.exec_ranges().iter().any(|r| r.contains(&addr))
    }

    /// The biases one mapping could imply, one per PT_LOAD segment whose
    /// page-aligned file range holds `m.offset`, with how well the
    /// segment's permissions match the mapping's (higher is better).
    fn bias_candidates(&self, m: &Mapping) -> Vec<(u32, LoadBias)> {
        let mut out = Vec::new();
        for seg in &self.segments {
            if seg.filesz == 0 {
                continue;
            }
            let first_page = seg.offset & !(PAGE - 1);
            let Some(end) = seg.offset.checked_add(seg.filesz) else {
                continue;
            };
            if m.offset < first_page || m.offset >= end {
                continue;
            }
            // File offset m.offset sits at link address vaddr + (m.offset - offset).
            let link = seg.vaddr.wrapping_sub(seg.offset).wrapping_add(m.offset);
            let bias = LoadBias(m.start.0.wrapping_sub(link));
            let score = u32::from((seg.flags & PF_X != 0) == m.perms.exec)
                + u32::from((seg.flags & PF_W != 0) == m.perms.write);
            out.push((score, bias));
        }
        out
    }

    /// The load bias implied by one mapping of this file: the PT_LOAD
    /// segment whose (page-aligned) file range holds `m.offset` tells which
    /// link address `m.start` corresponds to. `None` if no segment covers
    /// the mapping's offset (e.g. a data mapping of the file made by mmap).
    ///
    /// Exact for executable mappings. When two segments share a file page
    /// (e.g. the read-only segment and the RELRO part of the data segment
    /// after `mprotect`), a single mapping is ambiguous: the segment whose
    /// permissions match best wins. Prefer [`ElfModule::load_bias_for`]
    /// with all of the file's mappings.
    pub fn load_bias(&self, m: &Mapping) -> Option<LoadBias> {
        let mut best: Option<(u32, LoadBias)> = None;
        for (score, bias) in self.bias_candidates(m) {
            let better = match best {
                None => true,
                Some((s, _)) => score > s,
            };
            if better {
                best = Some((score, bias));
            }
        }
        best.map(|(_, b)| b)
    }

    /// The load bias that explains the most of this file's mappings (all
    /// the mappings of one loaded instance of the file); ties go to a bias
    /// implied by an executable mapping. `None` if no mapping is covered by
    /// a segment.
    pub fn load_bias_for<'m>(
        &self,
        maps: impl IntoIterator<Item = &'m Mapping>,
    ) -> Option<LoadBias> {
        let per_map: Vec<(bool, Vec<LoadBias>)> = maps
            .into_iter()
            .map(|m| {
                let c = self
                    .bias_candidates(m)
                    .into_iter()
                    .map(|(_, b)| b)
                    .collect();
                (m.perms.exec, c)
            })
            .collect();
        let mut best: Option<((usize, bool), LoadBias)> = None;
        for (_, cands) in &per_map {
            for &b in cands {
                let explained = per_map.iter().filter(|(_, c)| c.contains(&b)).count();
                let from_exec = per_map.iter().any(|(x, c)| *x && c.contains(&b));
                let key = (explained, from_exec);
                let better = match best {
                    None => true,
                    Some((k, _)) => key > k,
                };
                if better {
                    best = Some((key, b));
                }
            }
        }
        best.map(|(_, b)| b)
    }

    /// The GNU build id (`NT_GNU_BUILD_ID` note), if present.
    pub fn build_id(&self) -> Option<Vec<u8>> {
        self.build_id.clone()
    }
}

/// A data symbol (`STT_OBJECT`) of the ELF file at `path`, by its name as
/// stored (a `@VERSION` suffix is ignored), from `.symtab` or `.dynsym`:
/// [`ElfModule`] keeps functions only. Parses the file on each call (for
/// the odd variable a tracer needs, such as the loader's `_r_debug`).
pub fn data_symbol(path: &Path, name: &str) -> Result<Option<Symbol>, SymbolError> {
    let bytes = std::fs::read(path).map_err(|source| SymbolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = object::File::parse(&*bytes).map_err(|e| not_elf(path, e))?;
    let found = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Data && !s.is_undefined())
        .find(|s| s.name().is_ok_and(|n| strip_version(n) == name));
    Ok(found.map(|s| {
        let raw = s.name().unwrap_or(name).to_string();
        Symbol {
            name: name.to_string(),
            raw_name: raw,
            addr: LinkAddr(s.address()),
            size: s.size(),
            // Data: not a place code is called.
            kind: FunctionKind::Label,
        }
    }))
}

/// The FDEs of the file's `.eh_frame` (none without one).
fn eh_frame_of(file: &object::File<'_>) -> Vec<Fde> {
    let Some(sec) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    if sec.kind() == object::SectionKind::UninitializedData {
        return Vec::new();
    }
    let Ok(data) = sec.data() else {
        return Vec::new();
    };
    let text = file.section_by_name(".text").map_or(0, |t| t.address());
    parse_eh_frame(data, sec.address(), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix() {
        assert!(path_suffix_matches("/tmp/x/prog.c", "prog.c"));
        assert!(path_suffix_matches("/tmp/x/prog.c", "x/prog.c"));
        assert!(path_suffix_matches("/tmp/x/./prog.c", "/tmp/x/prog.c"));
        assert!(!path_suffix_matches("/tmp/x/prog.c", "rog.c"));
        assert!(!path_suffix_matches("/tmp/x/prog.c", "/x/prog.c"));
        assert!(!path_suffix_matches("/tmp/x/prog.c", ""));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(ElfModule::from_bytes("x".into(), vec![]).is_err());
        assert!(ElfModule::from_bytes("x".into(), b"\x7fELF\x02\x01\x01".to_vec()).is_err());
    }

    #[test]
    fn module_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ElfModule>();
    }
}
