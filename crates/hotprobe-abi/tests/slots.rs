//! Thread slots and handler slots given back and claimed again: a slot
//! whose ring still holds events is not handed out before the consumer
//! drained them (each event under its own owner's tid), an empty one at
//! once, only to a thread of the same process; counters add up over
//! owners.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::*;

struct Buf {
    ptr: *mut u8,
    layout: AllocLayout,
}
impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn make(n_threads: u32) -> (Buf, Shm) {
    let params = Params {
        n_probes: 4,
        n_site_slots: 8,
        n_threads,
        ring_capacity: 8,
        event_size: EVENT_SIZE_COMPACT,
    };
    let l = Layout::new(params).unwrap();
    let layout = AllocLayout::from_size_align(l.total_size, 4096).unwrap();
    // SAFETY: non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: zeroed, page-aligned, lives as long as the Buf returned beside it.
    let shm = unsafe { Shm::create(ptr, l.total_size, params) }.unwrap();
    (Buf { ptr, layout }, shm)
}

fn push(shm: &Shm, slot: u32, n: u64) {
    let p = shm.producer(slot).unwrap();
    let mut limit = 0;
    for i in 0..n {
        let ev = Event {
            tsc: i,
            probe_id: 1,
            kind: KIND_ENTRY,
            nargs: 2,
            ..Default::default()
        };
        // SAFETY: this test is the ring's only producer.
        assert!(unsafe { p.push(&mut limit, &ev) });
    }
}

fn drain(shm: &Shm, slot: u32) -> Vec<u32> {
    let mut tids = Vec::new();
    shm.consumer(slot)
        .unwrap()
        .drain(|e| tids.push(e.tid))
        .unwrap();
    tids
}

#[test]
fn a_thread_slot_is_reused_only_once_its_ring_is_drained() {
    let (_b, shm) = make(2);
    let a = shm.claim_thread_for(100, 1).unwrap();
    let b = shm.claim_thread_for(100, 2).unwrap();
    assert_eq!(shm.claim_thread_for(100, 3), None, "both live");
    push(&shm, a, 3);
    shm.thread_counters(a).unwrap()[1].store(3, Relaxed);
    shm.release_thread(a);
    assert_eq!(
        shm.ring_ctl(a).unwrap().state.load(Relaxed),
        THREAD_RETIRING
    );
    assert_eq!(shm.claim_thread_for(100, 3), None, "events not drained yet");
    // The drain hands out the old owner's events under its tid, then
    // makes the slot reusable.
    assert_eq!(drain(&shm, a), vec![1, 1, 1]);
    assert_eq!(
        shm.ring_ctl(a).unwrap().state.load(Relaxed),
        THREAD_REUSABLE
    );
    assert_eq!(shm.threads_reusable(), 1);
    assert_eq!(shm.claim_thread_for(200, 3), None, "another process's slot");
    assert_eq!(shm.claim_thread_for(100, 3), Some(a));
    assert_eq!(shm.thread_owner(a), Some((100, 3)));
    push(&shm, a, 2);
    shm.thread_counters(a).unwrap()[1].fetch_add(2, Relaxed);
    assert_eq!(drain(&shm, a), vec![3, 3], "the new owner's events");
    assert_eq!(shm.counter(1), 5, "counts add up over owners");
    // An empty ring is reusable at once.
    shm.release_thread(b);
    assert_eq!(
        shm.ring_ctl(b).unwrap().state.load(Relaxed),
        THREAD_REUSABLE
    );
    assert_eq!(shm.claim_thread_for(100, 4), Some(b));
    assert_eq!(shm.threads_in_use(), 2);
}

#[test]
fn handler_slots_are_given_back() {
    let (_b, shm) = make(1);
    let mut held = Vec::new();
    for tid in 1..=HANDLER_SLOTS as u32 {
        let (i, _) = shm.claim_handler_slot(tid).unwrap();
        held.push((i, tid));
    }
    assert!(shm.claim_handler_slot(9999).is_none(), "all taken");
    assert_eq!(shm.handler_slots_owned(), HANDLER_SLOTS as u32);
    let (i, tid) = held[7];
    assert!(shm.handler_slot_of(i, tid).is_some());
    shm.release_handler_slot(i, tid);
    assert!(shm.handler_slot_of(i, tid).is_none());
    let (j, _) = shm.claim_handler_slot(9999).unwrap();
    assert_eq!(j, i);
    // A slot in a call (a dead tracer took it) is kept.
    let (k, ktid) = held[8];
    shm.handler_slots()[k as usize]
        .state
        .store(HANDLER_BUSY, Relaxed);
    shm.release_handler_slot(k, ktid);
    assert!(shm.handler_slot_of(k, ktid).is_some());
}

/// The ring pool: nothing recorded until the tracer says so; then a count
/// that only grows and never passes the thread slots; and a ring start
/// that covers the slot's first events, page-aligned, within the ring
/// (the whole ring when it is smaller than `RING_START_BYTES`).
#[test]
fn the_ring_pool_only_grows_and_its_ring_starts_cover_each_rings_first_events() {
    let (_b, shm) = make(4);
    assert_eq!(shm.ring_pool(), (false, 0));
    shm.set_ring_pool(2);
    assert_eq!(shm.ring_pool(), (true, 2));
    shm.set_ring_pool(1);
    assert_eq!(shm.ring_pool(), (true, 2), "the count never goes down");
    shm.set_ring_pool(100);
    assert_eq!(shm.ring_pool(), (true, 4), "capped at the thread slots");
    for slot in 0..4 {
        let events = shm.ring_events(slot).unwrap() as usize;
        let (start, len) = shm.ring_start(slot).unwrap();
        assert_eq!(start % PAGE, 0);
        assert_eq!(len % PAGE, 0);
        // 8 events of 32 bytes: the ring, inside the pages.
        assert!(start <= events && events + 8 * 32 <= start + len);
        assert!(len <= RING_START_BYTES + PAGE, "{len}");
    }
    assert_eq!(shm.ring_start(4), None);
}

/// A slot another thread takes over goes on from its last head: the pages
/// its next events go to start at that head's event slot and end at the
/// ring's end at most (a head a lap further gives the same pages).
#[test]
fn the_pages_from_a_head_cover_the_next_events_and_stay_in_the_ring() {
    let (_b, shm) = make(4);
    let events = shm.ring_events(1).unwrap() as usize;
    let (capacity, size) = (8usize, 32usize);
    assert_eq!(shm.ring_pages_from(1, 0), shm.ring_start(1));
    for head in [1u64, 5, 7, 8 + 5] {
        let at = events + (head as usize % capacity) * size;
        let (start, len) = shm.ring_pages_from(1, head).unwrap();
        assert_eq!((start % PAGE, len % PAGE), (0, 0));
        assert!(start <= at && at < start + len, "head {head}");
        assert!(
            start + len <= (events + capacity * size).next_multiple_of(PAGE),
            "head {head}: past the ring's last page"
        );
    }
    assert_eq!(shm.ring_pages_from(1, 5), shm.ring_pages_from(1, 13));
    assert_eq!(shm.ring_pages_from(4, 0), None);
}
