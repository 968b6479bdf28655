//! Typed values copied in the target (issue 23 item 5): at a recorded
//! entry of a site whose action has `ACTION_CAPTURE`, the probe's capture
//! program ([`hotprobe_abi::capture`]) runs on the trampoline's saved
//! registers and writes the trap path's capture records (a value, a
//! string, an unreadable address, not available, a null string) as
//! continuation events in front of the entry event, all published at once
//! ([`hotprobe_abi::Producer::push_with_data`]).
//!
//! Memory is read through [`crate::saferead`], never by a plain load: a
//! hardware transaction where the processor has one (no system call; a
//! load that would fault aborts it), else or when it aborts
//! `process_vm_readv` on our own pid. Memory that is not mapped readable
//! gives the unreadable record, never a fault, and no signal handler is
//! involved. A string is at most [`CAPTURE_STRING_MAX`] bytes, read up to
//! its NUL. No allocation, no lock; the bytes go from a stack buffer
//! into the ring's slots.

use core::mem::MaybeUninit;
use core::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::capture::{
    CaptureItem, CaptureProgram, BASE_ARG, BASE_CONST, BASE_RAX, BASE_RSP, BASE_XMM, CAPTURE_ITEMS,
    CAPTURE_STEPS, CAPTURE_STRING_MAX,
};
use hotprobe_abi::{DataWriter, Event, Producer, Shm, ACTION_CAPTURE, KIND_EXIT};

use crate::hit::ThreadEntry;
use crate::trampoline::Frame;

/// Writes entry event `ev` of a capturing site into `p`, preceded by its
/// program's bytes; a probe without a published program gets the event
/// alone. `false` when the ring had no room (a counted drop).
#[inline(never)]
pub(crate) fn push_entry(
    shm: &Shm,
    t: &ThreadEntry,
    frame: &Frame,
    p: &Producer<'_>,
    limit: &mut u64,
    ev: &Event,
) -> bool {
    let Some(prog) = hotprobe_abi::capture::find(shm, ev.probe_id) else {
        // SAFETY: the caller owns the ring (busy flag held).
        return unsafe { p.push(limit, ev) };
    };
    let slot = t.slot.load(Relaxed);
    let pid = match shm.ring_ctl(slot).map(|c| c.owner_pid.load(Relaxed)) {
        Some(pid) if pid != 0 => pid,
        _ => crate::threads::getpid(),
    };
    // Seccomp strict mode allows no system call: memory reads as
    // unreadable there (no event is recorded then anyway: no clock).
    let reads = t.clock.load(Relaxed) != crate::clock::CLOCK_NONE && !crate::clock::filtered();
    let base = |it: &CaptureItem| {
        let reg = usize::from(it.reg);
        match it.base {
            BASE_ARG => frame.args.get(reg).copied(),
            BASE_RAX => Some(frame.rax),
            BASE_XMM => frame.xmm.get(reg).copied(),
            BASE_RSP if frame.slot != 0 => Some(frame.slot),
            BASE_CONST => Some(it.konst),
            _ => None,
        }
    };
    push_program(p, limit, ev, prog, (pid, reads), &base)
}

/// [`Shadow::flags`](crate::hit::Shadow) bit: the return runs the
/// probe's exit program (the site's action has `ACTION_CAPTURE`).
pub(crate) const SHADOW_CAPTURE: u32 = 16;

/// The shadow flag of a hooked entry whose site has `action`.
#[inline(always)]
pub(crate) fn shadow_flag(action: u32) -> u32 {
    if action & ACTION_CAPTURE != 0 {
        SHADOW_CAPTURE
    } else {
        0
    }
}

/// Records the return of `probe` (rax, rdx) with its exit program's bytes
/// (a returned string), or as a plain exit without one. Called by the
/// return hook with the thread's busy flag held.
#[inline(never)]
pub(crate) fn record_exit(shm: &Shm, t: &ThreadEntry, probe: u32, rax: u64, rdx: u64) {
    let Some(prog) = hotprobe_abi::capture::find_exit(shm, probe) else {
        crate::hit::record_exit(shm, t, probe, rax, rdx, None, 0);
        return;
    };
    let slot = t.slot.load(Relaxed);
    let Some(p) = shm.producer(slot) else {
        shm.header().drops_no_thread.fetch_add(1, Relaxed);
        shm.note_missed(probe);
        return;
    };
    let clock = t.clock.load(Relaxed);
    let Some(tsc) = crate::clock::now_tsc(shm, clock) else {
        crate::hit::refuse_events(shm, shm.ring_ctl(slot), probe, 1);
        return;
    };
    let pid = match shm.ring_ctl(slot).map(|c| c.owner_pid.load(Relaxed)) {
        Some(pid) if pid != 0 => pid,
        _ => crate::threads::getpid(),
    };
    let reads = clock != crate::clock::CLOCK_NONE && !crate::clock::filtered();
    let ev = Event {
        tsc,
        probe_id: probe,
        tid: t.tid.load(Relaxed),
        kind: KIND_EXIT,
        nargs: 2,
        reserved: 0,
        reserved2: 0,
        args: [rax, rdx, 0, 0, 0, 0],
    };
    // Only the returned value is known at a return.
    let base = |it: &CaptureItem| match it.base {
        BASE_RAX => Some(rax),
        BASE_CONST => Some(it.konst),
        _ => None,
    };
    let mut limit = t.fast.limit.load(Relaxed);
    if !push_program(&p, &mut limit, &ev, prog, (pid, reads), &base) {
        shm.note_missed(probe);
    }
    t.fast.limit.store(limit, Relaxed);
}

