//! The modules mapped in a process, and probe-spec resolution against them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use hotprobe_target::{LinkAddr, LoadBias, RuntimeAddr};

use crate::elf::{ElfModule, Symbol};
use crate::error::SymbolError;
use crate::kind::{Fde, FunctionKind};
use crate::maps::{read_maps, Mapping};
use crate::pattern::{is_pattern, NamePattern};
use crate::spec::ProbeSpec;

mod resolve;

/// Identifies one version of a file on disk, so a rebuilt file is re-read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileId {
    fn of(path: &Path) -> std::io::Result<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// Cached files: identity when parsed, and the module (`None`: not ELF).
type CacheMap = HashMap<PathBuf, (FileId, Option<Arc<ElfModule>>)>;

/// A cache of parsed ELF files by path, so that resolving symbols for many
/// processes (or many times) parses each library once. A file that changed
/// on disk (inode, size or mtime) is parsed again. Files that are not ELF
/// are remembered too.
#[derive(Debug, Default)]
pub struct ModuleCache {
    entries: Mutex<CacheMap>,
}

impl ModuleCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide cache used by [`ProcessSymbols::from_maps`] and
    /// [`ProcessSymbols::for_pid`].
    pub fn global() -> &'static ModuleCache {
        static GLOBAL: OnceLock<ModuleCache> = OnceLock::new();
        GLOBAL.get_or_init(ModuleCache::new)
    }

    /// The parsed module at `path`: `Ok(None)` if the file is not ELF.
    pub fn get(&self, path: &Path) -> Result<Option<Arc<ElfModule>>, SymbolError> {
        let io = |source| SymbolError::Io {
            path: path.to_path_buf(),
            source,
        };
        let id = FileId::of(path).map_err(io)?;
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((cached_id, m)) = entries.get(path) {
            if *cached_id == id {
                return Ok(m.clone());
            }
        }
        // The same file under another name (a deleted or memfd-backed file
        // reached through `/proc/PID/fd/N` or `/proc/PID/map_files/..`,
        // a new name per process): parsed once.
        if let Some(m) = entries
            .values()
            .find(|(other, _)| *other == id)
            .map(|(_, m)| m.clone())
        {
            entries.insert(path.to_path_buf(), (id, m.clone()));
            return Ok(m);
        }
        let module = if is_elf_file(path).map_err(io)? {
            Some(Arc::new(ElfModule::open(path)?))
        } else {
            None
        };
        entries.insert(path.to_path_buf(), (id, module.clone()));
        Ok(module)
    }

    /// How many files are cached.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every cached file.
    pub fn clear(&self) {
        if let Ok(mut e) = self.entries.lock() {
            e.clear();
        }
    }
}

/// Whether a file starts with the ELF magic (without reading all of it).
fn is_elf_file(path: &Path) -> std::io::Result<bool> {
    let mut f = std::fs::File::open(path)?;
    let mut magic = [0u8; 4];
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"\x7fELF"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// An ELF module mapped in a process, with its load bias.
#[derive(Clone, Debug)]
pub struct LoadedModule {
    /// The parsed file.
    pub module: Arc<ElfModule>,
    /// Run-time address minus link-time address.
    pub bias: LoadBias,
    /// File name (`libc.so.6`).
    pub name: String,
    /// Path as the maps file shows it.
    pub path: PathBuf,
    /// The address ranges of its mappings, in map order.
    pub ranges: Vec<Range<RuntimeAddr>>,
    /// The file offset each of `ranges` starts at.
    pub offsets: Vec<u64>,
}

impl LoadedModule {
    /// Whether `addr` lies in one of this module's mappings.
    pub fn contains(&self, addr: RuntimeAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(&addr))
    }

    /// The offset in the file of the byte mapped at `addr` (what a kernel
    /// uprobe is placed by), if `addr` is in one of its mappings.
    pub fn file_offset(&self, addr: RuntimeAddr) -> Option<u64> {
        let (r, off) = self
            .ranges
            .iter()
            .zip(&self.offsets)
            .find(|(r, _)| r.contains(&addr))?;
        Some(off + (addr.0 - r.start.0))
    }

    /// Run-time address of a link-time address.
    pub fn runtime(&self, addr: LinkAddr) -> RuntimeAddr {
        addr + self.bias
    }

    /// Link-time address of a run-time address.
    pub fn link(&self, addr: RuntimeAddr) -> LinkAddr {
        addr - self.bias
    }
}

