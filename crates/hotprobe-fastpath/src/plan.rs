//! Choosing a mechanism per site, from the ELF file alone (no process):
//! placeholders listed by the compiler (`__patchable_function_entries`,
//! `__mcount_loc`), a ColdPatch probe list beside the binary (`BIN.probes`),
//! a 5-byte NOP at a function's entry, then a jump plan, else trap.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hotprobe_coldpatch::{ProbeList, SiteKind};
use hotprobe_x86::{plan_jump_padded, PunPlan, JMP_REL32_LEN};
use object::{Object, ObjectSection, ObjectSegment};

use crate::FastPathError;

/// The mechanism a site gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// NOP placeholder rewritten into a `call` (iProbe HotPatch).
    Patch(PatchKind),
    /// Displaced instructions, `jmp rel32` to a per-site trampoline.
    Jump,
    /// The engine's trap mechanism must handle the site.
    Trap,
}

/// Which placeholder a patch site uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PatchKind {
    /// `-fpatchable-function-entry=N` NOPs.
    PatchableEntry,
    /// `-pg -mfentry -mnop-mcount` 5-byte NOP (listed in `__mcount_loc` or
    /// recognised at the function's entry).
    Mcount,
    /// A `-finstrument-functions` call that ColdPatch turned into a NOP.
    Coldpatch,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mechanism::Patch(PatchKind::PatchableEntry) => "patch (patchable entry)",
            Mechanism::Patch(PatchKind::Mcount) => "patch (mcount NOP)",
            Mechanism::Patch(PatchKind::Coldpatch) => "patch (coldpatch)",
            Mechanism::Jump => "jump",
            Mechanism::Trap => "trap",
        })
    }
}

/// What the user asked for (`--mechanism`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MechanismChoice {
    /// Patch, then jump, then trap.
    #[default]
    Auto,
    /// Patch only (an error if the function has no placeholder).
    Patch,
    /// Jump only (an error if the entry cannot take a jump).
    Jump,
    /// Trap (always possible from the fast path's point of view).
    Trap,
}

/// Where the exit of a function is observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitSite {
    /// A ColdPatched `__cyg_profile_func_exit` NOP (call site) at this link address.
    Call(u64),
    /// A ColdPatched tail exit (`ret` + NOP) at this link address.
    Tail(u64),
}

/// The mechanism chosen for a function's entry, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SitePlan {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Why (for `hotprobe list` and error messages).
    pub reason: String,
    /// Link address of the instruction rewritten (the placeholder, or the
    /// function's entry for jump and trap).
    pub site: u64,
    /// Bytes rewritten at `site`.
    pub len: usize,
    /// ColdPatch exit placeholders of the function (empty otherwise: exits
    /// then come from the agent's return hook).
    pub exits: Vec<ExitSite>,
    /// A [`Mechanism::Jump`] over a function shorter than a jump, punned
    /// (E9Patch-style: the displacement's high bytes are the next
    /// function's, the trampoline goes where they let it; see
    /// [`hotprobe_x86::PunPlan`]). `len` is then the bytes it owns (4):
    /// the next function's byte it keeps is never written.
    pub punned: bool,
}

impl SitePlan {
    /// The mechanism as `hotprobe list` shows it: `jump (punned)` for a
    /// punned jump, else the mechanism's name.
    pub fn label(&self) -> String {
        match (self.mechanism, self.punned) {
            (Mechanism::Jump, true) => "jump (punned)".into(),
            (m, _) => m.to_string(),
        }
    }
}

/// A function of a module, as far as the fast path cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionInfo {
    /// Name (demangled when it comes from the symbol table).
    pub name: String,
    /// Link address of its first byte.
    pub addr: u64,
    /// Size in bytes (0 if unknown: only a probe list named it).
    pub size: u64,
    /// For a function shorter than a jump: bytes of padding after it (`nop`
    /// forms, `int3`) before the next function, which a jump may overwrite
    /// (see [`hotprobe_x86::plan_jump_padded`]); 0 otherwise.
    pub padding: u64,
}