/// Pushes `ev` preceded by the records of `prog`'s items, each starting
/// from `base(item)`.
#[inline(always)]
fn push_program(
    p: &Producer<'_>,
    limit: &mut u64,
    ev: &Event,
    prog: &CaptureProgram,
    (pid, reads): (u32, bool),
    base: &dyn Fn(&CaptureItem) -> Option<u64>,
) -> bool {
    let mem = Memory { pid, reads };
    let n = (prog.n_items as usize).min(CAPTURE_ITEMS);
    let max = max_len(prog, n);
    // SAFETY: the caller owns the ring (busy flag held).
    unsafe {
        p.push_with_data(limit, ev, max, |w| {
            let mut i = 0;
            while i < n {
                if let Some(item) = prog.items.get(i) {
                    run_item(item, base(item), &mem, w);
                }
                i += 1;
            }
        })
    }
}

/// Bytes the first `n` items of `prog` write at most.
fn max_len(prog: &CaptureProgram, n: usize) -> usize {
    let mut len = 0;
    let mut i = 0;
    while i < n {
        len += match prog.items.get(i) {
            Some(it) if it.string != 0 => 4 + CAPTURE_STRING_MAX,
            _ => 9,
        };
        i += 1;
    }
    len
}

/// Where an item's memory is read from.
struct Memory {
    /// This process, for `process_vm_readv`.
    pid: u32,
    /// Whether system calls may be made (no seccomp filter or strict mode).
    reads: bool,
}

impl Memory {
    /// The `size` bytes (1–8) at `a`, zero-extended, through
    /// [`crate::saferead`] (never a plain load: a program may make any page
    /// of its own, its image's included, unreadable — `mprotect(PROT_NONE)`
    /// on a page of its `.rodata` was killed by a direct read of a
    /// published image range).
    #[inline(always)]
    fn value(&self, a: u64, size: u8) -> Option<u64> {
        if a == 0 || !self.reads {
            return None;
        }
        crate::saferead::read_value(self.pid, a, size)
    }

    /// Copies up to `len` bytes at `addr` into `dst`, or up to and
    /// including a NUL byte (see [`crate::saferead::read_into`]): how many
    /// were copied.
    ///
    /// # Safety
    /// `dst` is valid for writes of `len` bytes.
    #[inline(always)]
    unsafe fn string_bytes(&self, addr: u64, dst: *mut u8, len: usize) -> usize {
        if !self.reads {
            return 0;
        }
        // SAFETY: caller contract.
        unsafe { crate::saferead::read_into(self.pid, addr, dst, len, true) }
    }
}

/// One item's record, from its base value (`None`: not available).
#[inline(always)]
fn run_item(it: &CaptureItem, base: Option<u64>, mem: &Memory, w: &mut DataWriter<'_>) {
    let Some(mut v) = base else {
        w.byte(3);
        return;
    };
    let steps = usize::from(it.nsteps).min(CAPTURE_STEPS);
    let mut s = 0;
    while s < steps {
        let off = it.offsets.get(s).copied().unwrap_or(0);
        let size = it.sizes.get(s).copied().unwrap_or(8);
        let a = v.wrapping_add(off);
        match mem.value(a, size) {
            Some(x) => v = x,
            None => {
                w.byte(2);
                w.word(a);
                return;
            }
        }
        s += 1;
    }
    if it.string == 0 {
        w.byte(0);
        w.word(v);
    } else if v == 0 {
        w.byte(4);
    } else {
        string(v, mem, w);
    }
}

/// The string record of the NUL-terminated string at `addr`: at most
/// [`CAPTURE_STRING_MAX`] bytes, flagged cut when no NUL came first (the
/// limit, or unreadable memory after some bytes); unreadable when not
/// even its first byte is. One byte more than the limit is read, so that
/// a string of exactly the limit (its NUL right after) is whole.
#[inline(always)]
fn string(addr: u64, mem: &Memory, w: &mut DataWriter<'_>) {
    let mut buf = MaybeUninit::<[u8; CAPTURE_STRING_MAX + 1]>::uninit();
    let b = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: `buf` holds CAPTURE_STRING_MAX + 1 bytes.
    let got = unsafe { mem.string_bytes(addr, b, CAPTURE_STRING_MAX + 1) };
    if got == 0 {
        w.byte(2);
        w.word(addr);
        return;
    }
    let mut len = 0;
    let mut cut = true;
    while len < got {
        // SAFETY: the first `got` bytes were written by the read.
        if unsafe { b.add(len).read_volatile() } == 0 {
            cut = false;
            break;
        }
        len += 1;
    }
    let len = len.min(CAPTURE_STRING_MAX);
    w.byte(1);
    w.byte(cut as u8);
    w.byte(len as u8);
    w.byte((len >> 8) as u8);
    let mut i = 0;
    while i < len {
        // SAFETY: as above, i < len <= got.
        w.byte(unsafe { b.add(i).read_volatile() });
        i += 1;
    }
}
