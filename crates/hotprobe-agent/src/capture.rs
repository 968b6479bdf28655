//! Typed values copied in the target (issue 23 item 5): at a recorded
//! entry of a site whose action has `ACTION_CAPTURE`, the probe's capture
//! program ([`hotprobe_abi::capture`]) runs on the trampoline's saved
//! registers and writes the trap path's capture records (a value, a
//! string, an unreadable address, not available, a null string) as
//! continuation events in front of the entry event, all published at once
//! ([`hotprobe_abi::Producer::push_with_data`]).
//!
//! Memory is read with `process_vm_readv` on our own pid
//! ([`crate::saferead`]): memory that is not mapped gives the unreadable
//! record, never a fault, and no signal handler is involved. A string is
//! one system call (at most [`CAPTURE_STRING_MAX`] bytes, split at a page
//! boundary), a load one. No allocation, no lock; the bytes go straight
//! into the ring's slots.

use core::mem::MaybeUninit;
use core::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::capture::{
    CaptureItem, CaptureProgram, BASE_ARG, BASE_CONST, BASE_RAX, BASE_RSP, BASE_XMM, CAPTURE_ITEMS,
    CAPTURE_STEPS, CAPTURE_STRING_MAX,
};
use hotprobe_abi::{DataWriter, Event, Producer, Shm};

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
    let n = (prog.n_items as usize).min(CAPTURE_ITEMS);
    let max = max_len(prog, n);
    // SAFETY: the caller owns the ring (busy flag held).
    unsafe {
        p.push_with_data(limit, ev, max, |w| {
            let mut i = 0;
            while i < n {
                if let Some(item) = prog.items.get(i) {
                    run_item(item, frame, pid, reads, w);
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

/// One item's record.
#[inline(always)]
fn run_item(it: &CaptureItem, frame: &Frame, pid: u32, reads: bool, w: &mut DataWriter<'_>) {
    let reg = usize::from(it.reg);
    let base = match it.base {
        BASE_ARG => frame.args.get(reg).copied(),
        BASE_RAX => Some(frame.rax),
        BASE_XMM => frame.xmm.get(reg).copied(),
        BASE_RSP if frame.slot != 0 => Some(frame.slot),
        BASE_CONST => Some(it.konst),
        _ => None,
    };
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
        match (a != 0 && reads)
            .then(|| crate::saferead::read_value(pid, a, size))
            .flatten()
        {
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
        string(v, pid, reads, w);
    }
}

/// The string record of the NUL-terminated string at `addr`: at most
/// [`CAPTURE_STRING_MAX`] bytes, flagged cut when no NUL came first (the
/// limit, or unreadable memory after some bytes); unreadable when not
/// even its first byte is.
#[inline(always)]
fn string(addr: u64, pid: u32, reads: bool, w: &mut DataWriter<'_>) {
    let mut buf = MaybeUninit::<[u8; CAPTURE_STRING_MAX]>::uninit();
    let b = buf.as_mut_ptr().cast::<u8>();
    let got = if reads {
        // SAFETY: `buf` holds CAPTURE_STRING_MAX bytes.
        unsafe { crate::saferead::read_into(pid, addr, b, CAPTURE_STRING_MAX) }
    } else {
        0
    };
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