/// One ELF module's placeholders and functions.
#[derive(Debug)]
pub struct ModuleInfo {
    path: PathBuf,
    bytes: Vec<u8>,
    /// (vaddr, file offset, size) of each PT_LOAD segment.
    segments: Vec<(u64, u64, u64)>,
    pfe: BTreeSet<u64>,
    mcount: BTreeSet<u64>,
    probes: Option<ProbeList>,
    /// Sorted by address.
    functions: Vec<FunctionInfo>,
    /// Targets of the direct branches of every function, sorted (computed
    /// on the first jump plan: see [`ModuleInfo::branch_into`]).
    branch_targets: std::sync::OnceLock<Vec<(u64, u64)>>,
    /// Name → index of the first function of that name in `functions`.
    by_name: std::collections::HashMap<String, usize>,
    /// Loaded at its link addresses (ET_EXEC, no load bias).
    fixed_address: bool,
}

fn read_addr_section(file: &object::File<'_>, name: &str) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let Some(sec) = file.section_by_name(name) else {
        return out;
    };
    let Ok(data) = sec.data() else { return out };
    let base = sec.address();
    // PIE: the words may be 0 in the file and filled by R_X86_64_RELATIVE.
    let mut relative = std::collections::HashMap::new();
    if let Some(relocs) = file.dynamic_relocations() {
        for (off, r) in relocs {
            if let object::RelocationFlags::Elf { r_type } = r.flags() {
                if r_type == object::elf::R_X86_64_RELATIVE {
                    relative.insert(off, r.addend() as u64);
                }
            }
        }
    }
    for (i, w) in data.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        let v = if v == 0 {
            (8 * i as u64)
                .checked_add(base)
                .and_then(|a| relative.get(&a))
                .copied()
                .unwrap_or(0)
        } else {
            v
        };
        if v != 0 {
            out.insert(v);
        }
    }
    out
}

/// Where a binary's probe list lives: `BIN.probes`.
pub fn probe_list_path(binary: &Path) -> PathBuf {
    let mut s = binary.as_os_str().to_owned();
    s.push(".probes");
    PathBuf::from(s)
}

const NOP5: [u8; 5] = hotprobe_abi::patch::NOP5;
const NOP1X5: [u8; 5] = [0x90; 5];
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

