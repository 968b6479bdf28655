//! Bounded fuzz pass (hotprobe-fuzzcheck): `Shm::attach` validates any
//! header it is given, and a view it accepts never reads or writes out of
//! the mapping nor panics, whatever the rest of the memory holds. Same
//! input handling as the cargo-fuzz target `shm_attach` in `fuzz/`
//! (docs/FUZZING.md): the input is the whole mapping.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};

use hotprobe_abi::*;
use hotprobe_fuzzcheck::Fuzz;

/// A zeroed, page-aligned buffer standing in for the memfd mapping.
struct Buf {
    ptr: *mut u8,
    len: usize,
    layout: AllocLayout,
}

impl Buf {
    fn with(data: &[u8]) -> Buf {
        let layout = AllocLayout::from_size_align(data.len().max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        // SAFETY: the buffer holds at least data.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Buf {
            ptr,
            len: data.len(),
            layout,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: len bytes were allocated.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

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

fn exercise(data: &[u8]) -> bool {
    let buf = Buf::with(data);
    // SAFETY: the buffer is valid for `len` bytes and outlives the view.
    let shm = match unsafe { Shm::attach(buf.ptr, buf.len) } {
        Ok(s) => s,
        Err(e) => {
            let _ = e.to_string();
            return false;
        }
    };
    let _ = (shm.stub_key(), shm.layout(), shm.len(), shm.sites().len());
    for key in [0x5555_5555_5123, 1, u64::MAX] {
        let _ = shm.lookup_site(key);
        let _ = shm.set_site_action(key, 0);
    }
    let _ = shm.insert_site(0x40_1000, 0, 1);
    let n_probes = shm.layout().params.n_probes;
    for p in [0, 1, n_probes - 1, n_probes, u32::MAX] {
        let _ = shm.counter(p);
    }
    let _ = shm.global_counters().len();
    let _ = (shm.threads_in_use(), shm.total_drops());
    for t in 0..shm.layout().params.n_threads.min(8) {
        let _ = shm.thread_owner(t);
        let _ = shm.thread_counters(t).map(<[_]>::len);
        if let Some(mut c) = shm.consumer(t) {
            let _ = c.drain(|e| {
                let _ = (e.tsc, e.probe_id, e.kind, e.nargs, e.args);
            });
        }
    }
    let _ = shm.claim_thread(1);
    true
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
        .run(exercise);
}
