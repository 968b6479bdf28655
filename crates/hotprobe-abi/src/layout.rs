//! The `#[repr(C)]` structures that live in the shared memory, their
//! constants, and the arithmetic that places them ([`Layout`]).
//!
//! ```text
//! offset 0            Header (256 bytes)
//! offset 256          SlotDirectory (32 bytes; rest of the first page reserved)
//! sites_offset        SiteSlot[n_site_slots]        (4096, 16 bytes each)
//! counters_offset     AtomicU64[n_probes]           global counters (threads without a slot)
//! missed_offset       AtomicU64[n_probes]           events refused per probe (see Header::missed_offset)
//! traps_offset        the trap table (page-aligned, TRAP_TABLE_SIZE bytes):
//!                       +0                     TrapRegion[TRAP_REGIONS]  the tracer's scratch
//!                       +TRAP_RETURNS_OFFSET   TrapReturn[TRAP_RETURNS]  live trap return instances
//!                       +TRAP_SLOTS_OFFSET     TrapSlot[TRAP_SLOTS]      every int3: address → byte
//!                       +INPROC_OFFSET         InprocSite[INPROC_SITES]  in-process traps: int3 → counter, boosted copy
//! ledger_offset       the code ledger (page-aligned): LedgerCtl, then
//!                       LedgerEntry[ledger_capacity]  every site the fast path wrote
//! threads_offset      ThreadSlot[n_threads], each thread_stride bytes:
//!                       +0                     RingCtl (192 bytes)
//!                       +THREAD_COUNTERS_OFFSET AtomicU64[n_probes] per-thread counters
//!                       +events_offset          event slots: ring_capacity × event_size bytes
//! agg_offset          the aggregation region (page-aligned, crate::agg::AGG_REGION_SIZE bytes)
//! capture_offset      the capture table (crate::capture::CAPTURE_REGION_SIZE bytes)
//! (stacks region, when the tracer made one: crate::stacks)
//! chunk1_offset       thread slots n_threads.. in chunks of n_threads slots
//!                       (SlotDirectory; mapped apart, on demand)
//! ```
//! Every offset is a multiple of 64 (sections start on a page).
//!
//! An event slot is [`Header::event_size`] bytes — [`EVENT_SIZE_COMPACT`]
//! (32) or [`EVENT_SIZE_FULL`] (64), chosen by the tracer — of little-endian
//! words: the raw TSC, a *meta* word (see [`pack_meta`]: probe id, kind,
//! number of values, flags), then the values (2 or 6); the tid is the
//! ring owner's. Slots are
//! powers of two and never straddle a cache line; the producer writes only
//! the words an event uses. [`Event`] is the decoded form the consumer hands
//! out.

