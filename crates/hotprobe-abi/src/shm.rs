//! [`Shm`]: a validated view of one mapping, used by both sides.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{
    site_hash, site_index, slot_values, Header, HeaderFields, InprocSite, Layout, Params, RingCtl,
    SiteSlot, TrapRegion, TrapReturn, TrapSlot, HEADER_SIZE, INPROC_COUNT, INPROC_OFFSET,
    INPROC_SITES, MAGIC, THREAD_COUNTERS_OFFSET, TRAP_PRESENT, TRAP_REGIONS, TRAP_RETURNS,
    TRAP_RETURNS_OFFSET, TRAP_SLOTS, TRAP_SLOTS_OFFSET, VERSION,
};
use crate::layout::{HandlerCtl, HandlerSlot, HANDLER_OFFSET, HANDLER_SLOTS};
use crate::ring::{Consumer, Producer};
use crate::AbiError;

mod chunks;
mod ledger;
pub use chunks::{
    growable_file_len, SlotDirectory, DEFAULT_CHUNK_SLOTS, MAX_SLOTS, MAX_SLOT_CHUNKS,
    SLOT_DIRECTORY_OFFSET,
};
pub use ledger::LedgerSite;

/// A validated view of a hotprobe shared-memory mapping.
///
/// Every access after construction goes through atomics or volatile copies,
/// with offsets taken from the [`Layout`] copied at construction (the other
/// side can scribble on the header without making this view read out of
/// bounds).
#[derive(Debug)]
pub struct Shm {
    base: NonNull<u8>,
    len: usize,
    layout: Layout,
    /// The thread-slot chunks past the main layout's (see `chunks`).
    chunks: chunks::Chunks,
}

// SAFETY: all shared state is accessed through atomics or volatile copies;
// the raw pointer is only an address inside a mapping that outlives the view
// (the contract of `create`/`attach`).
unsafe impl Send for Shm {}
// SAFETY: as above; `&Shm` methods are safe to call from several threads
// (producers and consumers take per-ring exclusivity through `unsafe push` /
// `&mut Consumer`).
unsafe impl Sync for Shm {}

impl Shm {
    /// Writes a fresh header for `params` into `ptr` (tracer side). The
    /// mapping must be zero-filled (a new memfd or file is); the magic is
    /// written last.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, 4096-aligned,
    /// for as long as the returned view (and anything borrowed from it) lives,
    /// and no other party may use the memory until this returns.
    pub unsafe fn create(ptr: *mut u8, len: usize, params: Params) -> Result<Shm, AbiError> {
        let layout = Layout::new(params)?;
        let base = NonNull::new(ptr).ok_or(AbiError::Null)?;
        if (ptr as usize) & 63 != 0 {
            return Err(AbiError::Misaligned);
        }
        if layout.total_size > len {
            return Err(AbiError::TooSmall {
                needed: layout.total_size,
                len,
            });
        }
        let h = ptr as *mut Header;
        // SAFETY: `ptr` is valid and exclusively ours for len >= HEADER_SIZE
        // bytes (caller contract, checked size) and aligned (checked); the
        // fields are plain integers written through raw field pointers.
        unsafe {
            core::ptr::addr_of_mut!((*h).version).write(VERSION);
            core::ptr::addr_of_mut!((*h).header_size).write(HEADER_SIZE as u32);
            core::ptr::addr_of_mut!((*h).total_size).write(layout.total_size as u64);
            core::ptr::addr_of_mut!((*h).n_probes).write(params.n_probes);
            core::ptr::addr_of_mut!((*h).n_site_slots).write(params.n_site_slots);
            core::ptr::addr_of_mut!((*h).n_threads).write(params.n_threads);
            core::ptr::addr_of_mut!((*h).ring_capacity).write(params.ring_capacity);
            core::ptr::addr_of_mut!((*h).sites_offset).write(layout.sites_offset as u64);
            core::ptr::addr_of_mut!((*h).counters_offset).write(layout.counters_offset as u64);
            core::ptr::addr_of_mut!((*h).missed_offset).write(layout.missed_offset as u64);
            core::ptr::addr_of_mut!((*h).traps_offset).write(layout.traps_offset as u64);
            core::ptr::addr_of_mut!((*h).threads_offset).write(layout.threads_offset as u64);
            core::ptr::addr_of_mut!((*h).thread_stride).write(layout.thread_stride as u64);
            core::ptr::addr_of_mut!((*h).event_size).write(params.event_size);
            core::ptr::addr_of_mut!((*h).stub_key).write(new_stub_key());
            // The ledger's control block lies inside the mapping too
            // (layout.ledger_offset + 64 <= total_size <= len), page-aligned.
            let ledger = ptr.add(layout.ledger_offset) as *mut crate::LedgerCtl;
            core::ptr::addr_of_mut!((*ledger).capacity)
                .write(crate::ledger_capacity(&params) as u32);
            core::ptr::addr_of_mut!((*h).magic).write_volatile(MAGIC);
        }
        Ok(Shm {
            base,
            len,
            layout,
            chunks: chunks::Chunks::none(params.n_threads),
        })
    }

