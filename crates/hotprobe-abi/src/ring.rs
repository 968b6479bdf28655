//! The per-thread single-producer single-consumer ring: the agent's thread
//! produces, the tracer consumes. Lock-free, never blocks the producer: a
//! full ring drops the event and counts it in [`RingCtl::dropped`].
//!
//! `head` and `tail` are free-running u64 counters (never wrap in practice);
//! the slot of event `n` is `n & (capacity - 1)`, at byte
//! `(n & (capacity - 1)) << event_shift` of the ring (see the layout's
//! module docs for a slot's words).

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{
    pack_meta, Event, RingCtl, EVENT_HEADER_WORDS, META_FLAGS_SHIFT, META_KIND_SHIFT,
    META_NVALUES_SHIFT, META_PROBE_MASK, META_STACK_SHIFT,
};
use crate::AbiError;

/// The producing side of one ring (the owning thread in the agent).
#[derive(Debug)]
pub struct Producer<'a> {
    pub(crate) ctl: &'a RingCtl,
    pub(crate) events: *mut u8,
    pub(crate) mask: u64,
    /// log2 of the slot size.
    pub(crate) shift: u32,
    /// Values a slot holds (2 or 6).
    pub(crate) values: usize,
}

impl Producer<'_> {
    /// Appends one event, or counts a drop and returns `false` when the ring
    /// is full. `limit` is the producer's private write limit — its last
    /// copy of the consumer's `tail` plus the capacity (start it at 0) —:
    /// it is refreshed only when `head` reaches it, so the fast path never
    /// touches the consumer's cache line.
    ///
    /// Writes the slot's tsc and meta words and the event's first `nargs`
    /// values (at most what a slot holds; the rest are dropped) with
    /// volatile 8-byte stores (no vector registers are used, which the
    /// agent's trampolines rely on). `ev.tid` is not stored (the consumer
    /// reports the ring owner's).
    ///
    /// # Safety
    /// At most one producer may push to a given ring at a time (the agent
    /// guarantees it with one ring per thread and a re-entry guard).
    #[inline(always)]
    pub unsafe fn push(&self, limit: &mut u64, ev: &Event) -> bool {
        // Relaxed: only this producer writes head.
        let head = self.ctl.head.load(Relaxed);
        if head >= *limit {
            // Acquire pairs with the consumer's `tail.store(.., Release)` in
            // `Consumer::drain`: the consumer's reads of the slots it freed
            // happen before we overwrite them.
            let tail = self.ctl.tail.load(Acquire);
            if head.wrapping_sub(tail) > self.mask {
                // Relaxed load+store, not fetch_add: single writer (no lock prefix).
                let d = self.ctl.dropped.load(Relaxed);
                self.ctl.dropped.store(d.wrapping_add(1), Relaxed);
                return false;
            }
            *limit = tail.wrapping_add(self.mask + 1);
        }
        // Only the words the event uses: tsc, meta, then its values (as many
        // as it has, at most what the slot holds).
        let nv = (ev.nargs as usize).min(self.values).min(ev.args.len());
        let meta = pack_meta(ev.probe_id, ev.kind, nv as u8, ev.reserved)
            | (u64::from(ev.reserved2) << META_STACK_SHIFT);
        // SAFETY: `events` points to `mask + 1` slots of `1 << shift` bytes
        // inside the mapping (checked by `Shm::producer`), the index is
        // masked, and the slot is free (head - tail <= mask above), so the
        // consumer is not reading it. Slots are 8-aligned (64-aligned array
        // of 32- or 64-byte slots) and `2 + nv` words fit in one.
        unsafe {
            let slot = self.events.add(((head & self.mask) << self.shift) as usize) as *mut u64;
            slot.write_volatile(ev.tsc);
            slot.add(1).write_volatile(meta);
            // Constant indices only (no loop over `nv`): the event stays in
            // general registers, never copied through vector registers.
            let v = slot.add(EVENT_HEADER_WORDS);
            if nv > 0 {
                v.write_volatile(ev.args[0]);
            }
            if nv > 1 {
                v.add(1).write_volatile(ev.args[1]);
            }
            if nv > 2 {
                v.add(2).write_volatile(ev.args[2]);
            }
            if nv > 3 {
                v.add(3).write_volatile(ev.args[3]);
            }
            if nv > 4 {
                v.add(4).write_volatile(ev.args[4]);
            }
            if nv > 5 {
                v.add(5).write_volatile(ev.args[5]);
            }
        }
        // Release pairs with the consumer's `head.load(Acquire)` in
        // `Consumer::drain`: the event's words are visible before the new head.
        self.ctl.head.store(head.wrapping_add(1), Release);
        self.prefetch_ahead(head);
        true
    }

    /// Asks for the cache line [`PREFETCH_AHEAD`] bytes past event `head`'s
    /// slot (wrapping in the ring) for writing: a ring's lines are written
    /// once a lap, each a miss, and a fresh ring's (zeroed by the tracer)
    /// come from memory; the request overlaps the miss with the calls in
    /// between. `prefetchw` never faults (an unmapped page is no error)
    /// and is a no-op where unsupported.
    #[inline(always)]
    fn prefetch_ahead(&self, head: u64) {
        let ring_bytes = (self.mask + 1) << self.shift;
        let at = ((head << self.shift).wrapping_add(PREFETCH_AHEAD)) & (ring_bytes - 1);
        // SAFETY: `at` is inside the ring (masked); a prefetch reads and
        // writes nothing and never faults.
        unsafe {
            core::arch::asm!(
                "prefetchw byte ptr [{}]",
                in(reg) self.events.add(at as usize),
                options(nostack, preserves_flags, readonly)
            )
        };
    }
}

