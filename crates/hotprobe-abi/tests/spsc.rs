//! The ring under a real producer and consumer on two threads, the site
//! table, the counters, and header validation.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use hotprobe_abi::*;

/// A zeroed, page-aligned buffer standing in for the memfd mapping.
struct Buf {
    ptr: *mut u8,
    layout: AllocLayout,
}
// SAFETY: the buffer is plain memory shared through `Shm`'s atomics.
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}
impl Buf {
    fn new(len: usize) -> Buf {
        let layout = AllocLayout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Buf { ptr, layout }
    }
}
impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn make(params: Params) -> (Arc<Buf>, Shm) {
    let l = Layout::new(params).unwrap();
    let buf = Arc::new(Buf::new(l.total_size));
    // SAFETY: the buffer lives as long as the Arc we return next to the view.
    let shm = unsafe { Shm::create(buf.ptr, l.total_size, params) }.unwrap();
    (buf, shm)
}

fn ev(i: u64) -> Event {
    Event {
        tsc: i,
        probe_id: (i % 7) as u32,
        tid: 42,
        kind: KIND_ENTRY,
        nargs: 6,
        args: [i, !i, i * 3, 4, 5, 6],
        ..Default::default()
    }
}

/// `e` as a ring of `event_size`-byte slots gives it back: the first
/// values that fit, the rest zero.
fn fitted(e: Event, event_size: u32) -> Event {
    let n = (e.nargs as usize).min(slot_values(event_size));
    let mut args = [0; 6];
    args[..n].copy_from_slice(&e.args[..n]);
    Event {
        nargs: n as u8,
        args,
        ..e
    }
}

#[test]
fn spsc_two_threads_no_loss_no_duplicate_drops_counted() {
    for event_size in [EVENT_SIZE_COMPACT, EVENT_SIZE_FULL] {
        spsc_two_threads(event_size);
    }
}

fn spsc_two_threads(event_size: u32) {
    let params = Params {
        n_probes: 8,
        n_site_slots: 16,
        n_threads: 2,
        ring_capacity: 64,
        event_size,
    };
    let (buf, shm) = make(params);
    // The consumer side attaches like the agent would, through the header.
    // SAFETY: same buffer, kept alive by `buf`.
    let reader = unsafe { Shm::attach(buf.ptr, shm.len()) }.unwrap();
    let slot = shm.claim_thread(42).unwrap();
    const N: u64 = 2_000_000;
    let shm = Arc::new(shm);
    let s2 = shm.clone();
    let producer = std::thread::spawn(move || {
        let p = s2.producer(slot).unwrap();
        let mut cached = 0;
        let mut pushed = 0u64;
        for i in 0..N {
            // SAFETY: this thread is the ring's only producer.
            if unsafe { p.push(&mut cached, &ev(i)) } {
                pushed += 1;
            }
        }
        pushed
    });
    let mut c = reader.consumer(slot).unwrap();
    let mut last: Option<u64> = None;
    let mut got = 0u64;
    loop {
        let done = producer.is_finished();
        c.drain(|e| {
            // Strictly increasing sequence: no duplicate, no reorder, intact payload.
            assert!(
                last.is_none_or(|l| e.tsc > l),
                "duplicate or reordered {} after {:?}",
                e.tsc,
                last
            );
            assert_eq!(*e, fitted(ev(e.tsc), event_size));
            last = Some(e.tsc);
            got += 1;
        })
        .unwrap();
        if done {
            break;
        }
    }
    c.drain(|_| panic!("nothing may remain")).unwrap();
    let pushed = producer.join().unwrap();
    let dropped = reader.ring_ctl(slot).unwrap().dropped.load(Relaxed);
    assert_eq!(got, pushed, "every published event read exactly once");
    assert_eq!(
        pushed + dropped,
        N,
        "every event either delivered or counted as dropped"
    );
    assert_eq!(reader.total_drops(), dropped);
    eprintln!("{event_size}-byte slots: delivered {got}, dropped {dropped}");
}

