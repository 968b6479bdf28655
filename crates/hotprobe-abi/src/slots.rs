//! Thread slots and handler slots: claimed by a thread, given back when it
//! exits, claimed again by a later thread — with no event lost in the
//! hand-over.
//!
//! A thread slot ([`RingCtl::state`]) goes
//! [`THREAD_FREE`] → [`THREAD_LIVE`] (claimed: `owner_pid`, `owner_tid`
//! written first) → at its owner's exit either [`THREAD_REUSABLE`] at once
//! (its ring is empty: nothing left to drain) or [`THREAD_RETIRING`] (the
//! ring still holds events). The consumer drains a retiring ring as any
//! other and, having read `RETIRING` *before* the ring's head, knows it saw
//! the last event: it marks the slot `REUSABLE` ([`Consumer::drain`]). A
//! thread registering later takes a reusable slot of its own process
//! (`CLAIMING` while it writes the owner) before a fresh one. The slot's
//! counters, `dropped` and `refused` are never reset: they add up over
//! every owner, as the tracer's sums and per-slot loss accounting expect.
//!
//! [`Consumer::drain`]: crate::Consumer::drain

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use crate::layout::{site_hash, HandlerSlot, RingCtl, HANDLER_IDLE};
use crate::Shm;

/// [`RingCtl::state`]: slot never claimed.
pub const THREAD_FREE: u32 = 0;
/// [`RingCtl::state`]: slot owned by a live thread (`owner_pid`, `owner_tid`).
pub const THREAD_LIVE: u32 = 1;
/// [`RingCtl::state`]: the owning thread exited and its ring still holds
/// events the consumer has not drained; the consumer marks it
/// [`THREAD_REUSABLE`] once it drained it. (Layout ≤ 10 called this
/// `THREAD_EXITED` and never reused the slot.)
pub const THREAD_RETIRING: u32 = 2;
/// The name of [`THREAD_RETIRING`] in layouts ≤ 10.
pub const THREAD_EXITED: u32 = THREAD_RETIRING;
/// [`RingCtl::state`]: the owner exited and its ring is drained; a thread
/// of the same process may claim the slot (`owner_*` still name the last
/// owner until then).
pub const THREAD_REUSABLE: u32 = 3;
/// [`RingCtl::state`]: a registering thread took a reusable slot and is
/// writing its owner fields (then [`THREAD_LIVE`]).
pub const THREAD_CLAIMING: u32 = 4;

/// [`Header::ring_pool`] bit: some site writes events into the rings
/// (the tracer installed a recording site). The other bits count the
/// thread slots, from slot 0, whose ring start is in memory already.
///
/// [`Header::ring_pool`]: crate::Header::ring_pool
pub const RING_POOL_RECORDING: u32 = 1 << 31;

/// Bytes at the start of a ring ([`Shm::ring_start`]) put in memory before
/// its thread writes there: 2,048 events of 32 bytes, 1,024 of 64 — the
/// start of the first lap, without paying for the whole ring (32 MiB at
/// 2^20 events). The rest faults in as the first lap writes it.
pub const RING_START_BYTES: usize = 64 * 1024;

impl Shm {
    /// The ring pool as [`crate::Header::ring_pool`] holds it: whether any
    /// site writes events, and how many thread slots (from slot 0) have
    /// their ring start in memory already.
    pub fn ring_pool(&self) -> (bool, u32) {
        // Acquire pairs with the tracer's Release in `set_ring_pool`: the
        // pages it made ready are there once the count says so.
        let p = self.header().ring_pool.load(Acquire);
        (p & RING_POOL_RECORDING != 0, p & !RING_POOL_RECORDING)
    }

    /// Publishes the ring pool (tracer side, its only writer): recording
    /// sites exist, and slots `0..ready` have their ring start in memory.
    /// Never lowers the count.
    pub fn set_ring_pool(&self, ready: u32) {
        let ready = ready.min(self.slot_capacity()) & !RING_POOL_RECORDING;
        // Release: the pages made ready before are in memory for whoever
        // reads the new count (Acquire in `ring_pool`).
        self.header()
            .ring_pool
            .fetch_max(RING_POOL_RECORDING | ready, Release);
    }

    /// The page-aligned address and length of thread slot `slot`'s ring
    /// start: the pages holding its first [`RING_START_BYTES`] of events
    /// (the whole ring when it is smaller).
    pub fn ring_start(&self, slot: u32) -> Option<(usize, usize)> {
        self.ring_pages_from(slot, 0)
    }