/// How far ahead of the event being written [`Producer::push`] asks for
/// the ring's next line: 4 lines (8 compact events, 4 full ones).
pub const PREFETCH_AHEAD: u64 = 256;

impl Producer<'_> {
    /// Appends `ev` preceded by the continuation events
    /// ([`crate::KIND_DATA`]) holding the bytes `fill` writes (at most
    /// `max_len`, see [`DataWriter`]), all published at once: the consumer
    /// sees the event with all its bytes or nothing of it. A ring without
    /// room for `ev` and `max_len` bytes counts one drop and returns
    /// `false` (`fill` is not called), as does a ring of compact slots.
    /// `limit` as for [`Producer::push`].
    ///
    /// # Safety
    /// As [`Producer::push`].
    #[inline(always)]
    pub unsafe fn push_with_data(
        &self,
        limit: &mut u64,
        ev: &Event,
        max_len: usize,
        fill: impl FnOnce(&mut DataWriter<'_>),
    ) -> bool {
        let head = self.ctl.head.load(Relaxed);
        let need = crate::capture::data_events(max_len) as u64 + 1;
        if self.values != 6 || need > self.mask + 1 {
            let d = self.ctl.dropped.load(Relaxed);
            self.ctl.dropped.store(d.wrapping_add(1), Relaxed);
            return false;
        }
        if head.wrapping_add(need) > *limit {
            // Acquire pairs with the consumer's Release store of `tail`.
            let tail = self.ctl.tail.load(Acquire);
            if head.wrapping_add(need).wrapping_sub(tail) > self.mask + 1 {
                let d = self.ctl.dropped.load(Relaxed);
                self.ctl.dropped.store(d.wrapping_add(1), Relaxed);
                return false;
            }
            *limit = tail.wrapping_add(self.mask + 1);
        }
        let mut w = DataWriter {
            p: self,
            head,
            pos: 0,
            max: max_len,
        };
        fill(&mut w);
        let len = w.pos;
        let n = crate::capture::data_events(len) as u64;
        let per = crate::capture::DATA_BYTES_PER_EVENT;
        let meta = pack_meta(ev.probe_id, crate::KIND_DATA, 6, 0);
        for k in 0..n {
            let used = (len - (k as usize) * per).min(per);
            // SAFETY: slot head + k is free (room checked above), masked,
            // 8-aligned and 64 bytes long (values == 6).
            unsafe {
                let slot = self.slot(head.wrapping_add(k));
                slot.write_volatile(used as u64);
                slot.add(1).write_volatile(meta);
            }
        }
        let nv = (ev.nargs as usize).min(self.values).min(ev.args.len());
        // SAFETY: slot head + n is free (n + 1 <= need slots checked).
        unsafe {
            let slot = self.slot(head.wrapping_add(n));
            slot.write_volatile(ev.tsc);
            slot.add(1).write_volatile(
                pack_meta(ev.probe_id, ev.kind, nv as u8, ev.reserved)
                    | (u64::from(ev.reserved2) << META_STACK_SHIFT),
            );
            let v = slot.add(EVENT_HEADER_WORDS);
            // Constant indices (see `push`): no vector registers.
            v.write_volatile(ev.args[0]);
            v.add(1).write_volatile(ev.args[1]);
            v.add(2).write_volatile(ev.args[2]);
            v.add(3).write_volatile(ev.args[3]);
            v.add(4).write_volatile(ev.args[4]);
            v.add(5).write_volatile(ev.args[5]);
        }
        // Release pairs with the consumer's Acquire load of `head`.
        self.ctl.head.store(head.wrapping_add(n + 1), Release);
        true
    }

    /// The first word of event slot `n`.
    ///
    /// # Safety
    /// The caller owns slot `n` (it is free).
    #[inline(always)]
    unsafe fn slot(&self, n: u64) -> *mut u64 {
        // SAFETY: masked index into the ring's slots (caller contract).
        unsafe { self.events.add(((n & self.mask) << self.shift) as usize) as *mut u64 }
    }
}

