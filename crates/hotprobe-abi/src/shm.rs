//! [`Shm`]: a validated view of one mapping, used by both sides.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{
    site_hash, slot_values, Header, HeaderFields, Layout, Params, RingCtl, SiteSlot, HEADER_SIZE,
    MAGIC, THREAD_COUNTERS_OFFSET, VERSION,
};
use crate::ring::{Consumer, Producer};
use crate::AbiError;

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
            core::ptr::addr_of_mut!((*h).threads_offset).write(layout.threads_offset as u64);
            core::ptr::addr_of_mut!((*h).thread_stride).write(layout.thread_stride as u64);
            core::ptr::addr_of_mut!((*h).event_size).write(params.event_size);
            core::ptr::addr_of_mut!((*h).stub_key).write(new_stub_key());
            core::ptr::addr_of_mut!((*h).magic).write_volatile(MAGIC);
        }
        Ok(Shm { base, len, layout })
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
                threads_offset: core::ptr::addr_of!((*h).threads_offset).read_volatile(),
                thread_stride: core::ptr::addr_of!((*h).thread_stride).read_volatile(),
                event_size: core::ptr::addr_of!((*h).event_size).read_volatile(),
            }
        };
        let layout = Layout::from_header(&f, len)?;
        Ok(Shm { base, len, layout })
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
        let mut i = site_hash(key, self.layout.site_shift);
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
        let mut i = site_hash(key, self.layout.site_shift);
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
        let mut i = site_hash(key, self.layout.site_shift);
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

    #[inline(always)]
    fn thread_base(&self, slot: u32) -> Option<*mut u8> {
        if slot >= self.layout.params.n_threads {
            return None;
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

    /// Number of thread slots handed out so far (≤ `n_threads`).
    pub fn threads_in_use(&self) -> u32 {
        self.header()
            .threads_claimed
            .load(Acquire)
            .min(self.layout.params.n_threads)
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

    /// Every event lost so far: full rings plus threads without a slot.
    pub fn total_drops(&self) -> u64 {
        let mut sum = self.header().drops_no_thread.load(Relaxed);
        for t in 0..self.threads_in_use() {
            if let Some(c) = self.ring_ctl(t) {
                sum = sum.wrapping_add(c.dropped.load(Relaxed));
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

impl Shm {
    /// Claims the next free thread slot for thread `tid` of an unnamed
    /// process ([`RingCtl::owner_pid`] 0: the header's `agent_pid`); see
    /// [`Shm::claim_thread_for`].
    pub fn claim_thread(&self, tid: u32) -> Option<u32> {
        self.claim_thread_for(0, tid)
    }

    /// Claims the next free thread slot for thread `tid` of process `pid`
    /// (agent side, first hit of a thread). Slots are handed out once,
    /// never reused. Only atomics: callable from the agent's hot path.
    #[inline]
    pub fn claim_thread_for(&self, pid: u32, tid: u32) -> Option<u32> {
        // Relaxed: the counter only hands out distinct indices.
        let slot = self.header().threads_claimed.fetch_add(1, Relaxed);
        let ctl = self.ring_ctl(slot)?;
        ctl.owner_tid.store(tid, Relaxed);
        ctl.owner_pid.store(pid, Relaxed);
        // Release pairs with the tracer's `state.load(Acquire)` (thread
        // listing): it sees owner_pid/owner_tid once it sees LIVE.
        ctl.state.store(crate::layout::THREAD_LIVE, Release);
        Some(slot)
    }

    /// `(owner_pid, owner_tid)` of thread slot `slot` once it was claimed
    /// (`None` before, or out of range). `owner_pid` 0 means the header's
    /// `agent_pid`, which is returned in its place.
    pub fn thread_owner(&self, slot: u32) -> Option<(u32, u32)> {
        let ctl = self.ring_ctl(slot)?;
        // Acquire pairs with the Release store of LIVE in `claim_thread_for`.
        if ctl.state.load(Acquire) == crate::layout::THREAD_FREE {
            return None;
        }
        let pid = match ctl.owner_pid.load(Relaxed) {
            0 => self.header().agent_pid.load(Relaxed),
            p => p,
        };
        Some((pid, ctl.owner_tid.load(Relaxed)))
    }
}