/// One address a probe spec resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedProbe {
    /// Run-time address to probe.
    pub addr: RuntimeAddr,
    /// The same address in the module's file.
    pub link_addr: LinkAddr,
    /// The module's file name.
    pub module: String,
    /// The function containing the address, if known (demangled).
    pub function: Option<String>,
    /// Offset from the function's start (0 if no function is known).
    pub offset: u64,
    /// The containing function's run-time range, when its size is known.
    pub function_range: Option<Range<RuntimeAddr>>,
    /// A return probe (`%return`): `addr` is the function's entry.
    pub is_return: bool,
    /// The address lies in a PLT section (a stub, not the function itself).
    pub in_plt: bool,
    /// What the symbol `function` names is ([`FunctionKind`]: a function
    /// entry, a `.cold` partition, a label), when a symbol names it.
    pub kind: Option<FunctionKind>,
    /// Why `addr` is not a function's entry (an offset into a function,
    /// a cold partition, a label, code known only from `.eh_frame` whose
    /// `[rsp]` is not the return address); `None` when it is one. Return
    /// probes, recorded calls and `%return` counts need an entry.
    pub not_entry: Option<String>,
    /// A known instruction boundary at or before `addr` in the same code
    /// (the containing function's start, else the containing `.eh_frame`
    /// FDE's): decoding from there must land on `addr` for a probe to go
    /// in (`hotprobe_resolve::check_probe_point`); `None` when nothing is
    /// known (no symbol, no `.eh_frame` entry).
    pub boundary: Option<Boundary>,
    /// Why a call at `addr` never returns to the address at `[rsp]` (an
    /// entry point, the lazy binder, a function that does not return: see
    /// [`crate::no_return_reason`]); `None` when it may. `%return` is
    /// refused there, and recording takes the entry only.
    pub no_return: Option<String>,
    /// A USDT marker's semaphore (run-time address of its 16-bit
    /// counter): incremented while the probe is placed, so that the
    /// program runs the code that reaches the marker.
    pub semaphore: Option<RuntimeAddr>,
    /// A USDT marker's arguments, where they are at the marker (empty for
    /// anything else).
    pub usdt_args: Vec<crate::UsdtArg>,
    /// A USDT marker's instruction (its note says it is one): not a
    /// function entry, and needing none to be traced or recorded.
    pub usdt: bool,
}

impl ResolvedProbe {
    /// Whether `addr` is a function's entry (see
    /// [`ResolvedProbe::not_entry`]).
    pub fn is_entry(&self) -> bool {
        self.not_entry.is_none()
    }
}

/// Where a known instruction boundary comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundarySource {
    /// The start of this function (or other code symbol).
    Function(String),
    /// The start of an `.eh_frame` FDE (no symbol covers the address).
    Fde,
}

/// A known instruction boundary before a probe's address, from which the
/// code is decoded to check that the address starts an instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// The run-time address known to start an instruction.
    pub start: RuntimeAddr,
    /// The end of the code it starts (the function's or FDE's), when
    /// known: decoding stops there.
    pub end: Option<RuntimeAddr>,
    /// What it is.
    pub source: BoundarySource,
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            BoundarySource::Function(name) => write!(f, "{name}'s start {}", self.start),
            BoundarySource::Fde => write!(f, "the FDE start {}", self.start),
        }
    }
}

impl fmt::Display for ResolvedProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.function {
            Some(func) if self.offset == 0 => write!(f, "{func}")?,
            Some(func) => write!(f, "{func}+{:#x}", self.offset)?,
            None => write!(f, "{}", self.link_addr)?,
        }
        write!(f, " [{}] at {}", self.module, self.addr)?;
        if self.is_return {
            f.write_str(" (return)")?;
        }
        Ok(())
    }
}

/// A run-time address described as module, function and offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedAddr {
    /// The address.
    pub addr: RuntimeAddr,
    /// The same address in the module's file.
    pub link_addr: LinkAddr,
    /// The module's file name.
    pub module: String,
    /// The containing function (demangled), if known.
    pub function: Option<String>,
    /// Offset from the function's start (0 if no function is known).
    pub offset: u64,
}

impl fmt::Display for SymbolizedAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.function {
            Some(func) if self.offset == 0 => write!(f, "{func} [{}]", self.module),
            Some(func) => write!(f, "{func}+{:#x} [{}]", self.offset, self.module),
            None => write!(f, "{} [{}]", self.link_addr, self.module),
        }
    }
}

