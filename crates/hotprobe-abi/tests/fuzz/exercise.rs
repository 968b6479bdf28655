//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target `shm_attach` of `fuzz/`
//! (included there by path). Depends on hotprobe-abi and std only.
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};

use hotprobe_abi::*;

/// A zeroed, page-aligned buffer standing in for the memfd mapping.
pub struct Buf {
    /// The mapping.
    pub ptr: *mut u8,
    /// Its length.
    pub len: usize,
    layout: AllocLayout,
}

impl Buf {
    /// A buffer holding a copy of `data`.
    pub fn with(data: &[u8]) -> Buf {
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

    /// A copy of the buffer.
    pub fn bytes(&self) -> Vec<u8> {
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

/// The input is the whole mapping: `Shm::attach` validates it, and a view
/// it accepts is used through every accessor (site table, counters, thread
/// slots, ring drains), which must stay inside the mapping and not panic.
/// True if the header was accepted.
pub fn shm_attach(data: &[u8]) -> bool {
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
