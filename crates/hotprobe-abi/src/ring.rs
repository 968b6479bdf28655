//! The per-thread single-producer single-consumer ring: the agent's thread
//! produces, the tracer consumes. Lock-free, never blocks the producer: a
//! full ring drops the event and counts it in [`RingCtl::dropped`].
//!
//! `head` and `tail` are free-running u64 counters (never wrap in practice);
//! the slot of event `n` is `n & (capacity - 1)`.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::{Event, RingCtl};
use crate::AbiError;

/// The producing side of one ring (the owning thread in the agent).
#[derive(Debug)]
pub struct Producer<'a> {
    pub(crate) ctl: &'a RingCtl,
    pub(crate) events: *mut Event,
    pub(crate) mask: u64,
}

impl Producer<'_> {
    /// Appends one event, or counts a drop and returns `false` when the ring
    /// is full. `cached_tail` is the producer's private copy of the consumer's
    /// `tail` (start it at 0): it is refreshed only when the ring looks full,
    /// so the fast path never touches the consumer's cache line.
    ///
    /// Writes the event word by word with volatile 8-byte stores (no vector
    /// registers are used, which the agent's trampolines rely on).
    ///
    /// # Safety
    /// At most one producer may push to a given ring at a time (the agent
    /// guarantees it with one ring per thread and a re-entry guard).
    #[inline(always)]
    pub unsafe fn push(&self, cached_tail: &mut u64, ev: &Event) -> bool {
        // Relaxed: only this producer writes head.
        let head = self.ctl.head.load(Relaxed);
        if head.wrapping_sub(*cached_tail) > self.mask {
            // Acquire pairs with the consumer's `tail.store(.., Release)` in
            // `Consumer::drain`: the consumer's reads of the slots it freed
            // happen before we overwrite them.
            *cached_tail = self.ctl.tail.load(Acquire);
            if head.wrapping_sub(*cached_tail) > self.mask {
                // Relaxed load+store, not fetch_add: single writer (no lock prefix).
                let d = self.ctl.dropped.load(Relaxed);
                self.ctl.dropped.store(d.wrapping_add(1), Relaxed);
                return false;
            }
        }
        let words: [u64; 9] = [
            ev.tsc,
            ev.probe_id as u64 | (ev.tid as u64) << 32,
            ev.kind as u64
                | (ev.nargs as u64) << 8
                | (ev.reserved as u64) << 16
                | (ev.reserved2 as u64) << 32,
            ev.args[0],
            ev.args[1],
            ev.args[2],
            ev.args[3],
            ev.args[4],
            ev.args[5],
        ];
        // SAFETY: `events` points to `mask + 1` events inside the mapping
        // (checked by `Shm::producer`), the index is masked, and the slot is
        // free (head - tail <= mask above), so the consumer is not reading it.
        let slot = unsafe { self.events.add((head & self.mask) as usize) } as *mut u64;
        let mut i = 0;
        while i < 9 {
            // SAFETY: `slot` is 8-aligned (Event has align 8 inside a 64-aligned
            // array) and `i < 9` words = 72 bytes = size_of::<Event>().
            unsafe { slot.add(i).write_volatile(words[i]) };
            i += 1;
        }
        // Release pairs with the consumer's `head.load(Acquire)` in
        // `Consumer::drain`: the event's words are visible before the new head.
        self.ctl.head.store(head.wrapping_add(1), Release);
        true
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
    pub(crate) events: *const Event,
    pub(crate) mask: u64,
}

impl Consumer<'_> {
    /// Hands every event published so far to `f`, in order, then frees their
    /// slots. The producer's memory is untrusted: the events are copied out
    /// with volatile reads and a head that runs more than a ring's capacity
    /// ahead of the tail is reported as [`AbiError::RingCorrupt`] (the ring is
    /// then resynchronised: the tail jumps to the head).
    pub fn drain(&mut self, mut f: impl FnMut(&Event)) -> Result<DrainStats, AbiError> {
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
        let mut i = tail;
        while i != head {
            // SAFETY: `events` points to `mask + 1` events in the mapping
            // (checked by `Shm::consumer`), the index is masked; the producer
            // does not write slots in [tail, head) until we move tail.
            let ev = unsafe { self.events.add((i & self.mask) as usize).read_volatile() };
            f(&ev);
            i = i.wrapping_add(1);
        }
        // Release pairs with the producer's `tail.load(Acquire)` in
        // `Producer::push`: our reads of the slots happen before it reuses them.
        self.ctl.tail.store(head, Release);
        Ok(DrainStats {
            read: n,
            dropped: self.ctl.dropped.load(Relaxed),
        })
    }
}
