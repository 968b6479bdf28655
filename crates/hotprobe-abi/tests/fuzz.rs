//! Bounded fuzz pass (hotprobe-fuzzcheck): `Shm::attach` validates any
//! header it is given, and a view it accepts never reads or writes out of
//! the mapping nor panics, whatever the rest of the memory holds. Same
//! input handling as the cargo-fuzz target `shm_attach` in `fuzz/`
//! (docs/FUZZING.md): the input is the whole mapping.

#[path = "fuzz/exercise.rs"]
mod exercise;

use exercise::Buf;
use hotprobe_abi::*;
use hotprobe_fuzzcheck::Fuzz;

/// A mapping as the tracer leaves it: sites, a claimed thread, events.
fn seed(params: Params) -> Vec<u8> {
    let l = Layout::new(params).unwrap();
    let buf = Buf::with(&vec![0u8; l.total_size]);
    // SAFETY: the buffer outlives the view (dropped at the end of scope).
    let shm = unsafe { Shm::create(buf.ptr, buf.len, params) }.unwrap();
    shm.insert_site(0x5555_5555_5123, 1, 1).unwrap();
    shm.insert_site(0x7fff_f7da_8000, 2, 3).unwrap();
    let slot = shm.claim_thread_for(7, 42).unwrap();
    let p = shm.producer(slot).unwrap();
    let mut cached = 0;
    for i in 0..3u64 {
        let ev = Event {
            tsc: 1000 + i,
            probe_id: (i % 2) as u32,
            tid: 42,
            kind: KIND_ENTRY,
            nargs: 2,
            args: [i, !i, 0, 0, 0, 0],
            ..Default::default()
        };
        // SAFETY: this thread is the ring's only producer.
        assert!(unsafe { p.push(&mut cached, &ev) });
    }
    buf.bytes()
}

#[test]
fn fuzz_shm_attach() {
    let small = Params {
        n_probes: 4,
        n_site_slots: 8,
        n_threads: 2,
        ring_capacity: 4,
        event_size: EVENT_SIZE_COMPACT,
    };
    let full = Params {
        n_probes: 3,
        n_site_slots: 4,
        n_threads: 3,
        ring_capacity: 4,
        event_size: EVENT_SIZE_FULL,
    };
    Fuzz::new("shm_attach")
        .seed(seed(small))
        .seed(seed(full))
        .tokens([&b"HOTPROBE"[..], &VERSION.to_le_bytes()])
        .iterations(20_000)
        .run(exercise::shm_attach);
}