use core::mem::{align_of, offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::AbiError;

mod ledger;
mod traps;
pub use ledger::*;
pub use traps::*;

/// `b"HOTPROBE"` read as a little-endian `u64`: the first word of the mapping.
pub const MAGIC: u64 = u64::from_le_bytes(*b"HOTPROBE");
/// Version of this layout; bumped on any incompatible change (5:
/// [`RingCtl::owner_pid`], [`CONTROL_FOLLOW_FORKS`]; 6: the per-probe
/// missed counters ([`Header::missed_offset`]), [`RingCtl::refused`], and
/// the trap table ([`Header::traps_offset`]); 7: the in-process trap
/// table ([`InprocSite`]) at the end of the trap table; 8:
/// [`HandlerCtl::handler_trampoline`], [`HANDLER_STUB`], [`HANDLER_POST`],
/// [`INPROC_POST`]; 9: the site table is indexed by [`site_index`], which
/// keeps nearby sites on nearby slots; 10: xmm layouts in a site's action
/// bits 4–6 and [`EVENT_XMM`] events; 11: thread and handler slots are
/// recycled ([`crate::THREAD_RETIRING`], [`crate::THREAD_REUSABLE`]),
/// [`Header::tsc_hz`]; 12: the code ledger ([`LedgerCtl`], [`LedgerEntry`])
/// between the trap table and the thread slots; 13: the aggregation
/// region ([`crate::agg`], [`Layout::agg_offset`], [`ACTION_AGG`]) after
/// the thread slots; 14: the stacks region after the main layout
/// ([`crate::stacks::StacksView`]) and [`ACTION_STACK`]; 15: an entry
/// event carries its stack's id in the meta word's bits 32–63
/// ([`META_STACK_SHIFT`], [`Event::reserved2`]); 16: the capture table
/// ([`crate::capture`], [`Layout::capture_offset`]) after the aggregation
/// region, [`ACTION_CAPTURE`] and [`KIND_DATA`] events; 17: no image
/// ranges page after the capture slots; 18: [`Header::ring_pool`], the
/// ring starts the tracer made ready, in place of `reserved1`; 19: the
/// thread slots grow in chunks past the main layout's, described by the
/// [`crate::SlotDirectory`] after the header; 20:
/// [`crate::fast::ThreadBlock::hook_entry`], the agent's return hook for
/// record stubs, in place of `reserved0`).
pub const VERSION: u32 = 20;
/// Size of [`Header`] in bytes.
pub const HEADER_SIZE: usize = 256;
/// Alignment of every section start (the site table and the thread slots).
pub const PAGE: usize = 4096;

/// [`Header::control`] bit (tracer → agent): the agent acts on hits. Clear:
/// every hit returns at once.
pub const CONTROL_ENABLED: u32 = 1 << 0;
/// [`Header::control`] bit (tracer → agent): `record` actions write events.
/// The agent clears it itself when the heartbeat goes stale.
pub const CONTROL_RECORD: u32 = 1 << 1;

/// [`Header::control`] bit (tracer → agent), read by the agent in a forked
/// child (its `pthread_atfork` child handler), with the state it had when
/// the parent called `fork`.
///
/// A child inherits the patched code, the shared mapping (it is
/// `MAP_SHARED`), and its one thread's registration, which points into
/// the forking thread's slot: were the child to count or record through
/// it, two producers would share one single-producer ring.
///
/// * Clear (the default): the agent goes **dormant** in the child. It
///   stops using the shared memory at all — no counting, no recording, no
///   ring write, no thread registration, no header update — and clears the
///   forking thread's TLS word, so that a per-site stub still reached in
///   the child sends its hit to the agent's generic path, which returns at
///   once. Return addresses the parent's return hook swapped on the
///   forking thread's stack still lead to the return trampoline, which
///   still returns to the real addresses (the child runs correctly). The
///   tracer normally also writes back the original bytes of every site in
///   the child at its fork stop; dormancy covers what that cannot reach.
/// * Set (`--follow-forks`): the child's agent stays attached. It forgets
///   its thread registrations (the forking thread's TLS word is cleared,
///   the parent's thread-table entries are dropped) so that each of the
///   child's threads claims a slot of its own in the same memory, with
///   [`RingCtl::owner_pid`]/[`RingCtl::owner_tid`] the child's. The
///   forking thread claims its slot at once when the parent's return hook
///   left hooked frames on its stack (their exits are recorded in the
///   child), at its next hit otherwise. Counts of threads that get no slot
///   (slots exhausted) go to the shared global counters.
pub const CONTROL_FOLLOW_FORKS: u32 = 1 << 2;

/// [`Header::status`] bit (agent → tracer): the agent mapped the memory and
/// published its trampoline addresses.
pub const STATUS_ATTACHED: u32 = 1 << 0;
/// [`Header::status`] bit: the agent saw a stale heartbeat and stopped recording.
pub const STATUS_ORPHANED: u32 = 1 << 1;
/// [`Header::status`] bit: the agent's near page could not be mapped; the
/// tracer must provide its own stubs within ±2 GiB of the sites.
pub const STATUS_NO_NEAR_PAGE: u32 = 1 << 2;

/// [`SiteSlot::action`] bit: add one to the probe's counter.
pub const ACTION_COUNT: u32 = 1 << 0;
/// [`SiteSlot::action`] bit: write an [`Event`] to the thread's ring.
pub const ACTION_RECORD: u32 = 1 << 1;
/// [`SiteSlot::action`] bit: also hook the function's return — the agent
/// swaps the return address for its return trampoline and keeps the real one
/// on a per-thread shadow stack; the return then produces a [`KIND_EXIT`]
/// event (with `record`) carrying rax and rdx. Only for sites reached with
/// the stack exactly as at the function's first instruction (patchable
/// entry, fentry, a jump-mechanism entry trampoline).
pub const ACTION_EXIT: u32 = 1 << 2;
/// [`SiteSlot::action`] bit: count into counter `action >> ACTION_COUNTER_SHIFT`
/// instead of the site's probe id (exit placeholders count their returns
/// apart from the entries, while their events carry the entry's probe id).
pub const ACTION_ALT_COUNTER: u32 = 1 << 3;
/// [`SiteSlot::action`] bit: add the hit into the probe's aggregation
/// (see [`crate::agg`]: a histogram of a value, or a count per key), in
/// the target, instead of writing an event.
pub const ACTION_AGG: u32 = 1 << 7;
/// [`SiteSlot::action`] bit: capture the user stack at an entry (the
/// agent walks it with the tables of [`crate::stacks`] and adds it to the
/// stack table). Sites with it take the agent's generic trampoline. The
/// top bit: the bits below 8 are taken, and the alternative counter index
/// above [`ACTION_COUNTER_SHIFT`] (a probe id, below 2^23) never reaches
/// it; readers of that index mask it off ([`ACTION_COUNTER_MASK`]).
pub const ACTION_STACK: u32 = 1 << 31;
/// [`SiteSlot::action`] bit: at a recorded entry, run the probe's
/// capture program ([`crate::capture`]: strings, fields through pointers,
/// stack arguments, copied in the target) and write its bytes as
/// [`KIND_DATA`] events in front of the entry event. Sites with it take
/// the agent's generic trampoline. Takes bit 30: the alternative counter
/// index is then below 2^22.
pub const ACTION_CAPTURE: u32 = 1 << 30;
/// Shift of the alternative counter index in [`SiteSlot::action`].
pub const ACTION_COUNTER_SHIFT: u32 = 8;
/// The bits of [`SiteSlot::action`] that hold the alternative counter
/// index (shifted by [`ACTION_COUNTER_SHIFT`]): all but [`ACTION_STACK`]
/// and [`ACTION_CAPTURE`].
pub const ACTION_COUNTER_MASK: u32 = !(ACTION_STACK | ACTION_CAPTURE);
/// Largest alternative counter index an action holds (exclusive).
pub const ACTION_COUNTER_LIMIT: u32 = 1 << 22;
/// Shift of the xmm layout in [`SiteSlot::action`] (3 bits, see
/// [`action_xmm`]): 0 records the usual registers; `k + 1` (k in 0..=6)
/// makes an entry record the first `k` integer argument registers
/// (rdi, rsi, …) followed by the low 64 bits of xmm0, xmm1, … in the
/// remaining value words, and an exit record rax, rdx and xmm0 (3 values);
/// both carry [`EVENT_XMM`]. For functions taking or returning `float` or
/// `double`: the SysV ABI gives integer-class and float-class parameters
/// their registers in two independent sequences.
pub const ACTION_XMM_SHIFT: u32 = 4;
/// Mask of the xmm layout in [`SiteSlot::action`].
pub const ACTION_XMM_MASK: u32 = 7 << ACTION_XMM_SHIFT;

/// The action bits of the xmm layout recording `ints` integer argument
/// registers before the xmm registers (`ints` ≤ 6; larger is clamped).
#[inline(always)]
pub const fn action_xmm(ints: u8) -> u32 {
    let k = if ints > 6 { 6 } else { ints };
    (k as u32 + 1) << ACTION_XMM_SHIFT
}

/// The number of integer registers an action's xmm layout records first,
/// or `None` without the layout.
#[inline(always)]
pub const fn xmm_ints(action: u32) -> Option<u8> {
    match (action & ACTION_XMM_MASK) >> ACTION_XMM_SHIFT {
        0 => None,
        n => Some(n as u8 - 1),
    }
}

/// The shared-memory header at offset 0.
///
/// Plain (non-atomic) fields are written once by the tracer before the agent
/// maps the memory ([`crate::Shm::create`]) and are read-only afterwards;
/// both sides copy them into a validated [`Layout`] and never read them
/// again. Atomic fields are documented with their single writer.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u32,
    /// Size of the whole mapping in bytes.
    pub total_size: u64,
    /// Number of probe ids (length of each counter array).
    pub n_probes: u32,
    /// Number of slots of the site table (a power of two ≥ 2).
    pub n_site_slots: u32,
    /// Number of thread slots (each a ring and a counter array) of the
    /// main layout: chunk 0 of a growable memory, whose other chunks
    /// ([`crate::SlotDirectory`]) hold as many each.
    pub n_threads: u32,
    /// Events per ring (a power of two ≥ 2).
    pub ring_capacity: u32,
    /// Byte offset of the site table.
    pub sites_offset: u64,
    /// Byte offset of the global counter array.
    pub counters_offset: u64,
    /// Byte offset of the first thread slot.
    pub threads_offset: u64,
    /// Bytes per thread slot.
    pub thread_stride: u64,
    /// `CONTROL_*` bits; written by the tracer (the agent only ever clears
    /// [`CONTROL_RECORD`] when orphaned).
    pub control: AtomicU32,
    /// `STATUS_*` bits; written by the agent.
    pub status: AtomicU32,
    /// Last `rdtsc` value written by the tracer ("I am alive").
    pub heartbeat_tsc: AtomicU64,
    /// TSC ticks after which a heartbeat is stale; 0 disables the check.
    pub heartbeat_timeout_tsc: AtomicU64,
    /// Thread slots handed out so far (agent; monotonic, may exceed `n_threads`).
    pub threads_claimed: AtomicU32,
    /// Process id of the agent's host (agent).
    pub agent_pid: AtomicU32,
    /// `hotprobe_agent_version()` of the agent that attached (agent).
    pub agent_abi_version: AtomicU32,
    /// Bytes per event slot: [`EVENT_SIZE_COMPACT`] or [`EVENT_SIZE_FULL`]
    /// (plain field, written at creation).
    pub event_size: u32,
    /// Run-time address of `hotprobe_agent_entry_trampoline` (agent).
    pub entry_trampoline: AtomicU64,
    /// Run-time address of `hotprobe_agent_exit_trampoline` (agent).
    pub exit_trampoline: AtomicU64,
    /// Run-time address of `hotprobe_agent_mid_trampoline` (agent).
    pub mid_trampoline: AtomicU64,
    /// Run-time address of the agent's near page (within ±2 GiB of the main
    /// executable), 0 if none; see [`crate::patch::NEAR_STUB_ENTRY`] (agent).
    pub near_page: AtomicU64,
    /// Size of the near page in bytes (agent).
    pub near_page_size: AtomicU64,
    /// `rdtsc` paired with `calib_ns`: the tracer's at creation, or the
    /// agent's at attach when the tracer left it 0.
    pub calib_tsc: AtomicU64,
    /// `CLOCK_MONOTONIC` ns taken right after `calib_tsc` (agent).
    pub calib_ns: AtomicU64,
    /// Events lost because the thread had no slot (agent, relaxed add).
    pub drops_no_thread: AtomicU64,
    /// Hits whose return address was not in the site table (agent).
    pub site_misses: AtomicU64,
    /// Hits skipped because the thread was already inside the agent (agent).
    pub reentries: AtomicU64,
    /// Returns not hooked because the thread's shadow stack was full or
    /// missing (agent; the `nmissed` of return probes).
    pub return_misses: AtomicU64,
    /// Run-time address of `hotprobe_agent_return_trampoline`, the address
    /// hooked returns go through (agent).
    pub return_trampoline: AtomicU64,
    /// Frames left by longjmp or an exception without returning, whose
    /// shadow-stack entries were dropped (agent).
    pub unwound_frames: AtomicU64,
    /// Offset from the thread pointer (`fs:0`) of the agent's initial-exec
    /// TLS word that holds, per thread, the address of the thread's
    /// [`crate::fast::ThreadBlock`] (0 until the thread's first hit); the
    /// tracer's per-site stubs read it with `mov r11, fs:[off]`. 0 when the
    /// agent has no such word (stubs must not be used then) (agent).
    pub thread_tpoff: AtomicU64,
    /// Identifies this memory among the ones a target may see over its
    /// life (plain field, written at creation: non-zero, below 2^31,
    /// different for two creations). The agent copies it into every
    /// [`crate::fast::ThreadBlock::stub_key`]; a tracer builds it into its
    /// stubs.
    pub stub_key: u32,
    /// The ring pool (tracer; see [`crate::RING_POOL_RECORDING`]): 0 while
    /// no site writes events (a registering thread prepares no ring);
    /// then [`crate::RING_POOL_RECORDING`] plus the number of thread slots,
    /// from slot 0, whose ring start ([`crate::Shm::ring_start`]) the
    /// tracer has already put in memory, so that a thread claiming one
    /// maps it with no system call. Only grows.
    pub ring_pool: AtomicU32,
    /// Byte offset of the per-probe missed counters (plain field, written
    /// at creation): `AtomicU64[n_probes]`, indexed by the probe id events
    /// carry, each the events of that probe that were not written (a full
    /// ring, a thread without a ring slot or still registering, a hit
    /// refused because its thread was already inside the agent — a signal
    /// handler interrupting a probed function —, a return not hooked).
    /// Incremented with a locked add by the agent and the stubs, off their
    /// hot paths.
    pub missed_offset: u64,
    /// Byte offset of the trap table (plain field, written at creation):
    /// what the tracer publishes so that the agent survives the tracer's
    /// death with its `int3`s still in the code (see [`TrapSlot`]).
    pub traps_offset: u64,
    /// TSC ticks per second as the tracer measured them (tracer, at
    /// creation): the agent converts `CLOCK_MONOTONIC` readings into TSC
    /// units with it where the thread may not execute `rdtsc`.
    pub tsc_hz: AtomicU64,
}