impl ModuleInfo {
    /// Reads `path`, its placeholder sections, its functions (symbol table,
    /// and the probe list's function names for stripped binaries) and its
    /// probe list `path.probes` if there is one.
    pub fn open(path: &Path) -> Result<ModuleInfo, FastPathError> {
        let bytes = std::fs::read(path).map_err(|source| FastPathError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let probe_list = std::fs::read_to_string(probe_list_path(path)).ok();
        // The symbol table as `ProcessSymbols` already parsed it (one parse
        // per file per tracer: at 100,000 functions a parse is ~0.2 s).
        let elf = hotprobe_symbols::ModuleCache::global()
            .get(path)
            .ok()
            .flatten();
        Self::from_parts(path, bytes, probe_list.as_deref(), elf.as_deref())
    }

    /// [`ModuleInfo::open`] on bytes already read: the ELF file `bytes`
    /// and the text of its probe list, if it has one. `path` names the
    /// module (and, with `.probes`, the list) in messages. For tests and
    /// fuzzing: nothing is read from the file system but the separate
    /// debug file [`hotprobe_symbols::ElfModule::from_bytes`] may look for.
    pub fn from_bytes(
        path: &Path,
        bytes: Vec<u8>,
        probe_list: Option<&str>,
    ) -> Result<ModuleInfo, FastPathError> {
        Self::from_parts(path, bytes, probe_list, None)
    }

    /// [`ModuleInfo::from_bytes`] with the module's symbols already parsed
    /// (`elf`, from the same bytes), or parsed here when `None`.
    fn from_parts(
        path: &Path,
        bytes: Vec<u8>,
        probe_list: Option<&str>,
        elf: Option<&hotprobe_symbols::ElfModule>,
    ) -> Result<ModuleInfo, FastPathError> {
        let file = object::File::parse(&*bytes).map_err(|e| FastPathError::Elf {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        let segments = file
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (s.address(), off, size)
            })
            .collect();
        let fixed_address = file.kind() == object::ObjectKind::Executable;
        let pfe = read_addr_section(&file, "__patchable_function_entries");
        let mcount = read_addr_section(&file, "__mcount_loc");
        let probes = match probe_list {
            Some(text) => Some(
                ProbeList::parse(text).map_err(|e| FastPathError::ProbeList {
                    path: probe_list_path(path),
                    why: e.to_string(),
                })?,
            ),
            None => None,
        };
        let mut functions: Vec<FunctionInfo> = Vec::new();
        let parsed;
        let m = match elf {
            Some(m) => Some(m),
            None => {
                parsed =
                    hotprobe_symbols::ElfModule::from_bytes(path.to_path_buf(), bytes.clone()).ok();
                parsed.as_ref()
            }
        };
        if let Some(m) = m {
            for f in m.functions() {
                functions.push(FunctionInfo {
                    name: f.name.clone(),
                    addr: f.addr.0,
                    size: f.size,
                    padding: 0,
                });
            }
        }
        if let Some(p) = &probes {
            let mut known: std::collections::HashSet<String> =
                functions.iter().map(|f| f.name.clone()).collect();
            for s in &p.sites {
                let Some(name) = &s.function else { continue };
                if !known.insert(name.clone()) {
                    continue;
                }
                // A stripped binary: the function starts at or before its
                // first site; its extent is unknown.
                functions.push(FunctionInfo {
                    name: name.clone(),
                    addr: s.vaddr,
                    size: 0,
                    padding: 0,
                });
            }
        }
        functions.sort_by_key(|f| f.addr);
        let mut m = ModuleInfo {
            path: path.to_path_buf(),
            bytes,
            segments,
            pfe,
            mcount,
            probes,
            functions,
            branch_targets: std::sync::OnceLock::new(),
            by_name: std::collections::HashMap::new(),
            fixed_address,
        };
        m.find_padding();
        let functions = std::mem::take(&mut m.functions);
        let mut by_name = std::collections::HashMap::with_capacity(functions.len());
        for (i, f) in functions.iter().enumerate() {
            by_name.entry(f.name.clone()).or_insert(i);
        }
        m.functions = functions;
        m.by_name = by_name;
        Ok(m)
    }

    /// A direct branch (`jmp`, `jcc`, `call`, `loop`…) of any function of
    /// the module whose target is strictly inside `(addr, addr + len)`, as
    /// (target, branch address): a jump written over those bytes would
    /// send it into the middle of the `jmp rel32`. [`plan_jump`] sees the
    /// branches of the function itself only; hand-written assembly jumps
    /// into its neighbours (glibc's `__mempcpy_avx512_unaligned_erms`
    /// ends with `jmp` to `__memcpy_avx512_unaligned_erms+3`), and so do
    /// a function's `.cold` partitions. Found by a linear sweep of every
    /// function's bytes once per module (decoding data as code can only add
    /// targets: refuse more, never less). Indirect branches (jump tables)
    /// are not seen.
    pub fn branch_into(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let targets = self
            .branch_targets
            .get_or_init(|| self.sweep_branch_targets());
        let i = targets.partition_point(|&(t, _)| t <= addr);
        targets
            .get(i)
            .copied()
            .filter(|&(t, _)| t < addr.saturating_add(len))
    }

    fn sweep_branch_targets(&self) -> Vec<(u64, u64)> {
        use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};
        let mut out = Vec::new();
        for f in &self.functions {
            let Some(code) = self.code(f.addr, f.size) else {
                continue;
            };
            let mut dec = Decoder::with_ip(64, code, f.addr, DecoderOptions::NONE);
            let mut instr = iced_x86::Instruction::default();
            while dec.can_decode() {
                dec.decode_out(&mut instr);
                if !matches!(
                    instr.flow_control(),
                    FlowControl::UnconditionalBranch
                        | FlowControl::ConditionalBranch
                        | FlowControl::Call
                ) {
                    continue;
                }
                if matches!(
                    instr.op0_kind(),
                    OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
                ) {
                    out.push((instr.near_branch_target(), instr.ip()));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every function known (symbol table and probe list).
    pub fn functions(&self) -> &[FunctionInfo] {
        &self.functions
    }

    /// The function named `name` (symbol or probe-list name).
    pub fn function(&self, name: &str) -> Option<&FunctionInfo> {
        self.by_name.get(name).and_then(|&i| self.functions.get(i))
    }

    /// The first function whose entry is at link address `addr` (binary
    /// search: O(log n), so that planning every function of a module is
    /// not quadratic).
    pub fn function_at(&self, addr: u64) -> Option<&FunctionInfo> {
        let i = self.functions.partition_point(|f| f.addr < addr);
        self.functions.get(i).filter(|f| f.addr == addr)
    }

    /// Sets [`FunctionInfo::padding`] of each function shorter than a jump:
    /// the `nop`/`int3` bytes between its end and the next function's start
    /// (at most 16 looked at: a jump needs 4 at the most).
    fn find_padding(&mut self) {
        for i in 0..self.functions.len() {
            let f = &self.functions[i];
            if f.size == 0 || f.size >= 5 {
                continue;
            }
            let end = f.addr + f.size;
            let next = self.functions[i + 1..]
                .iter()
                .map(|g| g.addr)
                .find(|&a| a > f.addr);
            let gap = match next {
                Some(n) if n >= end => n - end,
                Some(_) => continue, // overlapping symbols: leave it
                None => 16,
            };
            let Some(bytes) = self.code(end, gap.min(16)) else {
                continue;
            };
            let padding = nop_prefix(bytes, end);
            self.functions[i].padding = padding;
        }
    }

    /// A function's bytes and the padding after it (see
    /// [`FunctionInfo::padding`]).
    pub fn code_with_padding(&self, f: &FunctionInfo) -> Option<&[u8]> {
        self.code(f.addr, f.size + f.padding)
    }

    /// The file bytes at link address `addr`, `len` long, if mapped from the file.
    pub fn code(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let end = addr.checked_add(len)?;
        for &(va, off, size) in &self.segments {
            // Segments come from the file's program headers: any values.
            let Some(seg_end) = va.checked_add(size) else {
                continue;
            };
            if addr >= va && end <= seg_end {
                let start = usize::try_from(off.checked_add(addr - va)?).ok()?;
                let len = usize::try_from(len).ok()?;
                return self.bytes.get(start..start.checked_add(len)?);
            }
        }
        None
    }

    /// The link address of the segment mapped from the file's first byte
    /// (a mapping of the file at offset 0 starts at it plus the load bias).
    pub(crate) fn first_segment_vaddr(&self) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(_, off, _)| off == 0)
            .map(|&(va, _, _)| va & !0xfff)
    }

    /// Whether the module has a ColdPatch probe list.
    pub fn has_probe_list(&self) -> bool {
        self.probes.is_some()
    }

    fn coldpatch_sites(&self, f: &FunctionInfo) -> Option<(u64, usize, Vec<ExitSite>)> {
        let p = self.probes.as_ref()?;
        let in_f = |s: &&hotprobe_coldpatch::ProbeSite| match &s.function {
            Some(n) => *n == f.name,
            None => s.vaddr.checked_sub(f.addr).is_some_and(|off| off < f.size),
        };
        let sites: Vec<_> = p.sites.iter().filter(in_f).collect();
        let entry = sites
            .iter()
            .find(|s| matches!(s.kind, SiteKind::Entry | SiteKind::Mcount))?;
        let exits = sites
            .iter()
            .filter_map(|s| match s.kind {
                SiteKind::Exit => Some(ExitSite::Call(s.vaddr)),
                SiteKind::ExitTail => Some(ExitSite::Tail(s.vaddr)),
                _ => None,
            })
            .collect();
        Some((entry.vaddr, entry.len as usize, exits))
    }

    /// The entry placeholder of `f` and its kind, if it has one.
    fn placeholder(&self, f: &FunctionInfo) -> Option<(PatchKind, u64, usize, Vec<ExitSite>)> {
        if let Some((site, len, exits)) = self.coldpatch_sites(f) {
            return Some((PatchKind::Coldpatch, site, len, exits));
        }
        // After an optional endbr64.
        let mut site = f.addr;
        if self.code(site, 4) == Some(&ENDBR64[..]) {
            site += 4;
        }
        let bytes = self.code(site, 5)?;
        let nops = bytes == NOP1X5 || bytes == NOP5;
        if !nops {
            return None;
        }
        if self.pfe.contains(&f.addr) || self.pfe.contains(&site) {
            return Some((PatchKind::PatchableEntry, site, 5, vec![]));
        }
        if self.mcount.contains(&site) || bytes == NOP5 {
            return Some((PatchKind::Mcount, site, 5, vec![]));
        }
        None
    }

    /// Where a jump goes in `f` and how many bytes it displaces there, or
    /// why it cannot. After an `endbr64` at the entry (`-fcf-protection`),
    /// at entry + 4: the `endbr64` stays the first instruction, so indirect
    /// calls through the function's address stay valid under CET's
    /// indirect-branch tracking, and the state there is the entry's
    /// (`endbr64` changes no register or flag). Only where no jump fits
    /// there (a function of less than 9 bytes) is the `endbr64` displaced
    /// with the rest, and the reason says so.
    fn plan_jump_site(&self, f: &FunctionInfo) -> (u64, Result<usize, String>) {
        let Some(code) = self.code_with_padding(f).filter(|_| f.size > 0) else {
            let why = match f.size {
                0 => "function size unknown (stripped binary)",
                _ => "function bytes not in the file",
            };
            return (f.addr, Err(why.to_string()));
        };
        let at = |site: u64| {
            let covered = plan_jump_padded(code, f.size as usize, f.addr, site)
                .map(|p| p.covered)
                .map_err(|e| e.to_string())?;
            match self.branch_into(site, covered as u64) {
                Some((target, from)) => Err(format!(
                    "a branch at {from:#x} elsewhere in the module lands at +{:#x}, \
                     inside the first {covered} bytes",
                    target - f.addr
                )),
                None => Ok(covered),
            }
        };
        if !code.starts_with(&ENDBR64) {
            return (f.addr, at(f.addr));
        }
        match at(f.addr + 4) {
            Ok(covered) => (f.addr + 4, Ok(covered)),
            Err(after) => match at(f.addr) {
                Ok(covered) => (f.addr, Ok(covered)),
                Err(_) => (f.addr + 4, Err(format!("after the endbr64: {after}"))),
            },
        }
    }

    /// The mechanism `f`'s entry gets under `choice`, and why; an error if
    /// a forced mechanism is impossible.
    pub fn plan(
        &self,
        f: &FunctionInfo,
        choice: MechanismChoice,
    ) -> Result<SitePlan, FastPathError> {
        let placeholder = self.placeholder(f);
        if matches!(choice, MechanismChoice::Auto | MechanismChoice::Patch) {
            if let Some((kind, site, len, exits)) = placeholder {
                let why = match kind {
                    PatchKind::PatchableEntry => {
                        "-fpatchable-function-entry NOPs (__patchable_function_entries)".to_string()
                    }
                    PatchKind::Mcount if self.mcount.contains(&site) => {
                        "-mnop-mcount 5-byte NOP (__mcount_loc)".to_string()
                    }
                    PatchKind::Mcount => {
                        "5-byte NOP at the function's entry (-mfentry -mnop-mcount)".to_string()
                    }
                    // A list may name a site before its function's symbol.
                    PatchKind::Coldpatch => match site.checked_sub(f.addr) {
                        Some(off) => format!(
                            "coldpatched -finstrument-functions placeholder at +{off:#x} (probe list)"
                        ),
                        None => format!(
                            "coldpatched -finstrument-functions placeholder at {site:#x} (probe list)"
                        ),
                    },
                };
                return Ok(SitePlan {
                    mechanism: Mechanism::Patch(kind),
                    reason: why,
                    site,
                    len,
                    exits,
                    punned: false,
                });
            }
            if choice == MechanismChoice::Patch {
                return Err(FastPathError::Impossible {
                    function: f.name.clone(),
                    mechanism: "patch",
                    why: "no placeholder: build with -fpatchable-function-entry=5, \
                          -pg -mfentry -mnop-mcount, or coldpatch a -finstrument-functions build"
                        .into(),
                });
            }
        }
        if choice == MechanismChoice::Trap {
            return Ok(SitePlan {
                mechanism: Mechanism::Trap,
                reason: "forced".into(),
                site: f.addr,
                len: 1,
                exits: vec![],
                punned: false,
            });
        }
        let (site, jump) = self.plan_jump_site(f);
        match jump {
            Ok(covered) => Ok(SitePlan {
                mechanism: Mechanism::Jump,
                reason: match site - f.addr {
                    0 if self.code(f.addr, 4) == Some(&ENDBR64[..]) => format!(
                        "{covered} bytes of relocatable instructions at the entry, the endbr64 \
                         among them (no jump fits after it; under enforced indirect-branch \
                         tracking an indirect call would fault)"
                    ),
                    0 if f.size < 5 => format!(
                        "the whole {}-byte function and {} bytes of the padding after it \
                         (never executed), relocated",
                        f.size,
                        covered as u64 - f.size
                    ),
                    0 => format!(
                        "{covered} bytes of relocatable instructions at the entry, no branch into them"
                    ),
                    _ => format!(
                        "{covered} bytes of relocatable instructions after the entry's endbr64, \
                         no branch into them"
                    ),
                },
                site,
                len: covered,
                exits: vec![],
                punned: false,
            }),
            Err(why) if site == f.addr && (1..5).contains(&f.size) => {
                let why = match self.plan_pun(f) {
                    Ok(owned) => {
                        return Ok(SitePlan {
                            mechanism: Mechanism::Jump,
                            reason: format!(
                                "punned jump over the whole {}-byte function{} (no room for a \
                                 plain jump): its displacement's last byte is the next \
                                 function's, the trampoline goes in the 16 MiB that allows",
                                f.size,
                                match owned as u64 - f.size {
                                    0 => String::new(),
                                    p => format!(" and {p} bytes of padding"),
                                },
                            ),
                            site,
                            len: owned,
                            exits: vec![],
                            punned: true,
                        });
                    }
                    Err(pun) => format!("{why}; no punned jump: {pun}"),
                };
                self.jump_refused(f, choice, why)
            }
            Err(why) => self.jump_refused(f, choice, why),
        }
    }

    /// A punned jump over `f` (shorter than a jump), from the file: the
    /// bytes it owns, or why not. Where the trampoline goes is chosen at
    /// run time ([`crate::FastPath::plan`] checks that there is room).
    ///
    /// Only the encoding whose one fixed byte is the next function's first
    /// is used (4 bytes owned: a 4-byte function, or a shorter one and its
    /// padding): a probe on that function may later write an `int3`, a
    /// `jmp` or a `call` there, and the jump then lands at one of three
    /// other addresses known now, where a copy of the trampoline waits
    /// (see the `pun` module). With more fixed bytes a jump written on the
    /// next function would send this one anywhere.
    pub fn plan_pun(&self, f: &FunctionInfo) -> Result<usize, String> {
        let owned = (f.size + f.padding).min(JMP_REL32_LEN as u64 - 1) as usize;
        if owned < JMP_REL32_LEN - 1 {
            return Err(format!(
                "it would fix {} bytes of the next function, which a probe there would change \
                 (only a 4-byte function, one fixed byte, is punned)",
                JMP_REL32_LEN - owned
            ));
        }
        let code = self
            .code(f.addr, owned as u64 + JMP_REL32_LEN as u64 - 1)
            .ok_or("the bytes after the function are not in the file")?;
        let pun = PunPlan::new(code, f.size as usize, owned, f.addr).map_err(|e| e.to_string())?;
        if self.fixed_address && !crate::pun::pun_in_user_space(&pun) {
            return Err(
                "its trampoline and the copies where an int3, jmp or patch on the next function \
                 would send it cannot all be in user space (a non-PIE executable's low \
                 addresses: the copies would lie below 0)"
                    .into(),
            );
        }
        if let Some((target, from)) = self.branch_into(f.addr, owned as u64) {
            return Err(format!(
                "a branch at {from:#x} elsewhere in the module lands at +{:#x}, inside the \
                 {owned} bytes it overwrites",
                target - f.addr
            ));
        }
        Ok(owned)
    }

    fn jump_refused(
        &self,
        f: &FunctionInfo,
        choice: MechanismChoice,
        why: String,
    ) -> Result<SitePlan, FastPathError> {
        match why {
            why if choice == MechanismChoice::Jump => Err(FastPathError::Impossible {
                function: f.name.clone(),
                mechanism: "jump",
                why,
            }),
            why => Ok(SitePlan {
                mechanism: Mechanism::Trap,
                reason: why,
                site: f.addr,
                len: 1,
                exits: vec![],
                punned: false,
            }),
        }
    }
}

/// One line of `hotprobe list`: a function and the mechanism its entry
/// would get under automatic choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionPlan {
    /// The function.
    pub function: FunctionInfo,
    /// The plan.
    pub plan: SitePlan,
}

/// Which mechanism each function of the ELF file at `path` would get, and
/// why (no process needed).
pub fn explain(path: &Path) -> Result<Vec<FunctionPlan>, FastPathError> {
    let m = ModuleInfo::open(path)?;
    let mut out = Vec::new();
    for f in m.functions() {
        if let Ok(plan) = m.plan(f, MechanismChoice::Auto) {
            out.push(FunctionPlan {
                function: f.clone(),
                plan,
            });
        }
    }
    Ok(out)
}

/// How many bytes from the start of `bytes` (at `at`) decode as padding:
/// `nop` forms and `int3`, whole instructions only.
fn nop_prefix(bytes: &[u8], at: u64) -> u64 {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic};
    let mut d = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE);
    let mut n = 0;
    while d.can_decode() {
        let i = d.decode();
        if i.code() == Code::INVALID || !(i.mnemonic() == Mnemonic::Nop || i.code() == Code::Int3) {
            break;
        }
        n += i.len() as u64;
    }
    n
}