#[test]
fn slots_round_trip_every_field() {
    for event_size in [EVENT_SIZE_COMPACT, EVENT_SIZE_FULL] {
        let params = Params {
            n_probes: 1 << 24,
            n_site_slots: 2,
            n_threads: 1,
            ring_capacity: 8,
            event_size,
        };
        let (_buf, shm) = make(params);
        // Events carry the ring owner's tid.
        assert_eq!(shm.claim_thread(4_194_304), Some(0));
        let entry = Event {
            tsc: u64::MAX - 1,
            probe_id: (1 << 24) - 1,
            tid: 4_194_304,
            kind: KIND_ENTRY,
            nargs: 6,
            args: [1, 2, 3, 4, 5, 6],
            ..Default::default()
        };
        let exit = Event {
            tsc: 7,
            probe_id: 3,
            tid: 4_194_304,
            kind: KIND_EXIT,
            nargs: 2,
            args: [u64::MAX, 9, 0, 0, 0, 0],
            ..Default::default()
        };
        let unwound = Event {
            kind: KIND_EXIT,
            reserved: EXIT_UNWOUND,
            nargs: 0,
            ..exit
        };
        let hit = Event {
            kind: KIND_HIT,
            nargs: 1,
            args: [5, 0, 0, 0, 0, 0],
            ..exit
        };
        let p = shm.producer(0).unwrap();
        let mut cached = 0;
        for e in [entry, exit, unwound, hit] {
            // SAFETY: single producer.
            assert!(unsafe { p.push(&mut cached, &e) });
        }
        let mut seen = vec![];
        shm.consumer(0).unwrap().drain(|e| seen.push(*e)).unwrap();
        let want: Vec<Event> = [entry, exit, unwound, hit]
            .into_iter()
            .map(|e| fitted(e, event_size))
            .collect();
        assert_eq!(seen, want, "{event_size}-byte slots");
        let values: Vec<u8> = seen.iter().map(|e| e.nargs).collect();
        let full = slot_values(event_size) as u8;
        assert_eq!(values, [full, 2, 0, 1]);
    }
}

#[test]
fn every_memory_gets_its_own_stub_key() {
    let params = Params {
        n_probes: 1,
        n_site_slots: 2,
        n_threads: 1,
        ring_capacity: 2,
        event_size: EVENT_SIZE_COMPACT,
    };
    let keys: Vec<u32> = (0..8)
        .map(|_| {
            let (buf, shm) = make(params);
            let k = shm.stub_key();
            // The agent's view reads the same key.
            // SAFETY: same buffer, alive.
            let agent = unsafe { Shm::attach(buf.ptr, shm.len()) }.unwrap();
            assert_eq!(agent.stub_key(), k);
            k
        })
        .collect();
    for (i, k) in keys.iter().enumerate() {
        assert!(*k != 0 && *k < 1 << 31, "{k:#x}");
        assert!(!keys[..i].contains(k), "key {k:#x} repeated: {keys:x?}");
    }
}

#[test]
fn slot_layout_is_tsc_meta_values() {
    let params = Params {
        n_probes: 8,
        n_site_slots: 2,
        n_threads: 1,
        ring_capacity: 4,
        event_size: EVENT_SIZE_COMPACT,
    };
    let (_buf, shm) = make(params);
    let p = shm.producer(0).unwrap();
    let mut cached = 0;
    for i in 0..2u64 {
        let e = Event {
            tsc: 100 + i,
            probe_id: 5,
            tid: 77,
            kind: KIND_EXIT,
            nargs: 2,
            args: [10 + i, 20 + i, 0, 0, 0, 0],
            ..Default::default()
        };
        // SAFETY: single producer.
        assert!(unsafe { p.push(&mut cached, &e) });
    }
    let base = shm.ring_events(0).unwrap() as *const u64;
    // SAFETY: two 32-byte slots of the ring, inside the buffer.
    let words: Vec<u64> = (0..8).map(|i| unsafe { base.add(i).read() }).collect();
    let meta = 5 | 1 << 24 | 2 << 26;
    assert_eq!(pack_meta(5, KIND_EXIT, 2, 0), meta);
    assert_eq!(pack_meta(5, KIND_EXIT, 2, EXIT_UNWOUND), meta | 1 << 29);
    assert_eq!(words, [100, meta, 10, 20, 101, meta, 11, 21]);
    assert_eq!(base as usize % 64, 0, "slots are cache-line aligned");
}