const _: () = assert!(size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(offset_of!(Header, control) == 72);
const _: () = assert!(offset_of!(Header, heartbeat_tsc) == 80);
const _: () = assert!(offset_of!(Header, entry_trampoline) == 112);
const _: () = assert!(offset_of!(Header, near_page) == 136);
const _: () = assert!(offset_of!(Header, event_size) == 108);
const _: () = assert!(offset_of!(Header, reentries) == 184);
const _: () = assert!(offset_of!(Header, thread_tpoff) == 216);
const _: () = assert!(offset_of!(Header, stub_key) == 224);
const _: () = assert!(offset_of!(Header, ring_pool) == 228);
const _: () = assert!(offset_of!(Header, missed_offset) == 232);
const _: () = assert!(offset_of!(Header, traps_offset) == 240);

/// One slot of the open-addressing site table (linear probing, index
/// [`site_index`]).
///
/// The key is the *return address* the patched `call` pushes: the run-time
/// address of the instruction after the call (site + 5), or for stubs the
/// address after the stub's call ([`crate::patch`]). Key 0 is an empty slot.
/// The tracer fills `probe_id` and `action` before publishing `key`.
#[repr(C)]
#[derive(Debug)]
pub struct SiteSlot {
    /// Return address identifying the site; 0 = empty.
    pub key: AtomicU64,
    /// Probe id (index into the counter arrays).
    pub probe_id: AtomicU32,
    /// `ACTION_*` bits; 0 disables the site without touching the text.
    pub action: AtomicU32,
}
const _: () = assert!(size_of::<SiteSlot>() == 16);

/// Slot index (before masking by the table size) of a site key in the
/// site table: the key's address in 16-byte units, with its upper 32 bits
/// folded in so that modules far apart in memory do not start on the same
/// slots. Not a mixing hash on purpose: sites close together in the text
/// (functions are 16-byte aligned) land on neighbouring slots, so the
/// table's pages that are ever touched — its memory cost — grow with the
/// span of text probed, not with the table's reserved size (a table sized
/// for a million probes costs a page for 10 probes in one function
/// region). Keys 16 bytes apart or more never collide within a module
/// whose text is smaller than 16 × the table's slots.
#[inline(always)]
pub fn site_index(key: u64) -> usize {
    ((key >> 4) ^ (key >> 32)) as usize
}

/// Hash of a key into a table of `1 << (64 - shift)` slots (the trap
/// table's).
#[inline(always)]
pub fn site_hash(key: u64, shift: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

/// Control block of one per-thread single-producer single-consumer ring.
///
/// `head` (agent-written) and `tail` (tracer-written) sit on separate cache
/// lines so the two sides do not false-share.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct RingCtl {
    /// Number of events ever written (producer: the owning thread).
    pub head: AtomicU64,
    pad0: [u64; 7],
    /// Number of events ever consumed (consumer: the tracer).
    pub tail: AtomicU64,
    pad1: [u64; 7],
    /// Linux tid of the owner (agent, written at each claim: a slot is
    /// claimed again once drained after its owner exited, see
    /// [`crate::THREAD_REUSABLE`]).
    pub owner_tid: AtomicU32,
    /// `THREAD_*` state (agent).
    pub state: AtomicU32,
    /// Events dropped because the ring was full (producer only).
    pub dropped: AtomicU64,
    /// Process id of the owner (agent, written once at claim, before
    /// `state` turns LIVE): the agent's host, or a forked child's pid
    /// ([`CONTROL_FOLLOW_FORKS`]); 0 when the claimer did not say
    /// ([`crate::Shm::claim_thread`]: read [`Header::agent_pid`] then).
    pub owner_pid: AtomicU32,
    pad3: u32,
    /// Events of this thread not written because the thread was already
    /// inside the agent or a stub (a signal handler interrupting it there)
    /// or a return could not be hooked (agent, locked add: a handler may
    /// interrupt an increment).
    pub refused: AtomicU64,
    pad2: [u64; 4],
}
const _: () = assert!(size_of::<RingCtl>() == 192);
const _: () = assert!(offset_of!(RingCtl, tail) == 64);
const _: () = assert!(offset_of!(RingCtl, owner_tid) == 128);
const _: () = assert!(offset_of!(RingCtl, dropped) == 136);
const _: () = assert!(offset_of!(RingCtl, owner_pid) == 144);
const _: () = assert!(offset_of!(RingCtl, refused) == 152);

/// Offset of the per-thread counter array inside a thread slot.
pub const THREAD_COUNTERS_OFFSET: usize = size_of::<RingCtl>();

/// [`Event::kind`]: function entry (args are rdi, rsi, rdx, rcx, r8, r9,
/// as many as the slot holds).
pub const KIND_ENTRY: u8 = 0;
/// [`Event::kind`]: function exit (args[0] = rax, args[1] = rdx at the site).
pub const KIND_EXIT: u8 = 1;
/// [`Event::reserved`] flag of a [`KIND_EXIT`] event: the frame was left
/// without returning (longjmp, exception); args are 0.
pub const EXIT_UNWOUND: u16 = 1;
/// [`Event::reserved`] flag: the values follow the xmm layout of the
/// site's action ([`ACTION_XMM_SHIFT`]): an entry's first `k` values are
/// integer argument registers and the rest xmm0, xmm1, … (low 64 bits);
/// an exit's third value is xmm0.
pub const EVENT_XMM: u16 = 2;
/// [`Event::kind`]: a mid-function site (args as for entry).
pub const KIND_HIT: u8 = 2;
/// [`Event::kind`]: a continuation of the next event of the ring that is
/// not one (see [`crate::Producer::push_with_data`]): its tsc word is the
/// number of payload bytes it holds (≤ 48), its six value words the
/// bytes. A consumer appends them and hands the bytes over with the event
/// they precede; a continuation is never an event of its own.
pub const KIND_DATA: u8 = 3;

/// Event slot size holding 2 values (tsc, meta, 2 values = 32 bytes):
/// exits (rax, rdx), and entries recorded with at most 2 arguments.
pub const EVENT_SIZE_COMPACT: u32 = 32;
/// Event slot size holding 6 values (tsc, meta, 6 values = 64 bytes, one
/// cache line): entries recorded with up to 6 arguments.
pub const EVENT_SIZE_FULL: u32 = 64;
/// Words of an event slot before its values (tsc, meta).
pub const EVENT_HEADER_WORDS: usize = 2;

/// Meta word: mask of the probe id (bits 0–23; probe ids are below 2^24).
pub const META_PROBE_MASK: u64 = (1 << 24) - 1;
/// Meta word: shift of the kind (`KIND_*`, 2 bits).
pub const META_KIND_SHIFT: u32 = 24;
/// Meta word: shift of the number of values stored (3 bits, ≤ 6).
pub const META_NVALUES_SHIFT: u32 = 26;
/// Meta word: shift of the flags ([`Event::reserved`], 2 bits: [`EXIT_UNWOUND`],
/// [`EVENT_XMM`]).
pub const META_FLAGS_SHIFT: u32 = 29;
/// Meta word: shift of an entry's stack id ([`Event::reserved2`], 32 bits).
pub const META_STACK_SHIFT: u32 = 32;

/// The meta word (word 1) of an event slot: `probe | kind << 24 |
/// nvalues << 26 | flags << 29`. Bits 31–63 are zero: a meta word is a
/// positive `i32` that a stub stores as one sign-extended immediate. The
/// event's tid is not stored: it is the ring owner's
/// ([`RingCtl::owner_tid`]), which the consumer fills in. Out-of-range
/// fields are truncated to their bits.
#[inline(always)]
pub const fn pack_meta(probe: u32, kind: u8, nvalues: u8, flags: u16) -> u64 {
    (probe as u64 & META_PROBE_MASK)
        | ((kind as u64 & 3) << META_KIND_SHIFT)
        | ((nvalues as u64 & 7) << META_NVALUES_SHIFT)
        | ((flags as u64 & 3) << META_FLAGS_SHIFT)
}

/// Values an event slot of `event_size` bytes holds (2 or 6).
#[inline(always)]
pub const fn slot_values(event_size: u32) -> usize {
    event_size as usize / 8 - EVENT_HEADER_WORDS
}

/// One recorded event, decoded (what [`crate::Consumer::drain`] hands out
/// and [`crate::Producer::push`] takes; in the ring it is a 32- or 64-byte
/// slot, see the module docs).
///
/// `tsc` is the raw `rdtsc` value (invariant, constant TSC assumed; convert
/// with [`TscCalibration`]): rdtsc costs ≈ 8–12 ns here against 29 ns for
/// `clock_gettime(CLOCK_MONOTONIC)`, and the record path is budgeted at
/// ≈ 30 ns for an entry and an exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Raw time stamp counter at the hit.
    pub tsc: u64,
    /// Probe id from the site table (below 2^24).
    pub probe_id: u32,
    /// Linux thread id of the thread that hit (the ring's
    /// [`RingCtl::owner_tid`]; not stored in the slot).
    pub tid: u32,
    /// `KIND_*`.
    pub kind: u8,
    /// Number of meaningful entries of `args`: for entry/hit, 6 with
    /// [`EVENT_SIZE_FULL`] slots, 2 with [`EVENT_SIZE_COMPACT`] ones; 2 for
    /// exit (0 when unwound). The rest of `args` is 0.
    pub nargs: u8,
    /// Flags ([`EXIT_UNWOUND`], [`EVENT_XMM`]; 2 bits survive the ring).
    pub reserved: u16,
    /// An entry's stack id with [`ACTION_STACK`]: 1 + the stack table
    /// slot holding its stack ([`crate::stacks::StacksView::add_with_id`]);
    /// 0 for none (stored in the meta word's high half).
    pub reserved2: u32,
    /// Argument registers (entry/hit) or rax, rdx (exit).
    pub args: [u64; 6],
}
const _: () = assert!(size_of::<Event>() == 72);
const _: () = assert!(align_of::<Event>() == 8);

