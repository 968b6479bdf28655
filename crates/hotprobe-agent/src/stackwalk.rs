//! Stacks at a hit (issue 24, `--stacks`): the agent walks the hitting
//! thread's user stack at a function entry and adds it to the stack table
//! of the stacks region ([`hotprobe_abi::stacks`]), where the tracer reads
//! and symbolizes it afterwards.
//!
//! The walk ([`hotprobe_abi::stacks::walk`]) follows the tracer's
//! compiled `.eh_frame` rows, frame pointers where a module has none, and
//! maps return addresses the agent swapped for its return trampoline back
//! through the thread's shadow stack, and those the tracer swapped for its
//! trap return trampoline (a trap `%return` probe) through the return
//! instances it publishes (`Shm::find_return`). It reads only the thread's own
//! stack, between the hit's stack pointer and the end of the readable
//! region (a stack mapping the tracer published) that holds it: never
//! memory the program could have unmapped, and no `SIGSEGV` handler.
//! The tables may change under the walk (a library loaded): the region's
//! sequence is read before and after, and a walk that saw a change is
//! dropped and counted (`torn`). No allocation, no lock, no system call.

use core::sync::atomic::Ordering::{Acquire, Relaxed};

use hotprobe_abi::stacks::{find_row, walk, StacksView, WalkStart, CFA_NONE, MAX_FRAMES};
use hotprobe_abi::Shm;

use crate::hit::{return_trampoline, Shadow, ThreadEntry};
use crate::trampoline::Frame;

/// Captures the stack of an entry hit of `probe` (the trampoline's
/// `frame`: `slot` is the function's return-address slot) into the stack
/// table. Called with the thread's busy flag held.
#[inline(never)]
pub(crate) fn capture(shm: &Shm, t: &ThreadEntry, frame: &Frame, probe: u32) {
    let Some(view) = StacksView::of(shm) else {
        return;
    };
    let ctl = view.ctl();
    let slot = frame.slot;
    if slot == 0 {
        return;
    }
    // The trampoline pushed the program's rbp right below the site key,
    // which sits right below `slot` (see `trampoline`).
    // SAFETY: `slot - 16` is the trampoline's own saved-rbp word on this
    // thread's stack, written before the fast path was called.
    let rbp = unsafe { (slot.wrapping_sub(16) as *const u64).read() };
    let seq = ctl.seq.load(Acquire);
    if seq & 1 != 0 {
        ctl.torn.fetch_add(1, Relaxed);
        return;
    }
    // Reads stay on this thread's stack: [slot, end of its region).
    let end = view
        .regions()
        .iter()
        .find(|r| r.start <= slot && slot < r.end)
        .map_or(0, |r| r.end);
    let read = |addr: u64| -> Option<u64> {
        if addr < slot || addr > end.checked_sub(8)? || addr % 8 != 0 {
            return None;
        }
        // SAFETY: `addr` lies between this thread's stack pointer at the
        // hit and the end of the stack mapping holding it, as the tracer
        // read it from the maps: mapped, readable memory of this thread.
        Some(unsafe { (addr as *const u64).read_volatile() })
    };
    let tramp = return_trampoline();
    let shadow = t.shadow.load(Relaxed) as *const Shadow;
    let depth = t.depth.load(Relaxed) as usize;
    let rows = view.rows();
    let tid = t.tid.load(Relaxed);
    let fix = |at: u64, word: u64| -> Option<u64> {
        if word != tramp {
            // No CFI covers it: maybe the tracer's trap return trampoline
            // (a trap `%return` probe), whose real address it published.
            let covered =
                find_row(rows, word.wrapping_sub(1)).is_some_and(|r| r.cfa_reg != CFA_NONE);
            if !covered {
                return Some(shm.find_return(tid, at).unwrap_or(word));
            }
            return Some(word);
        }
        if shadow.is_null() {
            return None;
        }
        // The newest shadow entry of this slot holds the real address.
        (0..depth).rev().find_map(|i| {
            // SAFETY: i < depth ≤ SHADOW_CAP entries of the thread's
            // shadow mapping; only this thread writes it.
            let e = unsafe { *shadow.add(i) };
            (e.slot == at).then_some(e.real)
        })
    };
    let mut frames = [0u64; MAX_FRAMES];
    let first = if end == 0 { None } else { read(slot) };
    let Some(first) = first else {
        ctl.no_region.fetch_add(1, Relaxed);
        return;
    };
    let start = WalkStart {
        ret: first,
        rsp: slot.wrapping_add(8),
        rbp,
    };
    let Some(ret) = fix(slot, first) else {
        return;
    };
    let start = WalkStart { ret, ..start };
    let out = walk(rows, start, read, fix, &mut frames);
    // Pairs with the tracer's Release increment after it rewrote tables.
    if ctl.seq.load(Acquire) != seq {
        ctl.torn.fetch_add(1, Relaxed);
        return;
    }
    ctl.captured.fetch_add(1, Relaxed);
    if out.truncated {
        ctl.truncated.fetch_add(1, Relaxed);
    }
    view.add(probe, frames.get(..out.depth).unwrap_or(&[]), out.truncated);
}