    /// Validates the header of an existing mapping (agent side, or a tracer
    /// re-opening one).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as
    /// the returned view (and anything borrowed from it) lives.
    pub unsafe fn attach(ptr: *mut u8, len: usize) -> Result<Shm, AbiError> {
        let base = NonNull::new(ptr).ok_or(AbiError::Null)?;
        if (ptr as usize) & 63 != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < HEADER_SIZE {
            return Err(AbiError::TooSmall {
                needed: HEADER_SIZE,
                len,
            });
        }
        let h = ptr as *const Header;
        // SAFETY: valid for HEADER_SIZE bytes (checked) and aligned (checked);
        // plain integer fields copied with volatile reads.
        let f = unsafe {
            HeaderFields {
                magic: core::ptr::addr_of!((*h).magic).read_volatile(),
                version: core::ptr::addr_of!((*h).version).read_volatile(),
                header_size: core::ptr::addr_of!((*h).header_size).read_volatile(),
                total_size: core::ptr::addr_of!((*h).total_size).read_volatile(),
                n_probes: core::ptr::addr_of!((*h).n_probes).read_volatile(),
                n_site_slots: core::ptr::addr_of!((*h).n_site_slots).read_volatile(),
                n_threads: core::ptr::addr_of!((*h).n_threads).read_volatile(),
                ring_capacity: core::ptr::addr_of!((*h).ring_capacity).read_volatile(),
                sites_offset: core::ptr::addr_of!((*h).sites_offset).read_volatile(),
                counters_offset: core::ptr::addr_of!((*h).counters_offset).read_volatile(),
                missed_offset: core::ptr::addr_of!((*h).missed_offset).read_volatile(),
                traps_offset: core::ptr::addr_of!((*h).traps_offset).read_volatile(),
                threads_offset: core::ptr::addr_of!((*h).threads_offset).read_volatile(),
                thread_stride: core::ptr::addr_of!((*h).thread_stride).read_volatile(),
                event_size: core::ptr::addr_of!((*h).event_size).read_volatile(),
            }
        };
        let layout = Layout::from_header(&f, len)?;
        // A growable memory's view covers what the tracer mapped at
        // creation; its chunks are mapped apart (see `chunks`).
        let (chunks, len) = Shm::read_chunks(ptr, &layout, len)?;
        Ok(Shm {
            base,
            len,
            layout,
            chunks,
        })
    }

    /// [`Header::stub_key`] of this memory (see
    /// [`crate::fast::ThreadBlock::stub_key`]).
    pub fn stub_key(&self) -> u32 {
        // SAFETY: the mapping holds a header (validated); a plain u32 field.
        unsafe {
            core::ptr::addr_of!((*(self.base.as_ptr() as *const Header)).stub_key).read_volatile()
        }
    }