/// Sizes the tracer chooses when it creates the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Number of probe ids.
    pub n_probes: u32,
    /// Site-table slots; a power of two ≥ 2, keep it ≥ 2 × sites for short probes.
    pub n_site_slots: u32,
    /// Thread slots (threads beyond that count and record into globals/drops).
    pub n_threads: u32,
    /// Events per ring; a power of two ≥ 2.
    pub ring_capacity: u32,
    /// Bytes per event slot: [`EVENT_SIZE_COMPACT`] (entries keep 2
    /// arguments) or [`EVENT_SIZE_FULL`] (6).
    pub event_size: u32,
}

/// Validated offsets and sizes of a mapping, computed from [`Params`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The parameters.
    pub params: Params,
    /// See [`Header::sites_offset`].
    pub sites_offset: usize,
    /// See [`Header::counters_offset`].
    pub counters_offset: usize,
    /// See [`Header::missed_offset`].
    pub missed_offset: usize,
    /// See [`Header::traps_offset`].
    pub traps_offset: usize,
    /// Offset of the code ledger ([`LedgerCtl`], then
    /// [`ledger_capacity`] × [`LedgerEntry`]); no header field: computed
    /// from the parameters on both sides.
    pub ledger_offset: usize,
    /// See [`Header::threads_offset`].
    pub threads_offset: usize,
    /// See [`Header::thread_stride`].
    pub thread_stride: usize,
    /// Offset of the aggregation region ([`crate::agg`],
    /// [`crate::agg::AGG_REGION_SIZE`] bytes, the mapping's last): after
    /// the thread slots, page-aligned; no header field.
    pub agg_offset: usize,
    /// Offset of the capture table ([`crate::capture`],
    /// [`crate::capture::CAPTURE_REGION_SIZE`] bytes, the mapping's last):
    /// after the aggregation region; no header field.
    pub capture_offset: usize,
    /// Offset of the event array inside a thread slot.
    pub events_offset: usize,
    /// Total bytes of the mapping.
    pub total_size: usize,
    /// Shift for [`site_hash`].
    pub site_shift: u32,
    /// log2 of `params.event_size` (slot `i` is at `i << event_shift`).
    pub event_shift: u32,
}

