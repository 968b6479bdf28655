//! Publishing the unwind tables and readable regions of a process into
//! its stacks region ([`hotprobe_abi::stacks::StacksView`]), and reading
//! the captured stacks back, symbolized.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use hotprobe_abi::stacks::{ReadableRegion, StackRow, StacksView};
use hotprobe_symbols::{read_maps, ProcessSymbols, SymbolError};
use hotprobe_target::RuntimeAddr;

use super::cfi::{compile_module, finish, CfiError};

/// Why the tables of a process could not be published.
#[derive(Debug, thiserror::Error)]
pub enum StacksError {
    /// The process's maps or modules could not be read.
    #[error("reading the process's modules: {0}")]
    Symbols(#[from] SymbolError),
    /// The rows or regions do not fit the region.
    #[error("{rows} unwind rows and {regions} stack regions do not fit the stacks region")]
    TooLarge {
        /// Rows wanted.
        rows: usize,
        /// Regions wanted.
        regions: usize,
    },
}

/// A module's compiled rows, or why it has none.
type Compiled = Result<Vec<StackRow>, String>;

/// The modules (path, load bias) and stack regions last published.
type Published = (BTreeSet<(PathBuf, u64)>, Vec<ReadableRegion>);

/// The tables published into one process, kept to publish again only what
/// changed.
#[derive(Debug)]
pub struct StackTables {
    /// Compiled rows per (module path, load bias).
    cache: HashMap<(PathBuf, u64), Compiled>,
    /// The modules and regions last published.
    published: Option<Published>,
    /// The process's modules at the last refresh: stacks are symbolized
    /// with them, after the process may be gone (shared with
    /// [`super::StackNames`], which names stacks while the session runs).
    symbols: super::names::SharedSymbols,
    /// The stacks of trap probes, walked in the tracer with these rows.
    pub trap: super::trap::TrapStacks,
    /// Tables of an image with no agent (a program a followed process
    /// executed): the rows go to the trap's walks only, never into the
    /// stacks region of the agent the image before had.
    no_agent: bool,
}

/// What one [`StackTables::refresh`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefreshReport {
    /// The tables were written again (something changed).
    pub published: bool,
    /// Rows published.
    pub rows: usize,
    /// Readable regions published.
    pub regions: usize,
    /// Modules whose unwind table could not be compiled, with the reason
    /// (their frames are walked by frame pointers).
    pub failed: Vec<(PathBuf, String)>,
}

impl Default for StackTables {
    fn default() -> StackTables {
        let symbols = super::names::SharedSymbols::default();
        StackTables {
            cache: HashMap::new(),
            published: None,
            trap: super::trap::TrapStacks::named_with(symbols.clone()),
            symbols,
            no_agent: false,
        }
    }
}

impl StackTables {
    /// Tables for a new process.
    pub fn new() -> StackTables {
        StackTables::default()
    }

    /// Tables for an image with no agent in it (a program a followed
    /// process executed): [`StackTables::publishes_to_agent`] is false.
    pub fn without_agent() -> StackTables {
        StackTables {
            no_agent: true,
            ..StackTables::default()
        }
    }

    /// Whether these tables go into the process's agent's stacks region
    /// (false for an image the agent is not in).
    pub fn publishes_to_agent(&self) -> bool {
        !self.no_agent
    }

    /// Reads `pid`'s maps, compiles the modules not seen yet and publishes
    /// rows and stack regions into `view` (the agent's, when there is one)
    /// when they changed; the trap's walks ([`StackTables::trap`]) take
    /// the rows too.
    pub fn refresh(
        &mut self,
        pid: u32,
        view: Option<&StacksView>,
    ) -> Result<RefreshReport, StacksError> {
        let maps = read_maps(pid)?;
        let symbols = ProcessSymbols::for_pid(pid)?;
        let mut modules = BTreeSet::new();
        for m in symbols.modules() {
            // The agent's own memfd: the walk starts at the probed
            // function's caller, never inside the agent.
            if m.path.to_string_lossy().starts_with("/memfd:") {
                continue;
            }
            let key = (m.path.clone(), m.bias.0);
            self.cache.entry(key.clone()).or_insert_with(|| {
                let data = std::fs::read(&m.path).map_err(|e| e.to_string())?;
                compile_module(&data, m.bias.0).map_err(|e: CfiError| e.to_string())
            });
            modules.insert(key);
        }
        let regions = stack_regions(&maps);
        let mut report = RefreshReport {
            regions: regions.len(),
            ..RefreshReport::default()
        };
        let mut rows = Vec::new();
        for key in &modules {
            match self.cache.get(key) {
                Some(Ok(r)) => rows.extend_from_slice(r),
                Some(Err(e)) => report.failed.push((key.0.clone(), e.clone())),
                None => {}
            }
        }
        let rows = finish(rows);
        report.rows = rows.len();
        *self.symbols.borrow_mut() = Some(symbols);
        self.trap.set_rows(&rows);
        let Some(view) = view else {
            return Ok(report);
        };
        let same = self
            .published
            .as_ref()
            .is_some_and(|(m, r)| *m == modules && *r == regions);
        if same {
            return Ok(report);
        }
        // SAFETY: the tracer is the region's only writer, and this session
        // holds the process's tables alone.
        if !unsafe { view.publish(&rows, &regions) } {
            return Err(StacksError::TooLarge {
                rows: rows.len(),
                regions: regions.len(),
            });
        }
        self.published = Some((modules, regions));
        report.published = true;
        Ok(report)
    }