    /// The validated layout.
    #[inline(always)]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a valid mapping holds at least a header).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Base address of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The header. Only its atomic fields change after creation.
    #[inline(always)]
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping holds a header at offset 0 (validated), aligned.
        unsafe { &*(self.base.as_ptr() as *const Header) }
    }

    /// The site table.
    #[inline(always)]
    pub fn sites(&self) -> &[SiteSlot] {
        // SAFETY: the layout was validated against `len`; SiteSlot is all
        // atomics, so shared references to concurrently written memory are fine.
        unsafe {
            core::slice::from_raw_parts(
                self.base.as_ptr().add(self.layout.sites_offset) as *const SiteSlot,
                self.layout.params.n_site_slots as usize,
            )
        }
    }

    /// Finds the site whose key (return address) is `key`: `(probe_id, action)`.
    /// O(1) expected (linear probing, bounded by the table size).
    #[inline(always)]
    pub fn lookup_site(&self, key: u64) -> Option<(u32, u32)> {
        let sites = self.sites();
        let mask = sites.len() - 1;
        let mut i = site_index(key);
        let mut n = 0;
        while n < sites.len() {
            let s = sites.get(i & mask)?;
            // Acquire pairs with the Release store of `key` in `insert_site`:
            // probe_id and action are written before the key is published.
            let k = s.key.load(Acquire);
            if k == key {
                return Some((s.probe_id.load(Relaxed), s.action.load(Relaxed)));
            }
            if k == 0 {
                return None;
            }
            i = i.wrapping_add(1);
            n += 1;
        }
        None
    }

    /// Adds a site (tracer side; the tracer is the table's only writer), or
    /// updates its probe id and action when the key is already present.
    pub fn insert_site(&self, key: u64, probe_id: u32, action: u32) -> Result<(), AbiError> {
        if key == 0 {
            return Err(AbiError::BadParams(
                "site key 0 is reserved for empty slots",
            ));
        }
        if probe_id >= self.layout.params.n_probes {
            return Err(AbiError::ProbeOutOfRange(probe_id));
        }
        let sites = self.sites();
        let mask = sites.len() - 1;
        let mut i = site_index(key);
        for _ in 0..sites.len() {
            let s = &sites[i & mask];
            let k = s.key.load(Relaxed);
            if k == key || k == 0 {
                s.probe_id.store(probe_id, Relaxed);
                s.action.store(action, Relaxed);
                // Release pairs with the agent's `key.load(Acquire)` in
                // `lookup_site`: it sees probe_id/action once it sees the key.
                s.key.store(key, Release);
                return Ok(());
            }
            i = i.wrapping_add(1);
        }
        Err(AbiError::SiteTableFull)
    }

    /// Changes the action bits of an existing site (0 disables it).
    pub fn set_site_action(&self, key: u64, action: u32) -> Result<(), AbiError> {
        let sites = self.sites();
        let mask = sites.len() - 1;
        let mut i = site_index(key);
        for _ in 0..sites.len() {
            let s = &sites[i & mask];
            let k = s.key.load(Relaxed);
            if k == key {
                s.action.store(action, Relaxed);
                return Ok(());
            }
            if k == 0 {
                break;
            }
            i = i.wrapping_add(1);
        }
        Err(AbiError::NoSuchSite(key))
    }

    /// Global counters (hits of threads that have no thread slot).
    #[inline(always)]
    pub fn global_counters(&self) -> &[AtomicU64] {
        // SAFETY: validated layout; atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.base.as_ptr().add(self.layout.counters_offset) as *const AtomicU64,
                self.layout.params.n_probes as usize,
            )
        }
    }

    /// The per-probe missed counters ([`Header::missed_offset`]).
    #[inline(always)]
    pub fn missed_counters(&self) -> &[AtomicU64] {
        // SAFETY: validated layout; atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.base.as_ptr().add(self.layout.missed_offset) as *const AtomicU64,
                self.layout.params.n_probes as usize,
            )
        }
    }

    /// Events of `probe_id` that were not written (see
    /// [`Header::missed_offset`]).
    pub fn missed(&self, probe_id: u32) -> u64 {
        self.missed_counters()
            .get(probe_id as usize)
            .map_or(0, |c| c.load(Relaxed))
    }

    /// Counts one event of `probe_id` not written (agent side; a locked
    /// add, safe against a signal handler on the same thread).
    #[inline]
    pub fn note_missed(&self, probe_id: u32) {
        if let Some(c) = self.missed_counters().get(probe_id as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    #[inline(always)]
    fn thread_base(&self, slot: u32) -> Option<*mut u8> {
        if slot >= self.layout.params.n_threads {
            return self.chunk_slot(slot);
        }
        // SAFETY: slot < n_threads, so the slot lies inside the validated mapping.
        Some(unsafe {
            self.base
                .as_ptr()
                .add(self.layout.threads_offset + slot as usize * self.layout.thread_stride)
        })
    }

    /// The ring control block of thread slot `slot`.
    #[inline(always)]
    pub fn ring_ctl(&self, slot: u32) -> Option<&RingCtl> {
        // SAFETY: in bounds (thread_base), 64-aligned (layout), all atomics.
        self.thread_base(slot)
            .map(|p| unsafe { &*(p as *const RingCtl) })
    }

    /// The per-thread counter array of thread slot `slot` (single writer:
    /// the owning thread; read by the tracer).
    #[inline(always)]
    pub fn thread_counters(&self, slot: u32) -> Option<&[AtomicU64]> {
        // SAFETY: in bounds (thread_base, layout), 8-aligned, atomics.
        self.thread_base(slot).map(|p| unsafe {
            core::slice::from_raw_parts(
                p.add(THREAD_COUNTERS_OFFSET) as *const AtomicU64,
                self.layout.params.n_probes as usize,
            )
        })
    }

    #[inline(always)]
    fn events(&self, slot: u32) -> Option<*mut u8> {
        // SAFETY: in bounds per layout.
        self.thread_base(slot)
            .map(|p| unsafe { p.add(self.layout.events_offset) })
    }

    /// Address of the first event slot of thread slot `slot`'s ring (slots
    /// of [`Layout::params`]`.event_size` bytes, 64-byte aligned).
    #[inline(always)]
    pub fn ring_events(&self, slot: u32) -> Option<*mut u8> {
        self.events(slot)
    }

    /// The producing side of thread slot `slot`'s ring.
    #[inline(always)]
    pub fn producer(&self, slot: u32) -> Option<Producer<'_>> {
        Some(Producer {
            ctl: self.ring_ctl(slot)?,
            events: self.events(slot)?,
            mask: self.layout.params.ring_capacity as u64 - 1,
            shift: self.layout.event_shift,
            values: slot_values(self.layout.params.event_size),
        })
    }

    /// The consuming side of thread slot `slot`'s ring (use one consumer per
    /// ring at a time).
    pub fn consumer(&self, slot: u32) -> Option<Consumer<'_>> {
        Some(Consumer {
            ctl: self.ring_ctl(slot)?,
            events: self.events(slot)?,
            mask: self.layout.params.ring_capacity as u64 - 1,
            shift: self.layout.event_shift,
            values: slot_values(self.layout.params.event_size),
        })
    }

    /// Number of thread slots handed out so far (≤ [`Shm::slot_capacity`];
    /// a slot handed out may have been recycled since, see `slots`).
    pub fn threads_in_use(&self) -> u32 {
        self.header()
            .threads_claimed
            .load(Acquire)
            .min(self.slot_capacity())
    }

    /// The hit count of `probe_id`: the global counter plus every thread
    /// slot's counter (exact once the target's threads are quiescent).
    pub fn counter(&self, probe_id: u32) -> u64 {
        let i = probe_id as usize;
        let mut sum = self.global_counters().get(i).map_or(0, |c| c.load(Relaxed));
        for t in 0..self.threads_in_use() {
            if let Some(c) = self.thread_counters(t).and_then(|c| c.get(i)) {
                sum = sum.wrapping_add(c.load(Relaxed));
            }
        }
        sum
    }

    /// Every event lost so far: full rings, threads without a slot, and
    /// events refused on re-entry ([`RingCtl::refused`]).
    pub fn total_drops(&self) -> u64 {
        let mut sum = self.header().drops_no_thread.load(Relaxed);
        for t in 0..self.threads_in_use() {
            if let Some(c) = self.ring_ctl(t) {
                sum = sum
                    .wrapping_add(c.dropped.load(Relaxed))
                    .wrapping_add(c.refused.load(Relaxed));
            }
        }
        sum
    }
}