const fn align_up(x: usize, a: usize) -> Option<usize> {
    match x.checked_add(a - 1) {
        Some(v) => Some(v & !(a - 1)),
        None => None,
    }
}

/// Upper bound on any count in [`Params`] (keeps every product within usize).
const MAX_COUNT: u32 = 1 << 24;

impl Layout {
    /// Computes the layout for `params`, refusing sizes that are not powers
    /// of two where required, zero, or absurdly large.
    pub fn new(params: Params) -> Result<Layout, AbiError> {
        let p = params;
        let pow2 = |v: u32| v >= 2 && v.is_power_of_two() && v <= MAX_COUNT;
        if !pow2(p.n_site_slots) || !pow2(p.ring_capacity) {
            return Err(AbiError::BadParams(
                "n_site_slots and ring_capacity must be powers of two in 2..=2^24",
            ));
        }
        if p.n_probes == 0 || p.n_probes > MAX_COUNT || p.n_threads == 0 || p.n_threads > 1 << 16 {
            return Err(AbiError::BadParams(
                "n_probes in 1..=2^24, n_threads in 1..=65536",
            ));
        }
        if p.event_size != EVENT_SIZE_COMPACT && p.event_size != EVENT_SIZE_FULL {
            return Err(AbiError::BadParams("event_size must be 32 or 64"));
        }
        let overflow = AbiError::BadParams("sizes overflow");
        let sites_offset = PAGE;
        let sites_bytes = p.n_site_slots as usize * size_of::<SiteSlot>();
        let counters_offset = align_up(sites_offset + sites_bytes, 64).ok_or(overflow)?;
        let counters_bytes = p.n_probes as usize * 8;
        let missed_offset = align_up(counters_offset + counters_bytes, 64).ok_or(overflow)?;
        let traps_offset = align_up(missed_offset + counters_bytes, PAGE).ok_or(overflow)?;
        let ledger_offset = align_up(traps_offset + TRAP_TABLE_SIZE, PAGE).ok_or(overflow)?;
        let ledger_bytes = size_of::<LedgerCtl>() + ledger_capacity(&p) * size_of::<LedgerEntry>();
        let threads_offset = align_up(ledger_offset + ledger_bytes, PAGE).ok_or(overflow)?;
        let events_offset =
            align_up(THREAD_COUNTERS_OFFSET + counters_bytes, 64).ok_or(overflow)?;
        let ring_bytes = p.ring_capacity as usize * p.event_size as usize;
        let thread_stride = align_up(events_offset + ring_bytes, 64).ok_or(overflow)?;
        let agg_offset = thread_stride
            .checked_mul(p.n_threads as usize)
            .and_then(|t| t.checked_add(threads_offset))
            .and_then(|t| align_up(t, PAGE))
            .ok_or(overflow)?;
        let capture_offset =
            align_up(agg_offset + crate::agg::AGG_REGION_SIZE, PAGE).ok_or(overflow)?;
        let total = capture_offset
            .checked_add(crate::capture::CAPTURE_REGION_SIZE)
            .ok_or(overflow)?;
        Ok(Layout {
            params,
            sites_offset,
            counters_offset,
            missed_offset,
            traps_offset,
            ledger_offset,
            threads_offset,
            thread_stride,
            agg_offset,
            capture_offset,
            events_offset,
            total_size: total,
            site_shift: 64 - p.n_site_slots.trailing_zeros(),
            event_shift: p.event_size.trailing_zeros(),
        })
    }

