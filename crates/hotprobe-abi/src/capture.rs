//! Typed values copied in the target (issue 23 item 5): the tracer
//! compiles what a typed probe reads at its entry (an argument register,
//! a stack slot, a field through a pointer, a string) into a fixed-size
//! [`CaptureProgram`] and publishes it in the capture table, keyed by
//! probe id; a site whose action has [`crate::ACTION_CAPTURE`] makes the
//! agent run it at each recorded entry and write the bytes in front of the
//! entry event as [`crate::KIND_DATA`] continuation events (see
//! [`crate::Producer::push_with_data`]). A probe may also have an exit
//! program (a returned string), run the same way at the return the
//! agent's return hook takes, on rax and rdx.
//!
//! The bytes are the trap path's capture records, one per item, so the
//! tracer formats them the same way (`hotprobe_dwarf::format_values`):
//! - `0` then 8 bytes: a value (little-endian, zero-extended);
//! - `1`, a truncated flag, a 2-byte length, the bytes: a string (at most
//!   [`CAPTURE_STRING_MAX`] bytes, flag 1 when cut);
//! - `2` then 8 bytes: the address that could not be read;
//! - `3`: not available;
//! - `4`: a null string pointer.
//!
//! The region sits at [`crate::Layout::capture_offset`], after the
//! aggregation region: [`CAPTURE_SLOTS`] slots of [`CAPTURE_SLOT_SIZE`]
//! bytes, open addressing by probe id (linear probing).

use core::mem::size_of;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::Shm;

/// Items a program holds (values shown per entry).
pub const CAPTURE_ITEMS: usize = 8;
/// Loads an item follows (`p->a->b`: 2; a stack slot: 1).
pub const CAPTURE_STEPS: usize = 4;
/// Longest string copied (bytes, the NUL not counted): the trap path's
/// `hotprobe_dwarf::MAX_STRING`.
pub const CAPTURE_STRING_MAX: usize = 128;
/// Slots of the capture table (functions with a program at once).
pub const CAPTURE_SLOTS: usize = 1024;
/// Bytes per slot.
pub const CAPTURE_SLOT_SIZE: usize = 512;
/// Bytes of the capture region: the slots.
pub const CAPTURE_REGION_SIZE: usize = CAPTURE_SLOTS * CAPTURE_SLOT_SIZE;
/// Longest payload a program writes: every item a cut string.
pub const CAPTURE_MAX_PAYLOAD: usize = CAPTURE_ITEMS * (4 + CAPTURE_STRING_MAX);

/// [`CaptureItem::base`]: the value is not available (record `3`).
pub const BASE_MISSING: u8 = 0;
/// [`CaptureItem::base`]: integer argument register `reg` (rdi, rsi, rdx,
/// rcx, r8, r9).
pub const BASE_ARG: u8 = 1;
/// [`CaptureItem::base`]: rax.
pub const BASE_RAX: u8 = 2;
/// [`CaptureItem::base`]: the low 64 bits of xmm`reg` (0–5).
pub const BASE_XMM: u8 = 3;
/// [`CaptureItem::base`]: the stack pointer at the function's first
/// instruction (its return address's slot); only at entry sites that
/// see the stack as the function's first instruction does.
pub const BASE_RSP: u8 = 4;
/// [`CaptureItem::base`]: the constant [`CaptureItem::konst`].
pub const BASE_CONST: u8 = 5;

/// One value: a base, then `nsteps` loads (`v = *(v + offset)`, `size`
/// bytes zero-extended), then either the value or, with `string`, the
/// NUL-terminated string `v` points to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureItem {
    /// `BASE_*`.
    pub base: u8,
    /// The register of [`BASE_ARG`] and [`BASE_XMM`].
    pub reg: u8,
    /// Loads to follow (≤ [`CAPTURE_STEPS`]).
    pub nsteps: u8,
    /// 1: the result is a string pointer.
    pub string: u8,
    /// Bytes of each load (1, 2, 4 or 8).
    pub sizes: [u8; CAPTURE_STEPS],
    /// The value of [`BASE_CONST`].
    pub konst: u64,
    /// Added to the value before each load.
    pub offsets: [u64; CAPTURE_STEPS],
}
const _: () = assert!(size_of::<CaptureItem>() == 48);

/// What one probe reads at its entries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureProgram {
    /// Items used (≤ [`CAPTURE_ITEMS`]).
    pub n_items: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The items, in the order their records are written.
    pub items: [CaptureItem; CAPTURE_ITEMS],
}
const _: () = assert!(size_of::<CaptureProgram>() == 392);

impl CaptureProgram {
    /// Whether an item reads the stack ([`BASE_RSP`]).
    pub fn reads_stack(&self) -> bool {
        self.items().iter().any(|i| i.base == BASE_RSP)
    }

    /// The items used.
    pub fn items(&self) -> &[CaptureItem] {
        &self.items[..(self.n_items as usize).min(CAPTURE_ITEMS)]
    }
}

/// The entry and exit programs of one probe: the exit's (a string or a
/// field through the returned pointer) runs at the return the agent's
/// return hook takes, on rax and rdx.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapturePrograms {
    /// What the entry reads.
    pub entry: CaptureProgram,
    /// What the return reads (`None`: rax and rdx, as recorded).
    pub exit: Option<CaptureProgram>,
}

/// A slot whose program was taken back, or is being rewritten: lookups
/// pass over it (no real key has all of bits 0–30 set: probe ids are
/// below 2^24).
const KEY_GONE: u32 = 0x7fff_ffff;