/// Every ELF module mapped in one process.
#[derive(Clone, Debug)]
pub struct ProcessSymbols {
    modules: Vec<LoadedModule>,
    main: Option<usize>,
}

fn same_file(a: &Path, b: &Path, b_canon: Option<&Path>) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a).ok(), b_canon) {
        (Some(ca), Some(cb)) => ca == cb,
        _ => false,
    }
}

impl ProcessSymbols {
    /// Open every ELF file mapped in `maps` (once each, through
    /// [`ModuleCache::global`]); `main_exe` names the main executable.
    /// Files that are not ELF, cannot be read, or were deleted are skipped.
    pub fn from_maps(maps: &[Mapping], main_exe: &Path) -> Result<Self, SymbolError> {
        Self::from_maps_with(maps, main_exe, ModuleCache::global())
    }

    /// [`ProcessSymbols::from_maps`] with a given cache.
    pub fn from_maps_with(
        maps: &[Mapping],
        main_exe: &Path,
        cache: &ModuleCache,
    ) -> Result<Self, SymbolError> {
        Self::build(maps, main_exe, cache, |_| None)
    }

    /// `open_as` may give another path to read a mapped file from (e.g.
    /// /proc/PID/exe for a deleted executable).
    fn build(
        maps: &[Mapping],
        main_exe: &Path,
        cache: &ModuleCache,
        open_as: impl Fn(&Mapping) -> Option<PathBuf>,
    ) -> Result<Self, SymbolError> {
        let exe_canon = std::fs::canonicalize(main_exe).ok();
        // Group mappings by file (path, device, inode: two memfds may carry
        // the same name), in order of first appearance.
        type Key<'m> = (&'m Path, (u32, u32), u64);
        let mut order: Vec<Key<'_>> = Vec::new();
        let mut groups: HashMap<Key<'_>, Vec<&Mapping>> = HashMap::new();
        for m in maps {
            let Some(p) = m.path.as_deref() else { continue };
            let key = (p, m.dev, m.inode);
            groups
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                })
                .push(m);
        }
        let mut modules = Vec::new();
        let mut main = None;
        for key in order {
            let path = key.0;
            let Some(group) = groups.get(&key) else {
                continue;
            };
            let read_path = match group.first().and_then(|m| open_as(m)) {
                Some(p) => p,
                None if group.iter().any(|m| m.deleted) => continue,
                None => path.to_path_buf(),
            };
            let module = match cache.get(&read_path) {
                Ok(Some(m)) => m,
                // Not ELF, unreadable or malformed: not a probe target.
                Ok(None) | Err(_) => continue,
            };
            let Some(bias) = module.load_bias_for(group.iter().copied()) else {
                continue;
            };
            let is_main = main.is_none() && same_file(path, main_exe, exe_canon.as_deref());
            if is_main {
                main = Some(modules.len());
            }
            modules.push(LoadedModule {
                name: module_name(path),
                path: path.to_path_buf(),
                module,
                bias,
                ranges: group.iter().map(|m| m.start..m.end).collect(),
                offsets: group.iter().map(|m| m.offset).collect(),
            });
        }
        Ok(ProcessSymbols { modules, main })
    }

    /// Read `/proc/PID/maps` and `/proc/PID/exe` and open every module.
    /// A deleted main executable is read through `/proc/PID/exe`; another
    /// deleted file — a library replaced on disk, or one loaded from a
    /// memfd (`/memfd:NAME (deleted)` in the maps, e.g. the hotprobe agent,
    /// which the tracer hands out as `/proc/TRACER/fd/N`) — through an open
    /// descriptor of the same file, ours or the process's
    /// (`/proc/{self,PID}/fd/N`), else `/proc/PID/map_files/START-END`
    /// (which needs `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`); it is
    /// skipped when none opens.
    pub fn for_pid(pid: u32) -> Result<Self, SymbolError> {
        let maps = read_maps(pid)?;
        let exe_link = crate::maps::proc_dir(pid).join("exe");
        let exe = std::fs::read_link(&exe_link).map_err(|source| SymbolError::Proc {
            pid,
            path: exe_link.clone(),
            source,
        })?;
        let exe = match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
            Some(s) => PathBuf::from(s),
            None => exe,
        };
        let exe_for_open = exe.clone();
        Self::build(&maps, &exe, ModuleCache::global(), move |m| {
            if !m.deleted {
                return None;
            }
            if m.path.as_deref() == Some(exe_for_open.as_path()) {
                return Some(exe_link.clone());
            }
            reopen_deleted(pid, m)
        })
    }

    /// The modules, in map order.
    pub fn modules(&self) -> &[LoadedModule] {
        &self.modules
    }

    /// The main executable's module.
    pub fn main_module(&self) -> Option<&LoadedModule> {
        self.main.and_then(|i| self.modules.get(i))
    }

    fn names(&self) -> Vec<String> {
        self.modules.iter().map(|m| m.name.clone()).collect()
    }

    /// The module named `name`: its file name or path exactly, or a prefix
    /// of its file name ending where the file name continues with `.` or `-`
    /// (`libc` and `libc.so` match `libc.so.6`).
    pub fn find_module(&self, name: &str) -> Result<&LoadedModule, SymbolError> {
        let exact: Vec<&LoadedModule> = self
            .modules
            .iter()
            .filter(|m| m.name == name || m.path.as_os_str() == name)
            .collect();
        let found = if exact.is_empty() {
            self.modules
                .iter()
                .filter(|m| {
                    m.name
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['.', '-']))
                })
                .collect()
        } else {
            exact
        };
        match found.as_slice() {
            [one] => Ok(one),
            [] => Err(SymbolError::ModuleNotFound {
                name: name.to_string(),
                loaded: self.names(),
            }),
            many => Err(SymbolError::AmbiguousModule {
                name: name.to_string(),
                candidates: many.iter().map(|m| m.path.display().to_string()).collect(),
            }),
        }
    }

    /// The module whose mappings contain `addr`.
    pub fn module_at(&self, addr: RuntimeAddr) -> Option<&LoadedModule> {
        self.modules.iter().find(|m| m.contains(addr))
    }

    /// Modules in search order: main executable first, then map order.
    fn search_order(&self) -> impl Iterator<Item = &LoadedModule> {
        self.main_module().into_iter().chain(
            self.modules
                .iter()
                .enumerate()
                .filter(move |(i, _)| Some(*i) != self.main)
                .map(|(_, m)| m),
        )
    }

    /// Describe a run-time address: module, function, offset.
    pub fn symbolize(&self, addr: RuntimeAddr) -> Option<SymbolizedAddr> {
        let lm = self.module_at(addr)?;
        let link = lm.link(addr);
        let sym = lm.module.symbolize(link);
        Some(SymbolizedAddr {
            addr,
            link_addr: link,
            module: lm.name.clone(),
            function: sym.map(|(s, _)| s.name.clone()),
            offset: sym.map_or(0, |(_, off)| off),
        })
    }
}

