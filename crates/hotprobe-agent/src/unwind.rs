//! Hooks on the C++ exception machinery, so that an exception can unwind
//! through frames whose return address the agent swapped (the unwinder
//! finds no unwind information for the return trampoline).
//!
//! With the agent preloaded (`LD_PRELOAD`), its definitions of
//! `_Unwind_RaiseException`, `_Unwind_Resume_or_Rethrow`,
//! `_Unwind_ForcedUnwind` (pthread_exit, cancellation) and
//! `__cxa_begin_catch` come first in symbol lookup. The first three put the
//! real return address back into every live hooked frame before forwarding
//! to libgcc's; `__cxa_begin_catch` (called by every `catch` handler) drops
//! the entries of the frames the exception unwound — recording an unwound
//! exit for each, so entry/exit events stay nested — and swaps the live
//! frames' return addresses back. An agent injected with `dlopen` does not
//! interpose these symbols: the tracer then must not hook returns in
//! programs that throw through probed frames (documented limitation).
//!
//! `backtrace` (glibc's, which walks the stack with the same unwinder)
//! is interposed too: the walk sees the real return addresses.
//!
//! Each hook is a naked function (it must see the caller's exact stack
//! pointer) calling a Rust helper that returns the real function's address,
//! resolved with `dlsym(RTLD_NEXT)`, then tail-jumps to it.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::ffi::CStr;

use crate::hit::{
    find_thread, pop_dead, return_trampoline, thread_pointer, Shadow, ThreadEntry, SHADOW_RESTORED,
};

static REAL: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
const NAMES: [&CStr; 4] = [
    c"_Unwind_RaiseException",
    c"_Unwind_Resume_or_Rethrow",
    c"_Unwind_ForcedUnwind",
    c"__cxa_begin_catch",
];

fn real(i: usize) -> usize {
    // The definition after the agent's (libgcc_s, libstdc++), or the one
    // a library the program dlopened brought.
    let p = crate::next_symbol::next_or_loaded_symbol(&REAL[i], NAMES[i]);
    if p == 0 {
        // SAFETY: abort has no preconditions; with no real unwinder the
        // program could not have thrown.
        unsafe { libc::abort() };
    }
    p
}

extern "C" fn before_unwind(sp: u64, which: u64) -> usize {
    // No catch_unwind here: the helpers are panic-free (no indexing that can
    // fail, no allocation).
    restore_for_unwind(sp);
    real(which as usize)
}

extern "C" fn before_catch(sp: u64) -> usize {
    rearm_after_catch(sp);
    real(3)
}

macro_rules! unwind_hook {
    ($name:ident, $which:literal) => {
        /// Interposed unwinder entry: restores hooked return addresses, then
        /// jumps to libgcc's function of the same name.
        ///
        /// # Safety
        /// Same contract as the libgcc function it forwards to.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                // The caller's stack pointer before its call: rsp + 24 + 8.
                "lea rdi, [rsp+32]",
                concat!("mov esi, ", $which),
                // Entry rsp ≡ 8 (mod 16); three pushes make the call aligned.
                "call {f}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                f = sym before_unwind,
            );
        }
    };
}

unwind_hook!(_Unwind_RaiseException, "0");
unwind_hook!(_Unwind_Resume_or_Rethrow, "1");
unwind_hook!(_Unwind_ForcedUnwind, "2");

/// Interposed `__cxa_begin_catch`: drops the unwound frames' shadow entries
/// and re-hooks the live ones, then jumps to libstdc++'s.
///
/// # Safety
/// Same contract as `__cxa_begin_catch`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!(
        "push rdi",
        "lea rdi, [rsp+16]",
        "call {f}",
        "pop rdi",
        "jmp rax",
        f = sym before_catch,
    );
}

/// The current thread's entry and shadow stack, for the unwinder hooks.
fn current_shadow() -> Option<(&'static ThreadEntry, *mut Shadow)> {
    let t = find_thread(thread_pointer())?;
    let base = t.shadow.load(Relaxed) as *mut Shadow;
    (!base.is_null()).then_some((t, base))
}