/// Writes the bytes of [`Producer::push_with_data`]'s continuation events
/// straight into their slots (volatile byte stores: no vector register,
/// no buffer). Bytes past its `max_len` are not written (see
/// [`DataWriter::room`]).
#[derive(Debug)]
pub struct DataWriter<'p> {
    p: &'p Producer<'p>,
    head: u64,
    pos: usize,
    max: usize,
}

impl DataWriter<'_> {
    /// Appends one byte (dropped beyond `max_len`).
    #[inline(always)]
    pub fn byte(&mut self, b: u8) {
        if self.pos >= self.max {
            return;
        }
        let per = crate::capture::DATA_BYTES_PER_EVENT;
        let (k, at) = (self.pos / per, self.pos % per);
        // SAFETY: the slot head + k is among the free ones reserved for
        // `max` bytes; `16 + at` < 64 lies within its value words.
        unsafe {
            let slot = self.p.slot(self.head.wrapping_add(k as u64)) as *mut u8;
            slot.add(EVENT_HEADER_WORDS * 8 + at).write_volatile(b);
        }
        self.pos += 1;
    }

    /// Appends a little-endian word.
    #[inline(always)]
    pub fn word(&mut self, v: u64) {
        let mut i = 0;
        while i < 8 {
            self.byte((v >> (i * 8)) as u8);
            i += 1;
        }
    }

    /// Bytes still allowed.
    #[inline(always)]
    pub fn room(&self) -> usize {
        self.max - self.pos
    }
}

/// What one [`Consumer::drain`] call saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Events handed to the callback.
    pub read: u64,
    /// The ring's drop counter after the drain (cumulative).
    pub dropped: u64,
}

/// The consuming side of one ring (the tracer).
#[derive(Debug)]
pub struct Consumer<'a> {
    pub(crate) ctl: &'a RingCtl,
    pub(crate) events: *const u8,
    pub(crate) mask: u64,
    /// log2 of the slot size.
    pub(crate) shift: u32,
    /// Values a slot holds (2 or 6).
    pub(crate) values: usize,
}