/// A fresh [`Header::stub_key`]: non-zero, below 2^31, from the TSC (two
/// creations are microseconds apart at least) mixed so that close values
/// differ in many bits.
fn new_stub_key() -> u32 {
    static SALT: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
    let salt = SALT.fetch_add(1, Relaxed) as u64;
    let k = (crate::rdtsc() ^ salt << 48).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
    (k as u32).max(1)
}

/// The trap table ([`crate::Header::traps_offset`]): the tracer publishes
/// its `int3`s, its out-of-line memory and its live return instances; the
/// agent reads them when a `SIGTRAP` reaches it after the tracer died.
impl Shm {
    fn traps_base(&self) -> *mut u8 {
        // SAFETY: the validated layout puts the table inside the mapping.
        unsafe { self.base.as_ptr().add(self.layout.traps_offset) }
    }

    /// The breakpoint part of the table.
    pub fn trap_slots(&self) -> &[TrapSlot] {
        // SAFETY: in bounds (layout), aligned, all atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.traps_base().add(TRAP_SLOTS_OFFSET) as *const TrapSlot,
                TRAP_SLOTS,
            )
        }
    }

    /// The return-instance part of the table.
    pub fn trap_returns(&self) -> &[TrapReturn] {
        // SAFETY: in bounds (layout), aligned, all atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.traps_base().add(TRAP_RETURNS_OFFSET) as *const TrapReturn,
                TRAP_RETURNS,
            )
        }
    }

    /// The region part of the table.
    pub fn trap_regions(&self) -> &[TrapRegion] {
        // SAFETY: in bounds (layout), aligned, all atomics.
        unsafe { core::slice::from_raw_parts(self.traps_base() as *const TrapRegion, TRAP_REGIONS) }
    }

    fn trap_slot(&self, addr: u64, insert: bool) -> Option<&TrapSlot> {
        let slots = self.trap_slots();
        let shift = 64 - TRAP_SLOTS.trailing_zeros();
        let mut i = site_hash(addr, shift);
        for _ in 0..slots.len() {
            let s = slots.get(i & (slots.len() - 1))?;
            // Acquire pairs with the Release store of `addr` below.
            let k = s.addr.load(Acquire);
            if k == addr || (k == 0 && insert) {
                return Some(s);
            }
            if k == 0 {
                return None;
            }
            i = i.wrapping_add(1);
        }
        None
    }

    /// Publishes the `int3` at `addr` over `orig` (tracer side, the only
    /// writer); `flags`: [`crate::TRAP_RETURN`], [`crate::TRAP_GUARD`].
    /// False when the table is full.
    pub fn publish_trap(&self, addr: u64, orig: u8, flags: u32) -> bool {
        if addr == 0 {
            return false;
        }
        let Some(s) = self.trap_slot(addr, true) else {
            return false;
        };
        let info = orig as u32 | TRAP_PRESENT | (flags & !0x1ff);
        s.info.store(info, Relaxed);
        // Release pairs with the Acquire load in `trap_slot`: the info is
        // seen with the key.
        s.addr.store(addr, Release);
        true
    }

    /// Takes the `int3` at `addr` out of the table (tracer side).
    pub fn unpublish_trap(&self, addr: u64) {
        if let Some(s) = self.trap_slot(addr, false) {
            s.info.fetch_and(!TRAP_PRESENT, Relaxed);
        }
    }

    /// The published `int3` at `addr`: `(original byte, flags)` (see
    /// [`Shm::publish_trap`]). Only atomics: callable from a signal handler.
    pub fn lookup_trap(&self, addr: u64) -> Option<(u8, u32)> {
        let s = self.trap_slot(addr, false)?;
        let info = s.info.load(Relaxed);
        (info & TRAP_PRESENT != 0).then_some((info as u8, info & !0x1ff))
    }

    /// Whether any `int3` was ever published.
    pub fn any_trap_published(&self) -> bool {
        self.trap_slots().iter().any(|s| s.addr.load(Relaxed) != 0)
    }

    /// Publishes the out-of-line regions (tracer side), replacing the
    /// previous list (at most [`TRAP_REGIONS`]).
    pub fn set_trap_regions(&self, regions: &[(u64, u64)]) {
        for (i, r) in self.trap_regions().iter().enumerate() {
            let (start, end) = regions.get(i).copied().unwrap_or((0, 0));
            r.end.store(0, Relaxed);
            r.start.store(start, Relaxed);
            r.end.store(end, Release);
        }
    }

    /// Whether `addr` lies in a published out-of-line region.
    pub fn in_trap_region(&self, addr: u64) -> bool {
        self.trap_regions().iter().any(|r| {
            let end = r.end.load(Acquire);
            addr >= r.start.load(Relaxed) && addr < end
        })
    }

    /// Publishes a trap return instance (tracer side, the thread stopped):
    /// replaces the thread's entry for the same slot, else takes a free
    /// entry, else one of the thread's entries below `slot` (frames it left:
    /// its stack pointer is above them now), else one chosen by the key.
    pub fn publish_return(&self, tid: u32, slot: u64, real: u64) -> bool {
        if tid == 0 {
            return false;
        }
        let rets = self.trap_returns();
        let mine = |r: &&TrapReturn| r.tid.load(Relaxed) == tid;
        let e = rets
            .iter()
            .find(|r| mine(r) && r.slot.load(Relaxed) == slot)
            .or_else(|| rets.iter().find(|r| r.tid.load(Relaxed) == 0))
            .or_else(|| rets.iter().find(|r| mine(r) && r.slot.load(Relaxed) < slot))
            .or_else(|| {
                // Full: evict an entry chosen by the key.
                let i = site_hash(slot ^ u64::from(tid), 64 - TRAP_RETURNS.trailing_zeros());
                rets.get(i % rets.len())
            });
        let Some(e) = e else { return false };
        e.tid.store(0, Relaxed);
        e.slot.store(slot, Relaxed);
        e.real.store(real, Relaxed);
        // Release pairs with the Acquire load in `find_return`.
        e.tid.store(tid, Release);
        true
    }

    /// Removes the trap return instance of `tid` at `slot` (tracer side),
    /// or, agent side, the one the agent just used.
    pub fn remove_return(&self, tid: u32, slot: u64) {
        for r in self.trap_returns() {
            if r.tid.load(Relaxed) == tid && r.slot.load(Relaxed) == slot {
                r.tid.store(0, Relaxed);
            }
        }
    }

    /// Removes every trap return instance (tracer side, after it put the
    /// real return addresses back).
    pub fn clear_returns(&self) {
        for r in self.trap_returns() {
            r.tid.store(0, Relaxed);
        }
    }

    /// The real return address of thread `tid`'s trap return instance at
    /// `slot`. Only atomics: callable from a signal handler.
    pub fn find_return(&self, tid: u32, slot: u64) -> Option<u64> {
        self.trap_returns().iter().find_map(|r| {
            // Acquire pairs with the Release store of `tid` in `publish_return`.
            (r.tid.load(Acquire) == tid && r.slot.load(Relaxed) == slot)
                .then(|| r.real.load(Relaxed))
        })
    }
}