/// A module's name: the file name of its path, without the `memfd:` prefix
/// of a memfd-backed file (`/memfd:libhotprobe_agent.so` is named
/// `libhotprobe_agent.so`).
fn module_name(path: &Path) -> String {
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    match n.strip_prefix("memfd:") {
        Some(rest) if !rest.is_empty() => rest.to_string(),
        _ => n,
    }
}

/// `(major, minor)` of a `st_dev` (glibc's `dev_t` encoding), as
/// `/proc/PID/maps` shows it.
fn dev_parts(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// A path that opens the deleted file behind mapping `m` of process `pid`:
/// a descriptor of ours or of the process on the same file (device and
/// inode), else the mapping's `/proc/PID/map_files` entry.
fn reopen_deleted(pid: u32, m: &Mapping) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = m.path.as_deref()?;
    // readlink of a descriptor shows the name the maps show, " (deleted)"
    // appended: a cheap filter before the stat.
    let mut shown = path.as_os_str().to_owned();
    shown.push(" (deleted)");
    for dir in [
        PathBuf::from(format!("/proc/{}/fd", std::process::id())),
        PathBuf::from(format!("/proc/{pid}/fd")),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let fd = e.path();
            if std::fs::read_link(&fd).ok().as_deref() != Some(Path::new(&shown)) {
                continue;
            }
            if let Ok(md) = std::fs::metadata(&fd) {
                if md.ino() == m.inode && dev_parts(md.dev()) == m.dev {
                    return Some(fd);
                }
            }
        }
    }
    let mf = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        m.start.0, m.end.0
    ));
    std::fs::File::open(&mf).ok().map(|_| mf)
}