/// The table key of `probe`'s entry program (`exit`: its exit program).
const fn key_of(probe: u32, exit: bool) -> u32 {
    (probe.wrapping_add(1) & 0x7fff_ffff) | if exit { 1 << 31 } else { 0 }
}

/// One slot of the capture table.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct CaptureSlot {
    /// 0: empty; else probe id + 1, with bit 31 for an exit program.
    /// Written last by the tracer (Release),
    /// after the program; cleared first when the program is taken back.
    pub key: AtomicU32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The program (read only while `key` holds its probe).
    pub program: CaptureProgram,
}
const _: () = assert!(size_of::<CaptureSlot>() <= CAPTURE_SLOT_SIZE);

fn slot_ptr(shm: &Shm, i: usize) -> *mut CaptureSlot {
    // SAFETY: the layout puts CAPTURE_REGION_SIZE bytes at capture_offset
    // inside the mapping (validated); i < CAPTURE_SLOTS by the callers.
    unsafe {
        shm.as_ptr()
            .add(shm.layout().capture_offset + i * CAPTURE_SLOT_SIZE)
            .cast()
    }
}

fn home(probe: u32, exit: bool) -> usize {
    (probe as usize)
        .wrapping_mul(2)
        .wrapping_add(exit as usize)
        .wrapping_mul(0x9E37_79B9)
        % CAPTURE_SLOTS
}

/// The entry program of `probe`, if the tracer published one (the agent,
/// at a hit of a site with [`crate::ACTION_CAPTURE`]).
#[inline]
pub fn find(shm: &Shm, probe: u32) -> Option<&CaptureProgram> {
    find_key(shm, probe, false)
}

/// The exit program of `probe`, if the tracer published one.
#[inline]
pub fn find_exit(shm: &Shm, probe: u32) -> Option<&CaptureProgram> {
    find_key(shm, probe, true)
}

#[inline]
fn find_key(shm: &Shm, probe: u32, exit: bool) -> Option<&CaptureProgram> {
    let want = key_of(probe, exit);
    let mut i = home(probe, exit);
    let mut n = 0;
    while n < CAPTURE_SLOTS {
        let s = slot_ptr(shm, i);
        // SAFETY: in the region (see `slot_ptr`), 64-aligned; `key` is atomic.
        let key = unsafe { &(*s).key };
        // Acquire pairs with `publish`'s Release store of the key: the
        // program's words are written before.
        match key.load(Ordering::Acquire) {
            0 => return None,
            KEY_GONE => {}
            // SAFETY: the program is written before its key and not
            // changed while the key holds it.
            k if k == want => return Some(unsafe { &(*s).program }),
            _ => {}
        }
        i = (i + 1) % CAPTURE_SLOTS;
        n += 1;
    }
    None
}

/// Publishes `program` as `probe`'s entry program (the tracer; one
/// writer). `false` when the table is full.
pub fn publish(shm: &Shm, probe: u32, program: &CaptureProgram) -> bool {
    publish_key(shm, probe, false, program)
}

/// Publishes `program` as `probe`'s exit program (see [`publish`]).
pub fn publish_exit(shm: &Shm, probe: u32, program: &CaptureProgram) -> bool {
    publish_key(shm, probe, true, program)
}

fn publish_key(shm: &Shm, probe: u32, exit: bool, program: &CaptureProgram) -> bool {
    let want = key_of(probe, exit);
    let mut i = home(probe, exit);
    for _ in 0..CAPTURE_SLOTS {
        let s = slot_ptr(shm, i);
        // SAFETY: in the region, aligned; `key` is atomic.
        let key = unsafe { &(*s).key };
        let k = key.load(Ordering::Relaxed);
        if k == 0 || k == want {
            if k == want {
                // Taken back while rewritten: no hit reads half a program
                // (and lookups of other keys still pass over the slot).
                key.store(KEY_GONE, Ordering::Release);
            }
            // SAFETY: the slot is ours (one writer) and no reader reads
            // the program while its key is not this probe's.
            unsafe { core::ptr::addr_of_mut!((*s).program).write_volatile(*program) };
            // Release pairs with `find`'s Acquire load.
            key.store(want, Ordering::Release);
            return true;
        }
        i = (i + 1) % CAPTURE_SLOTS;
    }
    false
}

/// Takes back `probe`'s exit program, if any (the tracer: a probe id
/// given again, without one). Its slot is not reused.
pub fn withdraw_exit(shm: &Shm, probe: u32) {
    let want = key_of(probe, true);
    let mut i = home(probe, true);
    for _ in 0..CAPTURE_SLOTS {
        let s = slot_ptr(shm, i);
        // SAFETY: in the region, aligned; `key` is atomic.
        let key = unsafe { &(*s).key };
        match key.load(Ordering::Relaxed) {
            0 => return,
            k if k == want => {
                key.store(KEY_GONE, Ordering::Release);
                return;
            }
            _ => {}
        }
        i = (i + 1) % CAPTURE_SLOTS;
    }
}

/// Payload bytes one [`crate::KIND_DATA`] event carries (its six value
/// words; its tsc word holds how many of them are used).
pub const DATA_BYTES_PER_EVENT: usize = 48;

/// Continuation events a payload of `len` bytes takes.
pub const fn data_events(len: usize) -> usize {
    len.div_ceil(DATA_BYTES_PER_EVENT)
}