/// The in-process trap table (end of the trap table, see [`InprocSite`]).
impl Shm {
    /// Every entry of the in-process trap table.
    pub fn inproc_sites(&self) -> &[InprocSite] {
        // SAFETY: in bounds (layout: the table ends the trap table),
        // aligned, all atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.traps_base().add(INPROC_OFFSET) as *const InprocSite,
                INPROC_SITES,
            )
        }
    }

    fn inproc_slot(&self, addr: u64, insert: bool) -> Option<&InprocSite> {
        let slots = self.inproc_sites();
        let shift = 64 - INPROC_SITES.trailing_zeros();
        let mut i = site_hash(addr, shift);
        for _ in 0..slots.len() {
            let s = slots.get(i & (slots.len() - 1))?;
            // Acquire pairs with the Release store of `addr` in `publish_inproc`.
            let k = s.addr.load(Acquire);
            if k == addr || (k == 0 && insert) {
                return Some(s);
            }
            if k == 0 {
                return None;
            }
            i = i.wrapping_add(1);
        }
        None
    }

    /// Publishes an in-process trap at `addr` (tracer side, the only
    /// writer), before the `int3` is written: `info` is the execution kind
    /// ([`INPROC_BOOST`], [`INPROC_RET`], [`INPROC_CALL`]) with
    /// [`INPROC_COUNT`]. Republishing an address replaces its entry. False
    /// when the table is full.
    pub fn publish_inproc(
        &self,
        addr: u64,
        counter: u32,
        info: u32,
        resume: u64,
        next: u64,
    ) -> bool {
        if addr == 0 {
            return false;
        }
        let Some(s) = self.inproc_slot(addr, true) else {
            return false;
        };
        s.resume.store(resume, Relaxed);
        s.next.store(next, Relaxed);
        s.counter.store(counter, Relaxed);
        s.info.store(info, Relaxed);
        // Release pairs with the Acquire load in `inproc_slot`: the fields
        // are seen with the key.
        s.addr.store(addr, Release);
        true
    }

    /// Stops counting the in-process trap at `addr` (tracer side, at
    /// detach); the entry stays so that a pending `SIGTRAP` still resumes
    /// the thread correctly.
    pub fn quiet_inproc(&self, addr: u64) {
        if let Some(s) = self.inproc_slot(addr, false) {
            s.info.fetch_and(!INPROC_COUNT, Relaxed);
        }
    }

    /// Sets (`on`) or clears the `bits` of the in-process trap at `addr`'s
    /// info (tracer side): [`crate::INPROC_COUNT`] and
    /// [`crate::INPROC_HANDLER`] enable and disable it; the `int3` stays.
    pub fn set_inproc_bits(&self, addr: u64, bits: u32, on: bool) {
        if let Some(s) = self.inproc_slot(addr, false) {
            if on {
                s.info.fetch_or(bits, Relaxed);
            } else {
                s.info.fetch_and(!bits, Relaxed);
            }
        }
    }

    /// The in-process trap at `addr`: `(counter, info, resume, next)`.
    /// Only atomics: callable from a signal handler.
    pub fn lookup_inproc(&self, addr: u64) -> Option<(u32, u32, u64, u64)> {
        let s = self.inproc_slot(addr, false)?;
        Some((
            s.counter.load(Relaxed),
            s.info.load(Relaxed),
            s.resume.load(Relaxed),
            s.next.load(Relaxed),
        ))
    }
}

/// The shared-memory handler area (see [`HandlerSlot`]).
impl Shm {
    /// The control words.
    pub fn handler_ctl(&self) -> &HandlerCtl {
        // SAFETY: in bounds (layout), 64-byte aligned (the trap table is
        // page-aligned, every part before is a multiple of 64), all atomics.
        unsafe { &*(self.traps_base().add(HANDLER_OFFSET) as *const HandlerCtl) }
    }

    /// Every slot.
    pub fn handler_slots(&self) -> &[HandlerSlot] {
        // SAFETY: in bounds (layout), aligned as above, all atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.traps_base()
                    .add(HANDLER_OFFSET + core::mem::size_of::<HandlerCtl>())
                    as *const HandlerSlot,
                HANDLER_SLOTS,
            )
        }
    }
}
