//! Threads that share one thread pointer (issue 22). A thread made by a
//! raw `clone(CLONE_VM | CLONE_THREAD | …)` without `CLONE_SETTLS` runs
//! with its creator's `fs` base: the same TLS word, the same thread-table
//! entry, the same counters, ring and shadow stack. The agent's per-thread
//! counters are bumped with one `inc` without `lock` (a single writer per
//! thread), so two threads on one block lose increments, and their events
//! and hooked returns would mix.
//!
//! glibc's `clone`, interposed, sees such a call before the thread exists
//! and marks the creator's thread pointer shared: its thread block's
//! stubs are keyed off (its sites' stubs send hits to the generic path),
//! and on the generic path and in the in-process trap's handler a hit of
//! a shared thread pointer counts into the global counters with a locked
//! add and writes no event and hooks no return (each counted as lost, as
//! for a thread without a slot). Other threads keep their own blocks and
//! their usual path; while no thread pointer is shared, the hot path pays
//! one load of a static.
//!
//! Not seen: `clone` or `clone3` by a `syscall` instruction of the
//! program's own (the session gives such a program no in-process trap,
//! but its patch and jump sites count on the creator's block).

#![cfg_attr(test, allow(dead_code))]

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

/// Thread pointers marked shared at once; past it, every thread is taken
/// as shared ([`ALL`]).
const MAX_SHARED: usize = 64;
static ANY: AtomicBool = AtomicBool::new(false);
static ALL: AtomicBool = AtomicBool::new(false);
static SHARED: [AtomicU64; MAX_SHARED] = [const { AtomicU64::new(0) }; MAX_SHARED];

/// Whether thread pointer `tp` is shared by several threads.
#[inline(always)]
pub(crate) fn is_shared(tp: u64) -> bool {
    ANY.load(Relaxed) && is_shared_slow(tp)
}

#[cold]
#[inline(never)]
fn is_shared_slow(tp: u64) -> bool {
    ALL.load(Acquire) || SHARED.iter().any(|s| s.load(Acquire) == tp)
}

/// Marks `tp` shared (before the thread sharing it exists) and keys its
/// thread block's stubs off.
fn mark(tp: u64) {
    if !SHARED.iter().any(|s| s.load(Relaxed) == tp)
        && !SHARED
            .iter()
            .any(|s| s.compare_exchange(0, tp, Release, Relaxed).is_ok())
    {
        ALL.store(true, Release);
    }
    ANY.store(true, Release);
    if ALL.load(Relaxed) {
        for e in crate::hit::THREADS.iter() {
            e.fast.stub_key.store(0, Relaxed);
        }
    } else if let Some(e) = crate::hit::find_thread(tp) {
        e.fast.stub_key.store(0, Relaxed);
    }
}

const CLONE_VM: u64 = 0x100;
const CLONE_SETTLS: u64 = 0x80000;

/// glibc's `clone`.
static NEXT_CLONE: AtomicUsize = AtomicUsize::new(0);

/// Notes a `clone` with `flags` (return address at `ret_slot`); returns
/// glibc's `clone`. A `CLONE_VFORK` child runs while its parent thread
/// sleeps: not a shared thread pointer, but a vfork child (`vfork`).
extern "C" fn before_clone(flags: u64, ret_slot: *mut u64) -> usize {
    if flags & crate::vfork::CLONE_VFORK != 0 {
        crate::vfork::before(ret_slot);
    } else if flags & CLONE_VM != 0 && flags & CLONE_SETTLS == 0 {
        mark(crate::hit::thread_pointer());
    }
    let f = crate::next_symbol::next_symbol(&NEXT_CLONE, c"clone");
    if f == 0 {
        // SAFETY: abort has no preconditions; without glibc's clone the
        // program could not have linked against it.
        unsafe { libc::abort() };
    }
    f
}

/// `clone`, interposed (variadic: a naked function that keeps every
/// argument register and the stack, then jumps to glibc's).
///
/// # Safety
/// As glibc's `clone`.
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn clone() {
    core::arch::naked_asm!(
        // Entry rsp ≡ 8 (mod 16); seven pushes make the call aligned.
        "push rax",
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        // The flags are the third argument; then the return address's
        // slot, above the seven pushes.
        "mov rdi, rdx",
        "lea rsi, [rsp + 56]",
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
        f = sym before_clone,
    );
}