    /// The page-aligned address and length of the pages of thread slot
    /// `slot`'s ring that its next [`RING_START_BYTES`] of events go to
    /// when its head is `head`: from the head's event slot to the end of
    /// the ring at most (the ring start when `head` is 0). A slot given to
    /// another thread of the process goes on from its last head, past the
    /// pages its last owner wrote.
    pub fn ring_pages_from(&self, slot: u32, head: u64) -> Option<(usize, usize)> {
        let events = self.ring_events(slot)? as usize;
        let lay = self.layout();
        let ring = (lay.params.ring_capacity as usize) << lay.event_shift;
        let at = ((head & (u64::from(lay.params.ring_capacity) - 1)) << lay.event_shift) as usize;
        let from = events + at;
        let start = from & !(crate::PAGE - 1);
        let end = (from + (ring - at).min(RING_START_BYTES)).next_multiple_of(crate::PAGE);
        Some((start, end - start))
    }

    /// Claims a thread slot for thread `tid` of an unnamed process
    /// ([`RingCtl::owner_pid`] 0: the header's `agent_pid`); see
    /// [`Shm::claim_thread_for`].
    pub fn claim_thread(&self, tid: u32) -> Option<u32> {
        self.claim_thread_for(0, tid)
    }

    /// Claims a thread slot for thread `tid` of process `pid` (agent side,
    /// first hit of a thread): a [`THREAD_REUSABLE`] slot last owned by the
    /// same process first (so that per-process counts stay per process),
    /// else a slot never used, in a chunk mapped here at its first use
    /// (see `shm::chunks`). None when every slot up to the cap
    /// ([`Shm::slot_capacity`]) is live or retiring, or when the chunk of
    /// a new slot could not be mapped (that slot is then never used).
    /// Only atomics: callable from the agent's hot path and signal
    /// handlers. O(slots handed out so far), on a thread's first hit only.
    pub fn claim_thread_for(&self, pid: u32, tid: u32) -> Option<u32> {
        for slot in 0..self.threads_in_use() {
            let Some(ctl) = self.ring_ctl(slot) else {
                break;
            };
            if ctl.state.load(Relaxed) != THREAD_REUSABLE || ctl.owner_pid.load(Relaxed) != pid {
                continue;
            }
            // Acquire pairs with the Release store of REUSABLE (by the
            // consumer or the exiting owner): the last owner's writes
            // (counters, ring head) happen before ours.
            if ctl
                .state
                .compare_exchange(THREAD_REUSABLE, THREAD_CLAIMING, Acquire, Relaxed)
                .is_ok()
            {
                return Some(self.own_slot(slot, ctl, pid, tid));
            }
        }
        let n = self.slot_capacity();
        let claimed = &self.header().threads_claimed;
        let mut c = claimed.load(Relaxed);
        loop {
            if c >= n {
                // Counted as before (the header documents that the
                // counter may exceed the slots: a claim that found none).
                claimed.fetch_add(1, Relaxed);
                return None;
            }
            // Relaxed: the counter only hands out distinct indices.
            match claimed.compare_exchange_weak(c, c + 1, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(now) => c = now,
            }
        }
        let ctl = self.ring_ctl(c)?;
        Some(self.own_slot(c, ctl, pid, tid))
    }

    fn own_slot(&self, slot: u32, ctl: &RingCtl, pid: u32, tid: u32) -> u32 {
        ctl.owner_tid.store(tid, Relaxed);
        ctl.owner_pid.store(pid, Relaxed);
        // Release pairs with the tracer's `state.load(Acquire)` (thread
        // listing, drain): it sees owner_pid/owner_tid once it sees LIVE.
        ctl.state.store(THREAD_LIVE, Release);
        slot
    }

    /// Gives thread slot `slot` back (agent side, its owner exiting, after
    /// its last event: the owner writes nothing into the slot afterwards).
    /// An empty ring makes the slot reusable at once; one holding events
    /// retires, and the consumer's next drain makes it reusable.
    pub fn release_thread(&self, slot: u32) {
        let Some(ctl) = self.ring_ctl(slot) else {
            return;
        };
        // Acquire pairs with the consumer's Release store of `tail`: once
        // it has taken every event, nothing of this ring is left to read.
        let empty = ctl.tail.load(Acquire) == ctl.head.load(Relaxed);
        // Release pairs with the consumer's and the claimer's Acquire
        // loads of `state`: the ring's last head and the counters are
        // visible once the state is.
        ctl.state.store(
            if empty {
                THREAD_REUSABLE
            } else {
                THREAD_RETIRING
            },
            Release,
        );
    }