impl Consumer<'_> {
    /// Hands every event published so far to `f`, in order, then frees their
    /// slots. The producer's memory is untrusted: the events are copied out
    /// with volatile reads and a head that runs more than a ring's capacity
    /// ahead of the tail is reported as [`AbiError::RingCorrupt`] (the ring is
    /// then resynchronised: the tail jumps to the head).
    ///
    /// The drain of a ring whose owner exited ([`crate::THREAD_RETIRING`])
    /// takes its last events and makes the slot reusable
    /// ([`crate::THREAD_REUSABLE`], see the `slots` module).
    pub fn drain(&mut self, mut f: impl FnMut(&Event)) -> Result<DrainStats, AbiError> {
        // Before the head: Acquire pairs with the exiting owner's Release
        // store of RETIRING, which follows its last event; the head read
        // below then includes that event.
        let retiring = self.ctl.state.load(Acquire) == crate::THREAD_RETIRING;
        // Relaxed: only this consumer writes tail.
        let tail = self.ctl.tail.load(Relaxed);
        // Acquire pairs with the producer's `head.store(.., Release)` in
        // `Producer::push`: the events below head are fully written.
        let head = self.ctl.head.load(Acquire);
        let n = head.wrapping_sub(tail);
        if n > self.mask + 1 {
            // Release pairs with the producer's `tail.load(Acquire)`.
            self.ctl.tail.store(head, Release);
            return Err(AbiError::RingCorrupt { head, tail });
        }
        // After the head (Acquire above): a slot changes owner only while
        // its ring is empty, so the events in [tail, head) are all of one
        // owner, and an owner writes `owner_tid` before its first event.
        let tid = self.ctl.owner_tid.load(Relaxed);
        let mut i = tail;
        while i != head {
            // SAFETY: `events` points to `mask + 1` slots of `1 << shift`
            // bytes in the mapping (checked by `Shm::consumer`), the index is
            // masked; the producer does not write slots in [tail, head) until
            // we move tail. The number of values read is bounded by the slot.
            let ev = unsafe {
                let slot = self.events.add(((i & self.mask) << self.shift) as usize) as *const u64;
                decode(slot, self.values, tid)
            };
            f(&ev);
            i = i.wrapping_add(1);
        }
        // Release pairs with the producer's `tail.load(Acquire)` in
        // `Producer::push`: our reads of the slots happen before it reuses them.
        self.ctl.tail.store(head, Release);
        if retiring {
            // Every event of the exited owner is taken: another thread may
            // have the slot (Release pairs with the claimer's Acquire CAS).
            let _ = self.ctl.state.compare_exchange(
                crate::THREAD_RETIRING,
                crate::THREAD_REUSABLE,
                Release,
                Relaxed,
            );
        }
        Ok(DrainStats {
            read: n,
            dropped: self.ctl.dropped.load(Relaxed),
        })
    }
}

/// Decodes the slot at `slot` of the ring owned by `tid` (its `values`
/// values are read; those beyond the meta word's count are zeroed).
///
/// # Safety
/// `slot` must be valid for volatile reads of `2 + values` words.
#[inline(always)]
unsafe fn decode(slot: *const u64, values: usize, tid: u32) -> Event {
    // Reads word `k` of the slot; only called with k < 2 + `values`.
    let w = |k: usize| {
        // SAFETY: caller contract: the slot holds 2 + `values` words, and
        // `values` is 2 or 6 (the callers below read within that).
        unsafe { slot.add(k).read_volatile() }
    };
    let (tsc, meta) = (w(0), w(1));
    let nv = (((meta >> META_NVALUES_SHIFT) & 7) as usize).min(values);
    // Whole-slot reads and masks rather than a loop over `nv` words: the
    // event is then built in registers (a per-word loop made the copy of
    // the event that follows miss store forwarding, ≈ 10 ns per event).
    let mut args = if values >= 6 {
        [w(2), w(3), w(4), w(5), w(6), w(7)]
    } else {
        [w(2), w(3), 0, 0, 0, 0]
    };
    for (k, a) in args.iter_mut().enumerate() {
        *a &= 0u64.wrapping_sub((k < nv) as u64);
    }
    Event {
        tsc,
        probe_id: (meta & META_PROBE_MASK) as u32,
        tid,
        kind: ((meta >> META_KIND_SHIFT) & 3) as u8,
        nargs: nv as u8,
        reserved: ((meta >> META_FLAGS_SHIFT) & 3) as u16,
        reserved2: (meta >> META_STACK_SHIFT) as u32,
        args,
    }
}