    /// Checks that a header describes exactly this crate's layout and fits
    /// in `len` bytes, returning the layout recomputed from its parameters.
    pub fn from_header(h: &HeaderFields, len: usize) -> Result<Layout, AbiError> {
        if h.magic != MAGIC {
            return Err(AbiError::BadMagic(h.magic));
        }
        if h.version != VERSION {
            return Err(AbiError::Version {
                found: h.version,
                expected: VERSION,
            });
        }
        if h.header_size as usize != HEADER_SIZE {
            return Err(AbiError::Inconsistent("header_size"));
        }
        let l = Layout::new(Params {
            n_probes: h.n_probes,
            n_site_slots: h.n_site_slots,
            n_threads: h.n_threads,
            ring_capacity: h.ring_capacity,
            event_size: h.event_size,
        })?;
        if h.total_size != l.total_size as u64
            || h.sites_offset != l.sites_offset as u64
            || h.counters_offset != l.counters_offset as u64
            || h.missed_offset != l.missed_offset as u64
            || h.traps_offset != l.traps_offset as u64
            || h.threads_offset != l.threads_offset as u64
            || h.thread_stride != l.thread_stride as u64
        {
            return Err(AbiError::Inconsistent(
                "offsets differ from the ones the parameters give",
            ));
        }
        if l.total_size > len {
            return Err(AbiError::TooSmall {
                needed: l.total_size,
                len,
            });
        }
        Ok(l)
    }
}