#[test]
fn full_ring_drops_and_counts() {
    let params = Params {
        n_probes: 1,
        n_site_slots: 2,
        n_threads: 1,
        ring_capacity: 4,
        event_size: EVENT_SIZE_FULL,
    };
    let (_buf, shm) = make(params);
    let p = shm.producer(0).unwrap();
    let mut cached = 0;
    // SAFETY: single producer.
    let ok: Vec<bool> = (0..6)
        .map(|i| unsafe { p.push(&mut cached, &ev(i)) })
        .collect();
    assert_eq!(ok, [true, true, true, true, false, false]);
    let mut c = shm.consumer(0).unwrap();
    let mut seen = vec![];
    let st = c.drain(|e| seen.push(e.tsc)).unwrap();
    assert_eq!(seen, [0, 1, 2, 3]);
    assert_eq!(
        st,
        DrainStats {
            read: 4,
            dropped: 2
        }
    );
    // Space again after the drain.
    // SAFETY: single producer.
    assert!(unsafe { p.push(&mut cached, &ev(9)) });
}

#[test]
fn corrupt_head_is_reported_not_followed() {
    let params = Params {
        n_probes: 1,
        n_site_slots: 2,
        n_threads: 1,
        ring_capacity: 4,
        event_size: EVENT_SIZE_FULL,
    };
    let (_buf, shm) = make(params);
    shm.ring_ctl(0).unwrap().head.store(1000, Relaxed);
    let mut c = shm.consumer(0).unwrap();
    assert!(matches!(
        c.drain(|_| panic!()),
        Err(AbiError::RingCorrupt {
            head: 1000,
            tail: 0
        })
    ));
    // Resynchronised.
    assert_eq!(c.drain(|_| panic!()).unwrap().read, 0);
}

#[test]
fn site_table_lookup_many_sites() {
    let params = Params {
        n_probes: 5000,
        n_site_slots: 8192,
        n_threads: 1,
        ring_capacity: 2,
        event_size: EVENT_SIZE_FULL,
    };
    let (_buf, shm) = make(params);
    for i in 0..4096u64 {
        shm.insert_site(0x5555_0000_1000 + i * 5, i as u32, ACTION_COUNT)
            .unwrap();
    }
    for i in 0..4096u64 {
        assert_eq!(
            shm.lookup_site(0x5555_0000_1000 + i * 5),
            Some((i as u32, ACTION_COUNT))
        );
    }
    assert_eq!(shm.lookup_site(0x1234), None);
    shm.set_site_action(0x5555_0000_1000, 0).unwrap();
    assert_eq!(shm.lookup_site(0x5555_0000_1000), Some((0, 0)));
    assert_eq!(
        shm.insert_site(1, 5000, 0),
        Err(AbiError::ProbeOutOfRange(5000))
    );
    assert_eq!(shm.set_site_action(7, 0), Err(AbiError::NoSuchSite(7)));
}

#[test]
fn site_table_full_is_an_error() {
    let params = Params {
        n_probes: 4,
        n_site_slots: 2,
        n_threads: 1,
        ring_capacity: 2,
        event_size: EVENT_SIZE_FULL,
    };
    let (_buf, shm) = make(params);
    shm.insert_site(10, 0, 1).unwrap();
    shm.insert_site(20, 1, 1).unwrap();
    assert_eq!(shm.insert_site(30, 2, 1), Err(AbiError::SiteTableFull));
    assert_eq!(shm.lookup_site(30), None);
}

#[test]
fn counters_sum_global_and_threads() {
    let params = Params {
        n_probes: 3,
        n_site_slots: 4,
        n_threads: 2,
        ring_capacity: 2,
        event_size: EVENT_SIZE_FULL,
    };
    let (_buf, shm) = make(params);
    let a = shm.claim_thread(1).unwrap();
    let b = shm.claim_thread(2).unwrap();
    assert_eq!(shm.claim_thread(3), None);
    shm.thread_counters(a).unwrap()[1].store(10, Relaxed);
    shm.thread_counters(b).unwrap()[1].store(5, Relaxed);
    shm.global_counters()[1].store(2, Relaxed);
    assert_eq!(shm.counter(1), 17);
    assert_eq!(shm.counter(2), 0);
    assert_eq!(shm.counter(99), 0);
    assert_eq!(shm.ring_ctl(a).unwrap().owner_tid.load(Relaxed), 1);
}