/// Before an unwinder walks the stack from `sp` (the caller's stack
/// pointer): drops the entries of dead frames and puts every live frame's
/// real return address back, marking it restored.
pub(crate) fn restore_for_unwind(sp: u64) {
    let Some((t, base)) = current_shadow() else {
        return;
    };
    // Without shared memory (dormant, a forked child) the hooked frames
    // still need their real return addresses.
    let shm = crate::shm();
    let was = t.fast.busy.swap(1, Relaxed);
    pop_dead(shm, t, base, sp, false);
    let tramp = return_trampoline();
    for i in 0..t.depth.load(Relaxed) as usize {
        // SAFETY: i < depth <= SHADOW_CAP.
        let e = unsafe { &mut *base.add(i) };
        if e.flags & SHADOW_RESTORED == 0 {
            // SAFETY: a live frame's return slot on this thread's stack.
            unsafe {
                if (e.slot as *const u64).read_volatile() == tramp {
                    (e.slot as *mut u64).write_volatile(e.real);
                }
            }
            e.flags |= SHADOW_RESTORED;
        }
    }
    t.fast.busy.store(was, Relaxed);
}

/// When a handler catches (the caller's stack pointer is `sp`): the frames
/// below `sp` were unwound (their entries are popped with unwound exits);
/// the live ones are hooked again.
pub(crate) fn rearm_after_catch(sp: u64) {
    let Some((t, base)) = current_shadow() else {
        return;
    };
    // Without shared memory (dormant, a forked child) the hooked frames
    // still need their real return addresses.
    let shm = crate::shm();
    let was = t.fast.busy.swap(1, Relaxed);
    pop_dead(shm, t, base, sp, false);
    let tramp = return_trampoline();
    for i in 0..t.depth.load(Relaxed) as usize {
        // SAFETY: i < depth <= SHADOW_CAP.
        let e = unsafe { &mut *base.add(i) };
        if e.flags & SHADOW_RESTORED != 0 {
            // SAFETY: a live frame's return slot on this thread's stack.
            unsafe {
                if (e.slot as *const u64).read_volatile() == e.real {
                    (e.slot as *mut u64).write_volatile(tramp);
                }
            }
            e.flags &= !SHADOW_RESTORED;
        }
    }
    t.fast.busy.store(was, Relaxed);
}

/// glibc's `backtrace`.
static NEXT_BACKTRACE: AtomicUsize = AtomicUsize::new(0);

type BacktraceFn = unsafe extern "C" fn(*mut *mut libc::c_void, libc::c_int) -> libc::c_int;

/// Frames [`backtrace`] gathers on its stack before copying them out.
const BACKTRACE_FRAMES: usize = 256;

/// `backtrace`, interposed: glibc's unwinder stops at the return
/// trampoline (it has no unwind information, and its address is not the
/// caller's), so while it walks, every live hooked frame holds its real
/// return address again — as for an exception, [`restore_for_unwind`] —
/// and is hooked again after ([`rearm_after_catch`], which finds no dead
/// frame: the walk unwinds nothing). The frames are the program's own:
/// this function's frame, which glibc's would report first, is left out.
///
/// # Safety
/// As glibc's `backtrace`: `buf` is valid for `size` pointers.
#[no_mangle]
pub unsafe extern "C" fn backtrace(buf: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int {
    let f = crate::next_symbol::next_symbol(&NEXT_BACKTRACE, c"backtrace");
    if f == 0 || size <= 0 || buf.is_null() {
        return 0;
    }
    // SAFETY: dlsym's address of glibc's backtrace.
    let real = unsafe { core::mem::transmute::<usize, BacktraceFn>(f) };
    let sp: u64;
    // SAFETY: reads the stack pointer; no other effect.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    restore_for_unwind(sp);
    let want = size as usize;
    let mut tmp = [core::ptr::null_mut::<libc::c_void>(); BACKTRACE_FRAMES];
    let n = if want < BACKTRACE_FRAMES {
        // One more: this function's frame comes first.
        // SAFETY: tmp holds want + 1 <= BACKTRACE_FRAMES pointers.
        let got = unsafe { real(tmp.as_mut_ptr(), want as libc::c_int + 1) }.max(0) as usize;
        let n = got.saturating_sub(1);
        // SAFETY: n <= want pointers of `buf` (caller), from tmp[1..].
        unsafe { core::ptr::copy_nonoverlapping(tmp.as_ptr().add(1), buf, n) };
        n
    } else {
        // SAFETY: the caller's buffer; the first frame (this one) dropped.
        let got = unsafe { real(buf, size) }.max(0) as usize;
        // SAFETY: within the `got` pointers written.
        unsafe { core::ptr::copy(buf.add(1), buf, got.saturating_sub(1)) };
        got.saturating_sub(1)
    };
    rearm_after_catch(sp);
    n as libc::c_int
}