    /// `(owner_pid, owner_tid)` of thread slot `slot` once it was claimed
    /// (`None` before, or out of range): its current owner, or the last
    /// one of a slot given back. `owner_pid` 0 means the header's
    /// `agent_pid`, which is returned in its place.
    pub fn thread_owner(&self, slot: u32) -> Option<(u32, u32)> {
        let ctl = self.ring_ctl(slot)?;
        // Acquire pairs with the Release store of LIVE in `own_slot`.
        if ctl.state.load(Acquire) == THREAD_FREE {
            return None;
        }
        let pid = match ctl.owner_pid.load(Relaxed) {
            0 => self.header().agent_pid.load(Relaxed),
            p => p,
        };
        Some((pid, ctl.owner_tid.load(Relaxed)))
    }

    /// Thread slots whose owner exited and whose ring is drained, ready
    /// for another thread (tracer side, for reports and tests).
    pub fn threads_reusable(&self) -> u32 {
        (0..self.threads_in_use())
            .filter_map(|s| self.ring_ctl(s))
            .filter(|c| c.state.load(Relaxed) == THREAD_REUSABLE)
            .count() as u32
    }
}

/// Handler slots ([`HandlerSlot`]): one per thread making shared-memory
/// handler calls, released when the thread exits.
impl Shm {
    /// Claims a free handler slot for thread `tid` (agent side; atomics,
    /// and the `mremap` of a chunk's first use: callable from a signal
    /// handler): its index and the slot. None when every slot up to
    /// [`Shm::handler_capacity`] is taken. The caller keeps the index for the
    /// thread's later calls and gives it back with
    /// [`Shm::release_handler_slot`].
    pub fn claim_handler_slot(&self, tid: u32) -> Option<(u32, &HandlerSlot)> {
        if tid == 0 {
            return None;
        }
        let slots = self.handler_slots();
        let mask = slots.len() - 1;
        let start = site_hash(u64::from(tid), 64 - slots.len().trailing_zeros());
        for k in 0..slots.len() {
            let i = start.wrapping_add(k) & mask;
            let s = slots.get(i)?;
            if s.tid.load(Relaxed) == 0 && s.tid.compare_exchange(0, tid, AcqRel, Relaxed).is_ok() {
                self.handler_ctl().in_use.fetch_max(i as u32 + 1, Relaxed);
                return Some((i as u32, s));
            }
        }
        // Every slot of the trap table taken: the chunks' (a memory whose
        // thread slots grow), in order, each chunk mapped when reached.
        for i in slots.len() as u32..self.handler_capacity() {
            let s = self.handler_slot_at(i)?;
            if s.tid.load(Relaxed) == 0 && s.tid.compare_exchange(0, tid, AcqRel, Relaxed).is_ok() {
                self.handler_ctl().in_use.fetch_max(i + 1, Relaxed);
                return Some((i, s));
            }
        }
        None
    }

    /// Handler slot `index` while thread `tid` owns it.
    pub fn handler_slot_of(&self, index: u32, tid: u32) -> Option<&HandlerSlot> {
        let s = self.handler_slot_at(index)?;
        (s.tid.load(Relaxed) == tid).then_some(s)
    }

    /// Gives handler slot `index` of thread `tid` back (agent side, the
    /// thread exiting, so no call of its own is in progress). A slot left
    /// in another state than idle (a call a dead tracer took) is kept.
    pub fn release_handler_slot(&self, index: u32, tid: u32) {
        let Some(s) = self.handler_slot_at(index) else {
            return;
        };
        if s.state.load(Acquire) == HANDLER_IDLE {
            // Release: the slot's last use happens before a new claim
            // (AcqRel CAS in `claim_handler_slot`).
            let _ = s.tid.compare_exchange(tid, 0, Release, Relaxed);
        }
    }

    /// Handler slots owned by a thread now (tracer side, for tests).
    pub fn handler_slots_owned(&self) -> u32 {
        let n = self.handler_ctl().in_use.load(Acquire);
        (0..n.min(self.handler_capacity()))
            .filter_map(|i| self.handler_slot_at(i))
            .filter(|s| s.tid.load(Relaxed) != 0)
            .count() as u32
    }
}
