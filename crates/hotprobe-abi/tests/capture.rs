//! The capture table and continuation events (typed values copied in the
//! target): a program published for a probe is found by its id; an event
//! pushed with its bytes comes out of the ring after them, all or nothing.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};

use hotprobe_abi::capture::{
    find, find_exit, publish, publish_exit, withdraw_exit, CaptureProgram, BASE_ARG, BASE_RSP,
    CAPTURE_SLOTS, DATA_BYTES_PER_EVENT,
};
use hotprobe_abi::*;

/// A zeroed, page-aligned buffer standing in for the memfd mapping.
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

fn make(ring_capacity: u32, event_size: u32) -> (Buf, Shm) {
    let params = Params {
        n_probes: 4096,
        n_site_slots: 64,
        n_threads: 2,
        ring_capacity,
        event_size,
    };
    let l = Layout::new(params).unwrap();
    assert!(l.capture_offset >= l.agg_offset + agg::AGG_REGION_SIZE);
    assert_eq!(l.capture_offset % PAGE, 0);
    let layout = AllocLayout::from_size_align(l.total_size, 4096).unwrap();
    // SAFETY: non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: the buffer outlives the view (returned together, dropped after).
    let shm = unsafe { Shm::create(ptr, l.total_size, params) }.unwrap();
    (Buf { ptr, layout }, shm)
}

fn entry(probe: u32, tsc: u64) -> Event {
    Event {
        tsc,
        probe_id: probe,
        kind: KIND_ENTRY,
        nargs: 6,
        args: [1, 2, 3, 4, 5, 6],
        ..Default::default()
    }
}

#[test]
fn programs_are_found_by_probe_id_until_the_table_is_full() {
    let (_buf, shm) = make(64, EVENT_SIZE_FULL);
    assert!(find(&shm, 3).is_none());
    let mut p = CaptureProgram {
        n_items: 1,
        ..CaptureProgram::default()
    };
    p.items[0].base = BASE_ARG;
    p.items[0].string = 1;
    assert!(publish(&shm, 3, &p));
    assert_eq!(find(&shm, 3), Some(&p));
    assert!(find(&shm, 4).is_none());
    // Published again: the new program replaces the old.
    p.items[0].base = BASE_RSP;
    assert!(publish(&shm, 3, &p));
    assert!(find(&shm, 3).unwrap().reads_stack());
    for id in 100..100 + CAPTURE_SLOTS as u32 - 1 {
        assert!(publish(&shm, id, &p), "{id}");
    }
    assert!(!publish(&shm, 9999, &p), "a full table refuses");
    assert!(find(&shm, 100 + CAPTURE_SLOTS as u32 - 2).is_some());
    assert!(find(&shm, 9999).is_none());
    // Exit programs have keys of their own.
    let (_buf2, shm) = make(64, EVENT_SIZE_FULL);
    assert!(publish(&shm, 7, &p) && publish_exit(&shm, 7, &p));
    assert!(find_exit(&shm, 7).is_some() && find_exit(&shm, 8).is_none());
    withdraw_exit(&shm, 7);
    assert!(find_exit(&shm, 7).is_none());
    assert!(find(&shm, 7).is_some(), "the entry's stays");
}

#[test]
fn an_event_comes_after_its_bytes_or_not_at_all() {
    let (_buf, shm) = make(8, EVENT_SIZE_FULL);
    let p = shm.producer(0).unwrap();
    let mut limit = 0;
    let bytes: Vec<u8> = (0..100u8).collect();
    // SAFETY: one producer on this ring.
    assert!(unsafe {
        p.push_with_data(&mut limit, &entry(5, 77), 132, |w| {
            bytes.iter().for_each(|b| w.byte(*b));
            assert_eq!(w.room(), 32);
        })
    });
    let mut c = shm.consumer(0).unwrap();
    let mut seen = Vec::new();
    c.drain(|e| seen.push(*e)).unwrap();
    // 100 bytes: three continuation events (48, 48, 4), then the entry.
    assert_eq!(seen.len(), 4);
    let mut got = Vec::new();
    for d in &seen[..3] {
        assert_eq!((d.kind, d.probe_id), (KIND_DATA, 5));
        assert!(d.tsc as usize <= DATA_BYTES_PER_EVENT);
        got.extend(
            d.args
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .take(d.tsc as usize),
        );
    }
    assert_eq!(got, bytes);
    assert_eq!(
        seen[3],
        Event {
            tid: 0,
            ..entry(5, 77)
        }
    );
    // 8 slots: an event with 4 continuations fits once, not twice; the
    // second is one counted drop, of which nothing is published.
    let fill = |w: &mut DataWriter<'_>| (0..24).for_each(|_| w.word(9));
    // SAFETY: as above.
    assert!(unsafe { p.push_with_data(&mut limit, &entry(6, 1), 4 * 48, fill) });
    // SAFETY: as above.
    assert!(!unsafe { p.push_with_data(&mut limit, &entry(6, 2), 4 * 48, fill) });
    assert_eq!(
        shm.ring_ctl(0)
            .unwrap()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    seen.clear();
    c.drain(|e| seen.push(*e)).unwrap();
    assert_eq!(seen.len(), 5);
    for d in &seen[..4] {
        assert_eq!((d.kind, d.tsc, d.args), (KIND_DATA, 48, [9; 6]));
    }
    assert_eq!((seen[4].kind, seen[4].tsc), (KIND_ENTRY, 1));
}

#[test]
fn compact_slots_take_no_bytes() {
    let (_buf, shm) = make(8, EVENT_SIZE_COMPACT);
    let p = shm.producer(0).unwrap();
    let mut limit = 0;
    // SAFETY: one producer on this ring.
    assert!(!unsafe { p.push_with_data(&mut limit, &entry(1, 1), 9, |_| panic!("not called")) });
    assert_eq!(
        shm.ring_ctl(0)
            .unwrap()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}