    /// Publishes the stack regions again when they changed (a thread
    /// started: its stack is a new mapping); the rows stay. Does nothing
    /// before the first [`StackTables::refresh`].
    pub fn refresh_regions(&mut self, pid: u32, view: &StacksView) -> Result<bool, StacksError> {
        let Some((_, published)) = &mut self.published else {
            return Ok(false);
        };
        let regions = stack_regions(&read_maps(pid)?);
        if *published == regions {
            return Ok(false);
        }
        // SAFETY: the tracer is the region's only writer.
        if !unsafe { view.publish_regions(&regions) } {
            return Err(StacksError::TooLarge {
                rows: 0,
                regions: regions.len(),
            });
        }
        *published = regions;
        Ok(true)
    }

    /// The name of the frame at return address `addr` (see
    /// [`frame_name`]), with the modules of the last refresh.
    pub fn frame_name(&self, addr: u64) -> String {
        match &*self.symbols.borrow() {
            Some(s) => frame_name(s, addr),
            None => format!("{addr:#x}"),
        }
    }

    /// The modules stacks are named with, shared (see [`super::StackNames`]).
    pub fn shared_symbols(&self) -> super::names::SharedSymbols {
        self.symbols.clone()
    }
}

/// Stack mappings: the main stack and anonymous read-write memory (thread
/// stacks are such mappings).
fn stack_regions(maps: &[hotprobe_symbols::Mapping]) -> Vec<ReadableRegion> {
    maps.iter()
        .filter(|m| m.perms.read && m.perms.write && !m.perms.shared)
        .filter(|m| m.path.is_none() && matches!(m.pseudo.as_deref(), None | Some("[stack]")))
        .map(|m| ReadableRegion {
            start: m.start.0,
            end: m.end.0,
        })
        .collect()
}

/// One stack as counted in the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackCount {
    /// Probe id (the fast path's) of the hits.
    pub probe: u32,
    /// Return addresses, innermost first.
    pub frames: Vec<u64>,
    /// The walk stopped before the outermost frame.
    pub truncated: bool,
    /// Hits with this stack.
    pub count: u64,
}

/// What the agent counted beside the stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackTotals {
    /// Stacks captured.
    pub captured: u64,
    /// Of them, truncated.
    pub truncated: u64,
    /// Hits whose walk overlapped a table update (dropped).
    pub torn: u64,
    /// Hits whose stack found the table full (not stored).
    pub table_full: u64,
    /// Hits on a stack the tracer had not published yet (walked with
    /// fault-safe reads, or not at all in seccomp strict mode).
    pub no_region: u64,
    /// Trap hits whose stack the tracer could not read at all (counted
    /// as an empty truncated stack).
    pub unwalked: u64,
}

/// The stacks counted in `view`, most frequent first.
pub fn read_stacks(view: &StacksView) -> (Vec<StackCount>, StackTotals) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = Vec::new();
    view.for_each(|probe, frames, truncated, count| {
        out.push(StackCount {
            probe,
            frames: frames.to_vec(),
            truncated,
            count,
        })
    });
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    let c = view.ctl();
    let totals = StackTotals {
        captured: c.captured.load(Relaxed),
        truncated: c.truncated.load(Relaxed),
        torn: c.torn.load(Relaxed),
        table_full: c.table_full.load(Relaxed),
        no_region: c.no_region.load(Relaxed),
        unwalked: 0,
    };
    (out, totals)
}

/// A frame's name: `function+0xoff` (`module!0xaddr` without a symbol),
/// for a return address `addr` (looked up at `addr - 1`: the call).
pub fn frame_name(symbols: &ProcessSymbols, addr: u64) -> String {
    match symbols.symbolize(RuntimeAddr(addr.wrapping_sub(1))) {
        Some(s) => match s.function {
            Some(f) => f,
            None => format!("{}!{:#x}", s.module, addr),
        },
        None => format!("{addr:#x}"),
    }
}
