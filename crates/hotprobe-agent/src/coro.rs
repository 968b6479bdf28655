//! Coroutines: one thread, several stacks (issue 22). A program that
//! switches stacks with `swapcontext` runs hooked functions on each: the
//! thread's shadow stack then holds entries of several stacks,
//! interleaved in time, and a return on one stack must neither take
//! another stack's entry nor take another stack's live entries for dead
//! frames (the single-stack rule: entries below the returning slot are
//! frames left by `longjmp` or an exception).
//!
//! `makecontext`, interposed, notes each coroutine's stack
//! (`uc_stack`) in a process-wide table. While the table is empty (every
//! program without coroutines) the shadow stack works as it always did
//! (`hit::pop_dead` checks one load). Otherwise an address's stack is the
//! table's range holding it, or the thread's own: [`pop_dead`] pops only
//! entries of the returning slot's stack (others stay, whatever their
//! address), and [`take_return`] takes the newest entry whose slot is the
//! returning one, leaving the other stacks' entries in place.
//!
//! Not covered: stacks switched without `makecontext` (hand-written
//! assembly, Boost.Context): their entries are taken as one stack's.

#![cfg_attr(test, allow(dead_code))]

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};

use hotprobe_abi::{Shm, CONTROL_RECORD, EXIT_UNWOUND};

use crate::hit::{Shadow, ThreadEntry, SHADOW_RECORD};

/// Coroutine stacks noted at once (a `makecontext` on a stack overlapping
/// a noted one replaces it: a program reusing its stacks keeps one each).
const MAX_STACKS: usize = 4096;

/// A noted stack: `[lo, hi)`; both 0 when unused or replaced.
struct Range {
    lo: AtomicU64,
    hi: AtomicU64,
}

static STACKS: [Range; MAX_STACKS] = [const {
    Range {
        lo: AtomicU64::new(0),
        hi: AtomicU64::new(0),
    }
}; MAX_STACKS];
/// Slots of [`STACKS`] ever used (a high-water mark).
pub(crate) static USED: AtomicU32 = AtomicU32::new(0);
/// Coroutine stacks that did not fit in the table (their entries are taken
/// as the thread stack's).
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
/// A spin lock for writers (`makecontext` calls): readers take none.
static WRITING: AtomicU32 = AtomicU32::new(0);

/// Whether any coroutine stack was noted.
#[inline(always)]
pub(crate) fn any() -> bool {
    USED.load(Relaxed) != 0
}

/// The stack holding `addr`: 1 + the index of its noted range, or 0 (the
/// thread's own stack).
#[inline(always)]
fn stack_of(addr: u64) -> usize {
    let n = (USED.load(Acquire) as usize).min(MAX_STACKS);
    for (i, r) in STACKS.iter().take(n).enumerate() {
        if addr >= r.lo.load(Relaxed) && addr < r.hi.load(Relaxed) {
            return i + 1;
        }
    }
    0
}

