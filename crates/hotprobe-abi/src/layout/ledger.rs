//! The code ledger: every site the fast path wrote into the target's code
//! (patch calls, jumps with their padding, in-process trap `int3`s), with
//! its original bytes, so that the agent can put them back when the
//! tracer dies without restoring them (killed with SIGKILL).

use super::*;

/// Bytes of a site a [`LedgerEntry`] holds: the longest the fast path
/// writes is a jump over up to 4 + 15 bytes of displaced instructions (19).
pub const LEDGER_BYTES: usize = 24;

/// [`LedgerEntry::state`]: free (never used, or taken out).
pub const LEDGER_FREE: u32 = 0;
/// [`LedgerEntry::state`]: the tracer is filling the entry in; never acted on.
pub const LEDGER_WRITING: u32 = 1;
/// [`LedgerEntry::state`]: published. The tracer's bytes are at `addr`, or
/// are about to be (published before they are written), or the original
/// is back after a disable: the agent restores `original` where it finds
/// `written`, and leaves any other bytes alone.
pub const LEDGER_LIVE: u32 = 2;
/// [`LedgerEntry::state`]: the agent is putting the original back
/// (after the tracer died).
pub const LEDGER_UNDOING: u32 = 3;
/// [`LedgerEntry::state`]: the agent put the original back, or found
/// neither the tracer's bytes nor the original there and left them.
pub const LEDGER_UNDONE: u32 = 4;

/// [`LedgerEntry::info`] owner (bits 8–15): a `call` over a placeholder
/// (a patch site's entry, or a ColdPatch exit placeholder).
pub const LEDGER_PATCH: u32 = 1 << 8;
/// [`LedgerEntry::info`] owner: a `jmp` and its `int3` padding (a jump
/// site, or a ColdPatch tail exit).
pub const LEDGER_JUMP: u32 = 2 << 8;
/// [`LedgerEntry::info`] owner: an in-process trap's `int3`.
pub const LEDGER_INPROC: u32 = 3 << 8;
/// Mask of the owner in [`LedgerEntry::info`].
pub const LEDGER_OWNER_MASK: u32 = 0xff << 8;

/// [`LedgerCtl::undo`]: the tracer is alive as far as the agent knows.
pub const UNDO_IDLE: u32 = 0;
/// [`LedgerCtl::undo`]: one thread of the agent is restoring the sites.
pub const UNDO_RUNNING: u32 = 1;
/// [`LedgerCtl::undo`]: every published site was restored.
pub const UNDO_DONE: u32 = 2;

/// The ledger's control words, at the start of its section.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct LedgerCtl {
    /// Entries after this control block (plain field, from the layout).
    pub capacity: u32,
    /// Entries `0..high_water` may be in use (tracer; only grows).
    pub high_water: AtomicU32,
    /// Sites written with no entry, the ledger being full (tracer): the
    /// agent cannot put those back.
    pub unmirrored: AtomicU64,
    /// The tracer's process id (tracer, at creation): the agent checks
    /// that it still exists when the heartbeat is late. Cleared by the
    /// tracer once it detached (no session holds the process through this
    /// memory): a second session refuses a process whose memory names a
    /// live one (hotprobe-fastpath's `check_not_probed`).
    pub tracer_pid: AtomicU32,
    /// Descriptor number, in the tracer, of the write end of a pipe only
    /// the tracer holds, for as long as its process lives (tracer; 0: none). The agent opens the read end
    /// through `/proc/TRACER/fd/N` and asks for a signal when it hangs up:
    /// the tracer's death then reaches the agent at once, even in a
    /// program whose hits never enter the agent (per-site stubs).
    pub hangup_fd: AtomicU32,
    /// [`UNDO_IDLE`], [`UNDO_RUNNING`], [`UNDO_DONE`] (agent).
    pub undo: AtomicU32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Sites the agent put back (agent).
    pub undone: AtomicU64,
    /// Sites the agent left as found: neither the tracer's bytes nor the
    /// original (another writer's) (agent).
    pub left: AtomicU64,
    /// `int3`s of the trap table the agent put back at once (agent).
    pub traps_undone: AtomicU64,
}
const _: () = assert!(size_of::<LedgerCtl>() == 64);

/// One site of the ledger. Single writer while the tracer lives: the
/// tracer, which fills every field with `state` at [`LEDGER_WRITING`] and
/// then stores [`LEDGER_LIVE`] (Release) before writing its bytes into the
/// target; it stores [`LEDGER_FREE`] after it restored the original
/// itself. After the tracer died, the agent moves `LIVE` entries to
/// [`LEDGER_UNDOING`] and [`LEDGER_UNDONE`] (compare-and-swap).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct LedgerEntry {
    /// Address of the site's first byte.
    pub addr: AtomicU64,
    /// [`LEDGER_FREE`], [`LEDGER_WRITING`], [`LEDGER_LIVE`],
    /// [`LEDGER_UNDOING`], [`LEDGER_UNDONE`].
    pub state: AtomicU32,
    /// Length in bytes (bits 0–7, at most [`LEDGER_BYTES`]) and owner
    /// ([`LEDGER_PATCH`], [`LEDGER_JUMP`], [`LEDGER_INPROC`]).
    pub info: AtomicU32,
    /// The site's original bytes (little-endian words; `len` of them count).
    pub original: [AtomicU64; LEDGER_BYTES / 8],
    /// The bytes the tracer wrote there.
    pub written: [AtomicU64; LEDGER_BYTES / 8],
}
const _: () = assert!(size_of::<LedgerEntry>() == 64);

/// Entries of the ledger for `params`: one per site-table slot (every
/// patch or jump site has one) and one per in-process trap.
pub const fn ledger_capacity(params: &Params) -> usize {
    params.n_site_slots as usize + INPROC_SITES
}