#[test]
fn attach_validates_header() {
    let params = Params {
        n_probes: 3,
        n_site_slots: 4,
        n_threads: 2,
        ring_capacity: 2,
        event_size: EVENT_SIZE_FULL,
    };
    let l = Layout::new(params).unwrap();
    let buf = Buf::new(l.total_size);
    // SAFETY: zeroed buffer of the right size.
    let r = unsafe { Shm::attach(buf.ptr, l.total_size) };
    assert!(matches!(r, Err(AbiError::BadMagic(0))));
    // SAFETY: as above.
    unsafe { Shm::create(buf.ptr, l.total_size, params) }.unwrap();
    // SAFETY: as above.
    let r = unsafe { Shm::attach(buf.ptr, l.total_size - 1) };
    assert!(matches!(r, Err(AbiError::TooSmall { .. })));
    // SAFETY: as above.
    assert!(unsafe { Shm::attach(buf.ptr, l.total_size) }.is_ok());
    // Scribbled parameters are refused, not followed.
    // SAFETY: in bounds of the header.
    unsafe { (buf.ptr.add(36) as *mut u32).write(3) }; // ring_capacity = 3
                                                       // SAFETY: as above.
    assert!(unsafe { Shm::attach(buf.ptr, l.total_size) }.is_err());
    assert!(Layout::new(Params {
        ring_capacity: 3,
        ..params
    })
    .is_err());
    assert!(Layout::new(Params {
        n_probes: 0,
        ..params
    })
    .is_err());
    assert!(Layout::new(Params {
        event_size: 72,
        ..params
    })
    .is_err());
    // A scribbled event size is refused too.
    // SAFETY: as above.
    unsafe { Shm::create(buf.ptr, l.total_size, params) }.unwrap();
    // SAFETY: in bounds of the header (`Header::event_size`).
    unsafe { (buf.ptr.add(108) as *mut u32).write(32) };
    // SAFETY: as above.
    assert!(unsafe { Shm::attach(buf.ptr, l.total_size) }.is_err());
}

#[test]
fn patch_bytes() {
    assert_eq!(
        patch::call_rel32(0x1000, 0x2000),
        Some([0xe8, 0xfb, 0x0f, 0, 0])
    );
    assert_eq!(
        patch::jmp_rel32(0x2000, 0x1000),
        Some([0xe9, 0xfb, 0xef, 0xff, 0xff])
    );
    assert_eq!(patch::call_rel32(0x1000, 0x1_0000_0000_0000), None);
    let s = patch::abs_jmp_stub(0x1122_3344_5566_7788);
    assert_eq!(&s[..6], &[0xff, 0x25, 0, 0, 0, 0]);
    assert_eq!(
        u64::from_le_bytes(s[6..14].try_into().unwrap()),
        0x1122_3344_5566_7788
    );
}

#[test]
fn tsc_calibration() {
    let c = TscCalibration {
        tsc0: 1000,
        ns0: 0,
        tsc1: 3000,
        ns1: 1000,
    };
    assert_eq!(c.to_ns(2000), Some(500));
    assert_eq!(c.ticks_per_sec(), Some(2_000_000_000));
    assert!(rdtsc() > 0);
}

/// An entry's stack id (`reserved2`) rides in the meta word's high half
/// and comes back out; events without one read 0.
#[test]
fn an_entry_carries_its_stack_id() {
    for event_size in [EVENT_SIZE_COMPACT, EVENT_SIZE_FULL] {
        let params = Params {
            n_probes: 1 << 24,
            n_site_slots: 2,
            n_threads: 1,
            ring_capacity: 8,
            event_size,
        };
        let (_buf, shm) = make(params);
        assert_eq!(shm.claim_thread(9), Some(0));
        let with = Event {
            reserved2: u32::MAX,
            ..ev(3)
        };
        let low = Event {
            reserved2: 1,
            probe_id: (1 << 24) - 1,
            ..ev(4)
        };
        let p = shm.producer(0).unwrap();
        let mut cached = 0;
        for e in [with, low, ev(5)] {
            // SAFETY: single producer.
            assert!(unsafe { p.push(&mut cached, &e) });
        }
        let mut seen = vec![];
        shm.consumer(0).unwrap().drain(|e| seen.push(*e)).unwrap();
        let ids: Vec<(u32, u32)> = seen.iter().map(|e| (e.probe_id, e.reserved2)).collect();
        assert_eq!(ids, [(3, u32::MAX), ((1 << 24) - 1, 1), (5, 0)]);
        assert_eq!(seen[0].kind, KIND_ENTRY);
        assert_eq!(seen[0].args[0], 3);
    }
}