/// Notes the stack `[lo, lo + size)` of a context being made.
fn note(lo: u64, size: u64) {
    let hi = lo.saturating_add(size);
    if lo == 0 || hi <= lo {
        return;
    }
    while WRITING
        .compare_exchange_weak(0, 1, Acquire, Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    let n = (USED.load(Relaxed) as usize).min(MAX_STACKS);
    let mut free = None;
    for (i, r) in STACKS.iter().take(n).enumerate() {
        let (l, h) = (r.lo.load(Relaxed), r.hi.load(Relaxed));
        if l == lo && h == hi {
            WRITING.store(0, Release);
            return;
        }
        if l < hi && lo < h {
            // Overlaps: the memory is another coroutine's stack now.
            r.hi.store(0, Relaxed);
            r.lo.store(0, Relaxed);
        }
        if free.is_none() && r.hi.load(Relaxed) == 0 {
            free = Some(i);
        }
    }
    let i = match free {
        Some(i) => i,
        None if n < MAX_STACKS => n,
        None => {
            OVERFLOW.fetch_add(1, Relaxed);
            WRITING.store(0, Release);
            return;
        }
    };
    if let Some(r) = STACKS.get(i) {
        r.lo.store(lo, Relaxed);
        r.hi.store(hi, Relaxed);
    }
    if i >= n {
        // Release: the range is seen with the count.
        USED.store(i as u32 + 1, Release);
    }
    WRITING.store(0, Release);
}

/// glibc's `makecontext`.
static NEXT_MAKECONTEXT: AtomicUsize = AtomicUsize::new(0);

/// Notes `ucp`'s stack; returns glibc's `makecontext`.
extern "C" fn before_makecontext(ucp: *const libc::ucontext_t) -> usize {
    if !ucp.is_null() {
        // SAFETY: `ucp` is the program's context, valid for makecontext.
        let st = unsafe { (*ucp).uc_stack };
        note(st.ss_sp as u64, st.ss_size as u64);
    }
    let f = crate::next_symbol::next_symbol(&NEXT_MAKECONTEXT, c"makecontext");
    if f == 0 {
        // SAFETY: abort has no preconditions; without glibc's
        // makecontext the program could not have linked against it.
        unsafe { libc::abort() };
    }
    f
}

/// `makecontext`, interposed (variadic: a naked function that keeps every
/// argument register and the stack, then jumps to glibc's).
///
/// # Safety
/// As glibc's `makecontext`.
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn makecontext() {
    core::arch::naked_asm!(
        // Entry rsp ≡ 8 (mod 16); seven pushes make the call aligned.
        "push rax",
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "call {f}",
        "mov r11, rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "pop rax",
        "jmp r11",
        f = sym before_makecontext,
    );
}

/// Entry `j` of the shadow stack at `base`, read word by word (volatile:
/// a whole-struct copy may be compiled to vector moves, which the return
/// path may not use).
///
/// # Safety
/// `j` is below the thread's depth.
#[inline(always)]
unsafe fn load(base: *mut Shadow, j: usize) -> Shadow {
    // SAFETY: per the caller: the 24 bytes of entry j, 8-aligned.
    unsafe {
        let w = base.add(j) as *const u64;
        let (slot, real, last) = (
            w.read_volatile(),
            w.add(1).read_volatile(),
            w.add(2).read_volatile(),
        );
        Shadow {
            slot,
            real,
            probe: last as u32,
            flags: (last >> 32) as u32,
        }
    }
}

/// Writes `e` as entry `j` of the shadow stack at `base` (see [`load`]).
///
/// # Safety
/// `j` is inside the thread's shadow mapping.
#[inline(always)]
unsafe fn store(base: *mut Shadow, j: usize, e: Shadow) {
    // SAFETY: per the caller.
    unsafe {
        let w = base.add(j) as *mut u64;
        w.write_volatile(e.slot);
        w.add(1).write_volatile(e.real);
        w.add(2)
            .write_volatile(u64::from(e.probe) | (u64::from(e.flags) << 32));
    }
}

/// Entry `e` is a dead frame of the stack `stack` when the stack pointer
/// is at `limit` or above (`inclusive`: `limit` itself too).
#[inline(always)]
fn dead(e: &Shadow, stack: usize, limit: u64, inclusive: bool) -> bool {
    (e.slot < limit || (inclusive && e.slot == limit)) && stack_of(e.slot) == stack
}

/// `hit::pop_dead` with coroutine stacks noted: pops (recording an
/// unwound exit for each, newest first) the entries of `limit`'s stack
/// that are dead, down to its first live one, leaving other stacks'
/// entries in place. Returns the real return address of an entry whose
/// slot equals `limit`, if one was popped.
pub(crate) fn pop_dead(
    shm: Option<&Shm>,
    t: &ThreadEntry,
    base: *mut Shadow,
    limit: u64,
    inclusive: bool,
) -> Option<u64> {
    let depth = t.depth.load(Relaxed) as usize;
    let stack = stack_of(limit);
    let record = shm.is_some_and(|s| s.header().control.load(Relaxed) & CONTROL_RECORD != 0);
    let mut same = None;
    // The first live entry of this stack, from the top: nothing below it
    // is popped.
    let mut keep_below = 0;
    let mut popped = 0;
    for j in (0..depth).rev() {
        // SAFETY: j < depth.
        let e = unsafe { load(base, j) };
        if stack_of(e.slot) != stack {
            continue;
        }
        if !dead(&e, stack, limit, inclusive) {
            keep_below = j + 1;
            break;
        }
        if e.slot == limit {
            same = Some(e.real);
        }
        popped += 1;
        if let Some(shm) = shm {
            shm.header().unwound_frames.fetch_add(1, Relaxed);
            if record && e.flags & SHADOW_RECORD != 0 {
                crate::hit::record_exit(shm, t, e.probe, 0, 0, None, EXIT_UNWOUND);
            }
        }
    }
    if popped > 0 {
        let mut w = keep_below;
        for j in keep_below..depth {
            // SAFETY: j < depth.
            let e = unsafe { load(base, j) };
            if !dead(&e, stack, limit, inclusive) {
                // SAFETY: w <= j, inside the mapping.
                unsafe { store(base, w, e) };
                w += 1;
            }
        }
        t.depth.store(w as u32, Relaxed);
    }
    same
}

/// With coroutine stacks noted: takes the newest entry whose slot is
/// `slot` (the return at `slot`'s entry), moving the newer entries of
/// other stacks down over it. None when there is none.
pub(crate) fn take_return(t: &ThreadEntry, base: *mut Shadow, slot: u64) -> Option<Shadow> {
    let depth = t.depth.load(Relaxed) as usize;
    for j in (0..depth).rev() {
        // SAFETY: j < depth.
        let e = unsafe { load(base, j) };
        if e.slot != slot {
            continue;
        }
        for k in j + 1..depth {
            // SAFETY: k - 1 < k < depth, inside the mapping.
            unsafe { store(base, k - 1, load(base, k)) };
        }
        t.depth.store(depth as u32 - 1, Relaxed);
        return Some(e);
    }
    None
}
