//! The code ledger ([`crate::LedgerCtl`]): the tracer publishes every site
//! of the fast path before writing it and takes it out after restoring it;
//! the agent reads it when the tracer is gone.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::Shm;
use crate::layout::{
    ledger_capacity, LedgerCtl, LedgerEntry, LEDGER_BYTES, LEDGER_FREE, LEDGER_LIVE, LEDGER_WRITING,
};

/// A site as the ledger holds it (see [`Shm::ledger_site`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerSite {
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes of the site (at most [`LEDGER_BYTES`]).
    pub len: usize,
    /// The owner bits ([`crate::LEDGER_PATCH`], …).
    pub owner: u32,
    /// The original bytes (`len` of them count).
    pub original: [u8; LEDGER_BYTES],
    /// The bytes the tracer wrote (`len` of them count).
    pub written: [u8; LEDGER_BYTES],
}

fn store_bytes(words: &[core::sync::atomic::AtomicU64], bytes: &[u8]) {
    let mut buf = [0u8; LEDGER_BYTES];
    buf[..bytes.len()].copy_from_slice(bytes);
    for (w, chunk) in words.iter().zip(buf.chunks_exact(8)) {
        let mut v = [0u8; 8];
        v.copy_from_slice(chunk);
        w.store(u64::from_le_bytes(v), Relaxed);
    }
}

fn load_bytes(words: &[core::sync::atomic::AtomicU64]) -> [u8; LEDGER_BYTES] {
    let mut buf = [0u8; LEDGER_BYTES];
    for (w, chunk) in words.iter().zip(buf.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    buf
}

impl Shm {
    fn ledger_base(&self) -> *mut u8 {
        // SAFETY: the validated layout puts the ledger inside the mapping.
        unsafe { self.base.as_ptr().add(self.layout.ledger_offset) }
    }

    /// The ledger's control words.
    pub fn ledger_ctl(&self) -> &LedgerCtl {
        // SAFETY: in bounds (layout), 64-byte aligned (a page), all
        // atomics but `capacity`, a plain field written at creation.
        unsafe { &*(self.ledger_base() as *const LedgerCtl) }
    }

    /// The ledger's entries ([`ledger_capacity`] of them).
    pub fn ledger(&self) -> &[LedgerEntry] {
        // SAFETY: in bounds (layout: the control block, then the entries),
        // aligned, all atomics.
        unsafe {
            core::slice::from_raw_parts(
                self.ledger_base().add(core::mem::size_of::<LedgerCtl>()) as *const LedgerEntry,
                ledger_capacity(&self.layout.params),
            )
        }
    }

    /// The entries that may be in use (`0..high_water`).
    pub fn ledger_in_use(&self) -> &[LedgerEntry] {
        let all = self.ledger();
        // Acquire pairs with the Release `fetch_max` in `publish_site`.
        let n = self.ledger_ctl().high_water.load(Acquire) as usize;
        all.get(..n).unwrap_or(all)
    }

    /// Publishes entry `index` (tracer side, the only writer; the entry
    /// free): the site at `addr` whose `original` bytes the tracer is about
    /// to replace with `written` (same length, at most [`LEDGER_BYTES`]);
    /// `owner` is one of [`crate::LEDGER_PATCH`], … Publish before the
    /// bytes go into the target. False (nothing published) when `index`
    /// is out of range or the site too long.
    pub fn publish_site(
        &self,
        index: u32,
        addr: u64,
        original: &[u8],
        written: &[u8],
        owner: u32,
    ) -> bool {
        let Some(e) = self.ledger().get(index as usize) else {
            return false;
        };
        if original.len() != written.len() || written.len() > LEDGER_BYTES || written.is_empty() {
            return false;
        }
        e.state.store(LEDGER_WRITING, Relaxed);
        e.addr.store(addr, Relaxed);
        e.info.store(written.len() as u32 | owner, Relaxed);
        store_bytes(&e.original, original);
        store_bytes(&e.written, written);
        // Release pairs with the Acquire loads of `state` in `ledger_site`:
        // every field is seen once LIVE is.
        e.state.store(LEDGER_LIVE, Release);
        self.ledger_ctl().high_water.fetch_max(index + 1, Release);
        true
    }

    /// Takes entry `index` out (tracer side): call it after the tracer put
    /// the original bytes back itself (or gave the site up).
    pub fn unpublish_site(&self, index: u32) {
        if let Some(e) = self.ledger().get(index as usize) {
            // Release: a reader that sees FREE sees nothing else of ours.
            e.state.store(LEDGER_FREE, Release);
        }
    }

    /// The site entry `e` describes, if it is published ([`LEDGER_LIVE`]).
    /// Only atomics: callable from a signal handler.
    pub fn ledger_site(&self, e: &LedgerEntry) -> Option<LedgerSite> {
        // Acquire pairs with the Release store of LIVE in `publish_site`.
        if e.state.load(Acquire) != LEDGER_LIVE {
            return None;
        }
        let info = e.info.load(Relaxed);
        let len = (info & 0xff) as usize;
        if len == 0 || len > LEDGER_BYTES {
            return None;
        }
        Some(LedgerSite {
            addr: e.addr.load(Relaxed),
            len,
            owner: info & crate::LEDGER_OWNER_MASK,
            original: load_bytes(&e.original),
            written: load_bytes(&e.written),
        })
    }
}
