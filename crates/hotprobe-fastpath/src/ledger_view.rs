//! The code ledger of another process, read from outside through
//! `/proc/PID/mem` (diagnostics and tests: how many sites a tracer has
//! published, and what the agent did with them after the tracer died).

use std::io::{Read, Seek, SeekFrom};
use std::mem::offset_of;
use std::path::PathBuf;

use hotprobe_abi::{
    Header, Layout, LedgerCtl, LedgerEntry, Params, LEDGER_LIVE, UNDO_DONE, UNDO_RUNNING,
};

use crate::FastPathError;

/// What the agent undoing a dead tracer's code is doing (see
/// [`LedgerState::undo`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UndoState {
    /// Nothing undone: the tracer is alive as far as the agent knows.
    Idle,
    /// The agent is putting the sites back.
    Running,
    /// Every published site was put back.
    Done,
}

/// The code ledger of a process's agent memory ([`ledger_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerState {
    /// Sites published (`LIVE`): written, about to be, or disabled.
    pub published: usize,
    /// Sites written without an entry (the ledger was full).
    pub unmirrored: u64,
    /// The agent's undo.
    pub undo: UndoState,
    /// Sites the agent put back.
    pub undone: u64,
    /// Sites the agent left as found (another writer's bytes).
    pub left: u64,
    /// `int3`s of the trap table the agent put back.
    pub traps_undone: u64,
}

/// The code ledger of the last hotprobe memory mapped in process `pid`
/// (a memfd named `hotprobe`), read through `/proc/PID/mem`; `None` when
/// the process maps none, or one of another layout version.
pub fn ledger_state(pid: u32) -> Result<Option<LedgerState>, FastPathError> {
    let io = |path: String| -> Box<dyn FnOnce(std::io::Error) -> FastPathError> {
        Box::new(move |source| FastPathError::Io {
            path: PathBuf::from(path),
            source,
        })
    };
    let maps_path = format!("/proc/{pid}/maps");
    let last_memory = || -> Result<Option<u64>, FastPathError> {
        let maps = std::fs::read_to_string(&maps_path).map_err(io(maps_path.clone()))?;
        Ok(maps
            .lines()
            .filter(|l| l.contains("/memfd:hotprobe ") || l.ends_with("/memfd:hotprobe"))
            .filter_map(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
            .next_back())
    };
    let Some(base) = last_memory()? else {
        return Ok(None);
    };
    match ledger_at(pid, base, &io) {
        // Unmapped meanwhile (a detach takes the memory out of the
        // process): no ledger any more.
        Err(_) if last_memory()? != Some(base) => Ok(None),
        r => r,
    }
}

/// The code ledger of the hotprobe memory mapped at `base` in `pid`.
fn ledger_at(
    pid: u32,
    base: u64,
    io: &dyn Fn(String) -> Box<dyn FnOnce(std::io::Error) -> FastPathError>,
) -> Result<Option<LedgerState>, FastPathError> {
    let mem_path = format!("/proc/{pid}/mem");
    let mut mem = std::fs::File::open(&mem_path).map_err(io(mem_path.clone()))?;
    let mut read = |at: u64, buf: &mut [u8]| -> Result<(), FastPathError> {
        mem.seek(SeekFrom::Start(at))
            .and_then(|_| mem.read_exact(buf))
            .map_err(io(mem_path.clone()))
    };
    let mut header = [0u8; size_of::<Header>()];
    read(base, &mut header)?;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if u64_at(&header, offset_of!(Header, magic)) != hotprobe_abi::MAGIC
        || u32_at(&header, offset_of!(Header, version)) != hotprobe_abi::VERSION
    {
        return Ok(None);
    }
    let params = Params {
        n_probes: u32_at(&header, offset_of!(Header, n_probes)),
        n_site_slots: u32_at(&header, offset_of!(Header, n_site_slots)),
        n_threads: u32_at(&header, offset_of!(Header, n_threads)),
        ring_capacity: u32_at(&header, offset_of!(Header, ring_capacity)),
        event_size: u32_at(&header, offset_of!(Header, event_size)),
    };
    let Ok(layout) = Layout::new(params) else {
        return Ok(None);
    };
    let at = base + layout.ledger_offset as u64;
    let mut ctl = [0u8; size_of::<LedgerCtl>()];
    read(at, &mut ctl)?;
    let high_water = (u32_at(&ctl, offset_of!(LedgerCtl, high_water)) as usize)
        .min(hotprobe_abi::ledger_capacity(&params));
    let mut entries = vec![0u8; high_water * size_of::<LedgerEntry>()];
    read(at + size_of::<LedgerCtl>() as u64, &mut entries)?;
    let published = entries
        .chunks_exact(size_of::<LedgerEntry>())
        .filter(|e| u32_at(e, offset_of!(LedgerEntry, state)) == LEDGER_LIVE)
        .count();
    Ok(Some(LedgerState {
        published,
        unmirrored: u64_at(&ctl, offset_of!(LedgerCtl, unmirrored)),
        undo: match u32_at(&ctl, offset_of!(LedgerCtl, undo)) {
            UNDO_RUNNING => UndoState::Running,
            UNDO_DONE => UndoState::Done,
            _ => UndoState::Idle,
        },
        undone: u64_at(&ctl, offset_of!(LedgerCtl, undone)),
        left: u64_at(&ctl, offset_of!(LedgerCtl, left)),
        traps_undone: u64_at(&ctl, offset_of!(LedgerCtl, traps_undone)),
    }))
}