/// A copy of the plain fields of a [`Header`], read once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderFields {
    /// See [`Header::magic`].
    pub magic: u64,
    /// See [`Header::version`].
    pub version: u32,
    /// See [`Header::header_size`].
    pub header_size: u32,
    /// See [`Header::total_size`].
    pub total_size: u64,
    /// See [`Header::n_probes`].
    pub n_probes: u32,
    /// See [`Header::n_site_slots`].
    pub n_site_slots: u32,
    /// See [`Header::n_threads`].
    pub n_threads: u32,
    /// See [`Header::ring_capacity`].
    pub ring_capacity: u32,
    /// See [`Header::sites_offset`].
    pub sites_offset: u64,
    /// See [`Header::counters_offset`].
    pub counters_offset: u64,
    /// See [`Header::missed_offset`].
    pub missed_offset: u64,
    /// See [`Header::traps_offset`].
    pub traps_offset: u64,
    /// See [`Header::threads_offset`].
    pub threads_offset: u64,
    /// See [`Header::thread_stride`].
    pub thread_stride: u64,
    /// See [`Header::event_size`].
    pub event_size: u32,
}

/// Converts raw TSC values to `CLOCK_MONOTONIC` nanoseconds from two
/// (tsc, ns) pairs taken on the same machine (e.g. the agent's
/// [`Header::calib_tsc`]/[`Header::calib_ns`] and one the tracer takes at the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TscCalibration {
    /// First pair: TSC.
    pub tsc0: u64,
    /// First pair: ns.
    pub ns0: u64,
    /// Second pair: TSC (must differ from `tsc0`).
    pub tsc1: u64,
    /// Second pair: ns.
    pub ns1: u64,
}

impl TscCalibration {
    /// The nanosecond time of `tsc` (linear interpolation; `None` when the
    /// two pairs have the same TSC or the result does not fit).
    pub fn to_ns(&self, tsc: u64) -> Option<u64> {
        let dt = self.tsc1 as i128 - self.tsc0 as i128;
        if dt == 0 {
            return None;
        }
        let dn = self.ns1 as i128 - self.ns0 as i128;
        let v = self.ns0 as i128 + (tsc as i128 - self.tsc0 as i128) * dn / dt;
        u64::try_from(v).ok()
    }

    /// TSC ticks per second according to the two pairs.
    pub fn ticks_per_sec(&self) -> Option<u64> {
        let dn = self.ns1.checked_sub(self.ns0)?;
        if dn == 0 {
            return None;
        }
        let dt = self.tsc1.checked_sub(self.tsc0)? as u128;
        u64::try_from(dt * 1_000_000_000 / dn as u128).ok()
    }
}
